"""The api process: the HTTP door and the console inside it.

Every endpoint is a :class:`~leasework.api.routing.Route` of the table in :mod:`.routes` (the
console's pages: of :data:`.console.routes.CONSOLE_ROUTES`), handled by a plain function by area
(:mod:`.submit`, :mod:`.jobs`, :mod:`.operators`, :mod:`.ops`) that gets its dependencies from
one :class:`~leasework.api.context.ApiContext`; :func:`create_app` (:mod:`.server`) builds the
app from the table, behind the guard (:mod:`.guard`: tokens and rate limits from :mod:`.auth`,
body caps from :mod:`.limits`). The OpenAPI document (:mod:`.openapi`) lists the table's
operations; the operators' cancel, retry and bulk retry are :mod:`leasework.operations`'."""

from leasework.api.server import create_app

__all__ = ["create_app"]
