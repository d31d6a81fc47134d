"""Every SQL statement leasework runs, as functions of a psycopg connection.

Functions are named noun first (``jobs_insert``, ``outbox_fetch``) and run inside the
transaction their caller opened (:meth:`leasework.db.Database.run` opens one per call).
Status changes are checked against :mod:`leasework.states` before they are written, and
every WHERE clause that changes a status names the states it may come from. Inserting jobs
goes through the SQL function ``leasework_jobs_insert`` (migration 0002), the same one the
SQL door ``leasework_enqueue`` calls, so every door writes the same rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from leasework.backoff import retry_or_dead
from leasework.context import Effect
from leasework.db import savepoint
from leasework.job import COLUMNS, Job
from leasework.states import RETRYABLE, TERMINAL, Status, sources_of, transition

Row = dict[str, Any]

JOB_COLUMNS = COLUMNS  # every column of jobs that leasework.job.Job holds, in its order

# the wake-up message of a queued job; leasework_jobs_insert builds the same in SQL
READY_VALUE_SQL = (
    "jsonb_build_object('job_id', {t}.id::text, 'type', {t}.type, 'attempt', {t}.attempt + 1)"
)
READY_HEADERS_SQL = "jsonb_build_object('job_id', {t}.id::text, 'type', {t}.type)"
READY_KEY_SQL = "coalesce({t}.ordering_key, {t}.id::text)"


def _ready_outbox_insert(source: str, topic_param: str = "%(topic)s") -> str:
    """``INSERT INTO outbox`` of the ready messages of the jobs in CTE ``source``."""
    t = source
    return (
        f"INSERT INTO outbox (job_id, topic, key, value, headers) "
        f"SELECT {t}.id, {topic_param}, {READY_KEY_SQL.format(t=t)}, "
        f"{READY_VALUE_SQL.format(t=t)}, {READY_HEADERS_SQL.format(t=t)} FROM {t}"
    )


# ---------------------------------------------------------------- submit


@dataclass(frozen=True)
class Inserted:
    """What became of one request of an insert: its job, and whether an earlier request with
    the same idempotency key made it (``replay``) or differed from it (``conflict``: nothing
    was written for this request)."""

    ord: int
    id: uuid.UUID
    status: Status
    run_at: datetime
    created_at: datetime
    max_attempts: int
    timeout_seconds: int
    replay: bool
    conflict: bool

    @classmethod
    def from_row(cls, row: Row) -> Inserted:
        return cls(
            ord=row["ord"],
            id=row["id"],
            status=Status(row["status"]),
            run_at=row["run_at"],
            created_at=row["created_at"],
            max_attempts=row["max_attempts"],
            timeout_seconds=row["timeout_seconds"],
            replay=row["replay"],
            conflict=row["conflict"],
        )


JOBS_INSERT = "SELECT * FROM leasework_jobs_insert(%s, %s) ORDER BY ord"


def _inserted(rows: list[Row], expected: int) -> list[Inserted]:
    found = [Inserted.from_row(r) for r in rows]
    if len(found) != expected:
        raise RuntimeError(f"leasework_jobs_insert answered {len(found)} rows for {expected}")
    return found


def jobs_insert(conn: psycopg.Connection, rows: list[dict[str, Any]], topic: str) -> list[Inserted]:
    """Insert the jobs of ``rows`` (see :func:`leasework.submission.insert_row`) and the
    outbox rows of those due now, in one statement, on any connection (the caller's own too:
    the statement runs in whatever transaction the connection is in)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(JOBS_INSERT, (Jsonb(rows), topic))
        return _inserted(cur.fetchall(), len(rows))


