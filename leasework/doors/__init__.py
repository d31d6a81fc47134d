"""The doors an application enqueues through: the database layer it already holds, in the
transaction it already has open (:mod:`leasework.enqueue` says what enqueue does).

Every door runs the same two statements, through the framework's own execute (so the
framework sees any error and rolls its own block back): the insert, ``SELECT * FROM
leasework_jobs_insert(rows, topic)``, and, for an enqueue without ``app=``, the check that
the types are registered. A savepoint, where one is needed (a batch with idempotency keys),
is the framework's own: ``begin_nested()`` in SQLAlchemy, a nested ``transaction()`` in
asyncpg, ``SAVEPOINT`` statements on psycopg.

- sync (:func:`sync_door`): a psycopg ``Connection``; a SQLAlchemy ``Session`` or
  ``Connection`` (any PostgreSQL driver: psycopg, psycopg2, pg8000); a Django connection;
- async (:func:`async_door`): a psycopg ``AsyncConnection``; a SQLAlchemy ``AsyncSession`` or
  ``AsyncConnection`` (asyncpg or psycopg); an asyncpg ``Connection``.

A door is recognised by its class's module, so SQLAlchemy, asyncpg and Django are imported
only by the applications that hand one in (none is a dependency of leasework's).

The same doors confirm a handler's fence in the caller's own transaction
(:func:`confirm_fence`): the last statement before its commit locks the job's row (``FOR
SHARE``: a new claim or the reaper waits for the commit) and refuses the transaction unless
the attempt still holds the job, so an effect written through the caller's own ORM commits
only while its attempt's fence holds.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol

from leasework.doors.statements import Inserted
from leasework.errors import FenceUnavailable, StaleFence


class SyncDoor(Protocol):
    """What enqueue needs of a caller's synchronous connection."""

    def database(self) -> tuple[Any, ...]:
        """The database it reaches (the key of the registered types seen)."""

    def insert(self, rows: list[dict[str, Any]], topic: str) -> list[Inserted]: ...

    def unregistered(self, names: list[str]) -> list[str]: ...

    def savepoint(self) -> AbstractContextManager[None]: ...

    def in_transaction(self) -> bool:
        """Whether a statement now runs inside a transaction the caller commits later."""

    def is_leasework(self) -> bool:
        """Whether the database holds leasework's tables."""

    def fence_row(self, job_id: str) -> tuple[int, str] | None:
        """The job's (fence, status), its row locked ``FOR SHARE`` (None: no such job)."""


class AsyncDoor(Protocol):
    """What enqueue needs of a caller's asyncio connection."""

    def database(self) -> tuple[Any, ...]: ...

    async def insert(self, rows: list[dict[str, Any]], topic: str) -> list[Inserted]: ...

    async def unregistered(self, names: list[str]) -> list[str]: ...

    def savepoint(self) -> AbstractAsyncContextManager[None]: ...

    def in_transaction(self) -> bool: ...

    async def is_leasework(self) -> bool: ...

    async def fence_row(self, job_id: str) -> tuple[int, str] | None: ...


def _module(conn: object) -> str:
    return type(conn).__module__


def sync_door(conn: object) -> SyncDoor:
    """The door of ``conn``, or a TypeError naming the doors there are."""
    import psycopg

    if isinstance(conn, psycopg.Connection):
        from leasework.doors.psycopg import PsycopgDoor

        return PsycopgDoor(conn)
    if _module(conn).startswith("sqlalchemy."):
        from leasework.doors.sqlalchemy import sync_door as sqlalchemy_door

        return sqlalchemy_door(conn)
    if _module(conn).startswith("django."):
        from leasework.doors.django import DjangoDoor

        return DjangoDoor(conn)
    if isinstance(conn, psycopg.AsyncConnection) or _module(conn).startswith("asyncpg."):
        raise TypeError(
            f"{type(conn).__name__} is an asyncio connection: use leasework.enqueue_async "
            "(or enqueue_many_async)"
        )
    raise TypeError(
        "leasework.enqueue takes a psycopg Connection, a SQLAlchemy Session or Connection, or a "
        f"Django connection; got {type(conn).__module__}.{type(conn).__name__}"
    )


