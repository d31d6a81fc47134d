"""The ``audit`` row: how long one auditor pass takes as the jobs table grows.

In a scratch schema of its own (the product's ``jobs``, ``attempts``, ``outbox`` and auditor
tables copied with their indexes, dropped afterwards), the row fills the table with finished
jobs (one attempt each, their effects committed) up to each size, then times passes of the
relay's own pass (:func:`leasework.store.audit.audit_pass`) (5,000 jobs each, from the watermark
the previous pass left), the watermark placed ``passes`` batches before the newest jobs.
The cost of a pass should follow its batch, not the table: the figure is the median pass
time at each size and its ratio to the smallest's.
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

from leasework.store.audit import audit_pass

TABLES = ("jobs", "attempts", "outbox", "invariant_audit", "invariant_violations")
SIZES = (100_000, 1_000_000)
PASSES = 7
CHUNK = 100_000


def _fill(conn: psycopg.Connection, start: int, stop: int) -> None:
    """Finished jobs ``start``..``stop`` (one minute apart in finished_at order, newest last),
    each with one succeeded attempt whose effects committed."""
    for lo in range(start, stop, CHUNK):
        hi = min(stop, lo + CHUNK)
        conn.execute(
            """INSERT INTO jobs (id, type, payload, status, run_at, attempt, max_attempts,
                                 attempt_budget, timeout_seconds, fence, finished_at,
                                 created_at, updated_at, started_at)
               SELECT gen_random_uuid(), 'ledger', '{}', 'succeeded', t, 1, 5, 5, 30, n, t,
                      t, t, t
               FROM generate_series(%s::bigint, %s::bigint - 1) AS n,
                    LATERAL (SELECT timestamptz '2020-01-01' + n * interval '1 second') AS x(t)""",
            (lo, hi),
        )
        conn.execute(
            """INSERT INTO attempts (job_id, attempt, worker, fence, started_at, finished_at,
                                     outcome, effects_committed)
               SELECT id, 1, 'bench', fence, started_at, finished_at, 'succeeded', true
               FROM jobs WHERE fence >= %s AND fence < %s""",
            (lo, hi),
        )
    conn.execute("ANALYZE jobs")
    conn.execute("ANALYZE attempts")


def _time_passes(conn: psycopg.Connection, size: int, batch: int) -> list[float]:
    """Passes from a watermark ``PASSES`` batches before the newest job (seconds each)."""
    start = size - PASSES * batch
    if start < 0:
        raise ValueError(f"a table of {size} jobs is too small for {PASSES} passes of {batch}")
    conn.execute(
        """UPDATE invariant_audit SET finished_after = timestamptz '2020-01-01'
                  + %s * interval '1 second', after_id = NULL""",
        (start,),
    )
    times = []
    for _ in range(PASSES):
        t0 = time.perf_counter()
        with conn.transaction():
            done = audit_pass(conn, batch=batch, settle=0.0, lease_grace=60.0, stuck_after=900.0)
        times.append(time.perf_counter() - t0)
        if done.checked != batch:
            raise RuntimeError(f"an audit pass checked {done.checked} jobs, not {batch}")
    return times


def audit_row(dsn: str, sizes: tuple[int, ...] = SIZES, batch: int = 5000) -> dict[str, Any]:
    schema = f"bench_audit_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        for table in TABLES:
            admin.execute(f"CREATE TABLE {schema}.{table} (LIKE public.{table} INCLUDING ALL)")
        admin.execute(f"INSERT INTO {schema}.invariant_audit DEFAULT VALUES")
    results = []
    try:
        with psycopg.connect(
            dsn, autocommit=True, row_factory=dict_row, options=f"-c search_path={schema},public"
        ) as conn:
            filled = 0
            for size in sizes:
                t0 = time.monotonic()
                _fill(conn, filled, size)
                filled = size
                fill_s = time.monotonic() - t0
                times = _time_passes(conn, size, batch)
                results.append(
                    {
                        "jobs": size,
                        "fill_s": round(fill_s, 1),
                        "pass_ms": [round(t * 1000, 1) for t in times],
                        "median_ms": round(statistics.median(times) * 1000, 1),
                    }
                )
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")
    base = results[0]["median_ms"] if results else None
    for r in results:
        r["vs_smallest"] = round(r["median_ms"] / base, 2) if base else None
    return {"batch": batch, "passes": PASSES, "sizes": results}
