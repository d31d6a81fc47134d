"""The guard's decisions (pure), on the api's route table (the invariants of the table itself
are in test_routes.py)."""

from __future__ import annotations

import pytest

from leasework.api.guard import bearer_token, refusal
from leasework.api.routes import ROUTES as TABLE
from leasework.api.routing import Router
from leasework.tokens import Principal

ROUTES = Router(TABLE)


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
