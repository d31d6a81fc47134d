"""The relay's statements: the outbox, the promoter, the pruner (finished jobs, and the
audit log and alert notifications by age). The reaper's are in :mod:`.worker`, beside the
fenced finish they mirror."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from leasework.delivery_marks import Mark
from leasework.states import TERMINAL, Status, sources_of
from leasework.store.common import ready_outbox_insert, release_held


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


# the (priority, topic) pairs a pass takes rows of, at most: with more waiting, the pairs past
# the first this many (in priority, then topic order) wait until those ahead drain
FAIR_TOPICS = 256

# One pass's rows: the (priority, topic) pairs with rows waiting, found by a walk of
# ``outbox_band_idx`` (one probe per pair: the next pair after the last, as a loose index
# scan), then each pair's oldest rows, an equal share of the batch, locked. ``full``: the
# pair filled its share, so rows may be left.
_FAIR_FETCH = """
WITH RECURSIVE pairs AS (
    (SELECT priority, topic, 1 AS n FROM outbox ORDER BY priority, topic LIMIT 1)
    UNION ALL
    SELECT later.priority, later.topic, p.n + 1
      FROM pairs p, LATERAL (
           SELECT o.priority, o.topic FROM outbox o
            WHERE (o.priority, o.topic) > (p.priority, p.topic)
            ORDER BY o.priority, o.topic LIMIT 1) later
     WHERE p.n < %(topics)s),
share AS (SELECT ceil(%(limit)s::numeric / greatest(count(*), 1))::integer AS rows FROM pairs)
SELECT m.id, m.topic, m.key, m.value, m.headers, m.free,
       count(*) OVER (PARTITION BY m.priority, m.topic) >= share.rows AS full
  FROM pairs p CROSS JOIN share, LATERAL (
       SELECT o.id, o.priority, o.topic, o.key, o.value::text AS value, o.headers,
              coalesce(o.key = o.value->>'job_id', false) AS free
         FROM outbox o WHERE o.priority = p.priority AND o.topic = p.topic
        ORDER BY o.id LIMIT share.rows FOR UPDATE SKIP LOCKED) m
 ORDER BY m.priority, m.id"""


@dataclass(frozen=True, slots=True)
class OutboxBatch:
    """The rows one pass publishes, and whether some topic had more than its share."""

    messages: list[OutboxMessage]
    full: bool


def outbox_fetch(conn: psycopg.Connection, limit: int) -> OutboxBatch:
    """Lock up to about ``limit`` rows (at most one more per topic), each topic's oldest in
    turn: every (priority, topic) pair with rows waiting gets an equal share of the batch, so
    a burst in one queue's topic does not hold another queue's wake-ups behind it (migration
    0023). The rows come highest priority (0) first, oldest first within one, so a wake-up of
    a high band goes out before a low one, and a topic keeps its order. Other relays skip the
    locked rows until this transaction ends, and take the next of each topic. Every row is
    still to be published: acknowledged rows are deleted."""
    rows = conn.execute(_FAIR_FETCH, {"limit": limit, "topics": FAIR_TOPICS}).fetchall()
    full = False
    messages = []
    for row in rows:
        full = row.pop("full") or full
        messages.append(OutboxMessage(**row))
    return OutboxBatch(messages, full)


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
                RETURNING id, type, attempt, ordering_key, queue, priority),
            wake AS ({ready_outbox_insert("promoted")} RETURNING 1)
            SELECT count(*) AS n FROM wake""",
        {"sources": sources, "limit": limit, "topic": topic},
    ).fetchone()
    return int(row["n"])


