"""The operator console's reads: counts by type and status, filtered keyset pages of jobs, a
job's attempts and fence rejections, the jobs running now with their leases, and the job
types to filter by. Every function returns typed records. The filter they take,
:class:`~leasework.store.jobs.JobFilter`, is the bulk retry's too, so it lives beside that
query in :mod:`leasework.store.jobs`; the console's actions go through
:mod:`leasework.operations` (cancel, retry, bulk retry, each with its audit row)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import psycopg

from leasework.job import Job
from leasework.states import Status
from leasework.store.common import JOB_COLUMNS
from leasework.store.jobs import JobFilter


def jobs_page(
    conn: psycopg.Connection,
    job_filter: JobFilter,
    *,
    before: tuple[datetime, uuid.UUID] | None,
    limit: int,
) -> list[Job]:
    """Newest first, keyset on (created_at, id): ``before`` is the last row of the previous
    page. Ask for one more than a page to know whether another follows."""
    where, params = job_filter.where()
    if before is not None:
        where += " AND (created_at, id) < (%(before_at)s, %(before_id)s)"
        params.update(before_at=before[0], before_id=before[1])
    rows = conn.execute(
        f"""SELECT {JOB_COLUMNS} FROM jobs WHERE {where}
            ORDER BY created_at DESC, id DESC LIMIT %(limit)s""",
        {**params, "limit": limit},
    ).fetchall()
    return [Job.from_row(r) for r in rows]


def jobs_count(conn: psycopg.Connection, job_filter: JobFilter, *, up_to: int) -> int:
    """How many jobs match, counted up to ``up_to`` (what a bulk retry's confirmation shows)."""
    where, params = job_filter.where()
    row = conn.execute(
        f"SELECT count(*) AS n FROM (SELECT 1 FROM jobs WHERE {where} LIMIT %(up_to)s) AS m",
        {**params, "up_to": up_to},
    ).fetchone()
    return int(row["n"])


# the overview counts each (type, status) cell up to this many jobs, so its read is bounded
# whatever the size of the table; a cell that reaches it shows as "10000+" (AtLeast)
COUNT_CAP = 10_000


class AtLeast(int):
    """A count known only to be at least this much: a cell of the overview that reached
    :data:`COUNT_CAP`. It prints as ``10000+``, and a sum it is part of stays one."""

    def __str__(self) -> str:
        return f"{int(self)}+"

    def __repr__(self) -> str:
        return f"AtLeast({int(self)})"

    def __add__(self, other: object) -> AtLeast:
        if not isinstance(other, int):
            return NotImplemented
        return AtLeast(int(self) + int(other))

    __radd__ = __add__


@dataclass(frozen=True)
class TypeCounts:
    """Jobs of one type by status (a status with no job is absent); a count that reached the
    cap is an :class:`AtLeast`, and so is the total then."""

    job_type: str
    by_status: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


def job_counts(conn: psycopg.Connection, *, cap: int = COUNT_CAP) -> list[TypeCounts]:
    """Every job type's count per status, by type name, each counted up to ``cap``.

    Not ``GROUP BY type, status``: that reads the whole table (a million rows: a parallel
    sequential scan of 100-150 ms, and growing with it). The types are found by skipping
    through jobs_type_created_idx (one descent per type, unregistered ones included), then
    each (type, status) cell counts at most ``cap`` entries of jobs_type_status_created_idx:
    exact below the cap, an :class:`AtLeast` at it, and never more than types x statuses x
    ``cap`` index entries read."""
    # the planner costs the cells as if each held `cap` rows, which passes jit_above_cost;
    # compiling would take longer (about 100 ms) than the count itself
    conn.execute("SET LOCAL jit = off")
    rows = conn.execute(
        """WITH RECURSIVE types(type) AS (
               (SELECT type FROM jobs ORDER BY type LIMIT 1)
               UNION ALL
               SELECT (SELECT j.type FROM jobs j WHERE j.type > t.type ORDER BY j.type LIMIT 1)
               FROM types t WHERE t.type IS NOT NULL)
           SELECT t.type, s.status, c.n
           FROM types t CROSS JOIN unnest(%(statuses)s::text[]) AS s(status)
           CROSS JOIN LATERAL (
               SELECT count(*) AS n FROM (
                   SELECT 1 FROM jobs j WHERE j.type = t.type AND j.status = s.status
                   LIMIT %(cap)s) AS cell) AS c
           WHERE t.type IS NOT NULL AND c.n > 0
           ORDER BY t.type""",
        {"statuses": [str(s) for s in Status], "cap": cap},
    ).fetchall()
    counts: dict[str, dict[str, int]] = {}
    for r in rows:
        n = int(r["n"])
        counts.setdefault(r["type"], {})[r["status"]] = AtLeast(n) if n >= cap else n
    return [TypeCounts(t, by_status) for t, by_status in counts.items()]


@dataclass(frozen=True)
class Attempt:
    attempt: int
    worker: str
    fence: int
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None  # None: still running, or its worker died (the reaper closes it)
    error: str | None


def attempts_of(conn: psycopg.Connection, job_id: uuid.UUID) -> list[Attempt]:
    rows = conn.execute(
        """SELECT attempt, worker, fence, started_at, finished_at, outcome, error
           FROM attempts WHERE job_id = %s ORDER BY attempt, id""",
        (job_id,),
    ).fetchall()
    return [Attempt(**r) for r in rows]


@dataclass(frozen=True)
class FenceRejection:
    fence: int
    worker: str
    outcome: str  # what the stale attempt would have written
    at: datetime


def fence_rejections_of(conn: psycopg.Connection, job_id: uuid.UUID) -> list[FenceRejection]:
    rows = conn.execute(
        """SELECT fence, worker, outcome, at FROM fence_rejections
           WHERE job_id = %s ORDER BY at, id""",
        (job_id,),
    ).fetchall()
    return [FenceRejection(**r) for r in rows]


@dataclass(frozen=True)
class RunningJob:
    id: uuid.UUID
    type: str
    attempt: int
    fence: int
    worker: str | None  # lease_owner
    started_at: datetime | None
    lease_expires_at: datetime | None  # what the last heartbeat wrote (the reaper reads it)
    lease_left: float | None  # seconds until lease_expires_at, by the database's clock
    cancel_requested: bool


def jobs_running(conn: psycopg.Connection, *, limit: int) -> list[RunningJob]:
    """Running jobs by worker, oldest start first, with their leases as Postgres knows them."""
    rows = conn.execute(
        """SELECT id, type, attempt, fence, lease_owner AS worker, started_at, lease_expires_at,
                  extract(epoch FROM lease_expires_at - now())::float8 AS lease_left,
                  cancel_requested
           FROM jobs WHERE status = 'running'
           ORDER BY lease_owner, started_at, id LIMIT %s""",
        (limit,),
    ).fetchall()
    return [RunningJob(**r) for r in rows]


def job_type_names(conn: psycopg.Connection) -> list[str]:
    """The registered job types (what the jobs page's type filter offers)."""
    return [r["name"] for r in conn.execute("SELECT name FROM job_types ORDER BY name")]
