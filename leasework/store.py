"""Every SQL statement leasework runs, as functions of a psycopg connection.

Functions are named noun first (``job_insert``, ``outbox_fetch``) and run inside the
transaction their caller opened (:meth:`leasework.db.Database.run` opens one per call).
Status changes are checked against :mod:`leasework.states` before they are written, and
every WHERE clause that changes a status names the states it may come from.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from leasework.backoff import retry_delay
from leasework.states import TERMINAL, Status, sources_of, transition

Row = dict[str, Any]

JOB_COLUMNS = (
    "id, type, payload, status, run_at, attempt, max_attempts, timeout_seconds, fence, "
    "lease_owner, lease_expires_at, idempotency_key, ordering_key, last_error, "
    "cancel_requested, created_at, updated_at, started_at, finished_at"
)


@dataclass(frozen=True)
class NewJob:
    type: str
    payload: Any
    run_at: datetime | None  # None: now (database clock)
    max_attempts: int
    timeout_seconds: int
    ordering_key: str | None
    idempotency_key: str | None
    request_hash: str | None


@dataclass(frozen=True)
class Insertion:
    job: Row
    replay: bool  # an earlier submit with the same Idempotency-Key and body made it
    conflict: bool  # the key exists with a different body: nothing was written


def ready_message(job: Row, topic: str) -> tuple[str, str, dict, dict]:
    """(topic, key, value, headers) of the Kafka message that wakes a worker for ``job``."""
    key = job.get("ordering_key") or str(job["id"])
    value = {"job_id": str(job["id"]), "type": job["type"], "attempt": job["attempt"] + 1}
    return topic, key, value, {"job_id": str(job["id"]), "type": job["type"]}


def outbox_add(conn: psycopg.Connection, job_id: uuid.UUID, message: tuple) -> None:
    topic, key, value, headers = message
    conn.execute(
        "INSERT INTO outbox (job_id, topic, key, value, headers) VALUES (%s, %s, %s, %s, %s)",
        (job_id, topic, key, Jsonb(value), Jsonb(headers)),
    )


# ---------------------------------------------------------------- submit, read, list, cancel


def job_insert(conn: psycopg.Connection, new: NewJob, topic: str) -> Insertion:
    """Insert the job and, when due now, its outbox row, in the caller's transaction.

    Under an Idempotency-Key the unique index decides between concurrent submits: exactly one
    insert wins, the others find its row and compare request hashes.
    """
    job_id = uuid.uuid4()
    row = conn.execute(
        f"""
        INSERT INTO jobs (id, type, payload, status, run_at, max_attempts, timeout_seconds,
                          ordering_key, idempotency_key, request_hash)
        VALUES (%(id)s, %(type)s, %(payload)s,
                CASE WHEN coalesce(%(run_at)s, now()) > now() THEN 'scheduled' ELSE 'queued' END,
                coalesce(%(run_at)s, now()), %(max_attempts)s, %(timeout)s,
                %(ordering_key)s, %(key)s, %(hash)s)
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING {JOB_COLUMNS}
        """,
        {
            "id": job_id,
            "type": new.type,
            "payload": Jsonb(new.payload),
            "run_at": new.run_at,
            "max_attempts": new.max_attempts,
            "timeout": new.timeout_seconds,
            "ordering_key": new.ordering_key,
            "key": new.idempotency_key,
            "hash": new.request_hash,
        },
    ).fetchone()
    if row is not None:
        if row["status"] == Status.QUEUED:
            outbox_add(conn, job_id, ready_message(row, topic))
        return Insertion(row, replay=False, conflict=False)
    existing = conn.execute(
        f"SELECT {JOB_COLUMNS}, request_hash FROM jobs WHERE idempotency_key = %s",
        (new.idempotency_key,),
    ).fetchone()
    assert existing is not None, "ON CONFLICT fired, so the key exists"
    same = existing.pop("request_hash") == new.request_hash
    return Insertion(existing, replay=same, conflict=not same)


def job_get(conn: psycopg.Connection, job_id: uuid.UUID) -> Row | None:
    return conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s", (job_id,)).fetchone()


def job_list(
    conn: psycopg.Connection,
    *,
    status: str | None,
    job_type: str | None,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[Row]:
    """Newest first; ``after`` is the (created_at, id) of the last row of the previous page."""
    clauses, params = [], []
    if status is not None:
        clauses.append("status = %s")
        params.append(status)
    if job_type is not None:
        clauses.append("type = %s")
        params.append(job_type)
    if after is not None:
        clauses.append("(created_at, id) < (%s, %s)")
        params.extend(after)
    where = ("WHERE " + " AND ".join(clauses)) if clauses else ""
    return conn.execute(
        f"SELECT {JOB_COLUMNS} FROM jobs {where} ORDER BY created_at DESC, id DESC LIMIT %s",
        (*params, limit),
    ).fetchall()


@dataclass(frozen=True)
class CancelResult:
    job: Row | None
    outcome: str  # "cancelled" | "requested" | "finished" | "missing"


def job_cancel(conn: psycopg.Connection, job_id: uuid.UUID) -> CancelResult:
    row = conn.execute(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s FOR UPDATE", (job_id,)
    ).fetchone()
    if row is None:
        return CancelResult(None, "missing")
    status = Status(row["status"])
    if status in TERMINAL:
        return CancelResult(row, "finished")
    if status == Status.RUNNING:  # cooperative: the worker's heartbeat sees the request
        row = conn.execute(
            f"UPDATE jobs SET cancel_requested = true, updated_at = now() WHERE id = %s "
            f"RETURNING {JOB_COLUMNS}",
            (job_id,),
        ).fetchone()
        return CancelResult(row, "requested")
    transition(status, Status.CANCELLED)
    row = conn.execute(
        f"""UPDATE jobs SET status = 'cancelled', cancel_requested = true, finished_at = now(),
                   updated_at = now()
            WHERE id = %s RETURNING {JOB_COLUMNS}""",
        (job_id,),
    ).fetchone()
    # any ready message already in Kafka finds the job terminal and is skipped
    return CancelResult(row, "cancelled")


# ---------------------------------------------------------------- relay: outbox and promoter


def outbox_fetch(conn: psycopg.Connection, limit: int) -> list[Row]:
    """Lock a batch of unpublished rows; other relays skip them until this transaction ends."""
    return conn.execute(
        """SELECT id, job_id, topic, key, value, headers, created_at FROM outbox
           WHERE published_at IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED""",
        (limit,),
    ).fetchall()


def outbox_mark_published(conn: psycopg.Connection, ids: list[int]) -> None:
    if ids:
        conn.execute("UPDATE outbox SET published_at = now() WHERE id = ANY(%s)", (ids,))


def outbox_pending(conn: psycopg.Connection) -> tuple[int, float]:
    """(unpublished rows, age in seconds of the oldest of them)."""
    row = conn.execute(
        """SELECT count(*) AS n,
                  coalesce(extract(epoch FROM now() - min(created_at)), 0) AS age
           FROM outbox WHERE published_at IS NULL"""
    ).fetchone()
    return int(row["n"]), float(row["age"])


def jobs_promote_due(conn: psycopg.Connection, limit: int, topic: str) -> int:
    """Due ``scheduled`` and ``failed`` jobs become ``queued`` with their outbox rows."""
    sources = [str(s) for s in sources_of(Status.QUEUED)]
    rows = conn.execute(
        f"""UPDATE jobs SET status = 'queued', updated_at = now()
            WHERE id IN (SELECT id FROM jobs WHERE status = ANY(%s) AND run_at <= now()
                         ORDER BY run_at LIMIT %s FOR UPDATE SKIP LOCKED)
            RETURNING {JOB_COLUMNS}""",
        (sources, limit),
    ).fetchall()
    for row in rows:
        outbox_add(conn, row["id"], ready_message(row, topic))
    return len(rows)


# ---------------------------------------------------------------- worker


def job_start(
    conn: psycopg.Connection, job_id: uuid.UUID, *, worker: str, fence: int | None, ttl: float
) -> Row | None:
    """Stamp a queued job ``running`` under ``fence`` and open its attempt row.

    ``fence`` must exceed the stored fence (Postgres guards monotonicity even if the lease
    service hands out an old token); ``None`` takes stored fence + 1. Returns the job, or
    None when it is not queued (finished, cancelled, not yet due, or already running).
    """
    row = conn.execute(
        f"""UPDATE jobs SET status = 'running', attempt = attempt + 1,
                   fence = coalesce(%(fence)s, fence + 1),
                   lease_owner = %(worker)s,
                   lease_expires_at = now() + make_interval(secs => %(ttl)s),
                   started_at = now(), updated_at = now()
            WHERE id = %(id)s AND status = 'queued'
              AND (%(fence)s::bigint IS NULL OR fence < %(fence)s::bigint)
            RETURNING {JOB_COLUMNS}""",
        {"id": job_id, "fence": fence, "worker": worker, "ttl": ttl},
    ).fetchone()
    if row is not None:
        conn.execute(
            "INSERT INTO attempts (job_id, attempt, worker, fence) VALUES (%s, %s, %s, %s)",
            (job_id, row["attempt"], worker, row["fence"]),
        )
    return row


def job_mark_dead_poison(
    conn: psycopg.Connection, job_id: uuid.UUID, error: str, dlq_topic: str
) -> Row | None:
    """A queued job nobody can run (unknown type, undecodable payload): dead, no retries."""
    row = conn.execute(
        f"""UPDATE jobs SET status = 'dead', last_error = %s, finished_at = now(),
                   updated_at = now()
            WHERE id = %s AND status = 'queued' RETURNING {JOB_COLUMNS}""",
        (error, job_id),
    ).fetchone()
    if row is not None:
        outbox_add(conn, job_id, dlq_message(row, dlq_topic))
    return row


def dlq_message(job: Row, topic: str) -> tuple[str, str, dict, dict]:
    headers = {
        "job_id": str(job["id"]),
        "type": job["type"],
        "attempts": str(job["attempt"]),
        "last_error": (job["last_error"] or "")[:1000],
    }
    value = {"job_id": str(job["id"]), "type": job["type"], "payload": job["payload"]}
    return topic, str(job["id"]), value, headers


@dataclass(frozen=True)
class Outcome:
    status: Status  # succeeded, failed (retry later), dead or cancelled
    error: str | None = None
    retry_in: float | None = None  # seconds, for failed


def _leave_running(
    conn: psycopg.Connection, job_id: uuid.UUID, fence: int, outcome: Outcome
) -> Row | None:
    """Move a job out of ``running`` under ``fence``: its outcome, its retry time, the lease
    cleared. None when the job is no longer running under that fence (a newer claim)."""
    return conn.execute(
        f"""UPDATE jobs SET status = %(status)s, last_error = %(error)s,
                   run_at = CASE WHEN %(retry)s::float8 IS NULL THEN run_at
                                 ELSE now() + make_interval(secs => %(retry)s::float8) END,
                   lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
                   finished_at = CASE WHEN %(status)s IN ('succeeded', 'dead', 'cancelled')
                                      THEN now() END
            WHERE id = %(id)s AND fence = %(fence)s AND status = 'running'
            RETURNING {JOB_COLUMNS}""",
        {
            "status": str(outcome.status),
            "error": outcome.error,
            "retry": outcome.retry_in,
            "id": job_id,
            "fence": fence,
        },
    ).fetchone()


def job_finish(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    fence: int,
    outcome: Outcome,
    *,
    dlq_topic: str,
    effects: list | None = None,
) -> Row | None:
    """The fenced terminal write: the outcome, the attempt row and the handler's effects in one
    transaction, only if ``fence`` still holds. None means a newer claim exists; the caller
    must roll back (raise) so none of the effects commit."""
    transition(Status.RUNNING, outcome.status)  # raises on an outcome running cannot reach
    row = _leave_running(conn, job_id, fence, outcome)
    if row is None:
        return None
    conn.execute(
        """UPDATE attempts SET finished_at = now(), outcome = %s, error = %s
           WHERE job_id = %s AND fence = %s""",
        (str(outcome.status), outcome.error, job_id, fence),
    )
    for effect in effects or ():
        effect(conn)
    if outcome.status == Status.DEAD:
        outbox_add(conn, job_id, dlq_message(row, dlq_topic))
    return row


def job_finish_unfenced(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    fence: int,
    outcome: Outcome,
    *,
    dlq_topic: str,
    effects: list | None = None,
) -> Row | None:
    """The UNSAFE terminal write of a plain TTL lease: no fence, no status condition. Exists
    only so the fencing demonstration and the chaos harness can show what fencing prevents."""
    conn.execute("UPDATE jobs SET status = 'running', fence = %s WHERE id = %s", (fence, job_id))
    return job_finish(conn, job_id, fence, outcome, dlq_topic=dlq_topic, effects=effects)


def fence_max(conn: psycopg.Connection) -> int:
    """The largest fence Postgres has stored: the floor for re-seeding the Redis counter."""
    return int(conn.execute("SELECT coalesce(max(fence), 0) AS f FROM jobs").fetchone()["f"])


def effect_insert(conn: psycopg.Connection, job_id: uuid.UUID, fence: int, kind: str, data: Any):
    conn.execute(
        "INSERT INTO effects (job_id, fence, kind, data) VALUES (%s, %s, %s, %s)",
        (job_id, fence, kind, Jsonb(data)),
    )


def job_heartbeat(
    conn: psycopg.Connection, job_id: uuid.UUID, fence: int, ttl: float
) -> tuple[bool, bool]:
    """Extend the Postgres view of the lease. Returns (still ours, cancel requested)."""
    row = conn.execute(
        """UPDATE jobs SET lease_expires_at = now() + make_interval(secs => %s)
           WHERE id = %s AND fence = %s AND status = 'running'
           RETURNING cancel_requested""",
        (ttl, job_id, fence),
    ).fetchone()
    if row is None:
        return False, False
    return True, bool(row["cancel_requested"])


def payload_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def jobs_reap_expired(
    conn: psycopg.Connection, limit: int, *, retry_base: float, retry_cap: float, dlq_topic: str
) -> list[Row]:
    """Running jobs whose lease expired go back to waiting: ``failed`` with a backoff delay, or
    ``dead`` after their last attempt. The fence is left as it is, so the lost worker's
    terminal write (conditioned on ``status = 'running'`` and its fence) matches nothing."""
    rows = conn.execute(
        f"""SELECT {JOB_COLUMNS} FROM jobs
            WHERE status = 'running' AND lease_expires_at < now()
            ORDER BY lease_expires_at LIMIT %s FOR UPDATE SKIP LOCKED""",
        (limit,),
    ).fetchall()
    reaped = []
    for row in rows:
        error = f"lease of {row['lease_owner']} expired (fence {row['fence']})"
        if row["attempt"] >= row["max_attempts"]:
            status, retry = Status.DEAD, None
        else:
            status, retry = Status.FAILED, retry_delay(row["attempt"], retry_base, retry_cap)
        transition(row["status"], status)
        conn.execute(
            """UPDATE attempts SET finished_at = now(), outcome = 'lease_expired', error = %s
               WHERE job_id = %s AND fence = %s AND finished_at IS NULL""",
            (error, row["id"], row["fence"]),
        )
        # the row is locked, running under this fence: the update cannot miss
        updated = _leave_running(conn, row["id"], row["fence"], Outcome(status, error, retry))
        if status == Status.DEAD:
            outbox_add(conn, row["id"], dlq_message(updated, dlq_topic))
        reaped.append(updated)
    return reaped
