"""Tokens, scopes and rate limits against the real api (issue 12): every operation of the
OpenAPI document refuses a request without a token (401) and one with the wrong scope (403),
so a new endpoint cannot be added unprotected; the tokens table holds no plaintext; a revoked
token stops working within a second; a spent rate limit is a 429 with Retry-After, and a
Redis outage lets requests through, visibly, losing nothing."""

from __future__ import annotations

import json
import time
import uuid

import httpx
import pytest

from leasework.tokens import ALL_SCOPES
from tests.integration.conftest import API_URL, auth, wait_for, wait_status

SAMPLE_PATH_VALUES = {"job_id": str(uuid.uuid4()), "name": "no-such-token"}


def operations() -> list[tuple[str, str, str | None]]:
    spec = httpx.get(f"{API_URL}/openapi.json", timeout=10).json()
    found = []
    for template, ops in spec["paths"].items():
        path = template.format(**SAMPLE_PATH_VALUES)
        for method, operation in ops.items():
            scope = operation.get("x-leasework-scope")
            assert scope is not None or operation.get("security") == [], (method, template)
            found.append((method.upper(), path, scope))
    return found


@pytest.fixture
def tokens(admin):
    """Makes tokens through the api (POST /tokens) and revokes them after the test."""
    made: list[str] = []

    def make(scopes: list[str], **extra) -> str:
        name = f"test-{uuid.uuid4().hex[:10]}"
        response = admin.post("/tokens", json={"name": name, "scopes": scopes, **extra})
        assert response.status_code == 201, response.text
        made.append(name)
        return response.json()["token"]

    yield make
    for name in made:
        admin.delete(f"/tokens/{name}")


@pytest.fixture
def admin(stack):
    with httpx.Client(base_url=API_URL, headers=auth(), timeout=10) as http:
        yield http


# bodies that change nothing if admitted (the bulk retry of a type that does not exist)
HARMLESS_BODIES = {"/jobs/retry": {"type": "no.such.type"}}