# The jobs held by each full concurrency limit (migration 0014), released oldest first as
# its slots free up: as many as the limit has room for, less the released jobs not yet
# claimed. A limit that no longer exists (its policy or the queue's cap removed) releases
# all of its jobs; a paused queue's are left for its resume.
_RELEASE_ROOM = release_held(
    "room",
    "held_for",
    "least(coalesce(room.free, %(limit)s), %(limit)s)",
    where="coalesce(room.free, 1) > 0",
)
RELEASE_LIMITED = f"""
WITH waiting AS (
    SELECT held_for, count(*) FILTER (WHERE status = 'queued') AS released
      FROM jobs WHERE held_for IS NOT NULL AND status IN ('scheduled', 'queued')
     GROUP BY held_for),
room AS (
    SELECT w.held_for,
           CASE WHEN w.held_for LIKE '@%%' THEN
                    q.concurrency - (SELECT count(*) FROM jobs r
                                      WHERE r.status = 'running' AND r.queue = q.name)
                ELSE (t.concurrency->>'limit')::integer
                     - (SELECT count(*) FROM jobs r
                         WHERE r.status = 'running' AND r.limit_key = w.held_for)
           END - w.released AS free
      FROM waiting w
      LEFT JOIN queues q ON w.held_for = '@' || q.name
      LEFT JOIN job_types t ON w.held_for NOT LIKE '@%%'
                           AND t.name = split_part(w.held_for, '/', 1)),
{_RELEASE_ROOM},
wake AS ({ready_outbox_insert("released")} RETURNING 1)
SELECT count(*) AS n FROM wake"""


def jobs_release_limited(conn: psycopg.Connection, limit: int, topic: str) -> int:
    """Queue again, with their outbox rows, up to ``limit`` per limit of the jobs a full
    concurrency limit held, as many as it has room for now. Returns how many."""
    row = conn.execute(RELEASE_LIMITED, {"limit": limit, "topic": topic}).fetchone()
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
    "schedule_deletions": "deleted_at",
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


# Lost records (migration 0024, leasework.relay.recovery): jobs waiting as queued with no
# outbox row for longer than ``after`` seconds and not watched yet, oldest first, since
# ``since`` (None: all of them), through jobs_queued_idx; one mark per topic for them, and a
# watch row of each under its topic's mark.
_WATCH = """
WITH found AS (
    SELECT j.id, j.updated_at, leasework_ready_topic(%(topic)s, j.queue, j.priority) AS topic
      FROM jobs j
     WHERE j.status = 'queued' AND j.updated_at < now() - make_interval(secs => %(after)s)
       AND (%(since)s::timestamptz IS NULL OR j.updated_at >= %(since)s::timestamptz)
       AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = j.id)
       AND NOT EXISTS (SELECT 1 FROM delivery_watch w WHERE w.job_id = j.id)
     ORDER BY j.updated_at LIMIT %(limit)s),
marks AS (
    INSERT INTO delivery_marks (topic) SELECT DISTINCT topic FROM found RETURNING id, topic),
watched AS (
    INSERT INTO delivery_watch (job_id, mark_id, seen_updated_at)
    SELECT f.id, m.id, f.updated_at FROM found f JOIN marks m USING (topic)
    ON CONFLICT (job_id) DO NOTHING RETURNING 1)
SELECT (SELECT count(*) FROM found) AS found, (SELECT count(*) FROM watched) AS watched,
       (SELECT max(updated_at) FROM found) AS last,
       (SELECT coalesce(array_agg(id), '{}') FROM marks) AS marks,
       now() - make_interval(secs => %(after)s) AS upto"""


@dataclass(frozen=True, slots=True)
class Watched:
    """One watch statement: jobs found and watched now, the newest one's ``updated_at``, the
    instant up to which every waiting job was looked at (when not ``full``), and the marks
    it made (committed once the statement's transaction is)."""

    found: int
    watched: int
    last: datetime | None
    upto: datetime
    marks: tuple[int, ...] = ()

    def full(self, limit: int) -> bool:
        return self.found >= limit


