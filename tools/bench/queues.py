"""``just bench --rows priorities,isolation`` (on request): scheduling delays behind a flood,
observed from Postgres while the demo's workers run it (issue 22).

* priorities: 20,000 ``sleep`` jobs (0.5 s) of the lowest priority (3) in the ``default``
  queue, enqueued at once; once they run, 100 ``noop`` jobs of the highest priority (0),
  one per transaction, 10 a second; their scheduling delays (start minus due). Measured
  twice, as a flood of the isolation row is (below): while the relay publishes the backlog,
  then with all of it published (the goal's verdict);
* isolation: the same 100 paced ``noop`` jobs in ``default`` with the machine otherwise
  idle (unflooded), then again while the ``emails`` queue holds 20,000 slow jobs (``sleep``,
  5 s) and runs them, and again with 20,000 of 1 s (five times the starts a second). Each
  flood is measured twice: at once, while the relay still publishes it (20,000 messages:
  seconds of both cores for the relay and the brokers, a cost of the burst, not of the
  queue), and again once its messages are all published, the queue holding its backlog and
  running its slots full. The goal's verdict is the second's: it asks whether a queue's
  backlog takes anything from another queue; the first says what a burst of 20,000 inserts
  costs everything else on two cores.

Every paced job has its delay split at its ``jobs.ready`` message's timestamp (read by a tap
outside every consumer group), so a stall says whether the relay or Kafka and the claim held
it: the report gives each measurement's slowest job and every job later than :data:`LATE`.

What is left of a flood when its measurement ends is cancelled in Postgres (its Kafka
messages then find the jobs cancelled), and the next measurement waits until nothing of it
runs and its band's consumer group has committed every message of it (lag 0, read from
outside the group as the relay's lag probe reads it): the workers have settled them all, so
the next measurement does not pay for them.
Each figure is what was observed, beside the goal: a p99 above it is the row's finding (the
report says so), not an assertion.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka.admin import AdminClient
from psycopg.rows import dict_row

import leasework
from devstack.layout import KAFKA_DIRECT_BOOTSTRAP
from leasework.config import Settings
from leasework.kafka import bands_lag
from tools.bench.tap import Published, ReadyTap

FLOOD = 20_000
PACED, PACE = 100, 0.1  # jobs, seconds between two
LOW, HIGH = 3, 0
# the backlog's jobs: long enough that about half of it still waits after both measurements
# (128 slots on the demo's two workers: about 250 starts a second)
LOW_SECONDS = 0.5
PRIORITY_GOAL = 1.0  # seconds, the high-priority jobs' p99 behind the flood
ISOLATION_MARGIN = 0.1  # seconds over the unflooded p99
FLOODED_QUEUE = "emails"
# the flood's job durations: slow jobs (every slot of the queue taken for minutes, few starts
# a second), then shorter ones (about 128 starts a second on the demo's two workers)
SLOW = (5.0, 1.0)
SETTLE_TIMEOUT = 180.0  # seconds for the workers to settle a cancelled flood's messages
LATE = 0.1  # seconds: a paced job later than this has its delay split in the report


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _count(conn: psycopg.Connection, tag: str, condition: str) -> int:
    return conn.execute(
        f"SELECT count(*) AS n FROM jobs WHERE payload->>'bench' = %s AND {condition}", (tag,)
    ).fetchone()["n"]


def _wait(what: str, done: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"queues: {what}: not within {timeout:.0f}s")
        time.sleep(0.1)


def _flood(dsn: str, conn: psycopg.Connection, tag: str, **job: Any) -> None:
    """Enqueue the flood, 1,000 per transaction, and wait until its jobs run."""
    payload = {**job.pop("payload"), "bench": tag}
    with psycopg.connect(dsn) as writer:
        for _ in range(FLOOD // 1000):
            leasework.enqueue_many(
                writer, [{"job_type": "sleep", "payload": payload, **job}] * 1000
            )
            writer.commit()
    _wait("the flood to run", lambda: _count(conn, tag, "status = 'running'") >= 50, 120)


def _published(conn: psycopg.Connection, tag: str) -> bool:
    """Whether the relay has published every message of the flood ``tag``."""
    row = conn.execute(
        "SELECT NOT EXISTS (SELECT 1 FROM outbox o JOIN jobs j ON j.id = o.job_id "
        "WHERE j.payload->>'bench' = %s) AS done",
        (tag,),
    ).fetchone()
    return bool(row["done"])


# the stack's workers run with the default topic and consumer group
WORKERS = Settings("bench", "bench")


def band_lag(admin: AdminClient, queue: str, priority: int) -> int:
    """The messages of ``queue``'s band ``priority`` its consumer group has not committed."""
    lags, unread = bands_lag(admin, WORKERS.topic_ready, WORKERS.consumer_group)
    if (queue, priority) in unread:
        raise RuntimeError(f"queues: the offsets of {queue}'s band {priority} could not be read")
    return sum(b.lag for b in lags if (b.queue, b.priority) == (queue, priority))


