"""What the api's handlers depend on, in one record stored on the Quart app: a handler is a
plain async function that takes an :class:`ApiContext` first (see
:class:`leasework.api.routing.Route`), so none of them closes over anything."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quart import current_app, request

from leasework.api.groupcommit import GroupCommit
from leasework.api.guard import principal_of
from leasework.api.known_queues import KnownQueues
from leasework.api.limits import BodyLimits
from leasework.app import App
from leasework.config import Settings
from leasework.db import Database
from leasework.health import Health
from leasework.operations import Actor
from leasework.submission import Defaults

EXTENSION = "leasework.api"  # the key of the context in the Quart app's ``extensions``


@dataclass(frozen=True)
class ApiContext:
    settings: Settings
    db: Database
    health: Health
    jobs_app: App  # the loaded app: its job types, what a submit is checked against
    group: GroupCommit  # single submits share a transaction through it
    limits: BodyLimits
    defaults: Defaults  # a job's attempts and timeout when neither it nor its type names them
    document: dict[str, Any]  # the OpenAPI document, served at /openapi.json
    queues: KnownQueues = field(default_factory=KnownQueues)  # the queues seen to exist

    @classmethod
    def current(cls) -> ApiContext:
        """The context of the app serving the current request."""
        context: ApiContext = current_app.extensions[EXTENSION]
        return context


def caller() -> Actor:
    """Who the current request came from (the token's name; ``anonymous`` on a public
    route), for the audit log."""
    principal = principal_of(request.scope)
    return Actor(principal.name if principal is not None else "anonymous", "api")
