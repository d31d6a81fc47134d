"""``python -m tools.profile_api``: where the api's CPU goes per single submit.

Samples the stack's api with py-spy (``--nonblocking``: the api is never paused; ``--gil``:
only the thread running Python, so waits on sockets and locks are not counted) while the
bench's single door sends one job per ``POST /jobs`` from 16 keep-alive clients, then prints
and writes (``reports/profile/<UTC time>/``) the share of samples per area of the code (the
HTTP server, the guard, validation, the group commit, the database driver, JSON, Trio) and the
functions with the most samples, inclusive and on top of the stack. It measures; it asserts
nothing. Run it alone, on a stack that is up (``just up``).

``--paced RATE`` sends the submits open loop at RATE per second instead of as fast as the
clients go, so that two api builds are compared with the same number of submits sharing each
group commit; either way it prints the api's CPU per submit, from ``/proc/PID/stat`` over the
submits (py-spy's own cost is not the api's: ``--no-profile`` leaves py-spy out, for the
figure alone). ``--repeat N`` runs it N times and prints each figure and their median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from devstack import Stack
from devstack.layout import POSTGRES_DIRECT_DSN, default_repo_root
from tools.bench import doors

API_URL = "http://127.0.0.1:8080"
# (area, substring of a frame "function (file)") in the order they are tried, innermost first
AREAS = (
    ("json", "json/"),
    ("database driver (psycopg)", "psycopg"),
    ("group commit", "groupcommit.py"),
    ("validation", "validation.py"),
    ("submission", "submission.py"),
    ("guard", "guard.py"),
    ("auth", "auth.py"),
    ("http server (httpserver.py, httptools)", "httpserver.py"),
    ("http server (httpserver.py, httptools)", "httptools"),
    ("trio", "trio/"),
)


def area_of(stack: list[str]) -> str:
    """The area of one sample: its innermost frame that belongs to a known area."""
    for frame in reversed(stack):
        for area, marker in AREAS:
            if marker in frame:
                return area
    return "other"


def parse_raw(text: str) -> list[tuple[list[str], int]]:
    """py-spy's ``--format raw`` (collapsed stacks: ``frame;frame;frame count``)."""
    samples = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            samples.append((stack.split(";"), int(count)))
    return samples


def summarize(samples: list[tuple[list[str], int]], top: int = 25) -> str:
    total = sum(n for _, n in samples) or 1
    areas: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for stack, n in samples:
        areas[area_of(stack)] += n
        for frame in set(stack):
            inclusive[frame] += n
        own[stack[-1]] += n
    lines = [f"{total} samples", "", "area (innermost frame that belongs to one):"]
    lines += [f"  {100 * n / total:5.1f}%  {area}" for area, n in areas.most_common()]
    lines += ["", f"top {top} functions, inclusive:"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    lines += ["", f"top {top} functions, on top of the stack:"]
    lines += [f"  {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    return "\n".join(lines) + "\n"


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid``, in clock ticks (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def run_once(a: argparse.Namespace, pid: int, out: Path, n: int) -> tuple[float, float, str]:
    """One batch of submits: (submits/s, api CPU ms per submit, the profile's text or "")."""
    raw = out / f"api.raw.{n}.txt"
    recorder = None
    if a.profile:
        spy = Path(sys.executable).with_name("py-spy")
        recorder = subprocess.Popen(
            [str(spy), "record", "--pid", str(pid), "--rate", str(a.rate), "--nonblocking",
             "--gil", "--format", "raw", "--output", str(raw)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        time.sleep(1.0)
    tag = f"profile-{uuid.uuid4().hex[:8]}"
    door = doors.Door("single", 1, a.clients)
    started = time.time()
    due = None
    if a.paced:
        begin = started + 0.2
        due = lambda i: begin + i / a.paced  # noqa: E731
    before = cpu_ticks(pid)
    submitted = doors.submit(
        door, url=API_URL, dsn=POSTGRES_DIRECT_DSN, tag=tag, jobs=a.jobs, due=due
    )
    spent = cpu_ticks(pid) - before
    seconds = submitted.last - submitted.first
    if recorder is not None:
        recorder.send_signal(2)  # SIGINT: py-spy writes what it has
        recorder.wait(30)
    import psycopg

    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True) as conn:
        doors.delete_tagged(conn, tag, started)
    ms_per_submit = 1000 * spent / os.sysconf("SC_CLK_TCK") / a.jobs
    profile = summarize(parse_raw(raw.read_text())) if recorder is not None else ""
    return a.jobs / seconds, ms_per_submit, profile


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="profile_api", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=4000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--paced", type=float, default=0.0, help="submits per second (0: flat out)")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--no-profile", dest="profile", action="store_false")
    a = p.parse_args(argv)
    stack = Stack.from_env()
    pid = stack.pid("api")
    if pid is None or not stack.is_ready("api"):
        print("profile_api: the api is not up; start the stack with `just up`", file=sys.stderr)
        return 2
    out = default_repo_root() / "reports" / "profile" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    pace = f"paced at {a.paced:g}/s" if a.paced else "flat out"
    lines, costs = [], []
    for n in range(1, a.repeat + 1):
        rate, cost, profile = run_once(a, pid, out, n)
        costs.append(cost)
        lines.append(
            f"run {n}: api pid {pid}: {a.jobs} single submits from {a.clients} clients "
            f"({pace}) at {rate:.0f}/s; api CPU {cost:.3f} ms per submit"
        )
        if profile:
            lines.append(profile)
    lines.append(
        f"api CPU ms per submit: median {statistics.median(costs):.3f} "
        f"({min(costs):.3f}-{max(costs):.3f}) over {len(costs)} run(s)"
    )
    text = "\n".join(lines) + "\n"
    (out / "api.txt").write_text(text)
    print(text)
    print(f"report: {out}/api.txt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
