"""The relay's statements: the outbox, the promoter, the pruner (finished jobs, and the
audit log and alert notifications by age). The reaper's are in :mod:`.worker`, beside the
fenced finish they mirror."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from leasework.states import TERMINAL, Status, sources_of
from leasework.store.common import ready_outbox_insert


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """One row of the outbox: a Kafka message waiting to be published. ``value`` is the JSON
    text Postgres holds, published as is (never re-encoded)."""

    id: int
    topic: str
    key: str
    value: str
    headers: dict[str, Any]
    # whether its key is its job's own id (no ordering key): the relay may put it on any
    # partition (leasework.relay.placement)
    free: bool = False


def outbox_fetch(conn: psycopg.Connection, limit: int) -> list[OutboxMessage]:
    """Lock a batch of rows, oldest first; other relays skip them until this transaction
    ends. Every row is still to be published: acknowledged rows are deleted."""
    rows = conn.execute(
        """SELECT id, topic, key, value::text AS value, headers,
                  coalesce(key = value->>'job_id', false) AS free
           FROM outbox ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED""",
        (limit,),
    ).fetchall()
    return [OutboxMessage(**r) for r in rows]


def outbox_retire(conn: psycopg.Connection, ids: list[int]) -> None:
    """Rows Kafka acknowledged leave the outbox (one statement per batch): the outbox holds
    only what is still to be published, so its size is the backlog."""
    if ids:
        conn.execute("DELETE FROM outbox WHERE id = ANY(%s)", (ids,))


def outbox_pending(conn: psycopg.Connection) -> tuple[int, float]:
    """(rows waiting for Kafka, age in seconds of the oldest of them)."""
    row = conn.execute(
        """SELECT count(*) AS n,
                  coalesce(extract(epoch FROM now() - min(created_at)), 0) AS age
           FROM outbox"""
    ).fetchone()
    return int(row["n"]), float(row["age"])


def jobs_promote_due(conn: psycopg.Connection, limit: int, topic: str) -> int:
    """Due ``scheduled`` and ``failed`` jobs become ``queued`` with their outbox rows."""
    sources = [str(s) for s in sources_of(Status.QUEUED)]
    row = conn.execute(
        f"""WITH promoted AS (
                UPDATE jobs SET status = 'queued', updated_at = now()
                WHERE id IN (SELECT id FROM jobs WHERE status = ANY(%(sources)s)
                             AND run_at <= now()
                             ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
                RETURNING id, type, attempt, ordering_key, queue),
            wake AS ({ready_outbox_insert("promoted")} RETURNING 1)
            SELECT count(*) AS n FROM wake""",
        {"sources": sources, "limit": limit, "topic": topic},
    ).fetchone()
    return int(row["n"])


def jobs_prune(conn: psycopg.Connection, status: Status, older_than: float, limit: int) -> int:
    """Delete up to ``limit`` jobs that finished ``status`` more than ``older_than`` seconds
    ago, with their outbox rows, attempts and effects (ON DELETE CASCADE). Rows another
    pruner holds are skipped."""
    if status not in TERMINAL:
        raise ValueError(f"only finished jobs are pruned, not {status}")
    # declared, for the jobs_vanished trigger (migration 0009): these deletes are the pruner's
    conn.execute("SELECT set_config('leasework.deleting', 'pruner', true)")
    row = conn.execute(
        """WITH gone AS (
               DELETE FROM jobs WHERE id IN (
                   SELECT id FROM jobs WHERE status = %s
                     AND finished_at < now() - make_interval(secs => %s)
                   ORDER BY finished_at LIMIT %s FOR UPDATE SKIP LOCKED)
               RETURNING 1)
           SELECT count(*) AS n FROM gone""",
        (str(status), older_than, limit),
    ).fetchone()
    return int(row["n"])


# the tables the pruner empties by age alone, each with its time column; an index on that
# column (0003) serves the oldest-first batch
AGED_TABLES = {
    "audit_log": "at",
    "alert_notifications": "received_at",
    "schedule_ticks": "recorded_at",
    "invariant_violations": "found_at",
}


def rows_prune(conn: psycopg.Connection, table: str, older_than: float, limit: int) -> int:
    """Delete up to ``limit`` rows of ``table`` (one of :data:`AGED_TABLES`) whose time is more
    than ``older_than`` seconds ago, oldest first. Rows another pruner holds are skipped."""
    column = AGED_TABLES[table]  # the table and column are ours, never user text
    row = conn.execute(
        f"""WITH gone AS (
               DELETE FROM {table} WHERE id IN (
                   SELECT id FROM {table}
                   WHERE {column} < now() - make_interval(secs => %s)
                   ORDER BY {column} LIMIT %s FOR UPDATE SKIP LOCKED)
               RETURNING 1)
           SELECT count(*) AS n FROM gone""",
        (older_than, limit),
    ).fetchone()
    return int(row["n"])
