"""``just bench``: submit N noop jobs and measure the pipeline on the real stack.

Reports, for 1 and then 2 workers: submit rate, end-to-end jobs per second (first submit to
last success) and scheduling delay p50/p95/p99 (start minus due time). The 1-worker run is the
baseline; the 2-worker row also shows its ratio to it, since absolute figures on a shared
2-core machine say little. It measures; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from dataclasses import dataclass

import psycopg
import trio
from psycopg.rows import dict_row

from chaos.stack import Stack
from leasework.client import AsyncClient

DIRECT_DSN = "postgresql://leasework:leasework@127.0.0.1:15433/leasework"
API_URL = "http://127.0.0.1:8080"
WORKERS = ("worker-1", "worker-2")


@dataclass(frozen=True)
class BenchResult:
    workers: int
    jobs: int
    submit_per_second: float
    end_to_end_per_second: float
    delay_p50: float
    delay_p95: float
    delay_p99: float


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


async def submit_all(jobs: int, tag: str, concurrency: int) -> list[str]:
    ids: list[str] = []
    limiter = trio.Semaphore(concurrency)
    async with AsyncClient(API_URL, timeout=30) as client:

        async def one(n: int) -> None:
            async with limiter:
                job = await client.submit(
                    "noop", {"bench": tag, "n": n}, idempotency_key=f"bench-{tag}-{n}"
                )
                ids.append(job["id"])

        async with trio.open_nursery() as nursery:
            for n in range(jobs):
                nursery.start_soon(one, n)
    return ids


def run(stack: Stack, workers: int, jobs: int, concurrency: int) -> BenchResult:
    for name in WORKERS[workers:]:
        stack.stop(name)
    for name in WORKERS[:workers]:
        stack.start(name)
        stack.wait_ready(name, timeout=90)
    tag = uuid.uuid4().hex[:8]
    started = time.monotonic()
    ids = trio.run(submit_all, jobs, tag, concurrency)
    submitted = time.monotonic()
    with psycopg.connect(DIRECT_DSN, autocommit=True, row_factory=dict_row) as db:
        deadline = time.monotonic() + 600
        while True:
            done = db.execute(
                "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[]) "
                "AND status = 'succeeded'",
                (ids,),
            ).fetchone()["n"]
            if done == jobs:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"bench: only {done}/{jobs} jobs succeeded within 600 s")
            time.sleep(0.05)
        finished = time.monotonic()
        delays = [
            r["d"]
            for r in db.execute(
                "SELECT extract(epoch FROM started_at - run_at)::float8 AS d FROM jobs "
                "WHERE id = ANY(%s::uuid[])",
                (ids,),
            )
        ]
    for name in WORKERS:
        stack.start(name)
    return BenchResult(
        workers=workers,
        jobs=jobs,
        submit_per_second=jobs / (submitted - started),
        end_to_end_per_second=jobs / (finished - started),
        delay_p50=percentile(delays, 50),
        delay_p95=percentile(delays, 95),
        delay_p99=percentile(delays, 99),
    )


def render(results: list[BenchResult]) -> str:
    base = results[0]
    lines = [
        "| workers | jobs | submit/s | end-to-end jobs/s | e2e vs 1 worker | delay p50 s "
        "| p95 s | p99 s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.workers} | {r.jobs} | {r.submit_per_second:.0f} | "
            f"{r.end_to_end_per_second:.0f} | "
            f"{r.end_to_end_per_second / base.end_to_end_per_second:.2f}x | "
            f"{r.delay_p50:.3f} | {r.delay_p95:.3f} | {r.delay_p99:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent submitters")
    args = parser.parse_args(argv)
    stack = Stack.from_env()
    stack.up(apps=True)
    results = [run(stack, w, args.jobs, args.concurrency) for w in (1, 2)]
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
