"""Submit: every door's insert (``leasework_jobs_insert``) and the job-type registry."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from leasework.states import Status
from leasework.store.common import Row, one_round_trip


@dataclass(frozen=True)
class Inserted:
    """What became of one request of an insert: its job, and whether an earlier request with
    the same idempotency key made it (``replay``) or differed from it (``conflict``), or a job
    holding the same unique key is it (``duplicate``: the holder; nothing was written for a
    conflict or a duplicate). ``unique_key`` is the job's key (None: it asked for none)."""

    ord: int
    id: uuid.UUID
    status: Status
    run_at: datetime
    created_at: datetime
    max_attempts: int
    timeout_seconds: int
    replay: bool
    conflict: bool
    duplicate: bool = False
    unique_key: bytes | None = None

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
            duplicate=row["duplicate"],
            unique_key=row["unique_key"],
        )


JOBS_INSERT = "SELECT * FROM leasework_jobs_insert(%s, %s) ORDER BY ord"


@dataclass(frozen=True)
class EncodedRows:
    """Rows of :func:`jobs_insert` already encoded as one JSON array (the api encodes a large
    batch in the thread that decoded it, so no big object graph outlives that thread)."""

    text: str
    count: int

    def __len__(self) -> int:
        return self.count


def _as_jsonb(rows: list[dict[str, Any]] | EncodedRows) -> Jsonb:
    if isinstance(rows, EncodedRows):
        return Jsonb(rows.text, dumps=lambda text: text)
    return Jsonb(rows)


def _inserted(rows: list[Row], expected: int) -> list[Inserted]:
    found = [Inserted.from_row(r) for r in rows]
    if len(found) != expected:
        raise RuntimeError(f"leasework_jobs_insert answered {len(found)} rows for {expected}")
    return found


def jobs_insert(
    conn: psycopg.Connection, rows: list[dict[str, Any]] | EncodedRows, topic: str
) -> list[Inserted]:
    """Insert the jobs of ``rows`` (see :func:`leasework.submission.insert_row`) and the
    outbox rows of those due now, in one statement, on any connection (the caller's own too:
    the statement runs in whatever transaction the connection is in)."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(JOBS_INSERT, (_as_jsonb(rows), topic))
        return _inserted(cur.fetchall(), len(rows))


def jobs_insert_begun(
    conn: psycopg.Connection, rows: list[dict[str, Any]] | EncodedRows, topic: str
) -> list[Inserted]:
    """:func:`jobs_insert` on an autocommit connection, ``BEGIN`` sent in the same round trip
    (:func:`one_round_trip`), the transaction left open for :meth:`Database.run_begun` to
    commit: the api's inserts, one round trip fewer than psycopg's own transaction."""
    cur = conn.cursor(row_factory=dict_row)
    with one_round_trip(conn, commit=False):
        cur.execute(JOBS_INSERT, (_as_jsonb(rows), topic), prepare=True)
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
                                       retry_base, retry_cap, description, unique_policy,
                                       queue, concurrency, rate, priority, registered_by)
           SELECT r.name, coalesce(r.payload_schema, '{}'::jsonb), r.max_attempts,
                  r.timeout_seconds, r.retry_base, r.retry_cap, r.description, r.unique_policy,
                  r.queue, r.concurrency, r.rate, r.priority, %s
           FROM jsonb_to_recordset(%s) AS r(name text, payload_schema jsonb, max_attempts int,
                timeout_seconds int, retry_base float8, retry_cap float8, description text,
                unique_policy jsonb, queue text, concurrency jsonb, rate jsonb,
                priority smallint)
           ON CONFLICT (name) DO UPDATE SET
               payload_schema = excluded.payload_schema, max_attempts = excluded.max_attempts,
               timeout_seconds = excluded.timeout_seconds, retry_base = excluded.retry_base,
               retry_cap = excluded.retry_cap, description = excluded.description,
               unique_policy = excluded.unique_policy, queue = excluded.queue,
               concurrency = excluded.concurrency, rate = excluded.rate,
               priority = excluded.priority, registered_by = excluded.registered_by,
               registered_at = now()""",
        (registered_by, Jsonb(types)),
    )
