"""The psycopg doors: a ``Connection`` and an ``AsyncConnection``, the store's own statements
(a prepared insert, ``SAVEPOINT`` by hand: psycopg's ``transaction()`` would commit a
transaction it opened, which is not "inside the caller's")."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from leasework import store
from leasework.db import savepoint, savepoint_async
from leasework.doors.statements import FENCE_TEXT, LEASEWORK_HERE_TEXT
from leasework.store import Inserted

SAVEPOINT = "leasework_enqueue"
UNREGISTERED_SQL = """SELECT r.name FROM unnest(%s::text[]) AS r(name)
                      WHERE NOT EXISTS (SELECT 1 FROM job_types t WHERE t.name = r.name)"""
FENCE_SQL = FENCE_TEXT.replace(":job_id", "%s")


def _database(conn: psycopg.Connection | psycopg.AsyncConnection) -> tuple[Any, ...]:
    info = conn.info
    return ("postgres", info.host, info.port, info.dbname)


class PsycopgDoor:
    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def database(self) -> tuple[Any, ...]:
        return _database(self.conn)

    def insert(self, rows: list[dict[str, Any]], topic: str) -> list[Inserted]:
        return store.jobs_insert(self.conn, rows, topic)

    def unregistered(self, names: list[str]) -> list[str]:
        with self.conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(UNREGISTERED_SQL, (names,))
            return [r[0] for r in cur.fetchall()]

    def savepoint(self) -> AbstractContextManager[None]:
        return savepoint(self.conn, SAVEPOINT)

    def in_transaction(self) -> bool:
        return not self.conn.autocommit

    def is_leasework(self) -> bool:
        with self.conn.cursor(row_factory=tuple_row) as cur:
            return bool(cur.execute(LEASEWORK_HERE_TEXT).fetchone()[0])  # type: ignore[index]

    def fence_row(self, job_id: str) -> tuple[int, str] | None:
        with self.conn.cursor(row_factory=tuple_row) as cur:
            return cur.execute(FENCE_SQL, (job_id,)).fetchone()


class AsyncPsycopgDoor:
    def __init__(self, conn: psycopg.AsyncConnection) -> None:
        self.conn = conn

    def database(self) -> tuple[Any, ...]:
        return _database(self.conn)

    async def insert(self, rows: list[dict[str, Any]], topic: str) -> list[Inserted]:
        return await store.jobs_insert_async(self.conn, rows, topic)

    async def unregistered(self, names: list[str]) -> list[str]:
        async with self.conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(UNREGISTERED_SQL, (names,))
            return [r[0] for r in await cur.fetchall()]

    def savepoint(self) -> AbstractAsyncContextManager[None]:
        return savepoint_async(self.conn, SAVEPOINT)

    def in_transaction(self) -> bool:
        return not self.conn.autocommit

    async def is_leasework(self) -> bool:
        async with self.conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(LEASEWORK_HERE_TEXT)
            return bool((await cur.fetchone())[0])  # type: ignore[index]

    async def fence_row(self, job_id: str) -> tuple[int, str] | None:
        async with self.conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(FENCE_SQL, (job_id,))
            return await cur.fetchone()
