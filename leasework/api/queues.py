"""The api's check that a submit's queue exists, before the insert: one read per name it has
not seen (the queue table is small and rows are never renamed), so that a submit naming an
unknown queue is its own 422, saying how to create it, and never fails the group commit it
would have shared with other callers' jobs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import tuple_row

from leasework.api.bodies import invalid, json_body
from leasework.api.problems import Problem
from leasework.app import App
from leasework.db import Database
from leasework.errors import FieldError
from leasework.jsonlimits import whole_numbers
from leasework.queue_ops import queues_list, set_concurrency, set_paused
from leasework.queues import DEFAULT, name_error
from leasework.submission import JobRequest

if TYPE_CHECKING:
    from leasework.api.context import ApiContext


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


async def list_queues(ctx: ApiContext) -> dict[str, Any]:
    """``GET /queues``: every queue with its depth, running jobs, oldest waiting job and
    throughput (:func:`leasework.queue_ops.queues_list`)."""
    states = await ctx.db.run(queues_list)
    return {"queues": [s.to_dict() for s in states]}


def no_such_queue(name: str) -> Problem:
    return Problem(
        404,
        "queue-not-found",
        "Queue not found",
        f"no queue is named {name[:120]!r}; GET /queues lists them (leasework queues create "
        "NAME makes one)",
    )


async def _toggle(ctx: ApiContext, name: str, paused: bool) -> dict[str, Any]:
    from leasework.api.context import caller  # (the context module imports this one)

    if name_error(name) is not None:
        raise no_such_queue(name)  # a name no queue can have
    who = caller()
    toggled = await ctx.db.run(lambda conn: set_paused(conn, name, paused, who))
    if toggled.queue is None:
        raise no_such_queue(name)
    return {**toggled.queue.to_dict(), "changed": toggled.changed, "released": toggled.released}


async def pause_queue(ctx: ApiContext, name: str) -> dict[str, Any]:
    """``POST /queues/{name}/pause``: ``changed`` false when it was paused already."""
    return await _toggle(ctx, name, True)


async def resume_queue(ctx: ApiContext, name: str) -> dict[str, Any]:
    """``POST /queues/{name}/resume``: its held jobs due at once."""
    return await _toggle(ctx, name, False)


def concurrency_body(body: Any) -> int | None:
    """The cap a ``PUT /queues/{name}/concurrency`` body sets: ``{"concurrency": n}`` with a
    whole number of at least 1, or null for none."""
    if not isinstance(body, dict) or set(body) != {"concurrency"}:
        raise invalid([FieldError("concurrency", 'send exactly {"concurrency": n or null}')])
    value = whole_numbers(body["concurrency"])  # JSON Schema calls 5.0 an integer
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise invalid([FieldError("concurrency", "a whole number of at least 1, or null")])
    return value


async def set_queue_concurrency(ctx: ApiContext, name: str) -> dict[str, Any]:
    """``PUT /queues/{name}/concurrency``: ``changed`` false when it had that cap already."""
    from leasework.api.context import caller  # (the context module imports this one)

    limit = await json_body(ctx.limits.small, concurrency_body)
    if name_error(name) is not None:
        raise no_such_queue(name)
    who = caller()
    done = await ctx.db.run(lambda conn: set_concurrency(conn, name, limit, who))
    if done.queue is None:
        raise no_such_queue(name)
    return {**done.queue.to_dict(), "changed": done.changed}
