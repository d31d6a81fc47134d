"""How long an honest caller waits while an attacker sends the worst bodies it can.

``python -m tools.bystander`` (``just bystander``): against the running api, a bystander
asks ``GET /readyz`` and submits one honest job (``POST /jobs``, a noop) in turn, first on
a quiet api (the baseline), then while attacker processes send, to every public and every
authenticated route, the largest body each refuses (one byte over its cap, declared, and
streamed without a length) and the largest and most expensive bodies it accepts or refuses
only after decoding (up to the value limits: a million commas and brackets in a batch, a
hundred thousand values in a payload, a megabyte string). Prints the bystander's p50, p99
and worst latency in both phases, and writes ``reports/bystander/<time>/report.{md,json}``.

The attacker holds the dev token (admin: every route is open to it), the worst case; a
stranger without one is refused before a byte of the body is read.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from leasework.jsonlimits import MAX_BATCH_STRUCTURE, MAX_NODES
from leasework.tokens import default_token

DEFAULT_URL = "http://127.0.0.1:8080"

# the caps of the stack's api (leasework.config defaults)
SUBMIT_CAP = 1_048_576
BATCH_CAP = 16 * 1_048_576
WEBHOOK_CAP = 262_144
FORM_CAP = 8_192
SMALL_CAP = 65_536


@dataclass(frozen=True)
class Attack:
    """One request an attacker sends: method, path, body, content type, and whether the body
    goes without a Content-Length (streamed in chunks)."""

    name: str
    method: str
    path: str
    body: bytes
    content_type: str = "application/json"
    chunked: bool = False


def _values(count: int, value: bytes = b"{}") -> bytes:
    return b"[" + b",".join([value] * count) + b"]"


def _job(payload: bytes) -> bytes:
    return b'{"type":"noop","payload":{"x":' + payload + b"}}"


def attacks() -> list[Attack]:
    """Every route with its worst bodies (pure)."""
    out: list[Attack] = []
    jobs_per_batch = 1000
    per_job = MAX_BATCH_STRUCTURE // jobs_per_batch - 10
    accepted_batch = b'{"jobs":[' + b",".join([_job(_values(per_job, b"0"))] * 1000) + b"]}"
    widest_batch = b'{"jobs":[' + _job(_values(MAX_BATCH_STRUCTURE - 20)) + b"]}"
    capped = {
        "/jobs": SUBMIT_CAP,
        "/jobs/batch": BATCH_CAP,
        "/alerts/webhook": WEBHOOK_CAP,
        "/jobs/retry": SMALL_CAP,
        "/tokens": SMALL_CAP,
        "/ui/login": FORM_CAP,
        "/readyz": SMALL_CAP,
        "/healthz": SMALL_CAP,
        "/openapi.json": SMALL_CAP,
        "/metrics": SMALL_CAP,
        "/no-such-path": SMALL_CAP,
    }
    for path, cap in capped.items():
        method = "GET" if path in ("/readyz", "/healthz", "/openapi.json", "/metrics") else "POST"
        over = b"[" + b"0," * (cap // 2) + b"0]"
        out.append(Attack(f"{path} over its cap", method, path, over))
        out.append(Attack(f"{path} over its cap, streamed", method, path, over, chunked=True))
    form = "application/x-www-form-urlencoded"
    out += [
        Attack("/jobs largest accepted payload", "POST", "/jobs",
               _job(_values(MAX_NODES - 10, b"0"))),
        Attack("/jobs a megabyte string", "POST", "/jobs",
               _job(b'"' + b"a" * (SUBMIT_CAP - 100) + b'"')),
        Attack("/jobs widest refused payload", "POST", "/jobs",
               _job(_values(SUBMIT_CAP // 3 - 20))),
        Attack("/jobs/batch largest accepted", "POST", "/jobs/batch", accepted_batch),
        Attack("/jobs/batch widest refused", "POST", "/jobs/batch", widest_batch),
        Attack("/alerts/webhook widest", "POST", "/alerts/webhook",
               b'{"alerts":' + _values(WEBHOOK_CAP // 3 - 20) + b"}"),
        Attack("/ui/login fullest form", "POST", "/ui/login",
               b"a=1&" * (FORM_CAP // 4 - 1), content_type=form),
        Attack("/jobs/retry widest filter", "POST", "/jobs/retry",
               b'{"type":' + _values(SMALL_CAP // 3 - 20) + b"}"),
    ]  # fmt: skip
    return out


def _connection(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(
        parts.hostname or "127.0.0.1", parts.port or 80, timeout=timeout
    )


def _send(url: str, token: str | None, attack: Attack) -> int:
    connection = _connection(url, 60)
    headers = {"Content-Type": attack.content_type, "Origin": url}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        if attack.chunked:
            chunks = (attack.body[i : i + 65536] for i in range(0, len(attack.body), 65536))
            connection.request(
                attack.method, attack.path, body=chunks, headers=headers, encode_chunked=True
            )
        else:
            connection.request(attack.method, attack.path, body=attack.body, headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return 0  # the api closed the connection on a refused body: as it should
    finally:
        connection.close()


def _attacker(url: str, token: str | None, until: float, offset: int, counts: dict) -> None:
    plan = attacks()
    index = offset
    while time.monotonic() < until:
        attack = plan[index % len(plan)]
        status = _send(url, token, attack)
        key = f"{attack.name} -> {status}"
        counts[key] = counts.get(key, 0) + 1
        index += 1


@dataclass(frozen=True)
class Latencies:
    what: str
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    failed: int

    @classmethod
    def of(cls, what: str, seconds: list[float], failed: int) -> Latencies:
        ms = sorted(s * 1000 for s in seconds) or [float("nan")]
        p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
        return cls(what, len(seconds), statistics.median(ms), p99, ms[-1], failed)


def bystand(url: str, token: str | None, seconds: float) -> tuple[Latencies, Latencies]:
    """``GET /readyz`` and one honest ``POST /jobs`` in turn for ``seconds``, each on its own
    keep-alive connection; their latencies (a failed request counts as its time, too)."""
    ready, submit = _connection(url, 30), _connection(url, 30)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    body = json.dumps({"type": "noop", "payload": {}})
    times: dict[str, list[float]] = {"readyz": [], "submit": []}
    failed = {"readyz": 0, "submit": 0}
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        for what, connection, method, path, data in (
            ("readyz", ready, "GET", "/readyz", None),
            ("submit", submit, "POST", "/jobs", body),
        ):
            started = time.perf_counter()
            try:
                connection.request(method, path, body=data, headers=headers)
                response = connection.getresponse()
                response.read()
                ok = response.status in (200, 202)
            except (OSError, http.client.HTTPException):
                ok = False
                connection.close()
            times[what].append(time.perf_counter() - started)
            failed[what] += 0 if ok else 1
        time.sleep(0.01)
    ready.close()
    submit.close()
    return (
        Latencies.of("GET /readyz", times["readyz"], failed["readyz"]),
        Latencies.of("POST /jobs (honest)", times["submit"], failed["submit"]),
    )


LAG_METRIC = "leasework_event_loop_lag_seconds_bucket"


def loop_lag_buckets(url: str) -> dict[float, float]:
    """The api's event-loop lag histogram (cumulative counts by upper bound, seconds)."""
    connection = _connection(url, 10)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(LAG_METRIC + "{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(bound)] = float(line.rsplit(" ", 1)[1])
    return buckets


def lag_summary(before: dict[float, float], after: dict[float, float]) -> dict[str, float]:
    """Of the loop-lag samples taken between two readings (pure): how many, how many woke
    more than 50 ms and more than 250 ms late, and the bound of the worst."""
    delta = {bound: after.get(bound, 0.0) - before.get(bound, 0.0) for bound in after}
    total = delta.get(float("inf"), 0.0)
    below = sorted((b, c) for b, c in delta.items() if b != float("inf"))
    worst = next((b for b, c in below if c >= total), float("inf")) if total else 0.0
    return {
        "samples": total,
        "over_50ms": total - delta.get(0.05, 0.0),
        "over_250ms": total - delta.get(0.25, 0.0),
        "worst_at_most_s": worst,
    }


def phase(url: str, token: str | None, seconds: float) -> dict:
    before, load = loop_lag_buckets(url), os.getloadavg()[0]
    ready, submit = bystand(url, token, seconds)
    return {
        "readyz": asdict(ready),
        "submit": asdict(submit),
        "loop_lag": lag_summary(before, loop_lag_buckets(url)),
        "load_before": load,
        "load_after": os.getloadavg()[0],
    }


def run(url: str, seconds: float, attackers: int, token: str | None) -> dict:
    baseline = phase(url, token, seconds)
    sent: dict[str, int] = {}
    with multiprocessing.Manager() as manager:
        counts = [manager.dict() for _ in range(attackers)]
        until = time.monotonic() + seconds + 1.0
        processes = [
            multiprocessing.Process(target=_attacker, args=(url, token, until, i * 7, counts[i]))
            for i in range(attackers)
        ]
        for process in processes:
            process.start()
        time.sleep(1.0)  # the attack is under way before the bystander starts
        attacked = phase(url, token, seconds)
        for process in processes:
            process.join(timeout=120)
            if process.is_alive():
                process.kill()
                process.join()
            process.close()
        for shard in counts:
            for key, value in dict(shard).items():
                sent[key] = sent.get(key, 0) + value
    return {
        "url": url,
        "seconds": seconds,
        "attackers": attackers,
        "baseline": baseline,
        "attacked": attacked,
        "sent": dict(sorted(sent.items())),
    }


def report(result: dict) -> list[str]:
    seconds = result["seconds"]
    lines = [
        f"Bystander on {result['url']}: {seconds:g} s quiet, then {seconds:g} s under "
        f"{result['attackers']} attacker processes.",
        "",
        "| request | phase | count | p50 ms | p99 ms | max ms | failed | p99 vs quiet |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for what in ("readyz", "submit"):
        quiet = result["baseline"][what]
        for name, row in (("quiet", quiet), ("attacked", result["attacked"][what])):
            ratio = row["p99_ms"] / quiet["p99_ms"] if quiet["p99_ms"] else float("nan")
            lines.append(
                f"| {row['what']} | {name} | {row['count']} | {row['p50_ms']:.1f} | "
                f"{row['p99_ms']:.1f} | {row['max_ms']:.1f} | {row['failed']} | {ratio:.1f}x |"
            )
    lines += [
        "",
        "The api's own event loop (leasework_event_loop_lag_seconds, a 100 ms sleep's lateness):",
        "",
        "| phase | samples | > 50 ms late | > 250 ms late | worst at most | load 1m |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in ("baseline", "attacked"):
        lag, row = result[name]["loop_lag"], result[name]
        lines.append(
            f"| {name} | {lag['samples']:.0f} | {lag['over_50ms']:.0f} | {lag['over_250ms']:.0f} "
            f"| {lag['worst_at_most_s']:g} s | {row['load_before']:.1f}-{row['load_after']:.1f} |"
        )
    lines += ["", "What the attackers sent (request -> status, 0: connection closed):", ""]
    lines += [f"- {key}: {count}" for key, count in result["sent"].items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bystander", description=__doc__)
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--seconds", type=float, default=30.0, help="each phase (default 30)")
    parser.add_argument("--attackers", type=int, default=2, help="attacker processes")
    parser.add_argument("--out", default="reports/bystander")
    args = parser.parse_args(argv)
    token = default_token()
    if not token:
        print("bystander: no token (just up writes one); set LEASEWORK_TOKEN", file=sys.stderr)
        return 2
    result = run(args.url, args.seconds, args.attackers, token)
    lines = report(result)
    print("\n".join(lines))
    out = Path(args.out) / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(result, indent=2))
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print(f"\nwritten to {out}/report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
