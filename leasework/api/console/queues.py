"""The console's queues: the list (``/ui/queues``: each queue's waiting, running and held
jobs, its oldest waiting job, its throughput and whether it is paused) and its actions, pause
and resume, and its cap (concurrency across all workers). Every change is
:func:`leasework.queues.operations.set_paused` or
:func:`~leasework.queues.operations.set_concurrency` (the
api and the CLI call the same functions, so the doors cannot drift), allowed as the api's
twin allows (``cancel``) and, as every console action, asked twice: a GET shows a
confirmation page (for a cap, its form) and changes nothing, a POST does it and redirects to
the list with a notice.

The handlers are plain async functions of the :class:`~.routes.Console` serving the request
(the route table binds them to it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Response, g, redirect, request, url_for

from leasework import operations
from leasework.api.console.errors import ConsoleError
from leasework.queues import name_error
from leasework.queues.operations import QueueState, queues_list, set_concurrency, set_paused

if TYPE_CHECKING:
    from leasework.api.console.routes import Console

NOTICES = {
    "paused": "Paused: no job of it starts until it is resumed; its jobs wait.",
    "resumed": "Resumed: workers fetch it again within a second; held jobs are due now.",
    "already-paused": "It was paused already: nothing changed.",
    "already-active": "It was not paused: nothing changed.",
    "capped": "Capped: no more of its jobs than that run at once; the rest wait, held.",
    "uncapped": "Its cap is lifted: held jobs are released as workers take them.",
    "cap-unchanged": "It had that cap already: nothing changed.",
}
CAP_RULE = "a whole number of at least 1, or empty for no cap"


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


def parse_cap(raw: str) -> int | None | str:
    """The cap a form's ``concurrency`` field sets (None: none), or why it sets none."""
    text = raw.strip()
    if text == "" or text.lower() == "none":
        return None
    if not text.isdigit() or int(text) < 1 or len(text) > 9:
        return f"The cap must be {CAP_RULE}; got {text[:40]!r}."
    return int(text)


async def queue_concurrency(console: Console, name: str) -> Response:
    """A queue's cap: GET shows its form, POST sets it (empty lifts it)."""
    state = await _state(console, name)
    error = None
    if request.method == "POST":
        form = await request.form
        cap = parse_cap(form.get("concurrency", ""))
        if not isinstance(cap, str):
            actor = operations.Actor(g.session.name, "console")
            done = await console.db.run(lambda conn: set_concurrency(conn, name, cap, actor))
            if done.queue is None:
                raise no_such_queue(name)
            notice = "cap-unchanged" if not done.changed else "capped" if cap else "uncapped"
            return redirect(url_for("console.queues", notice=notice, queue=name), 303)
        error = cap
    page = await console.page(
        "queue_cap.html",
        nav="queues",
        queue=state,
        error=error,
        rule=CAP_RULE,
        post_to=url_for("console.queue_concurrency", name=name),
        back=url_for("console.queues"),
    )
    return (page, 422) if error else page
