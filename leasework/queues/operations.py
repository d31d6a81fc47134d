"""Creating queues and reading their state: the I/O around :mod:`leasework.queues`.

A queue is usable once it has its row in ``queues`` (migration 0011), and it gets that row
only after its Kafka topic exists, so a job inserted into a queue always has a topic to be
published on. The topic copies the ready topic's shape (partitions, replication,
``min.insync.replicas``): a queue is as durable as the default one. Creating is idempotent;
``leasework queues create``, a worker starting with a queue that does not exist yet, and a
test all call :func:`ensure_queues`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from psycopg.rows import dict_row, tuple_row

from leasework.kafka import Properties, client_config
from leasework.operations import Actor
from leasework.queues import HELD_UNTIL, PAUSE_LOCK, name_error
from leasework.queues.priorities import LEVELS, band_topics
from leasework.states import TERMINAL, Status
from leasework.store import operators


class QueueError(Exception):
    """A queue could not be created (its name, or Kafka refused the topic)."""


def _shape(admin: AdminClient, base: str, timeout: float) -> tuple[int, int, dict[str, str]]:
    """The ready topic's partitions, replication factor and min.insync.replicas."""
    meta = admin.list_topics(base, timeout=timeout).topics.get(base)
    if meta is None or meta.error is not None or not meta.partitions:
        raise QueueError(f"the ready topic {base!r} is not readable: create it first")
    partitions = len(meta.partitions)
    replicas = len(next(iter(meta.partitions.values())).replicas)
    resource = ConfigResource(ConfigResource.Type.TOPIC, base)
    described = admin.describe_configs([resource])[resource].result(timeout)
    config = {}
    if (entry := described.get("min.insync.replicas")) is not None:
        config["min.insync.replicas"] = str(entry.value)
    return partitions, replicas, config


def create_topics(
    brokers: Sequence[str],
    client_id: str,
    base: str,
    names: Sequence[str],
    extra: Properties = (),
    timeout: float = 15.0,
) -> list[str]:
    """Create the topics of ``names``, a topic per priority band (``default``'s first band is
    ``base`` itself), shaped like ``base``; returns the topics made now (one that exists
    already is fine). Blocking."""
    wanted = [t for n in names for t in band_topics(base, n) if t != base]
    if not wanted:
        return []
    admin = AdminClient(client_config(brokers, client_id, extra))
    partitions, replicas, config = _shape(admin, base, timeout)
    futures = admin.create_topics(
        [
            NewTopic(t, num_partitions=partitions, replication_factor=replicas, config=config)
            for t in wanted
        ],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    made = []
    for topic, future in futures.items():
        try:
            future.result()
            made.append(topic)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            raise QueueError(f"Kafka refused the topic {topic!r}: {exc}") from None
    return made


def queues_insert(conn: psycopg.Connection, names: Sequence[str], created_by: str) -> None:
    conn.execute(
        "INSERT INTO queues (name, created_by) SELECT unnest(%s::text[]), %s "
        "ON CONFLICT (name) DO NOTHING",
        (list(names), created_by),
    )


def ensure_queues(
    conn: psycopg.Connection,
    brokers: Sequence[str],
    client_id: str,
    base: str,
    names: Sequence[str],
    *,
    created_by: str,
    extra: Properties = (),
    topics: bool = False,
) -> list[str]:
    """Make every queue of ``names`` usable: its topics, then its row (``topics``: the topics
    of every queue of ``names``, not only of those with no row: a queue made before its
    priority bands were). Blocking (call from a thread). Returns the names that had no row
    before."""
    for name in names:
        if (problem := name_error(name)) is not None:
            raise QueueError(f"queue {name!r}: {problem}")
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("SELECT name FROM queues WHERE name = ANY(%s)", (list(names),))
        known = {r[0] for r in cur.fetchall()}
    missing = [n for n in names if n not in known]
    if topics or missing:
        create_topics(brokers, client_id, base, names if topics else missing, extra)
        queues_insert(conn, missing, created_by)
    return missing


@dataclass(frozen=True)
class QueueState:
    """A queue as the list shows it: jobs waiting (queued, and scheduled or retrying and due),
    running, the oldest waiting job's age, and jobs finished in the last five minutes."""

    name: str
    waiting: int
    running: int
    oldest_waiting_seconds: float | None
    finished_5m: int
    created_at: datetime
    # paused (leasework.queues.operations.set_paused): since when, by whom, and the jobs a claim
    # found in it, held until the resume
    paused_at: datetime | None = None
    paused_by: str | None = None
    held: int = 0
    # a cap on its jobs running at once across all workers (None: none), and the jobs a claim
    # found over a concurrency limit (the queue's or their type's), held until a slot frees
    concurrency: int | None = None
    limited: int = 0
    # the waiting jobs of each priority, from 0 (the highest) to 3 (leasework.queues.priorities)
    waiting_by_priority: tuple[int, ...] = tuple(0 for _ in LEVELS)

    @property
    def throughput(self) -> float:
        """Jobs finished per second over the last five minutes."""
        return self.finished_5m / 300.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "waiting": self.waiting,
            "waiting_by_priority": list(self.waiting_by_priority),
            "running": self.running,
            "oldest_waiting_seconds": self.oldest_waiting_seconds,
            "finished_per_second": round(self.throughput, 3),
            "created_at": self.created_at.isoformat(),
            "paused": self.paused_at is not None,
            "paused_at": None if self.paused_at is None else self.paused_at.isoformat(),
            "paused_by": self.paused_by,
            "held": self.held,
            "concurrency": self.concurrency,
            "limited": self.limited,
        }


