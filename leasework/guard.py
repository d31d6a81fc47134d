"""The api's door keeper, an ASGI middleware in front of every route.

For each request it finds the operation in the OpenAPI document (:class:`leasework.auth.Routes`)
and answers, before any handler runs:

* 405 with ``Allow`` when the path exists but not with that method;
* 401 (``WWW-Authenticate: Bearer``) when an operation that needs a scope comes without a
  token, or with one that is malformed, unknown or revoked;
* 403 when the token lacks the operation's scope (the problem names the scope);
* 429 with ``Retry-After`` when the token's rate limit is spent.

Public operations (``security: []``: health, readiness, metrics, the OpenAPI document) pass
untouched, and so do paths the document does not know (the app answers 404) and the console
under ``/ui``, which keeps its own session. The principal of an admitted request is put in the
ASGI scope (``scope["leasework.principal"]``) for the audit log.
"""

from __future__ import annotations

import json
import math
from typing import Any

from leasework import metrics
from leasework.auth import Authenticator, RateLimiter, Route, Routes
from leasework.problems import Problem
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


def operation(routes: Routes, method: str, path: str) -> Route | None:
    """The document's operation for a request (HEAD is GET's)."""
    return routes.match("GET" if method == "HEAD" else method, path)


def refusal(
    method: str,
    path: str,
    routes: Routes,
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


class Guard:
    """ASGI middleware: :func:`refusal`'s answers, then the rate limit, then the app."""

    def __init__(
        self, app: Any, routes: Routes, auth: Authenticator, limiter: RateLimiter | None
    ) -> None:
        self.app = app
        self.routes = routes
        self.auth = auth
        self.limiter = limiter

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path == "/ui" or path.startswith("/ui/"):
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        token = bearer_token(scope["headers"])
        route = operation(self.routes, method, path)
        guarded = route is not None and route.scope is not None
        principal = await self.auth.principal(token) if token and guarded else None
        refused = refusal(method, path, self.routes, token, principal, route)
        if refused is None and principal is not None and self.limiter is not None:
            wait = await self.limiter.check(principal)
            if wait is not None:
                metrics.rate_limited.inc()
                seconds = max(1, math.ceil(wait))
                refused = (
                    Problem(
                        429,
                        "rate-limited",
                        "Too many requests",
                        f"token {principal.name!r} is limited to {principal.rate:g} requests/s "
                        f"(burst {principal.burst}); retry in {seconds} s",
                    ),
                    {"Retry-After": str(seconds)},
                )
        if refused is not None:
            problem, headers = refused
            if problem.status in (401, 403):
                metrics.auth_refused.labels(str(problem.status)).inc()
            await _answer(send, problem, path, headers)
            return
        if principal is not None:
            scope[PRINCIPAL_KEY] = principal
        if self.limiter is not None and self.limiter.degraded:
            send = _with_header(send, b"ratelimit-status", b"unavailable")
        await self.app(scope, receive, send)


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
