"""``just lost-records``: the recovery of lost Kafka records at scale, on the live stack.

Two measurements of issue 54 that are too long for a chaos scenario's history:

``mass-loss``
    The workers are stopped, ``--jobs`` ``ledger`` jobs are enqueued (``enqueue_many``,
    1,000 a transaction) and published (the outbox drained), every record of ``jobs.ready``
    is deleted, and the workers start again. Reports the time from the deletion to the first
    job published again and to the last job finished, how many were published again, and
    checks every job succeeded with exactly one fenced effect.
``slow-drain``
    ``--jobs`` ``sleep`` jobs (``--seconds`` each) are enqueued into a running stack, so the
    workers drain the backlog slowly (two workers, 64 handlers each: about 128 /
    ``--seconds`` jobs a second). Nothing is lost, so nothing may be published again however
    long the drain takes: reports the recovery's counters (jobs watched at most, marks
    retired, jobs published again) before and after.

Writes ``reports/lost-records/<time>/<mode>.json`` and prints a summary; exit 1 when a check
fails. Each run adds its jobs to the stack's database, as the bench does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

import leasework
from chaos.nemeses.records import delete_records
from chaos.poll import poll
from chaos.promql import scrape
from devstack import Stack
from devstack.layout import POSTGRES_DIRECT_DSN

RELAY_OPS_PORT = 9102
WORKERS = ("worker-1", "worker-2")
TOPIC = "jobs.ready"
BATCH = 1000  # jobs per enqueue_many transaction (its most)


def recovery_counters() -> dict[str, float]:
    """The relay's recovery metrics now (summed over labels)."""
    samples = scrape(RELAY_OPS_PORT)
    names = {
        "republished": "leasework_lost_records_republished_total",
        "marks_retired": "leasework_lost_records_marks_retired_total",
        "watched": "leasework_lost_records_watched_jobs",
    }
    return {
        short: sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))
        for short, name in names.items()
    }


def enqueue(conn: psycopg.Connection, job_type: str, payload: dict, n: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, BATCH):
        count = min(BATCH, n - start)
        with conn.transaction():
            done = leasework.enqueue_many(
                conn, [{"job_type": job_type, "payload": payload}] * count
            )
        ids.extend(str(j.id) for j in done)
    return ids


def count(conn: psycopg.Connection, query: str, ids: list[str]) -> int:
    return int(conn.execute(query, (ids,)).fetchone()["n"])


def outbox_rows(conn: psycopg.Connection, ids: list[str]) -> int:
    return count(conn, "SELECT count(*) AS n FROM outbox WHERE job_id = ANY(%s::uuid[])", ids)


def finished(conn: psycopg.Connection, ids: list[str]) -> int:
    return count(
        conn,
        "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[]) "
        "AND status IN ('succeeded', 'dead', 'cancelled')",
        ids,
    )


@dataclass(frozen=True)
class MassLoss:
    jobs: int
    deleted_records: int
    enqueue_seconds: float
    publish_seconds: float  # enqueue done to the outbox drained
    first_republish_seconds: float | None  # deletion to the first job published again
    recovered_seconds: float  # deletion to the last job finished
    republished: float
    succeeded: int
    effects_twice: int
    effects_missing: int

    @property
    def passed(self) -> bool:
        return self.succeeded == self.jobs and not self.effects_twice and not self.effects_missing


