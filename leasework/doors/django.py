"""The Django door: a database connection of Django's (``django.db.connection`` or
``connections[alias]``, on psycopg 3 or psycopg2). The statements run on its own cursor, in
its transaction: inside ``transaction.atomic()`` the job commits or rolls back with the
block, an error inside marks the block for rollback as any failed query of its own would;
outside one (Django's autocommit), the insert is a transaction of its own. A savepoint is
a nested ``atomic()``."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from typing import Any

from django.db import connections, transaction

from leasework.doors.statements import (
    FENCE_TEXT,
    JOBS_INSERT_TEXT,
    LEASEWORK_HERE_TEXT,
    UNREGISTERED_TEXT,
    checked,
)
from leasework.store import Inserted


def _pyformat(sql: str) -> str:
    """The doors' named placeholders (``:rows``) as Django's cursor takes them (``%s``)."""
    for name in (":rows", ":topic", ":names", ":job_id"):
        sql = sql.replace(name, "%s")
    return sql


INSERT = _pyformat(JOBS_INSERT_TEXT)
UNREGISTERED = _pyformat(UNREGISTERED_TEXT)
FENCE = _pyformat(FENCE_TEXT)


def wrapper(conn: Any) -> Any:
    """The ``DatabaseWrapper`` of ``conn`` (``django.db.connection`` is a proxy of the
    default one)."""
    alias = getattr(conn, "_alias", None)  # django.utils.connection.ConnectionProxy
    return connections[alias] if alias is not None else conn


class DjangoDoor:
    def __init__(self, conn: Any) -> None:
        self.conn = wrapper(conn)
        if self.conn.vendor != "postgresql":
            raise TypeError(
                f"leasework enqueues into PostgreSQL; Django's {self.conn.alias!r} database is "
                f"{self.conn.vendor}"
            )

    def database(self) -> tuple[Any, ...]:
        params = self.conn.settings_dict
        return ("postgres", params.get("HOST") or None, params.get("PORT") or 5432, params["NAME"])

    def _rows(self, sql: str, params: list[Any]) -> list[dict[str, Any]]:
        with self.conn.cursor() as cursor:
            cursor.execute(sql, params)
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def insert(self, rows: list[dict[str, Any]], topic: str) -> list[Inserted]:
        return checked(self._rows(INSERT, [json.dumps(rows), topic]), len(rows))

    def unregistered(self, names: list[str]) -> list[str]:
        return [r["name"] for r in self._rows(UNREGISTERED, [names])]

    def savepoint(self) -> AbstractContextManager[Any]:
        return transaction.atomic(using=self.conn.alias)

    def in_transaction(self) -> bool:
        return bool(self.conn.in_atomic_block)

    def fence_row(self, job_id: str) -> tuple[int, str] | None:
        found = self._rows(FENCE, [job_id])
        return (found[0]["fence"], found[0]["status"]) if found else None

    def is_leasework(self) -> bool:
        return bool(self._rows(LEASEWORK_HERE_TEXT, [])[0]["here"])
