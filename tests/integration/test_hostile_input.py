"""Input the job store cannot keep is the client's error, never an outage: a table of hostile
inputs, each sent through every door (single submit, batch, ``enqueue``, the SQL function),
must be refused with a 4xx naming the field (or a clear exception), write nothing, and never
be logged as a database outage."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
import pytest

import leasework
from leasework.demo import app as demo_app
from tests.integration.conftest import API_URL, DIRECT_DSN, auth, wait_status


@dataclass(frozen=True, repr=False)
class Hostile:
    name: str
    raw_payload: str  # the payload as JSON text, exactly as a hostile client sends it
    python: Any  # the same value handed to enqueue()
    field: str  # the field the answer must name
    sql: bool = True  # whether the SQL door can even be handed this (jsonb refuses some)

    def __repr__(self) -> str:  # the values themselves may be too deep to print
        return f"Hostile({self.name!r})"


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


HOSTILE = [
    Hostile("nul in a string", '{"s": "a\\u0000b"}', {"s": "a\x00b"}, "payload.s", sql=False),
    Hostile("nul in a key", '{"a\\u0000": 1}', {"a\x00": 1}, "payload", sql=False),
    Hostile("lone surrogate", '{"s": "\\ud800"}', {"s": "\ud800"}, "payload.s", sql=False),
    Hostile("NaN", '{"x": NaN}', {"x": float("nan")}, "payload.x", sql=False),
    Hostile("Infinity", '{"x": [Infinity]}', {"x": [float("inf")]}, "payload.x[0]", sql=False),
    Hostile("overflowing number", '{"x": 1e400}', {"x": float("inf")}, "payload.x", sql=False),
    Hostile("5000-digit integer", '{"x": ' + "7" * 5000 + "}", {"x": 7 * 10**4999}, "payload.x"),
    Hostile("40 levels deep", json.dumps(nested(40)), nested(40), "payload" + "[0]" * 32),
    Hostile(
        "100k levels deep", "[" * 100_000 + "]" * 100_000, nested(100_000), "(body)", sql=False
    ),
]


def submit_raw(body: str, path: str = "/jobs", **headers: str) -> httpx.Response:
    return httpx.post(
        API_URL + path,
        content=body.encode("utf-8", "surrogatepass"),
        headers=auth(**{"Content-Type": "application/json", **headers}),
        timeout=30,
    )


def assert_refused(response: httpx.Response, field: str) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    assert response.status_code != 503
    problem = response.json()
    named = [e["field"] for e in problem.get("errors", [])]
    assert any(n == field or n.endswith("." + field) or n.startswith(field) for n in named), (
        field,
        problem,
    )


def outages_logged(stack) -> int:
    return stack.logs("api", 100_000).count("database unavailable")


@pytest.fixture
def outage_count(stack):
    before = outages_logged(stack)
    yield
    assert outages_logged(stack) == before, "hostile input was logged as a database outage"


@pytest.mark.parametrize("hostile", HOSTILE, ids=lambda h: h.name)
def test_every_door_refuses_it_as_the_clients_error(hostile, db, outage_count):
    tag = uuid.uuid4().hex
    # single submit
    assert_refused(
        submit_raw(f'{{"type": "echo", "payload": {hostile.raw_payload}}}'), hostile.field
    )
    # batch: the bad item is named by its index, the good one is not written either
    good = f'{{"type": "noop", "payload": {{"tag": "{tag}"}}}}'
    batch = f'{{"jobs": [{good}, {{"type": "echo", "payload": {hostile.raw_payload}}}]}}'
    field = "jobs[1]." + hostile.field if hostile.field != "(body)" else "(body)"
    assert_refused(submit_raw(batch, "/jobs/batch"), field)
    # enqueue in the caller's transaction: a clear exception, the transaction still usable
    with psycopg.connect(DIRECT_DSN) as conn:
        with pytest.raises(leasework.InvalidJob) as caught:
            leasework.enqueue(conn, "echo", hostile.python, app=demo_app)
        expected = "payload" if hostile.field == "(body)" else hostile.field.split("[")[0]
        assert any(e.field.startswith(expected) for e in caught.value.errors), caught.value.errors
        assert conn.execute("SELECT 1").fetchone() == (1,)
    # the SQL door: refused by our checks or by jsonb itself, with SQLSTATE class 22
    if hostile.sql:
        with psycopg.connect(DIRECT_DSN) as conn:
            with pytest.raises(psycopg.DataError):
                conn.execute("SELECT leasework_enqueue('echo', %s::jsonb)", (hostile.raw_payload,))
    count = db.execute("SELECT count(*) AS n FROM jobs WHERE payload->>'tag' = %s", (tag,))
    assert count.fetchone()["n"] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"type": "no\u0000pe"}, "type"),
        ({"type": "noop", "ordering_key": "k\u0000"}, "ordering_key"),
        ({"type": "noop", "ordering_key": "\ud800"}, "ordering_key"),
        ({"type": "noop", "run_at": "0000-01-01T00:00:00Z"}, "run_at"),
        ({"type": "noop", "run_at": "0001-01-01T00:00:00+05:00"}, "run_at"),
        ({"type": "noop", "run_at": "9999-12-31T23:59:59-23:59"}, "run_at"),
        ({"type": "noop", "run_at": "10000-01-01T00:00:00Z"}, "run_at"),
        ({"type": "noop", "run_at": "2026-02-30T00:00:00Z"}, "run_at"),
        ({"type": "noop", "delay_seconds": 1e308}, "delay_seconds"),
        ({"type": "noop", "max_attempts": 2**63}, "max_attempts"),
        ({"type": "noop", "timeout_seconds": -(2**63)}, "timeout_seconds"),
        ({"type": "sleep", "payload": {"seconds": 10**400}}, "payload.seconds"),
    ],
)
def test_fields_the_store_cannot_keep_are_422_on_submit_and_in_a_batch(body, field, outage_count):
    text = json.dumps(body)
    assert_refused(submit_raw(text), field)
    assert_refused(submit_raw(f'{{"jobs": [{text}]}}', "/jobs/batch"), f"jobs[0].{field}")


def test_an_idempotency_key_the_store_cannot_keep_is_refused(outage_count):
    response = httpx.post(
        API_URL + "/jobs",
        json={"type": "noop"},
        headers=auth(**{"Idempotency-Key": "k" * 201}),
        timeout=10,
    )
    assert response.status_code == 422
    batch = {"jobs": [{"type": "noop", "idempotency_key": "key\u0000"}]}
    assert_refused(
        httpx.post(API_URL + "/jobs/batch", json=batch, timeout=10, headers=auth()),
        "jobs[0].idempotency_key",
    )


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("type=no%00pe", 422),
        ("status=%00", 422),
        ("limit=99999999999999999999", 422),
        ("cursor=%00", 400),
    ],
)
def test_hostile_list_filters_are_the_clients_error(query, status, outage_count):
    response = httpx.get(f"{API_URL}/jobs?{query}", timeout=10, headers=auth())
    assert response.status_code == status


def test_enqueue_refuses_python_values_with_no_json_form_and_naive_times(outage_count):
    with psycopg.connect(DIRECT_DSN) as conn:
        with pytest.raises(leasework.InvalidJob, match="payload.s"):
            leasework.enqueue(conn, "echo", {"s": {1, 2}}, app=None)
        with pytest.raises(leasework.InvalidJob, match="run_at"):
            leasework.enqueue(conn, "noop", run_at=datetime(2030, 1, 1))  # no offset
        with pytest.raises(leasework.InvalidJob, match="run_at"):
            leasework.enqueue(conn, "noop", run_at=datetime(1, 1, 1, tzinfo=UTC))


def test_the_sql_door_refuses_out_of_range_requests_with_clear_messages():
    cases = [
        ("SELECT leasework_enqueue('noop', run_at => 'infinity')", "finite"),
        ("SELECT leasework_enqueue('noop', delay => '-1 second')", "delay must be between"),
        ("SELECT leasework_enqueue('noop', max_attempts => 0)", "max_attempts"),
        ("SELECT leasework_enqueue('noop', ordering_key => '')", "ordering_key"),
        ("SELECT leasework_enqueue('no pe')", "job_type"),
        (f"SELECT leasework_enqueue('echo', '\"{'x' * 1_100_000}\"')", "1048576 bytes"),
    ]
    with psycopg.connect(DIRECT_DSN, autocommit=True) as conn:
        for sql, says in cases:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=says):
                conn.execute(sql)


def test_a_well_formed_unusual_payload_is_accepted(client):
    # the positive control: non-BMP characters, deep but legal nesting, big but legal numbers
    payload = {"emoji": "\U0001f680", "deep": nested(31), "n": 10**300, "f": 0.1}
    job = client.submit("echo", payload)
    assert client.wait(job["id"], timeout=60) == payload


def test_a_payload_stored_past_every_door_that_python_cannot_read_kills_the_job_not_the_worker(
    stack, client, db
):
    # jsonb keeps a 5000-digit integer; Python's json refuses to read one back (or write one)
    job_id = str(uuid.uuid4())
    request = f'[{{"id": "{job_id}", "type": "echo", "payload": {{"n": {"7" * 5000}}}}}]'
    db.execute("SELECT * FROM leasework_jobs_insert(%s::jsonb)", (request,))
    dead = wait_status(client, job_id, {"dead"}, timeout=60)
    assert dead["attempt"] == 1 and "cannot be read back: payload.n" in dead["last_error"]
    assert stack.is_running("worker-1") and stack.is_running("worker-2")