async def jobs_insert_async(
    conn: psycopg.AsyncConnection, rows: list[dict[str, Any]], topic: str
) -> list[Inserted]:
    """:func:`jobs_insert` on psycopg's ``AsyncConnection`` (asyncio applications)."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(JOBS_INSERT, (Jsonb(rows), topic))
        return _inserted(await cur.fetchall(), len(rows))


def job_types_register(
    conn: psycopg.Connection, types: list[dict[str, Any]], registered_by: str
) -> None:
    """Record the job types of an app (name, payload_schema, policy) for the SQL door."""
    if not types:
        return
    conn.execute(
        """INSERT INTO job_types AS t (name, payload_schema, max_attempts, timeout_seconds,
                                       retry_base, retry_cap, description, registered_by)
           SELECT r.name, coalesce(r.payload_schema, '{}'::jsonb), r.max_attempts,
                  r.timeout_seconds, r.retry_base, r.retry_cap, r.description, %s
           FROM jsonb_to_recordset(%s) AS r(name text, payload_schema jsonb, max_attempts int,
                timeout_seconds int, retry_base float8, retry_cap float8, description text)
           ON CONFLICT (name) DO UPDATE SET
               payload_schema = excluded.payload_schema, max_attempts = excluded.max_attempts,
               timeout_seconds = excluded.timeout_seconds, retry_base = excluded.retry_base,
               retry_cap = excluded.retry_cap, description = excluded.description,
               registered_by = excluded.registered_by, registered_at = now()""",
        (registered_by, Jsonb(types)),
    )


# ---------------------------------------------------------------- read, list, cancel, retry


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


# an operator's retry: a fresh attempt budget (attempts go on counting, so ctx.attempt and the
# attempts table stay one sequence; the budget is added on top), the cancel flag and the last
# run's outcome cleared; the fence is kept (it only ever grows)
_REQUEUE_SET = """status = 'queued', max_attempts = attempt + attempt_budget, run_at = now(),
                  cancel_requested = false, finished_at = NULL, started_at = NULL,
                  result = NULL, deferrals = 0, lease_owner = NULL, lease_expires_at = NULL,
                  updated_at = now()"""


@dataclass(frozen=True)
class RetryResult:
    job: Row | None
    outcome: str  # "retried" | "not-retryable" | "missing"


def job_retry(conn: psycopg.Connection, job_id: uuid.UUID, topic: str) -> RetryResult:
    """Put a ``dead`` or ``cancelled`` job back in the queue with a fresh attempt budget."""
    row = conn.execute(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s FOR UPDATE", (job_id,)
    ).fetchone()
    if row is None:
        return RetryResult(None, "missing")
    if Status(row["status"]) not in RETRYABLE:
        return RetryResult(row, "not-retryable")
    transition(row["status"], Status.QUEUED, requeue=True)
    row = conn.execute(
        f"""WITH requeued AS (UPDATE jobs SET {_REQUEUE_SET} WHERE id = %(id)s
                              RETURNING {JOB_COLUMNS}),
                 wake AS ({_ready_outbox_insert("requeued")})
            SELECT * FROM requeued""",
        {"id": job_id, "topic": topic},
    ).fetchone()
    return RetryResult(row, "retried")


def jobs_retry_matching(
    conn: psycopg.Connection,
    *,
    statuses: list[str],
    job_type: str | None,
    finished_after: datetime | None,
    finished_before: datetime | None,
    limit: int,
    topic: str,
) -> int:
    """Bulk retry: up to ``limit`` ``dead``/``cancelled`` jobs matching the filter, oldest
    finish first. Rows another transaction holds are skipped, so two calls never double up."""
    for status in statuses:
        transition(status, Status.QUEUED, requeue=True)
    row = conn.execute(
        f"""WITH picked AS (
                SELECT id FROM jobs
                WHERE status = ANY(%(statuses)s)
                  AND (%(type)s::text IS NULL OR type = %(type)s::text)
                  AND (%(after)s::timestamptz IS NULL OR finished_at >= %(after)s::timestamptz)
                  AND (%(before)s::timestamptz IS NULL OR finished_at < %(before)s::timestamptz)
                ORDER BY finished_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
            requeued AS (UPDATE jobs SET {_REQUEUE_SET} FROM picked WHERE jobs.id = picked.id
                         RETURNING jobs.id, jobs.type, jobs.attempt, jobs.ordering_key),
            wake AS ({_ready_outbox_insert("requeued")} RETURNING 1)
            SELECT count(*) AS n FROM wake""",
        {
            "statuses": statuses,
            "type": job_type,
            "after": finished_after,
            "before": finished_before,
            "limit": limit,
            "topic": topic,
        },
    ).fetchone()
    return int(row["n"])


# ---------------------------------------------------------------- relay: outbox, promoter, pruner


def outbox_fetch(conn: psycopg.Connection, limit: int) -> list[Row]:
    """Lock a batch of unpublished rows; other relays skip them until this transaction ends.
    ``value`` comes as the JSON text Postgres holds, published as is (never re-encoded)."""
    return conn.execute(
        """SELECT id, job_id, topic, key, value::text AS value, headers, created_at FROM outbox
           WHERE published_at IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED""",
        (limit,),
    ).fetchall()


def outbox_retire(conn: psycopg.Connection, ids: list[int]) -> None:
    """Rows Kafka acknowledged leave the outbox (one statement per batch): the outbox holds
    only what is still to be published, so its size is the backlog."""
    if ids:
        conn.execute("DELETE FROM outbox WHERE id = ANY(%s)", (ids,))


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
    row = conn.execute(
        f"""WITH promoted AS (
                UPDATE jobs SET status = 'queued', updated_at = now()
                WHERE id IN (SELECT id FROM jobs WHERE status = ANY(%(sources)s)
                             AND run_at <= now()
                             ORDER BY run_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
                RETURNING id, type, attempt, ordering_key),
            wake AS ({_ready_outbox_insert("promoted")} RETURNING 1)
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


def outbox_prune(conn: psycopg.Connection, older_than: float, limit: int) -> int:
    """Delete up to ``limit`` outbox rows Kafka acknowledged more than ``older_than`` s ago."""
    row = conn.execute(
        """WITH gone AS (
               DELETE FROM outbox WHERE id IN (
                   SELECT id FROM outbox
                   WHERE published_at < now() - make_interval(secs => %s)
                   ORDER BY published_at LIMIT %s FOR UPDATE SKIP LOCKED)
               RETURNING 1)
           SELECT count(*) AS n FROM gone""",
        (older_than, limit),
    ).fetchone()
    return int(row["n"])


# ---------------------------------------------------------------- worker


def jobs_get_many(conn: psycopg.Connection, job_ids: list[uuid.UUID]) -> list[Job]:
    """The jobs of a batch of messages, in one query (missing ids are simply absent)."""
    if not job_ids:
        return []
    rows = conn.execute(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ANY(%s::uuid[])", (job_ids,)
    ).fetchall()
    return [Job.from_row(r) for r in rows]


def jobs_start_many(
    conn: psycopg.Connection, claims: list[tuple[uuid.UUID, int]], *, worker: str, ttl: float
) -> list[Job]:
    """Stamp a batch of queued jobs ``running``, each under its own fence, and open their
    attempt rows, in one statement. Each row keeps its own condition: still ``queued`` and a
    fence above the stored one (Postgres guards monotonicity even if Redis hands out an old
    token). Returns the jobs stamped; the others were not ``queued`` or had a stale token."""
    if not claims:
        return []
    rows = conn.execute(
        f"""WITH claim AS (
                SELECT * FROM unnest(%(ids)s::uuid[], %(fences)s::bigint[]) AS c(id, fence)),
            started AS (
                UPDATE jobs SET status = 'running', attempt = jobs.attempt + 1,
                       fence = claim.fence, lease_owner = %(worker)s,
                       lease_expires_at = now() + make_interval(secs => %(ttl)s),
                       started_at = now(), updated_at = now()
                FROM claim
                WHERE jobs.id = claim.id AND jobs.status = 'queued' AND jobs.fence < claim.fence
                RETURNING jobs.*),
            opened AS (
                INSERT INTO attempts (job_id, attempt, worker, fence)
                SELECT id, attempt, %(worker)s, fence FROM started)
            SELECT {JOB_COLUMNS} FROM started""",
        {
            "ids": [c[0] for c in claims],
            "fences": [c[1] for c in claims],
            "worker": worker,
            "ttl": ttl,
        },
    ).fetchall()
    return [Job.from_row(r) for r in rows]


def jobs_heartbeat_many(
    conn: psycopg.Connection, leases: list[tuple[uuid.UUID, int]], ttl: float
) -> dict[uuid.UUID, bool]:
    """Extend the Postgres view of a batch of leases in one statement. Returns, for each job
    still running under its fence, whether a cancel was requested; a job absent from the
    answer has lost its lease (a newer claim, the reaper)."""
    if not leases:
        return {}
    rows = conn.execute(
        """UPDATE jobs SET lease_expires_at = now() + make_interval(secs => %(ttl)s)
           FROM unnest(%(ids)s::uuid[], %(fences)s::bigint[]) AS h(id, fence)
           WHERE jobs.id = h.id AND jobs.fence = h.fence AND jobs.status = 'running'
           RETURNING jobs.id, jobs.cancel_requested""",
        {
            "ids": [lease[0] for lease in leases],
            "fences": [lease[1] for lease in leases],
            "ttl": ttl,
        },
    ).fetchall()
    return {r["id"]: bool(r["cancel_requested"]) for r in rows}


def jobs_defer_many(
    conn: psycopg.Connection, job_ids: list[uuid.UUID], *, base: float, cap: float, reason: str
) -> list[Job]:
    """Queued jobs whose type this worker does not know (a rolling deploy) wait for a later
    ``run_at``: no lease, no attempt spent. The wait doubles with every deferral, from
    ``base`` up to ``cap`` (half fixed, half random). Jobs no longer queued are left alone."""
    if not job_ids:
        return []
    transition(Status.QUEUED, Status.SCHEDULED)
    rows = conn.execute(
        f"""UPDATE jobs SET status = 'scheduled', deferrals = deferrals + 1,
                   run_at = now() + make_interval(secs =>
                       least(%(cap)s, %(base)s * power(2, least(deferrals, 30)))
                       * (0.5 + random() / 2)),
                   last_error = %(reason)s, updated_at = now()
            WHERE id = ANY(%(ids)s::uuid[]) AND status = 'queued'
            RETURNING {JOB_COLUMNS}""",
        {"ids": job_ids, "base": base, "cap": cap, "reason": reason},
    ).fetchall()
    return [Job.from_row(r) for r in rows]


@dataclass(frozen=True)
class Completion:
    """One attempt's outcome waiting for its fenced write: the job under ``fence``, what
    became of it, the handler's effects (applied only if the job succeeded and the fence
    holds), and what the outcome becomes if one of those effects raises."""

    job_id: uuid.UUID
    fence: int
    outcome: Outcome
    effects: tuple[Effect, ...] = ()
    effect_failed: Callable[[Exception], Outcome] | None = None


FINISH_MANY = """
WITH done AS (
    SELECT * FROM jsonb_to_recordset(%(done)s)
        AS d(id uuid, fence bigint, status text, error text, retry float8, result jsonb)),
finished AS (
    UPDATE jobs SET status = done.status, last_error = done.error, result = done.result,
           run_at = CASE WHEN done.retry IS NULL THEN jobs.run_at
                         ELSE now() + make_interval(secs => done.retry) END,
           lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
           finished_at = CASE WHEN done.status IN ('succeeded', 'dead', 'cancelled')
                              THEN now() END
    FROM done
    WHERE jobs.id = done.id AND jobs.fence = done.fence AND jobs.status = 'running'
    RETURNING jobs.id, jobs.fence, jobs.type, jobs.status, jobs.attempt, jobs.last_error,
              jobs.payload),
closed AS (
    UPDATE attempts SET finished_at = now(), outcome = finished.status,
           error = finished.last_error
    FROM finished WHERE attempts.job_id = finished.id AND attempts.fence = finished.fence),
dead AS (
    INSERT INTO outbox (job_id, topic, key, value, headers)
    SELECT id, %(dlq)s, id::text,
           jsonb_build_object('job_id', id::text, 'type', type, 'payload', payload),
           jsonb_build_object('job_id', id::text, 'type', type, 'attempts', attempt::text,
                              'last_error', left(coalesce(last_error, ''), 1000))
    FROM finished WHERE status = 'dead')
SELECT id, status FROM finished
"""


def _held(conn: psycopg.Connection, completions: list[Completion]) -> set[uuid.UUID]:
    """Lock the rows whose fence still holds: their effects may run, and no one can take the
    job from under them before this transaction ends."""
    rows = conn.execute(
        """SELECT jobs.id FROM jobs
           JOIN unnest(%s::uuid[], %s::bigint[]) AS c(id, fence)
             ON jobs.id = c.id AND jobs.fence = c.fence
           WHERE jobs.status = 'running'
           ORDER BY jobs.id FOR UPDATE OF jobs""",
        ([c.job_id for c in completions], [c.fence for c in completions]),
    ).fetchall()
    return {r["id"] for r in rows}


def _apply_effects(conn: psycopg.Connection, jobs: list[Completion]) -> dict[uuid.UUID, Exception]:
    """Run the effects of ``jobs`` (their rows locked, their fences holding); returns the
    failure of each job whose effects raised, with its effects undone. All run first in one
    savepoint (two round trips for the batch); only if one raises are they run again, one
    savepoint per job, so the failing job is found and the others keep theirs."""
    everything = [effect for c in jobs for effect in c.effects]
    if effects_apply(conn, everything) is None:
        return {}
    failures = {}
    for c in jobs:
        failure = effects_apply(conn, list(c.effects))
        if failure is not None:
            failures[c.job_id] = failure
    return failures


def _ours_already(
    conn: psycopg.Connection, completions: list[Completion]
) -> dict[uuid.UUID, Status]:
    """Outcomes of ``completions`` that an earlier try of this same write committed (its
    answer was lost): the attempt under that very fence is closed with an outcome other than
    the reaper's. Only the worker holding the fence writes one, so it is ours."""
    rows = conn.execute(
        """SELECT attempts.job_id, attempts.outcome FROM attempts
           JOIN unnest(%s::uuid[], %s::bigint[]) AS c(id, fence)
             ON attempts.job_id = c.id AND attempts.fence = c.fence
           WHERE attempts.outcome IS NOT NULL AND attempts.outcome <> 'lease_expired'""",
        ([c.job_id for c in completions], [c.fence for c in completions]),
    ).fetchall()
    return {r["job_id"]: Status(r["outcome"]) for r in rows}


def jobs_finish_many(
    conn: psycopg.Connection,
    completions: list[Completion],
    *,
    dlq_topic: str,
    retrying: bool = False,
) -> dict[uuid.UUID, Status]:
    """The fenced terminal write of a batch: each job's outcome, attempt row and effects, only
    where its own fence still holds, in one transaction. Returns the status written per job;
    a job absent from the answer was rejected by the fence (a newer claim holds it) and none
    of its effects ran. An effect that raises is undone and turns that job's outcome into
    ``effect_failed(exc)``; the other jobs of the batch are not touched. ``retrying``: an
    earlier try may have committed without its answer arriving; rows it wrote are reported
    as written, not as rejected."""
    outcomes = {c.job_id: c.outcome for c in completions}
    for outcome in outcomes.values():
        transition(Status.RUNNING, outcome.status)  # raises on an outcome running cannot reach
    with_effects = [c for c in completions if c.effects and c.outcome.status == Status.SUCCEEDED]
    if with_effects:
        held = _held(conn, with_effects)
        failures = _apply_effects(conn, [c for c in with_effects if c.job_id in held])
        for c in with_effects:
            if (failure := failures.get(c.job_id)) is None:
                continue
            message = f"a fenced effect raised {type(failure).__name__}: {failure}"[:2000]
            outcome = (
                c.effect_failed(failure)
                if c.effect_failed is not None
                else Outcome(Status.FAILED, message, retry_in=0.0)
            )
            transition(Status.RUNNING, outcome.status)
            outcomes[c.job_id] = outcome
    done = [
        {
            "id": str(c.job_id),
            "fence": c.fence,
            "status": str(outcomes[c.job_id].status),
            "error": outcomes[c.job_id].error,
            "retry": outcomes[c.job_id].retry_in,
            "result": outcomes[c.job_id].result,
        }
        for c in completions
    ]
    rows = conn.execute(FINISH_MANY, {"done": Jsonb(done), "dlq": dlq_topic}).fetchall()
    written = {r["id"]: Status(r["status"]) for r in rows}
    if retrying and len(written) < len(completions):
        missing = [c for c in completions if c.job_id not in written]
        written.update(_ours_already(conn, missing))
    return written


def jobs_unfence_many(conn: psycopg.Connection, claims: list[tuple[uuid.UUID, int]]) -> None:
    """UNSAFE, for the plain-TTL demonstration only: put each job back to ``running`` under
    the given fence whatever happened meanwhile, so the fenced write that follows matches."""
    conn.execute(
        """UPDATE jobs SET status = 'running', fence = c.fence
           FROM unnest(%s::uuid[], %s::bigint[]) AS c(id, fence) WHERE jobs.id = c.id""",
        ([c[0] for c in claims], [c[1] for c in claims]),
    )


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


def job_defer(
    conn: psycopg.Connection, job_id: uuid.UUID, *, base: float, cap: float, reason: str
) -> Row | None:
    """A queued job whose type this worker does not know (a rolling deploy) waits for a later
    ``run_at``: no lease, no attempt spent. The wait doubles with every deferral, from
    ``base`` up to ``cap`` (half fixed, half random). None when it is no longer queued."""
    transition(Status.QUEUED, Status.SCHEDULED)
    return conn.execute(
        f"""UPDATE jobs SET status = 'scheduled', deferrals = deferrals + 1,
                   run_at = now() + make_interval(secs =>
                       least(%(cap)s, %(base)s * power(2, least(deferrals, 30)))
                       * (0.5 + random() / 2)),
                   last_error = %(reason)s, updated_at = now()
            WHERE id = %(id)s AND status = 'queued'
            RETURNING {JOB_COLUMNS}""",
        {"id": job_id, "base": base, "cap": cap, "reason": reason},
    ).fetchone()


def dlq_outbox_add(conn: psycopg.Connection, job_id: uuid.UUID, topic: str) -> None:
    """The dead-letter message of a job that just died, built in SQL from its row (the payload
    never round-trips through Python: what the store holds is what the DLQ gets)."""
    conn.execute(
        """INSERT INTO outbox (job_id, topic, key, value, headers)
           SELECT id, %(topic)s, id::text,
                  jsonb_build_object('job_id', id::text, 'type', type, 'payload', payload),
                  jsonb_build_object('job_id', id::text, 'type', type,
                                     'attempts', attempt::text,
                                     'last_error', left(coalesce(last_error, ''), 1000))
           FROM jobs WHERE id = %(id)s""",
        {"id": job_id, "topic": topic},
    )


@dataclass(frozen=True)
class Outcome:
    status: Status  # succeeded, failed (retry later), dead or cancelled
    error: str | None = None
    retry_in: float | None = None  # seconds, for failed
    result: Any = None  # JSON, for succeeded


def _leave_running(
    conn: psycopg.Connection, job_id: uuid.UUID, fence: int, outcome: Outcome
) -> Row | None:
    """Move a job out of ``running`` under ``fence``: its outcome, its retry time, the lease
    cleared. None when the job is no longer running under that fence (a newer claim)."""
    return conn.execute(
        f"""UPDATE jobs SET status = %(status)s, last_error = %(error)s, result = %(result)s,
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
            "result": None if outcome.result is None else Jsonb(outcome.result),
            "retry": outcome.retry_in,
            "id": job_id,
            "fence": fence,
        },
    ).fetchone()


def effects_apply(conn: psycopg.Connection, effects: list[Effect]) -> Exception | None:
    """Run a handler's fenced effects in a savepoint of the open transaction. An effect that
    raises (a bug, a constraint of the user's table) is undone with the others and returned:
    the attempt failed, nothing of it commits. A lost connection propagates (retry the write)."""
    try:
        with savepoint(conn, "leasework_effects"):
            for effect in effects:
                effect(conn)
    except Exception as exc:  # the user's code: any failure is the attempt's
        if conn.broken or isinstance(exc, psycopg.InterfaceError):
            raise
        return exc
    return None


def job_finish(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    fence: int,
    outcome: Outcome,
    *,
    dlq_topic: str,
    effects: list[Effect] | None = None,
    effect_failed: Callable[[Exception], Outcome] | None = None,
) -> Row | None:
    """The fenced terminal write: the outcome, the attempt row and the handler's effects in one
    transaction, only if ``fence`` still holds. None means a newer claim exists; the caller
    must roll back (raise) so none of the effects commit. An effect that raises turns the
    outcome into ``effect_failed(exc)`` (default: retry now), with no effect applied."""
    transition(Status.RUNNING, outcome.status)  # raises on an outcome running cannot reach
    if effects:
        failure = effects_apply(conn, effects)
        if failure is not None:
            message = f"a fenced effect raised {type(failure).__name__}: {failure}"[:2000]
            outcome = (
                effect_failed(failure)
                if effect_failed is not None
                else Outcome(Status.FAILED, message, retry_in=0.0)
            )
            transition(Status.RUNNING, outcome.status)
    row = _leave_running(conn, job_id, fence, outcome)
    if row is None:
        return None
    conn.execute(
        """UPDATE attempts SET finished_at = now(), outcome = %s, error = %s
           WHERE job_id = %s AND fence = %s""",
        (str(outcome.status), outcome.error, job_id, fence),
    )
    if outcome.status == Status.DEAD:
        dlq_outbox_add(conn, job_id, dlq_topic)
    return row


def job_finish_unfenced(
    conn: psycopg.Connection,
    job_id: uuid.UUID,
    fence: int,
    outcome: Outcome,
    *,
    dlq_topic: str,
    effects: list[Effect] | None = None,
    effect_failed: Callable[[Exception], Outcome] | None = None,
) -> Row | None:
    """The UNSAFE terminal write of a plain TTL lease: no fence, no status condition. Exists
    only so the fencing demonstration and the chaos harness can show what fencing prevents."""
    conn.execute("UPDATE jobs SET status = 'running', fence = %s WHERE id = %s", (fence, job_id))
    return job_finish(
        conn,
        job_id,
        fence,
        outcome,
        dlq_topic=dlq_topic,
        effects=effects,
        effect_failed=effect_failed,
    )


def fence_max(conn: psycopg.Connection) -> int:
    """The largest fence Postgres has stored: the floor for re-seeding the Redis counter."""
    return int(conn.execute("SELECT coalesce(max(fence), 0) AS f FROM jobs").fetchone()["f"])


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


def jobs_reap_expired(
    conn: psycopg.Connection, limit: int, *, retry_base: float, retry_cap: float, dlq_topic: str
) -> list[Row]:
    """Running jobs whose lease expired go back to waiting: ``failed`` with a backoff delay
    (the job's own backoff, else ``retry_base``/``retry_cap``), or ``dead`` after their last
    attempt. The fence is left as it is, so the lost worker's terminal write (conditioned on
    ``status = 'running'`` and its fence) matches nothing."""
    rows = conn.execute(
        f"""SELECT {JOB_COLUMNS} FROM jobs
            WHERE status = 'running' AND lease_expires_at < now()
            ORDER BY lease_expires_at LIMIT %s FOR UPDATE SKIP LOCKED""",
        (limit,),
    ).fetchall()
    reaped = []
    for row in rows:
        error = f"lease of {row['lease_owner']} expired (fence {row['fence']})"
        decision = retry_or_dead(
            row["attempt"],
            row["max_attempts"],
            row["retry_base"] or retry_base,
            row["retry_cap"] or retry_cap,
        )
        transition(row["status"], decision.status)
        conn.execute(
            """UPDATE attempts SET finished_at = now(), outcome = 'lease_expired', error = %s
               WHERE job_id = %s AND fence = %s AND finished_at IS NULL""",
            (error, row["id"], row["fence"]),
        )
        # the row is locked, running under this fence: the update cannot miss
        outcome = Outcome(decision.status, error, decision.delay)
        updated = _leave_running(conn, row["id"], row["fence"], outcome)
        if decision.status == Status.DEAD:
            dlq_outbox_add(conn, row["id"], dlq_topic)
        reaped.append(updated)
    return reaped
