"""``just bench --rows limits`` (on request): concurrency and rate limits under a backlog,
observed from Postgres while the demo's workers run them (issue 22).

* per key: 400 of the demo's ``keyed`` jobs (0.2 s each, at most 2 running at once per key)
  over 8 keys, enqueued at once; the running jobs per key sampled every 50 ms;
* per queue: 150 ``sleep`` jobs (0.2 s) in the ``emails`` queue capped at 3 for the row (the
  cap lifted after); the queue's running jobs sampled every 50 ms;
* rate: 330 of the demo's ``rated`` jobs (5/s per key) for one key, enqueued at once; from
  the effect each writes (when its handler began), the starts over the busiest minute and
  the most in any one second.

Each figure is what was observed, beside the limit: a maximum above its limit, or a rate
more than 10% off, is the row's finding (the report says so), not an assertion.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

import leasework
from chaos.limits import most_in_window
from leasework.queues.operations import Actor, set_concurrency

KEY_LIMIT, KEYS, KEYED_JOBS = 2, 8, 400
QUEUE, QUEUE_CAP, QUEUE_JOBS = "emails", 3, 150
RATE, RATED_JOBS = 5.0, 330
SAMPLE = 0.05


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def _enqueue(dsn: str, jobs: list[dict[str, Any]]) -> None:
    with psycopg.connect(dsn) as conn:
        for start in range(0, len(jobs), 100):
            leasework.enqueue_many(conn, jobs[start : start + 100])
        conn.commit()


def _sample_until_done(
    conn: psycopg.Connection, tag: str, jobs: int, sample: Callable[[], list[int]], timeout: float
) -> tuple[int, float]:
    """(the largest sampled count, seconds until every job of ``tag`` succeeded)."""
    start, most = time.monotonic(), 0
    while time.monotonic() - start < timeout:
        most = max([most, *sample()])
        done = conn.execute(
            "SELECT count(*) AS n FROM jobs WHERE payload->>'bench' = %s AND status = 'succeeded'",
            (tag,),
        ).fetchone()["n"]
        if done >= jobs:
            return most, time.monotonic() - start
        time.sleep(SAMPLE)
    raise RuntimeError(f"limits: {tag}: not every job succeeded within {timeout:.0f}s")


def _per_key(conn: psycopg.Connection, tag: str) -> list[int]:
    rows = conn.execute(
        "SELECT count(*) AS n FROM jobs WHERE type = 'keyed' AND status = 'running' "
        "AND payload->>'bench' = %s GROUP BY payload->>'key'",
        (tag,),
    ).fetchall()
    return [r["n"] for r in rows]


def _in_queue(conn: psycopg.Connection) -> list[int]:
    row = conn.execute(
        "SELECT count(*) AS n FROM jobs WHERE queue = %s AND status = 'running'", (QUEUE,)
    ).fetchone()
    return [row["n"]]


def limits_row(dsn: str, tag: str, timeout: float) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        ktag = f"{tag}-keyed"
        log(f"limits: {KEYED_JOBS} keyed jobs over {KEYS} keys, at most {KEY_LIMIT} per key")
        _enqueue(
            dsn,
            [
                {
                    "job_type": "keyed",
                    "payload": {"key": f"{ktag}-{i % KEYS}", "seconds": 0.2, "bench": ktag},
                }
                for i in range(KEYED_JOBS)
            ],
        )
        key_max, key_s = _sample_until_done(
            conn, ktag, KEYED_JOBS, lambda: _per_key(conn, ktag), timeout
        )
        qtag = f"{tag}-queue"
        actor = Actor("bench", "bench")
        with conn.transaction():
            set_concurrency(conn, QUEUE, QUEUE_CAP, actor)
        try:
            log(f"limits: {QUEUE_JOBS} sleep jobs in {QUEUE}, capped at {QUEUE_CAP}")
            _enqueue(
                dsn,
                [
                    {
                        "job_type": "sleep",
                        "payload": {"seconds": 0.2, "bench": qtag},
                        "queue": QUEUE,
                    }
                    for _ in range(QUEUE_JOBS)
                ],
            )
            queue_max, queue_s = _sample_until_done(
                conn, qtag, QUEUE_JOBS, lambda: _in_queue(conn), timeout
            )
        finally:
            with conn.transaction():
                set_concurrency(conn, QUEUE, None, actor)
        rtag = f"{tag}-rated"
        log(f"limits: {RATED_JOBS} rated jobs for one key at {RATE:g}/s")
        _enqueue(
            dsn,
            [
                {"job_type": "rated", "payload": {"key": rtag, "bench": rtag}}
                for _ in range(RATED_JOBS)
            ],
        )
        _, rated_s = _sample_until_done(
            conn, rtag, RATED_JOBS, lambda: [], max(timeout, RATED_JOBS / RATE * 2)
        )
        began = [
            float(r["began"])
            for r in conn.execute(
                "SELECT (e.data->>'began')::float8 AS began FROM effects e "
                "JOIN jobs j ON j.id = e.job_id WHERE e.kind = 'rated' "
                "AND j.payload->>'bench' = %s",
                (rtag,),
            ).fetchall()
        ]
    minute = most_in_window(began, 60.0) / 60.0
    return {
        "name": "limits",
        "key_limit": KEY_LIMIT,
        "key_max_running": key_max,
        "key_jobs": KEYED_JOBS,
        "key_seconds": round(key_s, 1),
        "queue_cap": QUEUE_CAP,
        "queue_max_running": queue_max,
        "queue_jobs": QUEUE_JOBS,
        "queue_seconds": round(queue_s, 1),
        "rate": RATE,
        "rate_busiest_minute": round(minute, 3),
        "rate_off_by": round(minute / RATE - 1, 4),
        "rate_most_in_a_second": most_in_window(began, 1.0),
        "rated_jobs": len(began),
        "rated_seconds": round(rated_s, 1),
    }