def request(method: str, path: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if method == "GET":
        return httpx.get(API_URL + path, headers=headers, timeout=10)
    body = json.dumps(HARMLESS_BODIES.get(path, {})).encode()
    headers["Content-Type"] = "application/json"
    return httpx.request(method, API_URL + path, content=body, headers=headers, timeout=10)


def test_every_operation_needs_its_scope(stack, tokens):
    ops = operations()
    assert len(ops) >= 15
    by_scope = {scope: tokens([scope]) for scope in sorted(ALL_SCOPES - {"admin"})}
    for method, path, scope in ops:
        if scope is None:  # public: health, readiness, metrics, the document
            assert request(method, path, None).status_code != 401, (method, path)
            continue
        bare = request(method, path, None)
        assert bare.status_code == 401, (method, path, bare.text)
        assert bare.headers["WWW-Authenticate"].startswith("Bearer")
        assert scope in bare.json()["detail"]
        forged = request(method, path, "lw_AAAAAAAA_" + "A" * 43)
        assert forged.status_code == 401, (method, path)
        assert 'error="invalid_token"' in forged.headers["WWW-Authenticate"]
        wrong = next(t for s, t in by_scope.items() if s != scope)
        refused = request(method, path, wrong)
        assert refused.status_code == 403, (method, path, refused.text)
        assert refused.json()["required_scope"] == scope
        assert refused.headers["content-type"].startswith("application/problem+json")
        allowed = request(method, path, by_scope.get(scope) or tokens([scope]))
        assert allowed.status_code not in (401, 403), (method, path, allowed.text)


def test_a_wrong_method_is_405_with_allow(stack, admin):
    for method, path, allow in [
        ("DELETE", f"/jobs/{uuid.uuid4()}", "GET"),
        ("TRACE", "/jobs", "GET, POST"),
        ("PUT", "/jobs/batch", "POST"),
        ("GET", "/jobs/batch", "POST"),
    ]:
        response = admin.request(method, path)
        assert response.status_code == 405, (method, path)
        assert response.headers["Allow"] == allow
        assert response.headers["content-type"].startswith("application/problem+json")


def test_the_tokens_table_holds_no_plaintext(stack, tokens, db):
    token = tokens(["read"])
    secret = token.split("_", 2)[2]
    rows = db.execute("SELECT row_to_json(t)::text AS row FROM api_tokens t").fetchall()
    assert rows and all(secret not in r["row"] and token not in r["row"] for r in rows)
    stored = db.execute(
        "SELECT token_hash FROM api_tokens WHERE prefix = %s", (token.split("_")[1],)
    ).fetchone()
    assert stored["token_hash"].startswith("hmac-sha256$")  # keyed: the key is not in the row


def test_a_revoked_token_stops_working_within_a_second(stack, admin, tokens):
    token = tokens(["read"])
    name = next(
        t["name"]
        for t in admin.get("/tokens").json()["tokens"]
        if t["prefix"] == token.split("_")[1]
    )
    assert request("GET", "/jobs?limit=1", token).status_code == 200
    assert admin.delete(f"/tokens/{name}").status_code == 200
    revoked = time.monotonic()
    wait_for(lambda: request("GET", "/jobs?limit=1", token).status_code == 401, 5, "refused")
    assert time.monotonic() - revoked < 1.0
    assert admin.delete(f"/tokens/{name}").status_code == 404


def test_a_spent_rate_limit_is_429_with_retry_after(stack, tokens):
    token = tokens(["read"], rate=0.5, burst=2)
    statuses = [request("GET", "/jobs?limit=1", token) for _ in range(3)]
    assert [r.status_code for r in statuses[:2]] == [200, 200]
    assert statuses[2].status_code == 429
    assert int(statuses[2].headers["Retry-After"]) >= 1
    assert "retry in" in statuses[2].json()["detail"]


def test_a_redis_outage_lets_requests_through_visibly(stack, tokens, client):
    token = tokens(["submit", "read"], rate=1000, burst=1000)
    # the api's Redis proxy: the plain port's, or in secure mode the TLS port's
    proxy = "http://127.0.0.1:8474/proxies/" + (
        "redis-tls" if stack.layout.mode() == "secure" else "redis"
    )
    httpx.post(proxy, json={"enabled": False}, timeout=5)
    try:

        def submitted() -> httpx.Response | None:
            response = httpx.post(
                API_URL + "/jobs",
                content=json.dumps({"type": "noop", "payload": {"redis": "down"}}),
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                timeout=10,
            )
            assert response.status_code == 202, response.text
            return response if response.headers.get("RateLimit-Status") == "unavailable" else None

        accepted = wait_for(submitted, 10, "a submit let through unmetered")
    finally:
        httpx.post(proxy, json={"enabled": True}, timeout=5)
    wait_status(client, accepted.json()["id"], "succeeded", timeout=60)
    metrics = httpx.get(f"{API_URL}/metrics", timeout=5).text
    assert "leasework_rate_limit_unavailable_total" in metrics


def test_actions_are_audited_with_their_token(stack, tokens, admin, client):
    token = tokens(["submit", "cancel"])
    job = client.submit("noop", {"audit": True}, delay_seconds=600)
    cancelled = request("POST", f"/jobs/{job['id']}/cancel", token)
    assert cancelled.status_code == 200
    entries = admin.get("/audit", params={"target": job["id"]}).json()["entries"]
    assert [(e["action"], e["actor"].startswith("test-")) for e in entries] == [("cancel", True)]


def test_alert_notifications_need_the_alerts_scope_and_are_recorded(stack, tokens, db):
    note = {
        "receiver": "leasework-api",
        "status": "firing",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": f"Test{uuid.uuid4().hex[:6]}", "severity": "page"},
                "annotations": {"summary": "a test"},
                "startsAt": "2026-12-01T10:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
            }
        ],
    }
    body = json.dumps(note).encode()
    headers = {"Content-Type": "application/json"}
    reader = tokens(["read"])
    refused = httpx.post(
        API_URL + "/alerts/webhook",
        content=body,
        headers={**headers, "Authorization": f"Bearer {reader}"},
    )
    assert refused.status_code == 403
    sender = tokens(["alerts"])
    ok = httpx.post(
        API_URL + "/alerts/webhook",
        content=body,
        headers={**headers, "Authorization": f"Bearer {sender}"},
    )
    assert ok.status_code == 200 and ok.json() == {"recorded": 1}
    row = db.execute(
        "SELECT status, severity, summary, ends_at FROM alert_notifications WHERE alertname = %s",
        (note["alerts"][0]["labels"]["alertname"],),
    ).fetchone()
    assert row == {"status": "firing", "severity": "page", "summary": "a test", "ends_at": None}


def test_the_token_cli_creates_lists_and_revokes(stack):
    from tests.integration.test_application import run_cli

    name = f"cli-{uuid.uuid4().hex[:8]}"
    env = {"LEASEWORK_POSTGRES_DSN": stack.app_env("api")["LEASEWORK_POSTGRES_DSN"]}
    created = run_cli("token", "create", "--name", name, "--scopes", "read", env=env)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("lw_") and "shown once" in created.stderr
    assert request("GET", "/jobs?limit=1", token).status_code == 200
    listed = run_cli("token", "list", env=env)
    assert name in listed.stdout and token.split("_", 2)[2] not in listed.stdout
    again = run_cli("token", "create", "--name", name, "--scopes", "read", env=env)
    assert again.returncode == 1 and "revoke it first" in again.stderr
    bad = run_cli("token", "create", "--name", "x", "--scopes", "everything", env=env)
    assert bad.returncode == 2 and "choose from submit" in bad.stderr
    assert run_cli("token", "revoke", name, env=env).returncode == 0
    wait_for(lambda: request("GET", "/jobs?limit=1", token).status_code == 401, 5, "revoked")
    # the CLI's own calls need a token: without one it says where to get it
    refused = run_cli("list", env={"LEASEWORK_TOKEN": "", "LEASEWORK_TOKEN_FILE": "/nonexistent"})
    assert refused.returncode == 1 and "LEASEWORK_TOKEN" in refused.stderr
