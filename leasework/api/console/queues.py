"""The console's queues: the list (``/ui/queues``: each queue's waiting, running and held
jobs, its oldest waiting job, its throughput and whether it is paused) and its actions, pause
and resume. Every change is :func:`leasework.queue_ops.set_paused` (the api and the CLI call
the same function, so the doors cannot drift), allowed as the api's twin allows (``cancel``)
and, as every console action, asked twice: a GET shows a confirmation page and changes
nothing, a POST does it and redirects to the list with a notice.

The handlers are plain async functions of the :class:`~.routes.Console` serving the request
(the route table binds them to it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Response, g, redirect, request, url_for

from leasework import operations
from leasework.api.console.errors import ConsoleError
from leasework.queue_ops import QueueState, queues_list, set_paused
from leasework.queues import name_error

if TYPE_CHECKING:
    from leasework.api.console.routes import Console

NOTICES = {
    "paused": "Paused: no job of it starts until it is resumed; its jobs wait.",
    "resumed": "Resumed: workers fetch it again within a second; held jobs are due now.",
    "already-paused": "It was paused already: nothing changed.",
    "already-active": "It was not paused: nothing changed.",
}


def no_such_queue(name: str) -> ConsoleError:
    return ConsoleError(404, "No such queue", f"No queue is named {name[:120]!r}.")


async def queues(console: Console) -> Response:
    """Every queue, by name."""
    states = await console.db.run(queues_list)
    notice = NOTICES.get(request.args.get("notice", ""))
    name = request.args.get("queue", "")
    return await console.page(
        "queues.html",
        nav="queues",
        queues=states,
        notice=notice,
        noticed=name if name_error(name) is None else None,
    )


async def _state(console: Console, name: str) -> QueueState:
    if name_error(name) is not None:
        raise no_such_queue(name)
    found = await console.db.run(lambda conn: queues_list(conn, name))
    if not found:
        raise no_such_queue(name)
    return found[0]


async def _toggle(console: Console, name: str, paused: bool) -> Response:
    """Pause or resume: GET asks, POST does (a pause of a paused queue changes nothing)."""
    action = "pause" if paused else "resume"
    state = await _state(console, name)
    if request.method == "GET":
        return await console.page(
            "confirm.html",
            nav="queues",
            action=f"queue-{action}",
            job=None,
            queue=state,
            post_to=url_for(f"console.queue_{action}", name=name),
            back=url_for("console.queues"),
        )
    actor = operations.Actor(g.session.name, "console")
    done = await console.db.run(lambda conn: set_paused(conn, name, paused, actor))
    if done.queue is None:
        raise no_such_queue(name)
    if done.changed:
        notice = "paused" if paused else "resumed"
    else:
        notice = "already-paused" if paused else "already-active"
    return redirect(url_for("console.queues", notice=notice, queue=name), 303)


async def queue_pause(console: Console, name: str) -> Response:
    return await _toggle(console, name, True)


async def queue_resume(console: Console, name: str) -> Response:
    return await _toggle(console, name, False)
