"""The doors an application enqueues through: the database layer it already holds, in the
transaction it already has open (:mod:`leasework.enqueue` says what enqueue does).

Every door runs the same two statements, through the framework's own execute (so the
framework sees any error and rolls its own block back): the insert, ``SELECT * FROM
leasework_jobs_insert(rows, topic)``, and, for an enqueue without ``app=``, the check that
the types are registered. A savepoint, where one is needed (a batch with idempotency keys),
is the framework's own: ``begin_nested()`` in SQLAlchemy, a nested ``transaction()`` in
asyncpg, ``SAVEPOINT`` statements on psycopg.

- sync (:func:`sync_door`): a psycopg ``Connection``; a SQLAlchemy ``Session`` or
  ``Connection`` (any PostgreSQL driver: psycopg, psycopg2, pg8000);
- async (:func:`async_door`): a psycopg ``AsyncConnection``; a SQLAlchemy ``AsyncSession`` or
  ``AsyncConnection`` (asyncpg or psycopg); an asyncpg ``Connection``.

A door is recognised by its class's module, so SQLAlchemy and asyncpg are imported only by
the applications that hand one in (neither is a dependency of leasework's).
"""

from __future__ import annotations

import uuid
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Protocol

from leasework.store import Inserted

JOBS_INSERT_TEXT = "SELECT * FROM leasework_jobs_insert(CAST(:rows AS jsonb), :topic) ORDER BY ord"
UNREGISTERED_TEXT = """SELECT r.name FROM unnest(CAST(:names AS text[])) AS r(name)
                       WHERE NOT EXISTS (SELECT 1 FROM job_types t WHERE t.name = r.name)"""


class SyncDoor(Protocol):
    """What enqueue needs of a caller's synchronous connection."""

    def database(self) -> tuple[Any, ...]:
        """The database it reaches (the key of the registered types seen)."""

    def insert(self, rows: list[dict[str, Any]], topic: str) -> list[Inserted]: ...

    def unregistered(self, names: list[str]) -> list[str]: ...

    def savepoint(self) -> AbstractContextManager[None]: ...


class AsyncDoor(Protocol):
    """What enqueue needs of a caller's asyncio connection."""

    def database(self) -> tuple[Any, ...]: ...

    async def insert(self, rows: list[dict[str, Any]], topic: str) -> list[Inserted]: ...

    async def unregistered(self, names: list[str]) -> list[str]: ...

    def savepoint(self) -> AbstractAsyncContextManager[None]: ...


def inserted(row: Any) -> Inserted:
    """An insert's row as any driver returns it (psycopg2 gives a uuid as text and bytea as
    a memoryview; asyncpg gives a Record)."""
    values = dict(row)
    if not isinstance(values["id"], uuid.UUID):
        values["id"] = uuid.UUID(str(values["id"]))
    if values.get("unique_key") is not None:
        values["unique_key"] = bytes(values["unique_key"])
    return Inserted.from_row(values)


def checked(rows: list[Any], expected: int) -> list[Inserted]:
    found = [inserted(r) for r in rows]
    if len(found) != expected:
        raise RuntimeError(f"leasework_jobs_insert answered {len(found)} rows for {expected}")
    return found


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
    if isinstance(conn, psycopg.AsyncConnection) or _module(conn).startswith("asyncpg."):
        raise TypeError(
            f"{type(conn).__name__} is an asyncio connection: use leasework.enqueue_async "
            "(or enqueue_many_async)"
        )
    raise TypeError(
        "leasework.enqueue takes a psycopg Connection, or a SQLAlchemy Session or Connection; "
        f"got {type(conn).__module__}.{type(conn).__name__}"
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
    if isinstance(conn, psycopg.Connection):
        raise TypeError("a psycopg Connection is synchronous: use leasework.enqueue")
    raise TypeError(
        "leasework.enqueue_async takes a psycopg AsyncConnection, a SQLAlchemy AsyncSession or "
        f"AsyncConnection, or an asyncpg Connection; got {module}.{type(conn).__name__}"
    )


__all__ = ["AsyncDoor", "SyncDoor", "async_door", "sync_door"]
