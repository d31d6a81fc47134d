"""The api as an ASGI app, built from the route table (:data:`leasework.api.routes.ROUTES`).

The guard (:mod:`leasework.api.guard`: tokens, scopes, rate limits, 405s, body caps) stands in
front of everything; behind it the fast path (:class:`FastPath`) answers the routes the table
marks ``fast`` (``POST /jobs``) without Quart's request and response machinery, and a Quart
app the rest: every other route of the table, the console under ``/ui`` and a 404 for any
other path. Every handler is a plain function that gets an :class:`ApiContext` (stored on the
app) and its path parameters. Every error is ``application/problem+json`` and says what to do;
only a store that really cannot be reached is a 503.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from quart import request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from leasework.api.auth import Authenticator, RateLimiter
from leasework.api.bodies import body_too_large
from leasework.api.console import add_console_routes
from leasework.api.context import EXTENSION, ApiContext
from leasework.api.groupcommit import GroupCommit
from leasework.api.guard import ClientGone, Guard
from leasework.api.limits import BodyLimits
from leasework.api.openapi import openapi_document
from leasework.api.ops import not_an_endpoint
from leasework.api.problems import Problem
from leasework.api.routes import ROUTES
from leasework.api.routing import Route, Router, quart_rule
from leasework.app import App
from leasework.config import Settings
from leasework.db import Database
from leasework.health import Health
from leasework.submission import Defaults

log = logging.getLogger("leasework.api.server")

PROBLEM = "application/problem+json"
# a path no route of the table serves is answered 404 for these methods (others: the guard's
# 405 when the path is an operation's, else Quart's 405)
FALLBACK_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]


def problem_of(exc: Exception, path: str) -> tuple[Problem, dict[str, str]]:
    """The problem document (and extra headers) an exception of a request answers with."""
    if isinstance(exc, Problem):
        return exc, {}
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        log.warning("database unavailable", extra={"error": str(exc)[:300]})
        problem = Problem(
            503,
            "database-unavailable",
            "Database unavailable",
            "the job store cannot be reached right now; nothing was written. Retry with the "
            "same Idempotency-Key to make the retry safe.",
        )
        return problem, {"Retry-After": "2"}
    if isinstance(exc, psycopg.DataError):
        # the checks before every write should make this unreachable; if one was missed, it
        # is still the client's input, not an outage, and retrying it cannot help
        log.error("store refused a value the checks let through", extra={"error": str(exc)[:300]})
        problem = Problem(
            422,
            "value-refused",
            "Value refused by the job store",
            f"the job store cannot keep a value of this request ({exc.diag.message_primary}); "
            "nothing was written. Change the request; retrying it as is will fail again.",
        )
        return problem, {}
    log.error("unhandled error", extra={"path": path}, exc_info=exc)
    problem = Problem(
        500,
        "internal-error",
        "Internal error",
        "leasework failed on this request (a bug, logged with its traceback); nothing of it "
        "is known to be written unless GET says so. Please report it.",
    )
    return problem, {}


def create_app(
    settings: Settings,
    db: Database,
    health: Health,
    jobs_app: App,
    group: GroupCommit,
    *,
    auth: Authenticator,
    limiter: RateLimiter | None = None,
) -> Guard:
    """The api as an ASGI app: the guard in front of the fast path and a Quart app, both
    serving the routes of :data:`~leasework.api.routes.ROUTES`. Single submits go through
    ``group``; the caller starts ``group.run``, ``auth.run`` and ``limiter.run``."""
    limits = BodyLimits.from_settings(settings)
    context = ApiContext(
        settings=settings,
        db=db,
        health=health,
        jobs_app=jobs_app,
        group=group,
        limits=limits,
        defaults=Defaults(settings.default_max_attempts, settings.default_timeout_seconds),
        document=openapi_document(jobs_app),
    )
    app = quart_app(context, ROUTES)
    add_console_routes(app, db=db, auth=auth, settings=settings, limiter=limiter, health=health)
    fast = FastPath(app, context, [route for route in ROUTES if route.fast])
    return Guard(fast, Router(ROUTES), auth, limiter, limits)


def quart_app(context: ApiContext, routes: tuple[Route, ...]) -> QuartTrio:
    """A Quart app serving ``routes`` (but the fast ones) with ``context``, its error handlers
    and the 404 for any other path."""
    # no static folder: the console's stylesheet is the only file served, by its blueprint
    app = QuartTrio("leasework-api", static_folder=None)
    # the guard has capped every body already; Quart's own limits are the second line
    app.config["MAX_CONTENT_LENGTH"] = context.limits.largest()
    app.config["MAX_FORM_MEMORY_SIZE"] = context.limits.form
    app.config["MAX_FORM_PARTS"] = 100
    app.extensions[EXTENSION] = context
    for route in routes:
        if not route.fast:
            rule = quart_rule(route.path)
            app.add_url_rule(rule, route.name, view_of(route), methods=[route.method])
    app.add_url_rule("/<path:unknown>", "not_found", not_found, methods=FALLBACK_METHODS)
    app.register_error_handler(Problem, on_problem)
    app.register_error_handler(HTTPException, on_http_error)
    app.register_error_handler(Exception, on_error)
    return app


def view_of(route: Route) -> Callable[..., Any]:
    """The Quart view of ``route``: its handler, given the app's context."""

    async def view(**parameters: str) -> Any:
        return await route.handler(ApiContext.current(), **parameters)

    view.__name__ = view.__qualname__ = route.name
    view.__doc__ = route.handler.__doc__
    return view


