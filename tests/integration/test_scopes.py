"""One scope for every door: every API operation (the route table, leasework.api.routes) and
every console page or action (its table, whose twins take their API operation's scope), asked
with a token of each scope, is refused (403) exactly when the tables say the token lacks the
scope, and served otherwise. The console's routes are read from the app itself, so a page
served without an entry in its table fails here."""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import pytest
from quart_trio import QuartTrio

from leasework.api.console import add_console_routes
from leasework.api.console.routes import console_scope
from leasework.api.routes import OPERATION_SCOPES
from leasework.config import Settings
from leasework.tokens import Principal
from tests.integration.conftest import API_URL, wait_for

SCOPE_SETS = [
    ("submit",),
    ("read",),
    ("cancel",),
    ("alerts",),
    ("read", "cancel"),
    ("read", "submit"),
    ("admin",),
]
MISSING = str(uuid.uuid4())  # a job that does not exist: an allowed request is a 404, no harm

# (template, method) -> (the path to ask, its JSON body): a request that passes the guard
# changes nothing (a missing job, an invalid body, a filter that matches nothing)
API_REQUESTS: dict[tuple[str, str], tuple[str, Any]] = {
    ("/jobs", "post"): ("/jobs", {"type": "noop", "payload": {}}),
    ("/jobs/batch", "post"): ("/jobs/batch", {"jobs": [{"type": "noop"}]}),
    ("/jobs", "get"): ("/jobs?limit=1", None),
    ("/jobs/{job_id}", "get"): (f"/jobs/{MISSING}", None),
    ("/job-types", "get"): ("/job-types", None),
    ("/workers", "get"): ("/workers", None),
    ("/queues", "get"): ("/queues", None),
    ("/queues/{name}/pause", "post"): ("/queues/t-no-such-queue/pause", None),
    ("/queues/{name}/resume", "post"): ("/queues/t-no-such-queue/resume", None),
    ("/queues/{name}/concurrency", "put"): (
        "/queues/t-no-such-queue/concurrency",
        {"concurrency": 1},
    ),
    ("/jobs/{job_id}/cancel", "post"): (f"/jobs/{MISSING}/cancel", None),
    ("/jobs/{job_id}/retry", "post"): (f"/jobs/{MISSING}/retry", None),
    ("/jobs/retry", "post"): ("/jobs/retry", {"type": "no-such-type", "limit": 1}),
    ("/schedules", "get"): ("/schedules?limit=1", None),
    ("/schedules", "post"): ("/schedules", {"name": "has space", "type": "noop", "cron": "*"}),
    ("/schedules/{name}", "get"): ("/schedules/t-no-such-schedule", None),
    ("/schedules/{name}", "delete"): ("/schedules/t-no-such-schedule", None),
    ("/schedules/{name}/pause", "post"): ("/schedules/t-no-such-schedule/pause", None),
    ("/schedules/{name}/resume", "post"): ("/schedules/t-no-such-schedule/resume", None),
    ("/schedules/{name}/trigger", "post"): ("/schedules/t-no-such-schedule/trigger", None),
    ("/schedules/{name}/backfill", "post"): (
        "/schedules/t-no-such-schedule/backfill",
        {"from": "2025-01-01T00:00:00Z", "until": "2025-01-02T00:00:00Z"},
    ),
    ("/tokens", "get"): ("/tokens", None),
    ("/tokens", "post"): ("/tokens", {"name": "", "scopes": []}),
    ("/tokens/{name}", "delete"): ("/tokens/no-such-token", None),
    ("/audit", "get"): ("/audit", None),
    ("/alerts/webhook", "post"): ("/alerts/webhook", {"alerts": "not a list"}),
    ("/openapi.json", "get"): ("/openapi.json", None),
    ("/healthz", "get"): ("/healthz", None),
    ("/readyz", "get"): ("/readyz", None),
    ("/metrics", "get"): ("/metrics", None),
}

JOB = f"/ui/jobs/{MISSING}"
SCHEDULE = "/ui/schedules/t-no-such-schedule"  # a schedule that does not exist: a 404
# console endpoint -> (method, path, form): what each page or action is asked with
CONSOLE_REQUESTS: dict[str, list[tuple[str, str, dict[str, str] | None]]] = {
    "overview": [("GET", "/ui/", None)],
    "jobs": [("GET", "/ui/jobs?type=noop", None)],
    "job": [("GET", f"/ui/jobs/{MISSING}", None)],
    "cancel": [("GET", f"{JOB}/cancel", None), ("POST", f"{JOB}/cancel", {})],
    "retry": [("GET", f"{JOB}/retry", None), ("POST", f"{JOB}/retry", {})],
    "retry_many": [
        ("GET", "/ui/jobs/retry?status=dead&type=no-such-type", None),
        ("POST", "/ui/jobs/retry", {"status": "dead", "type": "no-such-type"}),
    ],
    "schedules": [("GET", "/ui/schedules", None)],
    # the create form's first POST asks (a confirmation page) and writes nothing
    "schedule_create": [
        ("POST", "/ui/schedules", {"name": "t-scopes-asked", "type": "noop", "cron": "0 0 1 1 *"}),
    ],
    "schedule": [("GET", SCHEDULE, None)],
    **{
        f"schedule_{action}": [("GET", f"{SCHEDULE}/{action}", None),
                               ("POST", f"{SCHEDULE}/{action}", {})]
        for action in ("pause", "resume", "trigger", "delete")
    },
    "schedule_backfill": [
        ("GET", f"{SCHEDULE}/backfill?from=2025-01-01T00:00&until=2025-01-02T00:00", None),
        ("POST", f"{SCHEDULE}/backfill", {"from": "2025-01-01T00:00", "until": "2025-01-02T00:00"}),
    ],
    "queues": [("GET", "/ui/queues", None)],
    **{
        f"queue_{action}": [("GET", f"/ui/queues/t-no-such-queue/{action}", None),
                            ("POST", f"/ui/queues/t-no-such-queue/{action}", {})]
        for action in ("pause", "resume")
    },
    "queue_concurrency": [
        ("GET", "/ui/queues/t-no-such-queue/concurrency", None),
        ("POST", "/ui/queues/t-no-such-queue/concurrency", {"concurrency": "2"}),
    ],
    "workers": [("GET", "/ui/workers", None)],
    "audit": [("GET", "/ui/audit", None)],
    "invariants": [("GET", "/ui/invariants", None)],
    "alerts": [("GET", "/ui/alerts", None)],
    "not_found": [("GET", "/ui/no-such-page", None)],
    "logout": [("POST", "/ui/logout", {})],
}  # fmt: skip
PUBLIC_CONSOLE = {"login", "static"}