# a job waits: queued, or scheduled or retrying and due
WAITING = "(status = 'queued' OR (status IN ('scheduled', 'failed') AND run_at <= now()))"


def queues_list(conn: psycopg.Connection, name: str | None = None) -> list[QueueState]:
    """Every queue (or the one called ``name``) with its depth (and by priority), running jobs,
    oldest waiting job, recent throughput and pause (through the status indexes: the
    unfinished jobs and the last five minutes' finishes)."""
    by_priority = ", ".join(f"count(*) FILTER (WHERE {WAITING} AND priority = {p})" for p in LEVELS)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            f"""WITH live AS (
               SELECT queue,
                      count(*) FILTER (WHERE {WAITING}) AS waiting,
                      ARRAY[{by_priority}] AS by_priority,
                      count(*) FILTER (WHERE status = 'running') AS running,
                      count(*) FILTER (WHERE status = 'scheduled' AND held_for IS NULL
                                       AND run_at = %(held_until)s) AS held,
                      count(*) FILTER (WHERE status = 'scheduled'
                                       AND held_for IS NOT NULL) AS limited,
                      extract(epoch FROM now() - min(run_at) FILTER (
                          WHERE {WAITING}))::float8 AS oldest
               FROM jobs WHERE status = ANY(%(unfinished)s::text[])
               GROUP BY queue),
           done AS (
               SELECT queue, count(*) AS n FROM jobs
               WHERE finished_at > now() - interval '5 minutes'
                 AND status = ANY(%(terminal)s::text[])
               GROUP BY queue)
           SELECT q.name, q.created_at, q.paused_at, q.paused_by, q.concurrency,
                  coalesce(l.limited, 0) AS limited,
                  coalesce(l.waiting, 0) AS waiting, coalesce(l.running, 0) AS running,
                  coalesce(l.held, 0) AS held, l.oldest, coalesce(d.n, 0) AS finished,
                  l.by_priority
           FROM queues q LEFT JOIN live l ON l.queue = q.name
           LEFT JOIN done d ON d.queue = q.name
           WHERE %(name)s::text IS NULL OR q.name = %(name)s
           ORDER BY q.name""",
            {
                "unfinished": [str(s) for s in sorted(set(Status) - TERMINAL)],
                "terminal": [str(s) for s in sorted(TERMINAL)],
                "name": name,
                "held_until": HELD_UNTIL,
            },
        ).fetchall()
    return [
        QueueState(
            r["name"],
            int(r["waiting"]),
            int(r["running"]),
            r["oldest"],
            int(r["finished"]),
            r["created_at"],
            r["paused_at"],
            r["paused_by"],
            int(r["held"]),
            r["concurrency"],
            int(r["limited"]),
            tuple(r["by_priority"] or (0 for _ in LEVELS)),
        )
        for r in rows
    ]