def _settle(queue: str, priority: int) -> float:
    """Wait until the workers have committed every message of ``queue``'s band ``priority``;
    the seconds it took."""
    admin = AdminClient({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP})
    began = time.monotonic()
    _wait(
        f"{queue}'s band {priority} to be consumed",
        lambda: band_lag(admin, queue, priority) == 0,
        SETTLE_TIMEOUT,
    )
    return round(time.monotonic() - began, 1)


def _drain(conn: psycopg.Connection, tag: str, queue: str, priority: int) -> int:
    """Cancel what is left of a flood of ``queue``'s band ``priority``; wait until none of it
    runs and its band's messages are all consumed. Returns how many were left waiting."""
    left = 0
    while True:  # a thousand at a time, none a claim holds (one statement would deadlock)
        cancelled = conn.execute(
            "WITH c AS (SELECT id FROM jobs WHERE payload->>'bench' = %s "
            "AND status IN ('queued', 'scheduled') LIMIT 1000 FOR UPDATE SKIP LOCKED) "
            "UPDATE jobs SET status = 'cancelled', finished_at = now(), updated_at = now() "
            "FROM c WHERE jobs.id = c.id",
            (tag,),
        ).rowcount
        left += cancelled
        if not cancelled and not _count(conn, tag, "status IN ('queued', 'scheduled')"):
            break
    _wait("the flood to stop", lambda: _count(conn, tag, "status = 'running'") == 0, 120)
    # its messages are still consumed (each finds its job cancelled and is settled): a
    # measurement begun meanwhile would pay for them
    log(f"{tag}: its messages settled in {_settle(queue, priority)} s")
    return left


def _paced(dsn: str, conn: psycopg.Connection, tag: str, **options: Any) -> dict[str, Any]:
    """Enqueue :data:`PACED` ``noop`` jobs, one per transaction every :data:`PACE` s; their
    scheduling delays once all ran (:func:`_delays`), and where the time of the slowest and
    of each one later than :data:`LATE` went (:func:`late_stages`): split at its
    ``jobs.ready`` message's timestamp, read by a tap outside every consumer group."""
    with ReadyTap() as tap, psycopg.connect(dsn, autocommit=True) as writer:
        start = time.monotonic()
        for i in range(PACED):
            time.sleep(max(0.0, start + i * PACE - time.monotonic()))
            leasework.enqueue(writer, "noop", {"bench": tag}, **options)
        _wait(
            "the paced jobs to run",
            lambda: _count(conn, tag, "status = 'succeeded'") >= PACED,
            60,
        )
        rows = conn.execute(
            "SELECT id::text AS id, extract(epoch FROM run_at)::float8 AS due, "
            "extract(epoch FROM started_at)::float8 AS started FROM jobs "
            "WHERE payload->>'bench' = %s",
            (tag,),
        ).fetchall()
        try:
            seen = tap.read({r["id"] for r in rows}, timeout=10)
        except TimeoutError:  # (split as not seen)
            seen = dict(tap.found)
    return {**_delays([r["started"] - r["due"] for r in rows]), **late_stages(rows, seen)}


def late_stages(rows: list[dict[str, Any]], seen: dict[str, Published]) -> dict[str, Any]:
    """The slowest job's split (:func:`slowest_stages`), and every job's later than
    :data:`LATE`, slowest first (rows: ``id``, ``due`` and ``started`` in epoch seconds;
    ``seen``: the messages the tap read, by job id)."""

    def split(row: dict[str, Any]) -> dict[str, Any]:
        published = seen.get(row["id"])
        return slowest_stages(
            row["due"], None if published is None else published.produced_at, row["started"]
        )

    ordered = sorted(rows, key=lambda r: r["due"] - r["started"])
    return {
        "slowest": split(ordered[0]),
        "late": [split(r) for r in ordered if r["started"] - r["due"] > LATE],
    }


