"""Reading, listing, cancelling and retrying jobs (the queries under :mod:`leasework.operations`
and the api's reads), and :class:`JobFilter`, what the console's jobs page and every bulk retry
select by."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import psycopg

from leasework.job import Job
from leasework.states import RETRYABLE, TERMINAL, Status, transition
from leasework.store.common import JOB_COLUMNS, Row, ready_outbox_insert

# the job timestamps a console filter may bound
TIME_FIELDS = ("created_at", "finished_at")
_FINISHED = ", ".join(f"'{s}'" for s in sorted(TERMINAL))


@dataclass(frozen=True)
class JobFilter:
    """What the console's jobs page and a bulk retry (either door's) select. Times bound
    ``time_field``: ``since`` inclusive, ``until`` exclusive."""

    status: str | None = None
    job_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    time_field: str = "created_at"

    def __post_init__(self) -> None:
        if self.time_field not in TIME_FIELDS:
            raise ValueError(f"time_field must be one of {TIME_FIELDS}, not {self.time_field!r}")

    def where(self) -> tuple[str, dict[str, Any]]:
        """The WHERE clause (never empty: ``true`` at least) and its parameters."""
        clauses = ["true"]
        params: dict[str, Any] = {}
        if self.status is not None:
            clauses.append("status = %(status)s")
            params["status"] = self.status
        if self.job_type is not None:
            clauses.append("type = %(type)s")
            params["type"] = self.job_type
        # time_field is one of TIME_FIELDS (checked above), never user text
        if self.since is not None:
            clauses.append(f"{self.time_field} >= %(since)s")
            params["since"] = self.since
        if self.until is not None:
            clauses.append(f"{self.time_field} < %(until)s")
            params["until"] = self.until
        bounded = self.since is not None or self.until is not None
        if self.time_field == "finished_at" and bounded:
            # what every writer keeps true, said to the planner: only finished jobs have a
            # finish time (so the partial index jobs_finished_idx can serve), and a job
            # finishes after it was created, so a finish before `until` is a creation before
            # it too: the newest-first walk starts at `until`, not at the newest job
            clauses.append(f"status IN ({_FINISHED})")
            if self.until is not None:
                clauses.append("created_at < %(until)s")
        return " AND ".join(clauses), params


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
    DUPLICATE = "duplicate"  # another job holds its unique key now


@dataclass(frozen=True)
class RetryResult:
    job: Job | None
    outcome: RetryOutcome
    holder: uuid.UUID | None = None  # DUPLICATE: the job that holds the key


# the job holding a unique key now (the unique index's predicate, so the index answers)
_HOLDER_SQL = """SELECT id FROM jobs WHERE unique_key = %s AND id <> %s
                  AND leasework_unique_holds(unique_states, status) LIMIT 1"""


def _holder(conn: psycopg.Connection, job: Job) -> uuid.UUID | None:
    row = conn.execute(_HOLDER_SQL, (job.unique_key, job.id)).fetchone()
    return row["id"] if row else None


def job_retry(conn: psycopg.Connection, job_id: uuid.UUID, topic: str) -> RetryResult:
    """Put a ``dead`` or ``cancelled`` job back in the queue with a fresh attempt budget."""
    job = _locked(conn, job_id)
    if job is None:
        return RetryResult(None, RetryOutcome.MISSING)
    if job.status not in RETRYABLE:
        return RetryResult(job, RetryOutcome.NOT_RETRYABLE)
    transition(job.status, Status.QUEUED, requeue=True)
    # a unique job re-enters its key's states: refused while another job holds the key (a
    # holder inserted since this check makes the update fail on the index: the same answer)
    if job.unique_key is not None and (holder := _holder(conn, job)) is not None:
        return RetryResult(job, RetryOutcome.DUPLICATE, holder)
    try:
        with conn.transaction():
            row = conn.execute(
                f"""WITH requeued AS (UPDATE jobs SET {_REQUEUE_SET} WHERE id = %(id)s
                                      RETURNING {JOB_COLUMNS}),
                         wake AS ({ready_outbox_insert("requeued")})
                    SELECT * FROM requeued""",
                {"id": job_id, "topic": topic},
            ).fetchone()
    except psycopg.errors.UniqueViolation:
        return RetryResult(job, RetryOutcome.DUPLICATE, _holder(conn, job))
    return RetryResult(_job(row), RetryOutcome.RETRIED)


def jobs_retry_matching(
    conn: psycopg.Connection, job_filter: JobFilter, *, limit: int, topic: str
) -> int:
    """Bulk retry: up to ``limit`` jobs ``job_filter`` selects (its status ``dead`` or
    ``cancelled``), oldest finish first, each put back in the queue as :func:`job_retry` does.
    Rows another transaction holds are skipped, so two calls never double up; so is a unique
    job whose key another job holds, and all but one of the selected jobs sharing a key. The
    WHERE clause is the filter's own, the one the console's page and count use."""
    if job_filter.status is None:
        raise ValueError("a bulk retry needs a status (dead or cancelled)")
    transition(job_filter.status, Status.QUEUED, requeue=True)
    where, params = job_filter.where()
    row = conn.execute(
        f"""WITH picked AS (
                SELECT id, unique_key FROM jobs WHERE {where}
                  AND (unique_key IS NULL OR NOT EXISTS (
                      SELECT 1 FROM jobs h WHERE h.unique_key = jobs.unique_key
                        AND leasework_unique_holds(h.unique_states, h.status)))
                ORDER BY finished_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
            chosen AS (SELECT DISTINCT ON (coalesce(unique_key, uuid_send(id))) id FROM picked),
            requeued AS (UPDATE jobs SET {_REQUEUE_SET} FROM chosen WHERE jobs.id = chosen.id
                         RETURNING jobs.id, jobs.type, jobs.attempt, jobs.ordering_key,
                                   jobs.queue, jobs.priority),
            wake AS ({ready_outbox_insert("requeued")} RETURNING 1)
            SELECT count(*) AS n FROM wake""",
        {**params, "limit": limit, "topic": topic},
    ).fetchone()
    return int(row["n"])
