"""Reading, listing, cancelling and retrying jobs (the api's and the console's queries)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import psycopg

from leasework.job import Job
from leasework.states import RETRYABLE, TERMINAL, Status, transition
from leasework.store.common import JOB_COLUMNS, Row, ready_outbox_insert


def _job(row: Row | None) -> Job | None:
    return None if row is None else Job.from_row(row)


def job_get(conn: psycopg.Connection, job_id: uuid.UUID) -> Job | None:
    return _job(conn.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s", (job_id,)).fetchone())


def job_list(
    conn: psycopg.Connection,
    *,
    status: str | None,
    job_type: str | None,
    after: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[Job]:
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
    rows = conn.execute(
        f"SELECT {JOB_COLUMNS} FROM jobs {where} ORDER BY created_at DESC, id DESC LIMIT %s",
        (*params, limit),
    ).fetchall()
    return [Job.from_row(r) for r in rows]


class CancelOutcome(StrEnum):
    CANCELLED = "cancelled"  # it was waiting: cancelled now
    REQUESTED = "requested"  # it runs: its worker's heartbeat sees the request
    FINISHED = "finished"  # too late: it ended already
    MISSING = "missing"


@dataclass(frozen=True)
class CancelResult:
    job: Job | None
    outcome: CancelOutcome


def _locked(conn: psycopg.Connection, job_id: uuid.UUID) -> Job | None:
    return _job(
        conn.execute(
            f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = %s FOR UPDATE", (job_id,)
        ).fetchone()
    )


def job_cancel(conn: psycopg.Connection, job_id: uuid.UUID) -> CancelResult:
    job = _locked(conn, job_id)
    if job is None:
        return CancelResult(None, CancelOutcome.MISSING)
    if job.status in TERMINAL:
        return CancelResult(job, CancelOutcome.FINISHED)
    if job.status == Status.RUNNING:  # cooperative: the worker's heartbeat sees the request
        row = conn.execute(
            f"UPDATE jobs SET cancel_requested = true, updated_at = now() WHERE id = %s "
            f"RETURNING {JOB_COLUMNS}",
            (job_id,),
        ).fetchone()
        return CancelResult(_job(row), CancelOutcome.REQUESTED)
    transition(job.status, Status.CANCELLED)
    row = conn.execute(
        f"""UPDATE jobs SET status = 'cancelled', cancel_requested = true, finished_at = now(),
                   updated_at = now()
            WHERE id = %s RETURNING {JOB_COLUMNS}""",
        (job_id,),
    ).fetchone()
    # any ready message already in Kafka finds the job terminal and is skipped
    return CancelResult(_job(row), CancelOutcome.CANCELLED)


# an operator's retry: a fresh attempt budget (attempts go on counting, so ctx.attempt and the
# attempts table stay one sequence; the budget is added on top), the cancel flag and the last
# run's outcome cleared; the fence is kept (it only ever grows)
_REQUEUE_SET = """status = 'queued', max_attempts = attempt + attempt_budget, run_at = now(),
                  cancel_requested = false, finished_at = NULL, started_at = NULL,
                  result = NULL, deferrals = 0, lease_owner = NULL, lease_expires_at = NULL,
                  updated_at = now()"""


class RetryOutcome(StrEnum):
    RETRIED = "retried"
    NOT_RETRYABLE = "not-retryable"  # not dead or cancelled
    MISSING = "missing"


@dataclass(frozen=True)
class RetryResult:
    job: Job | None
    outcome: RetryOutcome


def job_retry(conn: psycopg.Connection, job_id: uuid.UUID, topic: str) -> RetryResult:
    """Put a ``dead`` or ``cancelled`` job back in the queue with a fresh attempt budget."""
    job = _locked(conn, job_id)
    if job is None:
        return RetryResult(None, RetryOutcome.MISSING)
    if job.status not in RETRYABLE:
        return RetryResult(job, RetryOutcome.NOT_RETRYABLE)
    transition(job.status, Status.QUEUED, requeue=True)
    row = conn.execute(
        f"""WITH requeued AS (UPDATE jobs SET {_REQUEUE_SET} WHERE id = %(id)s
                              RETURNING {JOB_COLUMNS}),
                 wake AS ({ready_outbox_insert("requeued")})
            SELECT * FROM requeued""",
        {"id": job_id, "topic": topic},
    ).fetchone()
    return RetryResult(_job(row), RetryOutcome.RETRIED)


def jobs_retry_matching(
    conn: psycopg.Connection,
    *,
    statuses: list[str],
    job_type: str | None,
    finished_after: datetime | None,
    finished_before: datetime | None,
    limit: int,
    topic: str,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> int:
    """Bulk retry: up to ``limit`` ``dead``/``cancelled`` jobs matching the filter, oldest
    finish first. Rows another transaction holds are skipped, so two calls never double up.
    Lower bounds are inclusive, upper bounds exclusive."""
    for status in statuses:
        transition(status, Status.QUEUED, requeue=True)
    row = conn.execute(
        f"""WITH picked AS (
                SELECT id FROM jobs
                WHERE status = ANY(%(statuses)s)
                  AND (%(type)s::text IS NULL OR type = %(type)s::text)
                  AND (%(after)s::timestamptz IS NULL OR finished_at >= %(after)s::timestamptz)
                  AND (%(before)s::timestamptz IS NULL OR finished_at < %(before)s::timestamptz)
                  AND (%(c_after)s::timestamptz IS NULL OR created_at >= %(c_after)s::timestamptz)
                  AND (%(c_before)s::timestamptz IS NULL
                       OR created_at < %(c_before)s::timestamptz)
                ORDER BY finished_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
            requeued AS (UPDATE jobs SET {_REQUEUE_SET} FROM picked WHERE jobs.id = picked.id
                         RETURNING jobs.id, jobs.type, jobs.attempt, jobs.ordering_key),
            wake AS ({ready_outbox_insert("requeued")} RETURNING 1)
            SELECT count(*) AS n FROM wake""",
        {
            "statuses": statuses,
            "type": job_type,
            "after": finished_after,
            "before": finished_before,
            "c_after": created_after,
            "c_before": created_before,
            "limit": limit,
            "topic": topic,
        },
    ).fetchone()
    return int(row["n"])