@dataclass(frozen=True)
class QueueToggled:
    """What a pause or resume found (None: no such queue) and whether it changed it."""

    queue: QueueState | None
    changed: bool
    released: int = 0  # jobs a resume made due again (held while it was paused)


def set_paused(conn: psycopg.Connection, name: str, paused: bool, actor: Actor) -> QueueToggled:
    """Pause or resume queue ``name`` (in the caller's transaction, audited).

    A pause holds :data:`PAUSE_LOCK` exclusively until it commits: every claim's stamp
    holds it shared and reads the pause in a statement begun once it holds it, so no job of
    the queue starts once the pause has committed. Workers stop fetching the queue's topic
    within half a second; a job a claim found there meanwhile is held (``scheduled``, due
    at :data:`leasework.queues.HELD_UNTIL`). A resume makes the held jobs due now; the
    promoter queues them again."""
    with conn.cursor(row_factory=tuple_row) as cur:
        if paused:
            cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", PAUSE_LOCK)
        row = cur.execute(
            "SELECT paused_at IS NOT NULL FROM queues WHERE name = %s FOR UPDATE", (name,)
        ).fetchone()
        if row is None:
            return QueueToggled(None, False)
        released = 0
        if row[0] != paused:
            # paused_at: once the lock is held, so every job that started before the pause
            # started before it (a claim's started_at is its transaction's start)
            (at,) = cur.execute(
                "UPDATE queues SET paused_at = CASE WHEN %(p)s THEN clock_timestamp() END, "
                "paused_by = CASE WHEN %(p)s THEN %(by)s END, "
                "resumed_at = CASE WHEN %(p)s THEN resumed_at ELSE now() END "
                "WHERE name = %(name)s RETURNING coalesce(paused_at, resumed_at)",
                {"p": paused, "by": actor.name, "name": name},
            ).fetchone()
            if not paused:
                released = cur.execute(
                    "UPDATE jobs SET run_at = now(), updated_at = now() "
                    "WHERE queue = %s AND status = 'scheduled' AND run_at = %s "
                    "AND held_for IS NULL",
                    (name, HELD_UNTIL),
                ).rowcount
            detail = (
                {"via": actor.via, "paused_at": at.isoformat()}
                if paused
                else {"via": actor.via, "resumed_at": at.isoformat(), "released": released}
            )
            operators.audit_add(
                conn,
                actor.name,
                "queue-pause" if paused else "queue-resume",
                f"queue:{name}",
                detail,
            )
    return QueueToggled(queues_list(conn, name)[0], row[0] != paused, released)


def paused_queues(conn: psycopg.Connection) -> set[str]:
    """The names of the paused queues (every worker reads it every half second)."""
    with conn.cursor(row_factory=tuple_row) as cur:
        return {r[0] for r in cur.execute("SELECT name FROM queues WHERE paused_at IS NOT NULL")}


def set_concurrency(
    conn: psycopg.Connection, name: str, limit: int | None, actor: Actor
) -> QueueToggled:
    """Cap how many of queue ``name``'s jobs run at once across all workers (None: no cap),
    in the caller's transaction, audited. Claims count against it from their next stamp; a
    lower cap stops no running job (they finish), a higher one or none lets the relay
    release held jobs at its next pass."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise QueueError(f"a queue's concurrency is a whole number of at least 1, got {limit!r}")
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(
            "SELECT concurrency FROM queues WHERE name = %s FOR UPDATE", (name,)
        ).fetchone()
        if row is None:
            return QueueToggled(None, False)
        if row[0] != limit:
            cur.execute("UPDATE queues SET concurrency = %s WHERE name = %s", (limit, name))
            operators.audit_add(
                conn,
                actor.name,
                "queue-concurrency",
                f"queue:{name}",
                {"via": actor.via, "from": row[0], "to": limit},
            )
    return QueueToggled(queues_list(conn, name)[0], row[0] != limit)