async def not_found(unknown: str) -> None:
    raise not_an_endpoint(f"/{unknown}")


async def on_problem(problem: Problem) -> Any:
    return problem.response(request.path)


async def on_http_error(exc: HTTPException) -> Any:
    if exc.code == 413:
        problem = body_too_large(ApiContext.current().limits.for_request(None, request.path))
    elif exc.code == 405:
        problem = Problem(
            405,
            "method-not-allowed",
            "Method not allowed",
            f"{request.method} is not supported on {request.path}; see /openapi.json",
        )
    else:
        problem = Problem(exc.code or 500, "http-error", exc.name, exc.description or exc.name)
    return problem.response(request.path)


async def on_error(exc: Exception) -> Any:
    problem, headers = problem_of(exc, request.path)
    response = problem.response(request.path)
    response.headers.update(headers)
    return response


class FastPath:
    """ASGI: the routes the table marks ``fast`` (``POST /jobs``) answered without Quart's
    request and response machinery (about a third of the api's CPU per submit, measured with
    ``just bench``), everything else by the Quart app. The answer is the same document and
    headers either way. A fast route's path has no parameters; its handler takes the context,
    the request's headers (names in lower case) and its body."""

    def __init__(self, app: QuartTrio, context: ApiContext, routes: list[Route]) -> None:
        if any("{" in route.path for route in routes):
            raise ValueError("a fast route's path cannot have parameters")
        self.app = app
        self.context = context
        self.routes = {(route.method, route.path): route for route in routes}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        route = (
            self.routes.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        )
        if route is None:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        content_type = "application/json"
        try:
            raw = await self._body(receive)
            view, status, extra = await route.handler(self.context, headers, raw)
        except ClientGone:
            return
        except Exception as exc:  # every refusal and failure answers a problem document
            problem, extra = problem_of(exc, scope["path"])
            view, status, content_type = problem.body(scope["path"]), problem.status, PROBLEM
        body = json.dumps(view).encode()
        response_headers = [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in extra.items()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": body})

    async def _body(self, receive: Any) -> bytes:
        """The whole body, in one message: the guard in front has read it under its cap and
        deadline (and ``parse_body`` checks the size once more)."""
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        return message.get("body", b"")
