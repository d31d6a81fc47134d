"""What every part of the store shares: the job columns, and the wake-up and dead-letter
messages in SQL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from leasework.job import COLUMNS

Row = dict[str, Any]

JOB_COLUMNS = COLUMNS  # every column of jobs that leasework.job.Job holds, in its order

# Said first in the transactions of the worker's hot statements (the stamp, the finish), each
# executed prepared: the statement is planned once per connection, not at every execution.
# Unprepared, the stamp alone took about 2 ms to plan (7 ms on a new backend), and the
# plancache's default (``auto``) plans each prepared statement anew at its first five
# executions on every connection: a lone job, whose calls rotate over the pool's
# connections, paid for planning on most of its statements (measured: NOTIFY heard to
# started 20.6 and 21.0 ms, 8.2 and 9.7 ms with generic plans). Safe for these statements:
# each reads its rows by primary key from arrays and has one sensible plan whatever the
# values. ``LOCAL``: it ends with the transaction, so a user's fenced effects, run before it,
# keep the default.
GENERIC_PLANS = "SET LOCAL plan_cache_mode = force_generic_plan"


@contextmanager
def one_round_trip(conn: psycopg.Connection, *, commit: bool = True) -> Iterator[None]:
    """The block's statements sent together (a pipeline); read their results after it.

    On an autocommit connection (:meth:`leasework.db.Database.transact`) the block is a
    transaction of its own, ``BEGIN`` and ``COMMIT`` sent in the same pipeline: the whole
    transaction costs one round trip. With ``commit=False`` the transaction stays open for
    the caller to commit (:meth:`leasework.db.Database.run_begun`: ``BEGIN`` rides with the
    first statements). psycopg's own transactions cost more: outside a pipeline a round trip
    for ``BEGIN``, each statement and ``COMMIT``; inside one it still syncs after ``BEGIN``,
    and a fetch inside the block asks for another round trip. A statement that fails aborts
    the rest (``COMMIT`` included); the block raises its error. On a connection in a
    transaction already (a caller's), the statements join it."""
    with conn.pipeline():
        if not conn.autocommit:
            yield
            return
        conn.execute("BEGIN")
        yield
        if commit:
            conn.execute("COMMIT")


# the wake-up message of a queued job; leasework_jobs_insert builds the same in SQL
READY_VALUE_SQL = (
    "jsonb_build_object('job_id', {t}.id::text, 'type', {t}.type, 'attempt', {t}.attempt + 1)"
)
READY_HEADERS_SQL = "jsonb_build_object('job_id', {t}.id::text, 'type', {t}.type)"
READY_KEY_SQL = "coalesce({t}.ordering_key, {t}.id::text)"


def ready_outbox_insert(source: str, topic_param: str = "%(topic)s") -> str:
    """``INSERT INTO outbox`` of the ready messages of the jobs in CTE ``source`` (which
    returns their id, type, attempt, ordering_key, queue and priority), each on its band's topic
    (``topic_param`` is the ready topic's base name: ``leasework_ready_topic``, migrations
    0011 and 0016) and with its priority, which the relay publishes by (migration 0017)."""
    t = source
    return (
        f"INSERT INTO outbox (job_id, topic, key, value, headers, priority) "
        f"SELECT {t}.id, leasework_ready_topic({topic_param}, {t}.queue, {t}.priority), "
        f"{READY_KEY_SQL.format(t=t)}, "
        f"{READY_VALUE_SQL.format(t=t)}, {READY_HEADERS_SQL.format(t=t)}, {t}.priority "
        f"FROM {t}"
    )


def release_held(slots: str, slot: str, count: str, where: str = "true") -> str:
    """The CTEs ``picked`` and ``released``: for each row of CTE ``slots`` (a concurrency
    limit's ``slot``, a ``held_for`` of migration 0014, with room for ``count`` jobs, where
    ``where``), the oldest jobs that limit holds, outside paused queues, are locked (skipping
    rows another transaction holds) and queued again. ``released`` returns what
    :func:`ready_outbox_insert` needs to wake them. The relay's release pass and the fenced
    finish (whose finishes free the slots) both release so."""
    return f"""picked AS (
    SELECT x.id FROM {slots} CROSS JOIN LATERAL (
        SELECT h.id FROM jobs h
         WHERE h.held_for = {slots}.{slot} AND h.status = 'scheduled'
           AND NOT EXISTS (SELECT 1 FROM queues p
                           WHERE p.name = h.queue AND p.paused_at IS NOT NULL)
         ORDER BY h.created_at LIMIT {count} FOR UPDATE OF h SKIP LOCKED) x
     WHERE {where}),
released AS (
    UPDATE jobs SET status = 'queued', run_at = now(), updated_at = now()
      FROM picked WHERE jobs.id = picked.id AND jobs.status = 'scheduled'
    RETURNING jobs.id, jobs.type, jobs.attempt, jobs.ordering_key, jobs.queue,
              jobs.priority)"""


# the dead-letter message of a job that died: built in SQL from its row, so the payload never
# round-trips through Python (what the store holds is what jobs.dlq gets)
DEAD_LETTER_VALUE_SQL = (
    "jsonb_build_object('job_id', {t}.id::text, 'type', {t}.type, 'payload', {t}.payload)"
)
DEAD_LETTER_HEADERS_SQL = (
    "jsonb_build_object('job_id', {t}.id::text, 'type', {t}.type, "
    "'attempts', {t}.attempt::text, 'last_error', left(coalesce({t}.last_error, ''), 1000))"
)


def dead_letter_outbox_insert(source: str, topic_param: str = "%(dlq)s") -> str:
    """``INSERT INTO outbox`` of the dead-letter messages of the jobs in CTE ``source`` whose
    ``status`` is ``dead`` (``source`` returns their id, type, payload, attempt, last_error
    and status, as written: the fenced finish's and the reaper's ``RETURNING``)."""
    t = source
    return (
        f"INSERT INTO outbox (job_id, topic, key, value, headers) "
        f"SELECT {t}.id, {topic_param}, {t}.id::text, "
        f"{DEAD_LETTER_VALUE_SQL.format(t=t)}, {DEAD_LETTER_HEADERS_SQL.format(t=t)} "
        f"FROM {t} WHERE {t}.status = 'dead'"
    )
