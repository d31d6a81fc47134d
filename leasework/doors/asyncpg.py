"""The asyncpg door: a ``Connection`` (or a pool's proxy of one). Its ``transaction()``
nested in an open transaction is a savepoint; on a connection with none open it is a
transaction of its own, as enqueue is on an autocommit psycopg connection."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from typing import Any

from leasework.doors.statements import LEASEWORK_HERE_TEXT, checked
from leasework.store import Inserted

INSERT = "SELECT * FROM leasework_jobs_insert($1::jsonb, $2) ORDER BY ord"
UNREGISTERED = """SELECT r.name FROM unnest($1::text[]) AS r(name)
                  WHERE NOT EXISTS (SELECT 1 FROM job_types t WHERE t.name = r.name)"""
FENCE = "SELECT fence, status FROM jobs WHERE id = $1::uuid FOR SHARE"


class AsyncpgDoor:
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def database(self) -> tuple[Any, ...]:
        params = self.conn._params  # (asyncpg keeps the database it connected to here)
        addr = self.conn._addr
        host, port = addr if isinstance(addr, tuple) else (addr, None)
        return ("postgres", host, port, params.database)

    async def insert(self, rows: list[dict[str, Any]], topic: str) -> list[Inserted]:
        return checked(await self.conn.fetch(INSERT, json.dumps(rows), topic), len(rows))

    async def unregistered(self, names: list[str]) -> list[str]:
        return [r[0] for r in await self.conn.fetch(UNREGISTERED, names)]

    def savepoint(self) -> AbstractAsyncContextManager[Any]:
        return self.conn.transaction()

    def in_transaction(self) -> bool:
        return bool(self.conn.is_in_transaction())

    async def is_leasework(self) -> bool:
        return bool(await self.conn.fetchval(LEASEWORK_HERE_TEXT))

    async def fence_row(self, job_id: str) -> tuple[int, str] | None:
        row = await self.conn.fetchrow(FENCE, job_id)
        return None if row is None else (row["fence"], row["status"])
