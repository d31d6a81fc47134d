"""The route tables (leasework/api/routes.py, the console's in leasework/api/console/routes.py)
and what is derived from them: the app serves exactly the table, the OpenAPI document has an
operation for exactly its documented routes with the same scope, the guard finds each route,
and every handler is a plain module-level function (no closures)."""

from __future__ import annotations

import inspect
import re

import pytest

from leasework import demo
from leasework.api.auth import Authenticator
from leasework.api.console import routes as console
from leasework.api.groupcommit import GroupCommit
from leasework.api.limits import BodyKind
from leasework.api.openapi import openapi_document
from leasework.api.routes import OPERATION_SCOPES, ROUTES, scope_of
from leasework.api.routing import Route, Router, quart_rule
from leasework.api.server import create_app
from leasework.config import load
from leasework.db import Database
from leasework.health import Health
from leasework.tokens import SCOPES


def built_app():
    settings = load("api", {"LEASEWORK_APP": "leasework.demo:app"})
    db = Database("postgresql://unused@127.0.0.1:1/none", name="test")
    return create_app(
        settings, db, Health(), demo.app, GroupCommit(db, "t"), auth=Authenticator(db)
    )


def test_the_app_serves_exactly_the_table():
    guard = built_app()
    quart = guard.app.app
    served = set()
    for rule in quart.url_map.iter_rules():
        if rule.rule.startswith(("/ui", "/<path:")):
            continue  # the console has its own table; the catch-all answers 404
        template = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        served |= {(template, method.lower()) for method in rule.methods - {"HEAD", "OPTIONS"}}
    fast = set(guard.app.routes)
    assert served == {r.key for r in ROUTES if not r.fast}
    assert fast == {("POST", "/jobs")} == {(r.method, r.path) for r in ROUTES if r.fast}
    # no static folder served by accident: the console's stylesheet is the only file
    files = {rule.rule for rule in quart.url_map.iter_rules() if rule.endpoint.endswith("static")}
    assert files == {"/ui/static/<path:filename>"}, files


def test_the_document_has_an_operation_for_each_documented_route_with_its_scope():
    paths = openapi_document(demo.app)["paths"]
    operations = {(path, method): op for path, ops in paths.items() for method, op in ops.items()}
    documented = {r.key: r for r in ROUTES if r.doc is not None}
    assert set(operations) == set(documented)
    for key, operation in operations.items():
        scope = documented[key].scope
        if scope is None:
            assert operation["security"] == [] and "x-leasework-scope" not in operation, key
        else:
            assert operation["x-leasework-scope"] == scope, key
            assert {"401", "403", "429"} <= set(operation["responses"]), key
        assert {"408", "413"} <= set(operation["responses"]), key
    # the document does not describe itself; nothing else is left out
    assert [r.key for r in ROUTES if r.doc is None] == [("/openapi.json", "get")]
    # in the table's order, as the document has always listed them
    assert list(paths) == list(dict.fromkeys(r.path for r in ROUTES if r.doc is not None))


def test_operation_scopes_are_the_tables_and_every_scope_is_a_real_one():
    assert OPERATION_SCOPES == {r.key: r.scope for r in ROUTES}
    assert len(OPERATION_SCOPES) == len(ROUTES)  # no (path, method) twice
    assert len({r.name for r in ROUTES}) == len(ROUTES)  # nor a name
    assert {r.scope for r in ROUTES} - {None} <= set(SCOPES)
    assert scope_of("GET", "/audit") == "admin"
    with pytest.raises(KeyError):
        scope_of("GET", "/no-such-operation")


def test_each_body_cap_is_named_by_its_route():
    kinds = {r.key: r.body for r in ROUTES if r.body is not BodyKind.SMALL}
    assert kinds == {
        ("/jobs", "post"): BodyKind.SUBMIT,
        ("/jobs/batch", "post"): BodyKind.BATCH,
        ("/alerts/webhook", "post"): BodyKind.WEBHOOK,
    }


def handlers(routes: tuple[Route, ...]) -> list:
    return [route.handler for route in routes]


@pytest.mark.parametrize("handler", handlers(ROUTES) + handlers(console.CONSOLE_ROUTES))
def test_every_handler_is_a_plain_async_function_not_a_closure(handler):
    assert inspect.iscoroutinefunction(handler)
    assert "<locals>" not in handler.__qualname__
    assert handler.__closure__ is None


def test_the_router_prefers_a_literal_segment_and_knows_each_paths_methods():
    router = Router(ROUTES)
    assert router.match("POST", "/jobs/batch").name == "submit_batch"  # not /jobs/{job_id}
    assert router.match("GET", "/jobs/abc").name == "get_job"
    assert router.match("GET", "/jobs/retry") is None
    assert router.allowed("/jobs/retry") == ["POST"]
    assert router.allowed("/jobs") == ["GET", "POST"]
    assert router.match("GET", "/openapi.json") is None  # not in the document: the app's
    assert router.allowed("/no/such/path") == []


def test_a_path_template_becomes_a_quart_rule():
    assert quart_rule("/jobs/{job_id}/cancel") == "/jobs/<job_id>/cancel"
    assert quart_rule("/{rest:path}") == "/<path:rest>"
    assert quart_rule("/jobs") == "/jobs"


def test_each_console_twin_needs_the_scope_of_its_api_operation():
    assert console.console_scope("audit") == OPERATION_SCOPES[("/audit", "get")] == "admin"
    assert console.console_scope("retry_many") == OPERATION_SCOPES[("/jobs/retry", "post")]
    assert console.console_scope("job") == OPERATION_SCOPES[("/jobs/{job_id}", "get")]
    assert console.JOB_AUDIT_SCOPE == "admin" and console.ACTION_SCOPE == "cancel"
    assert console.console_scope("login") is None and console.console_scope("static") is None
    with pytest.raises(KeyError):
        console.console_scope("no_such_page")


def test_a_console_endpoint_cannot_have_two_scopes():
    overview = console.Console.overview
    table = (Route("GET", "/", overview, "read", "x"), Route("POST", "/", overview, "admin", "x"))
    with pytest.raises(ValueError, match="x has two scopes"):
        console._scopes(table)
