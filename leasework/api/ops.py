"""The api's public ops endpoints: ``/healthz``, ``/readyz`` (it names the dependencies that are
down, never their errors: the api's port may face a network; the errors are in the log and on
the internal listener), ``/metrics`` (unless ``LEASEWORK_INTERNAL_ADDR`` serves it instead) and
``/openapi.json``. The other processes, and the api's internal listener, serve theirs from
:func:`leasework.service.add_ops_routes`."""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from quart import Response, request

from leasework.api.context import ApiContext
from leasework.api.problems import Problem


def not_an_endpoint(path: str) -> Problem:
    return Problem(404, "not-found", "Not found", f"{path} is not an endpoint; see /openapi.json")


async def healthz(ctx: ApiContext) -> dict[str, Any]:
    return {"status": "alive", "process": ctx.settings.process_name}


async def readyz(ctx: ApiContext) -> tuple[dict[str, Any], int]:
    return ctx.health.readiness(ctx.settings.process_name, detail=False)


async def metrics(ctx: ApiContext) -> Response:
    if ctx.settings.internal_addr is not None:  # served on the internal listener only
        raise not_an_endpoint(request.path)
    return Response(generate_latest(), content_type=CONTENT_TYPE_LATEST)


async def openapi(ctx: ApiContext) -> dict[str, Any]:
    return ctx.document