def delivery_watch(
    conn: psycopg.Connection, *, after: float, since: datetime | None, limit: int, topic: str
) -> Watched:
    """Watch up to ``limit`` jobs that have waited published (queued, no outbox row) for more
    than ``after`` seconds, each under a new mark of its band's topic (``topic``: the ready
    topic's base name); only those that became queued at or after ``since``, when given."""
    # each candidate's two NOT EXISTS are index probes whatever the statistics say (a backlog
    # that built up since jobs was analyzed is estimated at a row or two; see the auditor's
    # stuck check, leasework.store.audit); LOCAL: it ends with the pass's transaction
    conn.execute("SET LOCAL enable_seqscan = off")
    params = {"after": after, "since": since, "limit": limit, "topic": topic}
    row = conn.execute(_WATCH, params).fetchone()
    return Watched(
        int(row["found"]), int(row["watched"]), row["last"], row["upto"], tuple(row["marks"])
    )


def delivery_marks(conn: psycopg.Connection) -> list[Mark]:
    """Every mark that still watches, oldest first (a mark left with no watch is deleted)."""
    conn.execute(
        """DELETE FROM delivery_marks m
            WHERE NOT EXISTS (SELECT 1 FROM delivery_watch w WHERE w.mark_id = m.id)
              AND m.created_at < now() - interval '1 minute'"""
    )
    rows = conn.execute(
        """SELECT id, topic, topic_id, high,
                  extract(epoch FROM now() - created_at)::float8 AS age
             FROM delivery_marks ORDER BY id"""
    ).fetchall()
    return [
        Mark(
            r["id"],
            r["topic"],
            r["age"],
            r["topic_id"],
            None if r["high"] is None else {int(p): int(h) for p, h in r["high"].items()},
        )
        for r in rows
    ]


def delivery_marks_fill(
    conn: psycopg.Connection, ids: list[int], topic_id: str | None, high: dict[str, int]
) -> int:
    """Fill the marks ``ids`` not filled yet with their topic's id and high watermarks."""
    cur = conn.execute(
        """UPDATE delivery_marks SET topic_id = %s, high = %s, filled_at = now()
            WHERE id = ANY(%s) AND high IS NULL""",
        (topic_id, Jsonb(high), ids),
    )
    return cur.rowcount


def jobs_republish_lost(conn: psycopg.Connection, mark: int, limit: int, topic: str) -> int:
    """Publish again, with a new outbox row each, up to ``limit`` jobs watched under ``mark``
    that still wait unchanged with no outbox row (their records are lost), and end their
    watch; rows another transaction holds are skipped. Each is queued anew (``updated_at``),
    so the watch finds it again should its new record be lost too. Returns how many."""
    row = conn.execute(
        f"""WITH lost AS (
                SELECT w.job_id FROM delivery_watch w JOIN jobs j ON j.id = w.job_id
                 WHERE w.mark_id = %(mark)s AND j.status = 'queued'
                   AND j.updated_at = w.seen_updated_at
                   AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = j.id)
                 LIMIT %(limit)s FOR UPDATE OF w, j SKIP LOCKED),
            ended AS (DELETE FROM delivery_watch d USING lost
                       WHERE d.job_id = lost.job_id RETURNING d.job_id),
            again AS (UPDATE jobs SET updated_at = now() FROM ended
                       WHERE jobs.id = ended.job_id
                       RETURNING jobs.id, jobs.type, jobs.attempt, jobs.ordering_key,
                                 jobs.queue, jobs.priority),
            wake AS ({ready_outbox_insert("again")} RETURNING 1)
            SELECT count(*) AS n FROM wake""",
        {"mark": mark, "limit": limit, "topic": topic},
    ).fetchone()
    return int(row["n"])


def delivery_mark_retire(conn: psycopg.Connection, mark: int) -> int:
    """Delete ``mark`` with what it still watches (jobs that moved on since). Returns how
    many watches ended with it."""
    row = conn.execute(
        """WITH gone AS (DELETE FROM delivery_watch WHERE mark_id = %(mark)s RETURNING 1),
                mark AS (DELETE FROM delivery_marks WHERE id = %(mark)s)
           SELECT count(*) AS n FROM gone""",
        {"mark": mark},
    ).fetchone()
    return int(row["n"])


def delivery_watched(conn: psycopg.Connection) -> int:
    """Jobs watched now."""
    return int(conn.execute("SELECT count(*) AS n FROM delivery_watch").fetchone()["n"])
