"""``python -m tools.profile_api``: where the api's CPU goes per single submit.

Samples the stack's api with py-spy (``--nonblocking``: the api is never paused; ``--gil``:
only the thread running Python, so waits on sockets and locks are not counted) while the
bench's single door sends one job per ``POST /jobs`` from 16 keep-alive clients, then prints
and writes (``reports/profile/<UTC time>/``) the share of samples per area of the code (the
HTTP server, the guard, validation, the group commit, the database driver, JSON, Trio) and the
functions with the most samples, inclusive and on top of the stack. It measures; it asserts
nothing. Run it alone, on a stack that is up (``just up``).
"""

from __future__ import annotations

import argparse
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
    ("http server (hypercorn, h11)", "hypercorn"),
    ("http server (hypercorn, h11)", "h11"),
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="profile_api", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=4000)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    a = p.parse_args(argv)
    stack = Stack.from_env()
    pid = stack.pid("api")
    if pid is None or not stack.is_ready("api"):
        print("profile_api: the api is not up; start the stack with `just up`", file=sys.stderr)
        return 2
    spy = Path(sys.executable).with_name("py-spy")
    out = default_repo_root() / "reports" / "profile" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    raw = out / "api.raw.txt"
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
    submitted = doors.submit(door, url=API_URL, dsn=POSTGRES_DIRECT_DSN, tag=tag, jobs=a.jobs)
    seconds = submitted.last - submitted.first
    recorder.send_signal(2)  # SIGINT: py-spy writes what it has
    recorder.wait(30)
    import psycopg

    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True) as conn:
        doors.delete_tagged(conn, tag, started)
    text = (
        f"api pid {pid}: {a.jobs} single submits from {a.clients} clients in {seconds:.1f} s "
        f"({a.jobs / seconds:.0f}/s)\n" + summarize(parse_raw(raw.read_text()))
    )
    (out / "api.txt").write_text(text)
    print(text)
    print(f"report: {out}/api.txt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
