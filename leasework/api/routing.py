"""How an endpoint is declared, and how a request finds it (pure).

Every endpoint of the api and of the console is a :class:`Route` in a table
(:data:`leasework.api.routes.ROUTES`, :data:`leasework.api.console.routes.CONSOLE_ROUTES`): its
method and path, the plain async function that handles it, the scope it needs, its name and,
for the api, its OpenAPI operation and the kind of body it takes. Everything else is derived
from the tables: the Quart rules, the guard's lookup (:class:`Router`), the scopes by
operation, the OpenAPI document's operations, each route's body cap.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from leasework.api.limits import BodyKind

Handler = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """One endpoint. ``path`` is an OpenAPI template (``/jobs/{job_id}``; a last parameter
    ``{rest:path}`` takes slashes too). A handler of the api is called with the api's
    :class:`~leasework.api.context.ApiContext` and the path's parameters; with ``fast``, it is
    served by the ASGI fast path instead of Quart and called with the context, the request's
    headers and its body, and answers ``(document, status, headers)``."""

    method: str  # GET, POST, DELETE
    path: str
    handler: Handler
    scope: str | None  # the scope a token needs (admin allows all); None: public
    name: str  # the endpoint's name, unique in its table
    doc: Callable[[], dict] | None = None  # its OpenAPI operation; None: not in the document
    body: BodyKind = BodyKind.SMALL  # which cap the guard reads its body under
    fast: bool = False

    @property
    def key(self) -> tuple[str, str]:
        """(path, method in lower case): how the OpenAPI document names the operation."""
        return self.path, self.method.lower()


_PARAMETER = re.compile(r"\{([a-z_]+)(:path)?\}")


def quart_rule(path: str) -> str:
    """``path`` as a Quart (werkzeug) rule: ``/jobs/{job_id}`` is ``/jobs/<job_id>``."""
    return _PARAMETER.sub(lambda m: f"<path:{m[1]}>" if m[2] else f"<{m[1]}>", path)


def _pattern(path: str) -> re.Pattern[str]:
    """The regular expression of the paths ``path`` matches."""
    parts, at = [], 0
    for parameter in _PARAMETER.finditer(path):
        parts += [re.escape(path[at : parameter.start()]), ".+" if parameter[2] else "[^/]+"]
        at = parameter.end()
    return re.compile("^" + "".join(parts) + re.escape(path[at:]) + "$")


class Router:
    """(method, path) -> the route of the api that serves it, for the guard in front of the
    app: the routes the OpenAPI document describes (a request to any other path is the app's
    to answer: its 404, the console, ``/openapi.json``)."""

    def __init__(self, routes: Iterable[Route]) -> None:
        documented = [r for r in routes if r.doc is not None]
        # the most specific first: a literal segment beats a parameter, as in any router
        # (``/jobs/batch`` is not ``/jobs/{job_id}``)
        documented.sort(key=lambda r: (r.path.count("{"), -len(r.path)))
        self.routes = [(route, _pattern(route.path)) for route in documented]
        # a path that is a template without parameters is its own most specific template:
        # found without a pattern (every request passes here, POST /jobs most of all)
        self.literal = {r.path for r in documented if "{" not in r.path}
        self.by_key = {(r.path, r.method): r for r in documented}

    def _path(self, path: str) -> str | None:
        """The most specific template ``path`` matches."""
        if path in self.literal:
            return path
        return next((r.path for r, pattern in self.routes if pattern.match(path)), None)

    def match(self, method: str, path: str) -> Route | None:
        template = self._path(path)
        return None if template is None else self.by_key.get((template, method))

    def allowed(self, path: str) -> list[str]:
        """The methods the document defines for ``path`` (for a 405's ``Allow``)."""
        template = self._path(path)
        return sorted({r.method for r, _ in self.routes if r.path == template})