def mass_loss(stack: Stack, jobs: int, timeout: float) -> MassLoss:
    with psycopg.connect(POSTGRES_DIRECT_DSN, row_factory=dict_row, autocommit=True) as conn:
        stack.stop_many(list(WORKERS))
        try:
            began = time.monotonic()
            ids = enqueue(conn, "ledger", {}, jobs)
            enqueued = time.monotonic()
            print(f"mass-loss: {jobs} jobs enqueued in {enqueued - began:.1f}s", flush=True)
            drained = poll(lambda: outbox_rows(conn, ids) == 0, patience=timeout, interval=1.0)
            if not drained.met:
                raise SystemExit("mass-loss: the relay did not publish every job in time")
            published = time.monotonic()
            before = recovery_counters()["republished"]
            deleted = delete_records(TOPIC)
            lost_at = time.monotonic()
            print(f"mass-loss: published in {published - enqueued:.1f}s; {deleted} records deleted")
        finally:
            for worker in WORKERS:
                stack.start(worker)
        first: float | None = None
        while finished(conn, ids) < jobs:
            if time.monotonic() - lost_at > timeout:
                break
            if first is None and recovery_counters()["republished"] > before:
                first = time.monotonic() - lost_at
            time.sleep(1.0)
        recovered = time.monotonic() - lost_at
        effects = conn.execute(
            """SELECT count(*) FILTER (WHERE n > 1) AS twice,
                      %s - count(*) AS missing
                 FROM (SELECT job_id, count(*) AS n FROM effects
                        WHERE job_id = ANY(%s::uuid[]) GROUP BY job_id) e""",
            (jobs, ids),
        ).fetchone()
        succeeded = count(
            conn,
            "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[]) AND status = 'succeeded'",
            ids,
        )
        return MassLoss(
            jobs,
            deleted,
            round(enqueued - began, 1),
            round(published - enqueued, 1),
            None if first is None else round(first, 1),
            round(recovered, 1),
            recovery_counters()["republished"] - before,
            succeeded,
            int(effects["twice"]),
            int(effects["missing"]),
        )


@dataclass(frozen=True)
class SlowDrain:
    jobs: int
    seconds_each: float
    drain_seconds: float
    watched_most: float
    marks_retired: float
    republished: float
    finished: int

    @property
    def passed(self) -> bool:
        return self.finished == self.jobs and self.republished == 0


def slow_drain(jobs: int, seconds: float, timeout: float) -> SlowDrain:
    with psycopg.connect(POSTGRES_DIRECT_DSN, row_factory=dict_row, autocommit=True) as conn:
        before = recovery_counters()
        began = time.monotonic()
        ids = enqueue(conn, "sleep", {"seconds": seconds}, jobs)
        print(f"slow-drain: {jobs} jobs enqueued in {time.monotonic() - began:.1f}s", flush=True)
        watched_most, done = 0.0, 0
        while time.monotonic() - began < timeout:
            done = finished(conn, ids)
            now = recovery_counters()
            watched_most = max(watched_most, now["watched"])
            again = now["republished"] - before["republished"]
            print(
                f"slow-drain: t={time.monotonic() - began:5.0f}s finished {done}, watched "
                f"{now['watched']:.0f}, published again {again:.0f}",
                flush=True,
            )
            if done == jobs:
                break
            time.sleep(10.0)
        after = recovery_counters()
        return SlowDrain(
            jobs,
            seconds,
            round(time.monotonic() - began, 1),
            watched_most,
            after["marks_retired"] - before["marks_retired"],
            after["republished"] - before["republished"],
            done,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="just lost-records", description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("mass-loss", "slow-drain"))
    parser.add_argument("--jobs", type=int, default=None, help="100000 / 200000 by mode")
    parser.add_argument("--seconds", type=float, default=0.4, help="slow-drain: each job's sleep")
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)
    stack = Stack.from_env()
    stack.up(apps=True)
    if args.mode == "mass-loss":
        result: MassLoss | SlowDrain = mass_loss(stack, args.jobs or 100_000, args.timeout)
    else:
        result = slow_drain(args.jobs or 200_000, args.seconds, args.timeout)
    directory = Path("reports/lost-records") / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    directory.mkdir(parents=True, exist_ok=True)
    record = {**asdict(result), "passed": result.passed}
    (directory / f"{args.mode}.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    print(f"{args.mode}: {'passed' if result.passed else 'FAILED'} -> {directory}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
