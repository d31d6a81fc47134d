"""The api process: the HTTP door (route table, guard, auth, body limits, group commit, the
OpenAPI document, operator endpoints) and the console inside it."""

from leasework.api.server import create_app

__all__ = ["create_app"]
