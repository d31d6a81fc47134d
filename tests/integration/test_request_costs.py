"""Nothing anyone sends may stall the api: every request's cost is bounded before it is paid.

Against the stack's real api: an oversized body is refused with 413 before its bytes are even
sent (the answer comes from the declared length) and as soon as a streamed one passes the cap,
on every route; a body that trickles in is refused at the read timeout; a container where a
scalar belongs is a 4xx at every field of every door; a stranger's token costs no query; the
console is metered like the API; no static folder is served; the ops endpoints can live on an
internal listener; a bystander is never held for seconds while an attacker sends the worst
bodies there are (tools/bystander.py measures it properly: `just bystander`)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import psycopg
import pytest

import leasework
from leasework.api.limits import BodyLimits
from leasework.config import Settings
from leasework.demo import app as demo_app
from leasework.tokens import new_token
from tests.integration.conftest import API_URL, DIRECT_DSN, auth, free_port, wait_for
from tools import bystander

LIMITS = BodyLimits.from_settings(Settings(role="api", process_name="api"))  # the stack's api
HOST, PORT = "127.0.0.1", int(API_URL.rsplit(":", 1)[1])

# (method, path, cap): every kind of route, public and authenticated
CAPPED = [
    ("GET", "/healthz", LIMITS.small),
    ("GET", "/readyz", LIMITS.small),
    ("GET", "/metrics", LIMITS.small),
    ("GET", "/openapi.json", LIMITS.small),
    ("POST", "/no-such-path", LIMITS.small),
    ("POST", "/ui/login", LIMITS.form),
    ("POST", "/ui/jobs/retry", LIMITS.form),
    ("POST", "/jobs", LIMITS.submit),
    ("POST", "/jobs/batch", LIMITS.batch),
    ("POST", "/jobs/retry", LIMITS.small),
    ("POST", "/tokens", LIMITS.small),
    ("POST", "/alerts/webhook", LIMITS.webhook),
]


def raw_request(head: str, body: bytes = b"", *, read_timeout: float = 5.0) -> tuple[int, float]:
    """Send a request head (and ``body``) on a fresh connection; (status, seconds until the
    status line arrived)."""
    started = time.monotonic()
    with socket.create_connection((HOST, PORT), timeout=read_timeout) as sock:
        sock.sendall(head.encode() + body)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ", 2)[1]), time.monotonic() - started


def head(method: str, path: str, extra: str = "") -> str:
    token = auth().get("Authorization", "")
    return (
        f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{PORT}\r\nAuthorization: {token}\r\n"
        f"Content-Type: application/json\r\n{extra}"
    )


@pytest.mark.parametrize(("method", "path", "cap"), CAPPED, ids=[f"{m} {p}" for m, p, _ in CAPPED])
def test_an_oversized_body_is_413_before_it_is_sent_and_as_a_stream_passes_the_cap(
    stack, method, path, cap
):
    # only the head: the answer comes from the declared length, no byte of the body is read
    status, seconds = raw_request(head(method, path, f"Content-Length: {cap + 1}\r\n\r\n"))
    assert (status, seconds < 2) == (413, True), (status, seconds)
    # streamed without a length: refused as soon as the bytes pass the cap
    chunk = b"0" * 65536
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(cap // 65536 + 1))
    status, _ = raw_request(head(method, path, "Transfer-Encoding: chunked\r\n\r\n"), chunks)
    assert status == 413


def test_a_body_that_trickles_in_is_refused_at_the_read_timeout(stack):
    started = time.monotonic()
    with socket.create_connection((HOST, PORT), timeout=LIMITS.read_timeout + 10) as sock:
        sock.sendall(head("POST", "/jobs", "Content-Length: 100\r\n\r\n").encode() + b'{"ty')
        answer = sock.recv(4096)  # and nothing more is sent
    elapsed = time.monotonic() - started
    assert answer.split(b" ", 2)[1] == b"408", answer[:200]
    assert LIMITS.read_timeout - 1 < elapsed < LIMITS.read_timeout + 5


def test_quart_does_not_serve_a_static_folder(stack):
    for path in ("/static/console.css", "/static/../pyproject.toml", "/static/"):
        assert httpx.get(API_URL + path, timeout=10).status_code == 404, path
    assert httpx.get(API_URL + "/ui/static/console.css", timeout=10).status_code == 200


# ---------------------------------------------------------------- no input is a 500

DEEP = "[" * 900 + "1" + "]" * 900  # as deep as JSON parsers go, where a scalar belongs
CONTAINERS = {
    "deep list": DEEP,
    "object": '{"a": {"b": [1, 2]}}',
    "empty list": "[]",
    "wide list": "[" + ",".join(["0"] * 5000) + "]",
}

# (door, a valid body as JSON text with {} where each field's hostile value goes)
SUBMIT_FIELDS = ["type", "payload", "run_at", "delay_seconds", "max_attempts",
                 "timeout_seconds", "ordering_key"]  # fmt: skip


SCALAR_FIELDS = {*SUBMIT_FIELDS, "idempotency_key", "status", "finished_after",
                 "finished_before", "limit", "name", "rate", "burst", "startsAt", "endsAt",
                 "alertname", "receiver"} - {"payload"}  # fmt: skip


def job_with(field: str, value: str) -> str:
    fields = {"type": '"noop"', "payload": "{}"}
    fields[field] = value
    return "{" + ",".join(f'"{k}": {v}' for k, v in fields.items()) + "}"


STARTS = "2026-01-01T00:00:00Z"


def bodies() -> list[tuple[str, str, str]]:
    """(path, the field, the body) for every field of every JSON door."""
    out = []
    for name, value in CONTAINERS.items():
        for field in SUBMIT_FIELDS:
            out.append(("/jobs", f"{field} ({name})", job_with(field, value)))
            out.append(("/jobs/batch", f"jobs[0].{field} ({name})",
                        '{"jobs": [' + job_with(field, value) + "]}"))  # fmt: skip
        out.append(("/jobs/batch", f"jobs[0].idempotency_key ({name})",
                    '{"jobs": [{"type": "noop", "idempotency_key": ' + value + "}]}"))  # fmt: skip
        out.append(("/jobs/batch", f"jobs ({name})", '{"jobs": ' + value + "}"))
        out.append(("/jobs/batch", f"jobs[0] ({name})", '{"jobs": [' + value + "]}"))
        for field in ("type", "status", "finished_after", "finished_before", "limit"):
            out.append(("/jobs/retry", f"{field} ({name})", f'{{"{field}": {value}}}'))
        for field in ("name", "scopes", "rate", "burst"):
            body = {"name": '"n"', "scopes": '["read"]', "rate": "1", "burst": "1"}
            body[field] = value
            out.append(("/tokens", f"{field} ({name})",
                        "{" + ",".join(f'"{k}": {v}' for k, v in body.items()) + "}"))  # fmt: skip
        alert = {"labels": '{"alertname": "A"}', "annotations": "{}", "status": '"firing"',
                 "startsAt": f'"{STARTS}"', "endsAt": '"0001-01-01T00:00:00Z"'}  # fmt: skip
        for field in alert:
            one = {**alert, field: value}
            text = "{" + ",".join(f'"{k}": {v}' for k, v in one.items()) + "}"
            out.append(("/alerts/webhook", f"alerts[0].{field} ({name})",
                        '{"receiver": "r", "alerts": [' + text + "]}"))  # fmt: skip
        out.append(("/alerts/webhook", f"alerts[0].labels.alertname ({name})",
                    '{"alerts": [{"labels": {"alertname": ' + value + "}}]}"))  # fmt: skip
        for field in ("receiver", "status", "alerts"):
            out.append(("/alerts/webhook", f"{field} ({name})",
                        '{"alerts": [], "' + field + '": ' + value + "}"))  # fmt: skip
    return out


def test_a_container_where_a_scalar_belongs_is_a_4xx_at_every_field_of_every_http_door(stack):
    answers: dict[str, int] = {}
    with httpx.Client(base_url=API_URL, headers=auth(), timeout=30) as http:
        for path, field, body in bodies():
            response = http.post(path, content=body, headers={"Content-Type": "application/json"})
            answers[f"{path} {field}"] = response.status_code
    errors = {k: v for k, v in answers.items() if v >= 500}
    assert not errors, errors
    assert len(answers) > 100
    # every field that holds a scalar refused every container (payload, labels, annotations
    # and the lists themselves may hold one)
    wrong = {
        k: v
        for k, v in answers.items()
        if re.split(r"[.\[ ]", k.split(" ", 1)[1].rsplit(".", 1)[-1])[0] in SCALAR_FIELDS
        and not 400 <= v < 500
    }
    assert not wrong, wrong


@pytest.mark.parametrize("name", list(CONTAINERS))
def test_a_container_where_a_scalar_belongs_is_refused_by_enqueue(name):
    value = json.loads(CONTAINERS[name])
    with psycopg.connect(DIRECT_DSN) as conn:
        for field in ("max_attempts", "timeout_seconds", "ordering_key", "idempotency_key"):
            with pytest.raises(leasework.InvalidJob):
                leasework.enqueue(conn, "noop", {}, app=demo_app, **{field: value})
        with pytest.raises(leasework.InvalidJob):
            leasework.enqueue(conn, "noop", {}, app=demo_app, delay=value)
        assert conn.execute("SELECT 1").fetchone() == (1,)


# ---------------------------------------------------------------- tokens, console


def api_token_scans(db) -> int:
    row = db.execute(
        "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) AS n FROM pg_stat_user_tables "
        "WHERE relname = 'api_tokens'"
    ).fetchone()
    return row["n"]


def scans_while(db, action) -> int:
    """Scans of api_tokens while ``action`` runs (the statistics flushed before and after)."""
    db.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(1.1)
    before = api_token_scans(db)
    action()
    time.sleep(1.1)  # the api's own counts reach the view within a second
    return api_token_scans(db) - before


def test_a_strangers_well_formed_tokens_never_reach_postgres(stack, db):
    def strangers() -> None:
        def one(_: int) -> int:
            stranger, _ = new_token()
            headers = {"Authorization": f"Bearer {stranger}"}
            return httpx.get(API_URL + "/jobs", headers=headers, timeout=30).status_code

        with ThreadPoolExecutor(max_workers=50) as pool:
            assert set(pool.map(one, range(200))) == {401}

    started = time.monotonic()
    during = scans_while(db, strangers)
    elapsed = time.monotonic() - started
    quiet = scans_while(db, lambda: time.sleep(elapsed - 2.2))
    # the reloads scan it twice a second either way; 200 strangers add nothing of their own
    assert during - quiet < 20, (during, quiet)


def console_session(token: str) -> httpx.Client:
    http = httpx.Client(base_url=API_URL, timeout=30)
    page = http.get("/ui/login")
    nonce = re.search(r'name="nonce" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    login = http.post(
        "/ui/login",
        data={"token": token, "nonce": nonce, "next": "/ui/jobs"},
        headers={"Origin": API_URL},
    )
    assert login.status_code == 303, login.text[:300]
    return http


def test_console_requests_count_against_the_tokens_rate_limit(stack, make_token):
    _, token = make_token("read", rate=0.5, burst=3)
    http = console_session(token)
    try:
        statuses = [http.get("/ui/jobs").status_code for _ in range(6)]
    finally:
        http.close()
    assert statuses[:2] == [200, 200], statuses  # the login took one of the three
    assert 429 in statuses, statuses


def test_alertmanagers_webhook_token_has_a_rate(stack, db):
    row = db.execute(
        "SELECT rate, burst FROM api_tokens WHERE name = 'alertmanager' AND revoked_at IS NULL"
    ).fetchone()
    assert row is not None and row["rate"] is not None and row["burst"] is not None


# ---------------------------------------------------------------- the internal listener


def test_metrics_and_dependency_errors_can_live_on_an_internal_listener(stack, tmp_path):
    public, internal = free_port(), free_port()
    env = {
        **os.environ,
        "LEASEWORK_OPS_ADDR": f"{HOST}:{public}",
        "LEASEWORK_INTERNAL_ADDR": f"{HOST}:{internal}",
        "LEASEWORK_PROCESS_NAME": "api-internal-test",
        "LEASEWORK_APP": "leasework.demo:app",
        # a Prometheus nobody answers: the overview degrades, nothing else needs it
        "LEASEWORK_POSTGRES_DSN": DIRECT_DSN,
    }
    log = (tmp_path / "api.log").open("wb")
    api = subprocess.Popen(
        [sys.executable, "-m", "leasework", "api"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:

        def ready() -> bool:
            return httpx.get(f"http://{HOST}:{public}/readyz", timeout=2).status_code == 200

        wait_for(ready, 60, "the second api ready")
        assert httpx.get(f"http://{HOST}:{public}/metrics", timeout=5).status_code == 404
        metrics = httpx.get(f"http://{HOST}:{internal}/metrics", timeout=5)
        assert metrics.status_code == 200 and "leasework_event_loop_lag" in metrics.text
        assert httpx.get(f"http://{HOST}:{internal}/readyz", timeout=5).status_code == 200
    finally:
        api.terminate()
        api.wait(timeout=30)
        log.close()


# ---------------------------------------------------------------- the bystander


def test_a_bystander_is_never_held_for_seconds_while_the_worst_bodies_arrive(stack):
    result = bystander.run(API_URL, seconds=6, attackers=2, token=auth()["Authorization"][7:])
    print("\n".join(bystander.report(result)))
    for what in ("readyz", "submit"):
        attacked = result["attacked"][what]
        assert attacked["count"] >= 10, attacked
        assert attacked["failed"] == 0, attacked
        assert attacked["max_ms"] < 3000, attacked  # a generous bound: never held for seconds
    assert result["attacked"]["loop_lag"]["over_250ms"] <= 2, result["attacked"]["loop_lag"]


# ---------------------------------------------------------------- a restarted Postgres


def test_the_first_requests_after_postgres_restarted_succeed(stack):
    stack.restart("postgres")
    shop = httpx.post(
        "http://127.0.0.1:8090/orders",
        json={"email": f"{uuid.uuid4().hex[:8]}@example.com", "amount_cents": 100},
        timeout=30,
    )
    assert shop.status_code in (200, 201), shop.text
    submit = httpx.post(API_URL + "/jobs", json={"type": "noop"}, headers=auth(), timeout=30)
    assert submit.status_code == 202, submit.text
