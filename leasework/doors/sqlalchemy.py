"""The SQLAlchemy doors: a ``Session`` or ``Connection``, an ``AsyncSession`` or
``AsyncConnection``, on any PostgreSQL driver. The statements run through the session's or
connection's own ``execute`` (in its transaction, begun by it if none is: SQLAlchemy 2's
autobegin), and a savepoint is its ``begin_nested()``; an error inside leaves the caller's
transaction for the caller to roll back, as any failed statement of its own would."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from leasework.doors.statements import (
    FENCE_TEXT,
    JOBS_INSERT_TEXT,
    LEASEWORK_HERE_TEXT,
    UNREGISTERED_TEXT,
    checked,
)
from leasework.store import Inserted

INSERT = text(JOBS_INSERT_TEXT)
UNREGISTERED = text(UNREGISTERED_TEXT)
FENCE = text(FENCE_TEXT)
LEASEWORK_HERE = text(LEASEWORK_HERE_TEXT)


def _autocommit(bind: Any) -> bool:
    """Whether a Connection or an Engine runs each statement in AUTOCOMMIT (a Session is
    judged by its engine's options)."""
    level = bind.get_execution_options().get("isolation_level")
    return level == "AUTOCOMMIT" or bind.engine.dialect.isolation_level == "AUTOCOMMIT"


def _fence_row(result: Any) -> tuple[int, str] | None:
    row = result.first()
    return None if row is None else (row[0], row[1])


def _database(url: URL) -> tuple[Any, ...]:
    return ("postgres", url.host, url.port or 5432, url.database)


def sync_door(conn: object) -> SqlAlchemyDoor:
    if isinstance(conn, Session | Connection):
        return SqlAlchemyDoor(conn)
    raise _refused(conn, "enqueue", "Session or Connection", "AsyncSession or AsyncConnection")


def async_door(conn: object) -> AsyncSqlAlchemyDoor:
    if isinstance(conn, AsyncSession | AsyncConnection):
        return AsyncSqlAlchemyDoor(conn)
    raise _refused(
        conn, "enqueue_async", "AsyncSession or AsyncConnection", "Session or Connection"
    )


def _refused(conn: object, door: str, takes: str, other: str) -> TypeError:
    elsewhere = "enqueue" if door == "enqueue_async" else "enqueue_async"
    return TypeError(
        f"leasework.{door} takes a SQLAlchemy {takes} (a {other} goes to "
        f"leasework.{elsewhere}); got {type(conn).__name__}"
    )


class SqlAlchemyDoor:
    def __init__(self, conn: Session | Connection) -> None:
        self.conn = conn

    def database(self) -> tuple[Any, ...]:
        bind = self.conn.get_bind() if isinstance(self.conn, Session) else self.conn
        return _database(bind.engine.url)

    def insert(self, rows: list[dict[str, Any]], topic: str) -> list[Inserted]:
        result = self.conn.execute(INSERT, {"rows": json.dumps(rows), "topic": topic})
        return checked(list(result.mappings()), len(rows))

    def unregistered(self, names: list[str]) -> list[str]:
        return list(self.conn.execute(UNREGISTERED, {"names": names}).scalars())

    @contextmanager
    def _nested(self):
        with self.conn.begin_nested():
            yield

    def savepoint(self) -> AbstractContextManager[None]:
        return self._nested()

    def in_transaction(self) -> bool:
        if isinstance(self.conn, Session):
            return not _autocommit(self.conn.get_bind())
        return not _autocommit(self.conn)

    def is_leasework(self) -> bool:
        return bool(self.conn.execute(LEASEWORK_HERE).scalar())

    def fence_row(self, job_id: str) -> tuple[int, str] | None:
        return _fence_row(self.conn.execute(FENCE, {"job_id": job_id}))


class AsyncSqlAlchemyDoor:
    def __init__(self, conn: AsyncSession | AsyncConnection) -> None:
        self.conn = conn

    def database(self) -> tuple[Any, ...]:
        if isinstance(self.conn, AsyncSession):
            return _database(self.conn.bind.engine.url)
        return _database(self.conn.engine.url)

    async def insert(self, rows: list[dict[str, Any]], topic: str) -> list[Inserted]:
        result = await self.conn.execute(INSERT, {"rows": json.dumps(rows), "topic": topic})
        return checked(list(result.mappings()), len(rows))

    async def unregistered(self, names: list[str]) -> list[str]:
        result = await self.conn.execute(UNREGISTERED, {"names": names})
        return list(result.scalars())

    def savepoint(self) -> AbstractAsyncContextManager[Any]:
        return self.conn.begin_nested()

    def in_transaction(self) -> bool:
        if isinstance(self.conn, AsyncSession):
            return not _autocommit(self.conn.bind.sync_engine)
        return not _autocommit(self.conn.sync_connection)

    async def is_leasework(self) -> bool:
        return bool((await self.conn.execute(LEASEWORK_HERE)).scalar())

    async def fence_row(self, job_id: str) -> tuple[int, str] | None:
        return _fence_row(await self.conn.execute(FENCE, {"job_id": job_id}))