def async_door(conn: object) -> AsyncDoor:
    """The asyncio door of ``conn``, or a TypeError naming the doors there are."""
    import psycopg

    if isinstance(conn, psycopg.AsyncConnection):
        from leasework.doors.psycopg import AsyncPsycopgDoor

        return AsyncPsycopgDoor(conn)
    module = _module(conn)
    if module.startswith("sqlalchemy."):
        from leasework.doors.sqlalchemy import async_door as sqlalchemy_door

        return sqlalchemy_door(conn)
    if module.startswith("asyncpg."):
        from leasework.doors.asyncpg import AsyncpgDoor

        return AsyncpgDoor(conn)
    if isinstance(conn, psycopg.Connection) or module.startswith("django."):
        raise TypeError(
            f"{type(conn).__name__} is synchronous: use leasework.enqueue (from async Django "
            "code, through asgiref's sync_to_async, as Django's own ORM calls are)"
        )
    raise TypeError(
        "leasework.enqueue_async takes a psycopg AsyncConnection, a SQLAlchemy AsyncSession or "
        f"AsyncConnection, or an asyncpg Connection; got {module}.{type(conn).__name__}"
    )


# databases seen to hold leasework's tables (a database does not lose them while it runs)
_LEASEWORK: set[tuple[Any, ...]] = set()


def _not_here(door: SyncDoor | AsyncDoor) -> FenceUnavailable:
    return FenceUnavailable(
        f"the fence is confirmed in leasework's own database, and this connection reaches "
        f"{door.database()[1:]}, which has no leasework tables: send the fence to the "
        "service that owns that database instead (ctx.fence_headers(), leasework.downstream)"
    )


def _outside() -> FenceUnavailable:
    return FenceUnavailable(
        "confirm the fence inside the transaction that writes the effect, as its last "
        "statement: outside one (autocommit) the lock would end at once and the effect could "
        "commit after a newer attempt took the job (Django: inside transaction.atomic(); "
        "SQLAlchemy: a Session or Connection not in AUTOCOMMIT; psycopg: autocommit off)"
    )


def _judge(job_id: uuid.UUID, fence: int, row: tuple[int, str] | None) -> None:
    if row is None:
        raise StaleFence(job_id, fence, None, detail=f"stale fence: job {job_id} is not there")
    held, status = row
    if held != fence or status != "running":
        raise StaleFence(
            job_id,
            fence,
            held,
            detail=f"stale fence: job {job_id} is {status} under fence {held}; this attempt's "
            f"fence is {fence} (a newer attempt, or the reaper, took the job): the transaction "
            "is refused",
        )


def confirm_fence(conn: object, job_id: uuid.UUID, fence: int, *, rehearsal: bool = False) -> None:
    """Lock job ``job_id``'s row in ``conn``'s open transaction until it ends and raise
    :class:`StaleFence` unless attempt ``fence`` still holds the job; run it as the
    transaction's last statement (its lock holds off the job's next claim and its lease
    renewals until the commit). :class:`FenceUnavailable` outside a transaction or in a
    database without leasework's tables. A ``rehearsal`` (:mod:`leasework.testing`'s attempt,
    whose job has no row) checks the transaction and the database only."""
    door = sync_door(conn)
    if not door.in_transaction():
        raise _outside()
    if door.database() not in _LEASEWORK:
        if not door.is_leasework():
            raise _not_here(door)
        _LEASEWORK.add(door.database())
    if not rehearsal:
        _judge(job_id, fence, door.fence_row(str(job_id)))


async def confirm_fence_async(
    conn: object, job_id: uuid.UUID, fence: int, *, rehearsal: bool = False
) -> None:
    """:func:`confirm_fence` on an asyncio connection (the async doors')."""
    door = async_door(conn)
    if not door.in_transaction():
        raise _outside()
    if door.database() not in _LEASEWORK:
        if not await door.is_leasework():
            raise _not_here(door)
        _LEASEWORK.add(door.database())
    if not rehearsal:
        _judge(job_id, fence, await door.fence_row(str(job_id)))


__all__ = [
    "AsyncDoor",
    "SyncDoor",
    "async_door",
    "confirm_fence",
    "confirm_fence_async",
    "sync_door",
]
