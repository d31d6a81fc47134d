"""The api's door keeper, an ASGI middleware in front of every route.

For each request it finds the route in the api's table (:class:`leasework.api.routing.Router`
over :data:`leasework.api.routes.ROUTES`: the operations the OpenAPI document describes) and
answers, before any handler runs:

* 405 with ``Allow`` when the path exists but not with that method;
* 401 (``WWW-Authenticate: Bearer``) when an operation that needs a scope comes without a
  token, or with one that is malformed, unknown or revoked;
* 403 when the token lacks the operation's scope (the problem names the scope);
* 429 with ``Retry-After`` when the token's rate limit is spent;

and then reads the body itself, under the route's cap and the read timeout
(:mod:`leasework.api.limits`), before the app sees a byte of it:

* 413 at once when ``Content-Length`` or the bytes received pass the cap;
* 408 when the body has not arrived within the read timeout;
* 503 with ``Retry-After`` when too many large bodies are in memory already.

Public operations (scope None: health, readiness, metrics, the OpenAPI document) need no
token, and neither do paths the document does not know (the app answers 404) nor the console
under ``/ui``, which keeps its own session; their bodies are capped all the same (small, and a
few KiB for the console's forms). The principal of an admitted request is put in the ASGI
scope (``scope["leasework.principal"]``) for the audit log.
"""

from __future__ import annotations

import json
import math
from typing import Any

import trio

from leasework import metrics
from leasework.api.auth import Authenticator, RateLimiter
from leasework.api.bodies import body_too_large
from leasework.api.limits import LARGE_BODIES, LARGE_BODY_BYTES, BodyLimits
from leasework.api.problems import Problem
from leasework.api.routing import Route, Router
from leasework.tokens import Principal

PRINCIPAL_KEY = "leasework.principal"
PROBLEM = "application/problem+json"


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The token of an ``Authorization: Bearer …`` header; "" for another scheme; None when
    there is no such header."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""
    return None


def unauthorized(detail: str, error: str) -> tuple[Problem, dict[str, str]]:
    challenge = 'Bearer realm="leasework"' + (f', error="{error}"' if error else "")
    return Problem(401, "unauthorized", "Unauthorized", detail), {"WWW-Authenticate": challenge}


def operation(routes: Router, method: str, path: str) -> Route | None:
    """The route of a request (HEAD is GET's)."""
    return routes.match("GET" if method == "HEAD" else method, path)


def refusal(
    method: str,
    path: str,
    routes: Router,
    token: str | None,
    principal: Principal | None,
    route: Route | None = None,
) -> tuple[Problem, dict[str, str]] | None:
    """The answer to refuse this request with, or None to let it through (pure: the token is
    already looked up; ``route``, the operation when the caller has found it already)."""
    route = route or operation(routes, method, path)
    if route is None:
        allowed = routes.allowed(path)
        if not allowed:
            return None  # not an endpoint: the app's 404
        return (
            Problem(
                405,
                "method-not-allowed",
                "Method not allowed",
                f"{method} is not supported on {path}; allowed: {', '.join(allowed)}",
            ),
            {"Allow": ", ".join(allowed)},
        )
    if route.scope is None:
        return None
    needs = f"this operation needs a token with scope {route.scope!r} (or admin)"
    if token is None:
        return unauthorized(
            f"no token: send 'Authorization: Bearer <token>'; {needs}. "
            "Create one with `leasework token create --name NAME --scopes "
            f"{route.scope}`",
            "",
        )
    if principal is None:
        return unauthorized(
            f"the token is not valid (malformed, unknown or revoked); {needs}", "invalid_token"
        )
    if not principal.allows(route.scope):
        have = ", ".join(sorted(principal.scopes)) or "none"
        return (
            Problem(
                403,
                "insufficient-scope",
                "Forbidden",
                f"token {principal.name!r} has scopes {have}; {needs}",
                required_scope=route.scope,
            ),
            {"WWW-Authenticate": f'Bearer realm="leasework", scope="{route.scope}"'},
        )
    return None


def body_too_slow(seconds: float) -> Problem:
    return Problem(
        408,
        "body-timeout",
        "Request body too slow",
        f"the body did not arrive within {seconds:g} s; nothing was written. Send the whole "
        "body at once, or a smaller one",
    )


def too_many_large_bodies() -> Problem:
    return Problem(
        503,
        "busy",
        "Too many large requests at once",
        f"{LARGE_BODIES} requests with bodies over {LARGE_BODY_BYTES} bytes are being read "
        "already; nothing was written. Retry in a moment, or send smaller batches",
    )


def declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            return int(value) if value.strip().isdigit() else None
    return None


class ClientGone(Exception):
    """The client disconnected before its request body arrived: nothing to answer."""


