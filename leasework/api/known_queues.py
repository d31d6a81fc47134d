"""The api's check that a submit's queue exists, before the insert: one read per name it has
not seen (the queue table is small and rows are never renamed), so that a submit naming an
unknown queue is its own 422, saying how to create it, and never fails the group commit it
would have shared with other callers' jobs."""

from __future__ import annotations

from collections.abc import Iterable

import psycopg
from psycopg.rows import tuple_row

from leasework.api.problems import Problem
from leasework.app import App
from leasework.db import Database
from leasework.queues import DEFAULT
from leasework.submission import JobRequest


def queue_of(request: JobRequest, app: App | None) -> str:
    """The queue ``request`` goes to: its own, else its type's, else ``default``."""
    if request.queue is not None:
        return request.queue
    job_type = app.get(request.type) if app is not None else None
    return (job_type.queue if job_type is not None else None) or DEFAULT


class KnownQueues:
    """The queue names this api has seen exist (a queue is never deleted while jobs use it:
    nothing deletes queues yet)."""

    def __init__(self) -> None:
        self._known: set[str] = {DEFAULT}

    async def check(self, db: Database, names: Iterable[str], *, batch: bool = False) -> None:
        """Raise a 422 naming the first of ``names`` that is no queue."""
        unseen = sorted(set(names) - self._known)
        if not unseen:
            return

        def read(conn: psycopg.Connection) -> set[str]:
            with conn.cursor(row_factory=tuple_row) as cur:
                cur.execute("SELECT name FROM queues WHERE name = ANY(%s)", (unseen,))
                return {r[0] for r in cur.fetchall()}

        found = await db.read(read)
        self._known |= found
        missing = [n for n in unseen if n not in found]
        if missing:
            raise Problem(
                422,
                "unknown-queue",
                "Unknown queue",
                f"queue {missing[0]!r} does not exist; create it (leasework queues create "
                f"{missing[0]}) or leave queue out for the type's queue; nothing was "
                + ("written (the whole batch)" if batch else "written"),
                queue=missing[0],
            )