def slowest_stages(due: float, published: float | None, started: float) -> dict[str, Any]:
    """A job's delay split at its message's timestamp (epoch seconds; None: not seen):
    insert to publish (the relay), publish to start (Kafka and the claim; negative when a
    worker claimed it on its Postgres wake-up before the message was published)."""
    to_publish = after_publish = None
    if published is not None:
        to_publish, after_publish = _ms(published - due), _ms(started - published)
    return {
        "delay_ms": _ms(started - due),
        "to_publish_ms": to_publish,
        "after_publish_ms": after_publish,
    }


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def _delays(delays: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(delays, 0.5) * 1000, 1),
        "p99_ms": round(percentile(delays, 0.99) * 1000, 1),
        "max_ms": round(max(delays) * 1000, 1),
    }


def priorities_row(dsn: str, tag: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        flood = f"{tag}-low"
        log(f"priorities: {FLOOD} sleep jobs of priority {LOW} in default")
        _flood(dsn, conn, flood, payload={"seconds": LOW_SECONDS}, priority=LOW)
        log(f"priorities: {PACED} noop jobs of priority {HIGH}, backlog being published")
        publishing = _paced(dsn, conn, f"{tag}-high-publishing", priority=HIGH)
        waiting_published = _count(conn, flood, "status = 'queued'")
        _wait("the backlog's publishing", lambda: _published(conn, flood), 300)
        log(f"priorities: {PACED} noop jobs of priority {HIGH}, {1 / PACE:g} a second")
        delays = _paced(dsn, conn, f"{tag}-high", priority=HIGH)
        waiting = _count(conn, flood, "status = 'queued'")
        ran = _count(conn, flood, "started_at IS NOT NULL")
        _drain(conn, flood, "default", LOW)
    return {
        "name": "priorities",
        "flood": FLOOD,
        "flood_waiting_after": waiting,
        "flood_started": ran,
        "flood_job_seconds": LOW_SECONDS,
        "publishing": {**publishing, "flood_waiting_after": waiting_published},
        "paced": PACED,
        "goal_p99_ms": PRIORITY_GOAL * 1000,
        **delays,
    }


def isolation_row(dsn: str, tag: str) -> dict[str, Any]:
    """The unflooded delays, then the same while ``emails`` holds a flood of slow jobs, for
    each of :data:`SLOW` (the first is the goal's; the second, more starts per second,
    shows what the shared CPU costs)."""
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        log(f"isolation: {PACED} noop jobs in default, unflooded")
        alone = _paced(dsn, conn, f"{tag}-alone")
        floods = []
        for seconds in SLOW:
            flood = f"{tag}-flood-{seconds:g}"
            log(f"isolation: {FLOOD} sleep jobs of {seconds:g} s in {FLOODED_QUEUE}")
            _flood(dsn, conn, flood, payload={"seconds": seconds}, queue=FLOODED_QUEUE)
            log(f"isolation: {PACED} noop jobs in default, {FLOODED_QUEUE} being published")
            publishing = _paced(dsn, conn, f"{tag}-publishing-{seconds:g}")
            _wait("the flood's publishing", lambda f=flood: _published(conn, f), 300)
            log(f"isolation: {PACED} noop jobs in default, {FLOODED_QUEUE} flooded")
            delays = _paced(dsn, conn, f"{tag}-flooded-{seconds:g}")
            waiting = _count(conn, flood, "status = 'queued'")
            _drain(conn, flood, FLOODED_QUEUE, 0)
            floods.append(
                {
                    "job_seconds": seconds,
                    "waiting_after": waiting,
                    "publishing": publishing,
                    **delays,
                }
            )
    return {
        "name": "isolation",
        "flood": FLOOD,
        "paced": PACED,
        "unflooded": alone,
        "floods": floods,
        "goal_p99_ms": round(alone["p99_ms"] + ISOLATION_MARGIN * 1000, 1),
    }