def allows(scopes: tuple[str, ...], needs: str | None) -> bool:
    return needs is None or Principal("t", "t", frozenset(scopes)).allows(needs)


def console_endpoints() -> set[str]:
    """Every endpoint the console serves, read from a real app."""
    app = QuartTrio("scopes-test")
    add_console_routes(app, db=None, auth=None, settings=Settings(role="api", process_name="t"))  # type: ignore[arg-type]
    return {
        rule.endpoint.removeprefix("console.")
        for rule in app.url_map.iter_rules()
        if rule.endpoint.startswith("console.")
    }


def test_the_table_knows_every_console_endpoint_and_the_walk_covers_them():
    endpoints = console_endpoints()
    for endpoint in endpoints:
        console_scope(endpoint)  # KeyError for a page without an entry
    assert endpoints == set(CONSOLE_REQUESTS) | PUBLIC_CONSOLE
    assert set(API_REQUESTS) == set(OPERATION_SCOPES)
    # the case that was wrong: the console showed a read token the audit log
    assert console_scope("audit") == OPERATION_SCOPES[("/audit", "get")] == "admin"


@pytest.mark.parametrize("scopes", SCOPE_SETS, ids=lambda s: "+".join(s))
def test_every_api_operation_answers_as_the_table_says(stack, make_token, scopes):
    _, token = make_token(*scopes)
    # /readyz is one of the operations: a 503 from a dependency an earlier test restarted
    # (Postgres, in test_request_costs) is not what this test is about
    wait_for(lambda: httpx.get(f"{API_URL}/readyz", timeout=5).status_code == 200, 60, "api ready")
    with httpx.Client(base_url=API_URL, timeout=30) as http:
        for (template, method), needs in OPERATION_SCOPES.items():
            path, body = API_REQUESTS[(template, method)]
            response = http.request(
                method.upper(), path, json=body, headers={"Authorization": f"Bearer {token}"}
            )
            where = f"{method.upper()} {template} with {scopes}: {response.status_code}"
            if allows(scopes, needs):
                assert response.status_code not in (401, 403), where
                assert response.status_code < 500, where
            else:
                assert response.status_code == 403, where
                assert response.json()["required_scope"] == needs, where


def console_login(http: httpx.Client, token: str) -> httpx.Response:
    page = http.get("/ui/login")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    return http.post(
        "/ui/login",
        data={"token": token, "nonce": nonce, "next": "/ui/"},
        headers={"Origin": API_URL},
    )


@pytest.mark.parametrize("scopes", SCOPE_SETS, ids=lambda s: "+".join(s))
def test_every_console_page_and_action_answers_as_its_api_twin(stack, make_token, scopes):
    _, token = make_token(*scopes)
    with httpx.Client(base_url=API_URL, timeout=30) as http:
        login = console_login(http, token)
        if not allows(scopes, "read"):
            assert login.status_code == 403, (scopes, login.status_code)  # read to see anything
            return
        assert login.status_code == 303, login.text[:300]
        overview = http.get("/ui/").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', overview).group(1)  # type: ignore[union-attr]
        # the navigation offers only what the token may see
        assert ('href="/ui/audit"' in overview) == allows(scopes, "admin")
        # logout last: it ends the session
        for endpoint in sorted(CONSOLE_REQUESTS, key=lambda e: e == "logout"):
            needs = console_scope(endpoint)
            for method, path, form in CONSOLE_REQUESTS[endpoint]:
                response = http.request(
                    method,
                    path,
                    data=None if form is None else {**form, "csrf": csrf},
                    headers={"Origin": API_URL} if method == "POST" else {},
                )
                where = f"{method} {path} ({endpoint}, needs {needs}) with {scopes}"
                if allows(scopes, needs):
                    assert response.status_code in (200, 303, 404), (where, response.status_code)
                    if endpoint != "logout":  # logging out sends you to the login page
                        assert "/ui/login" not in response.headers.get("location", ""), where
                else:
                    assert response.status_code == 403, (where, response.status_code)
