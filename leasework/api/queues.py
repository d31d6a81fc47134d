"""The queues' HTTP handlers: ``GET /queues``, pause and resume, the concurrency cap
(:mod:`leasework.queues.operations` does each change; the console calls the same)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from leasework.api.bodies import invalid, json_body
from leasework.api.problems import Problem
from leasework.errors import FieldError
from leasework.jsonlimits import whole_numbers
from leasework.queues import name_error
from leasework.queues.operations import queues_list, set_concurrency, set_paused

if TYPE_CHECKING:
    from leasework.api.context import ApiContext


async def list_queues(ctx: ApiContext) -> dict[str, Any]:
    """``GET /queues``: every queue with its depth, running jobs, oldest waiting job and
    throughput (:func:`leasework.queues.operations.queues_list`)."""
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
