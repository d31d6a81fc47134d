"""The ``audit`` row: how long one auditor pass takes as the jobs table grows.

In a scratch schema of its own (the product's ``jobs``, ``attempts``, ``outbox`` and auditor
tables copied with their indexes, dropped afterwards), the row fills the table with finished
jobs (one attempt each, their effects committed) up to each size, then times passes of the
relay's own pass (:func:`leasework.store.audit.audit_pass`) (5,000 jobs each, from the watermark
the previous pass left), the watermark placed ``passes`` batches before the newest jobs.
The cost of a pass should follow its batch, not the table: the figure is the median pass
time at each size and its ratio to the smallest's.

Then the same for limited jobs (:func:`limited_row`): passes over jobs of a capped queue
(cap 4, one limit for all of them) of the stack's ``keyed`` type (a concurrency key each) or
its ``rated`` type (a rate key each), their attempts four at once, with a backlog of the
queue's jobs waiting beside them (0, then 100,000, then 400,000): the limit checks read the
limit's other attempts, and the queue's and the rate's read its unfinished jobs too.
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
# the limited passes' own queues and job types (a capped queue), copied from the stack's
LIMITED_TABLES = (*TABLES, "queues", "job_types")
LIMITED_TYPES = ("keyed", "rated")
BACKLOGS = (0, 100_000, 400_000)
CAP = 4
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


def _scratch(dsn: str, tables: tuple[str, ...]) -> str:
    """A scratch schema holding empty copies of ``tables`` (with their indexes)."""
    schema = f"bench_audit_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        for table in tables:
            admin.execute(f"CREATE TABLE {schema}.{table} (LIKE public.{table} INCLUDING ALL)")
        admin.execute(f"INSERT INTO {schema}.invariant_audit DEFAULT VALUES")
    return schema


def _drop(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")


def _connect(dsn: str, schema: str) -> psycopg.Connection:
    return psycopg.connect(
        dsn, autocommit=True, row_factory=dict_row, options=f"-c search_path={schema},public"
    )


def _fill_limited(conn: psycopg.Connection, job_type: str, count: int) -> None:
    """``count`` finished jobs of ``job_type`` in the capped queue, 50 keys, one attempt each
    of 1 s, one starting every 250 ms (four at once: the cap, never above it)."""
    conn.execute(
        """INSERT INTO jobs (id, type, payload, status, run_at, attempt, max_attempts,
                             attempt_budget, timeout_seconds, fence, finished_at, created_at,
                             updated_at, started_at, queue, limit_key)
           SELECT gen_random_uuid(), %(type)s, jsonb_build_object('key', (n %% 50)::text),
                  'succeeded', t, 1, 5, 5, 30, n, t + interval '1 second', t, t, t, 'capped',
                  CASE WHEN %(type)s = 'keyed' THEN 'keyed/' || (n %% 50)::text END
           FROM generate_series(1, %(count)s) AS n,
                LATERAL (SELECT now() - interval '1 day' + n * interval '250 ms') AS x(t)""",
        {"type": job_type, "count": count},
    )
    conn.execute(
        """INSERT INTO attempts (job_id, attempt, worker, fence, started_at, finished_at,
                                 outcome, effects_committed)
           SELECT id, 1, 'bench', fence, started_at, finished_at, 'succeeded', true
           FROM jobs WHERE status = 'succeeded'"""
    )


def _fill_backlog(conn: psycopg.Connection, job_type: str, count: int) -> None:
    conn.execute(
        """INSERT INTO jobs (id, type, payload, status, run_at, attempt, max_attempts,
                             attempt_budget, timeout_seconds, fence, created_at, updated_at,
                             queue)
           SELECT gen_random_uuid(), %(type)s, jsonb_build_object('key', (n %% 50)::text),
                  'queued', now(), 0, 5, 5, 30, 0, now(), now(), 'capped'
           FROM generate_series(1, %(count)s) AS n""",
        {"type": job_type, "count": count},
    )


def limited_row(
    dsn: str, backlogs: tuple[int, ...] = BACKLOGS, batch: int = 5000
) -> list[dict[str, Any]]:
    """Audit passes over limited jobs (see the module's text), for each type and backlog."""
    results = []
    for job_type in LIMITED_TYPES:
        schema = _scratch(dsn, LIMITED_TABLES)
        try:
            with _connect(dsn, schema) as conn:
                conn.execute("INSERT INTO job_types SELECT * FROM public.job_types")
                conn.execute(
                    "INSERT INTO queues (name, created_by, concurrency) VALUES "
                    "('capped', 'bench', %s), ('default', 'bench', NULL)",
                    (CAP,),
                )
                _fill_limited(conn, job_type, PASSES * batch)
                waiting = 0
                for backlog in backlogs:
                    _fill_backlog(conn, job_type, backlog - waiting)
                    waiting = backlog
                    conn.execute("ANALYZE jobs")
                    conn.execute("ANALYZE attempts")
                    times = _time_passes(conn, PASSES * batch, batch)
                    violations = conn.execute(
                        "SELECT count(*) AS n FROM invariant_violations"
                    ).fetchone()["n"]
                    results.append(
                        {
                            "type": job_type,
                            "backlog": backlog,
                            "pass_ms": [round(t * 1000, 1) for t in times],
                            "median_ms": round(statistics.median(times) * 1000, 1),
                            "violations": violations,
                        }
                    )
        finally:
            _drop(dsn, schema)
    return results


def audit_row(dsn: str, sizes: tuple[int, ...] = SIZES, batch: int = 5000) -> dict[str, Any]:
    schema = _scratch(dsn, TABLES)
    results = []
    try:
        with _connect(dsn, schema) as conn:
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
        _drop(dsn, schema)
    base = results[0]["median_ms"] if results else None
    for r in results:
        r["vs_smallest"] = round(r["median_ms"] / base, 2) if base else None
    return {"batch": batch, "passes": PASSES, "sizes": results, "limited": limited_row(dsn)}