class Guard:
    """ASGI middleware: :func:`refusal`'s answers, then the rate limit, then the body under
    its cap and timeout, then the app."""

    def __init__(
        self,
        app: Any,
        routes: Router,
        auth: Authenticator,
        limiter: RateLimiter | None,
        limits: BodyLimits,
    ) -> None:
        self.app = app
        self.routes = routes
        self.auth = auth
        self.limiter = limiter
        self.limits = limits
        self.large_bodies = trio.Semaphore(LARGE_BODIES)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        method = scope["method"]
        route = operation(self.routes, method, path)
        refused = await self.admit(scope, method, path, route)
        if refused is not None:
            problem, headers = refused
            if problem.status in (401, 403):
                metrics.auth_refused.labels(str(problem.status)).inc()
            await _answer(send, problem, path, headers)
            return
        if self.limiter is not None and self.limiter.degraded:
            send = _with_header(send, b"ratelimit-status", b"unavailable")
        cap = self.limits.for_request(route.body if route else None, path)
        slot = _LargeBodySlot(self.large_bodies)
        try:
            try:
                body = await self.read_body(scope, receive, cap, slot)
            except Problem as problem:
                metrics.requests_refused.labels(problem.slug).inc()
                headers = {"Retry-After": "1"} if problem.status == 503 else {}
                await _answer(send, problem, path, {**headers, "Connection": "close"})
                return
            except ClientGone:
                return
            await self.app(scope, _replay(body, receive), send)
        finally:
            slot.release()

    async def admit(
        self, scope: dict, method: str, path: str, route: Route | None
    ) -> tuple[Problem, dict[str, str]] | None:
        """The refusal of a request before its body (405, 401, 403, 429), or None."""
        if path == "/ui" or path.startswith("/ui/"):
            return None  # the console's own session decides (and meters it)
        token = bearer_token(scope["headers"])
        guarded = route is not None and route.scope is not None
        principal = await self.auth.principal(token) if token and guarded else None
        refused = refusal(method, path, self.routes, token, principal, route)
        if refused is None and principal is not None:
            scope[PRINCIPAL_KEY] = principal
            if self.limiter is not None:
                refused = await rate_limited(self.limiter, principal)
        return refused

    async def read_body(self, scope: dict, receive: Any, cap: int, slot: _LargeBodySlot) -> bytes:
        """The whole body, or a :class:`Problem`: 413 past ``cap`` (at once, when the client
        declared a larger length), 408 past the read timeout, 503 when a large body finds no
        free slot."""
        declared = declared_length(scope["headers"])
        if declared is not None and declared > cap:
            raise body_too_large(cap)
        slot.take_if_large(declared or 0)
        chunks: list[bytes] = []
        size = 0
        with trio.move_on_after(self.limits.read_timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > cap:
                    raise body_too_large(cap)
                slot.take_if_large(size)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
        raise body_too_slow(self.limits.read_timeout)


async def rate_limited(
    limiter: RateLimiter, principal: Principal
) -> tuple[Problem, dict[str, str]] | None:
    """The 429 for a principal whose bucket is empty, or None."""
    wait = await limiter.check(principal)
    if wait is None:
        return None
    metrics.rate_limited.inc()
    seconds = max(1, math.ceil(wait))
    return (
        Problem(
            429,
            "rate-limited",
            "Too many requests",
            f"token {principal.name!r} is limited to {principal.rate:g} requests/s "
            f"(burst {principal.burst}); retry in {seconds} s",
        ),
        {"Retry-After": str(seconds)},
    )


class _LargeBodySlot:
    """One request's claim on the process's slots for large bodies (taken once, when the
    body is known to be large, released when the request is answered)."""

    def __init__(self, slots: trio.Semaphore) -> None:
        self.slots = slots
        self.held = False

    def take_if_large(self, size: int) -> None:
        if self.held or size <= LARGE_BODY_BYTES:
            return
        try:
            self.slots.acquire_nowait()
        except trio.WouldBlock:
            raise too_many_large_bodies() from None
        self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.slots.release()


def _replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that hands the app the body already read, then the client's messages
    (its disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> dict:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


async def _answer(send: Any, problem: Problem, path: str, headers: dict[str, str]) -> None:
    body = json.dumps(problem.body(path)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": problem.status,
            "headers": [
                (b"content-type", PROBLEM.encode()),
                (b"content-length", str(len(body)).encode()),
                *((k.lower().encode(), v.encode()) for k, v in headers.items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _with_header(send: Any, name: bytes, value: bytes) -> Any:
    async def sending(message: dict) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (name, value)]}
        await send(message)

    return sending


def principal_of(scope: dict) -> Principal | None:
    """The principal the guard admitted this request as."""
    return scope.get(PRINCIPAL_KEY)
