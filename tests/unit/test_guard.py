"""The guard's decisions (pure) and the route table: every route the api serves is an
operation of the OpenAPI document, so the guard knows the scope it needs."""

from __future__ import annotations

import re

import pytest

from leasework import demo
from leasework.api.auth import Authenticator, Routes
from leasework.api.groupcommit import GroupCommit
from leasework.api.guard import bearer_token, refusal
from leasework.api.openapi import openapi_document
from leasework.api.scopes import OPERATION_SCOPES
from leasework.api.server import create_app
from leasework.config import load
from leasework.db import Database
from leasework.health import Health
from leasework.tokens import Principal

ROUTES = Routes(openapi_document(demo.app))


def principal(*scopes: str) -> Principal:
    return Principal("id", "ci", frozenset(scopes))


@pytest.mark.parametrize(
    ("method", "path", "token", "who", "status"),
    [
        ("GET", "/jobs", None, None, 401),
        ("GET", "/jobs", "bad", None, 401),
        ("GET", "/jobs", "t", principal("submit"), 403),
        ("GET", "/jobs", "t", principal("read"), None),
        ("GET", "/jobs", "t", principal("admin"), None),
        ("POST", "/jobs", "t", principal("read"), 403),
        ("POST", "/jobs/abc/retry", "t", principal("read"), 403),
        ("POST", "/jobs/abc/retry", "t", principal("cancel"), None),
        ("DELETE", "/tokens/x", "t", principal("cancel"), 403),
        ("POST", "/alerts/webhook", "t", principal("read"), 403),
        ("GET", "/healthz", None, None, None),
        ("HEAD", "/readyz", None, None, None),
        ("GET", "/openapi.json", None, None, None),
        ("DELETE", "/jobs/abc", "t", principal("admin"), 405),
        ("TRACE", "/jobs", None, None, 405),
        ("GET", "/no/such/thing", None, None, None),
    ],
)
def test_refusal(method, path, token, who, status):
    refused = refusal(method, path, ROUTES, token, who)
    assert (refused[0].status if refused else None) == status


def test_refusals_say_what_is_needed():
    problem, headers = refusal("GET", "/jobs", ROUTES, None, None)
    assert headers == {"WWW-Authenticate": 'Bearer realm="leasework"'}
    assert "scope 'read'" in problem.detail and "leasework token create" in problem.detail
    problem, headers = refusal("POST", "/jobs", ROUTES, "t", principal("read"))
    assert problem.extensions == {"required_scope": "submit"}
    problem, headers = refusal("PATCH", "/jobs/x", ROUTES, None, None)
    assert headers == {"Allow": "GET"}


def test_bearer_token():
    assert bearer_token([(b"authorization", b"Bearer  abc ")]) == "abc"
    assert bearer_token([(b"Authorization", b"bearer abc")]) == "abc"
    assert bearer_token([(b"authorization", b"Basic abc")]) == ""
    assert bearer_token([(b"x", b"y")]) is None


def test_an_operation_without_a_scope_cannot_be_served():
    with pytest.raises(ValueError, match="names no x-leasework-scope"):
        Routes({"paths": {"/new": {"get": {"responses": {}}}}})


def test_every_route_the_api_serves_is_in_the_document():
    settings = load("api", {"LEASEWORK_APP": "leasework.demo:app"})
    db = Database("postgresql://unused@127.0.0.1:1/none", name="test")
    guard = create_app(
        settings, db, Health(), demo.app, GroupCommit(db, "t"), auth=Authenticator(db)
    )
    quart = guard.app.app
    served = set()
    for rule in quart.url_map.iter_rules():
        if rule.rule.startswith(("/ui", "/static", "/<path:")):
            continue  # the console keeps its own session; the catch-all answers 404
        template = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            served.add((template, method.lower()))
    served.add(("/jobs", "post"))  # the ASGI fast path
    assert served == set(OPERATION_SCOPES)
    # no static folder served by accident: the console's stylesheet is the only file
    files = {rule.rule for rule in quart.url_map.iter_rules() if rule.endpoint.endswith("static")}
    assert files == {"/ui/static/<path:filename>"}, files
