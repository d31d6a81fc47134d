"""The durable job pipeline on the real stack: submit now and later, idempotency, listing,
retries, dead letters, poison, cancel, the relay's outbox under concurrency and failure; the
operators' cancel, retry and bulk retry (leasework.operations) and their audit rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row

from leasework import operations
from leasework.client import ApiError
from leasework.store import console as console_queries
from leasework.store.jobs import JobFilter
from tests.integration.conftest import (
    API_URL,
    DIRECT_DSN,
    auth,
    delete_jobs,
    dlq_message,
    insert_unchecked,
    readyz,
    wait_for,
    wait_status,
)
from tools.bench.tap import ReadyTap


def test_submit_later_is_scheduled_without_outbox_row_then_runs_after_its_due_time(client, db):
    job = client.submit("noop", {}, delay_seconds=3)
    assert job["status"] == "scheduled"
    assert (
        db.execute("SELECT count(*) AS n FROM outbox WHERE job_id = %s", (job["id"],)).fetchone()[
            "n"
        ]
        == 0
    )
    done = wait_status(client, job["id"], {"succeeded"}, timeout=60)
    assert done["started_at"] >= done["run_at"]


def test_run_at_in_the_past_runs_now(client):
    job = client.submit("noop", {}, run_at="2020-01-01T00:00:00+00:00")
    assert job["status"] == "queued"
    wait_status(client, job["id"], {"succeeded"}, timeout=30)


def test_idempotent_replay_returns_the_same_job_and_conflict_is_409(client):
    key = f"test-{uuid.uuid4()}"
    first = client.submit("noop", {"a": 1}, idempotency_key=key)
    again = client.submit("noop", {"a": 1}, idempotency_key=key)
    assert again["id"] == first["id"] and again["replay"] is True and first["replay"] is False
    with pytest.raises(ApiError) as caught:
        client.submit("noop", {"a": 2}, idempotency_key=key)
    assert caught.value.status == 409
    assert caught.value.problem["job_id"] == first["id"]


async def test_twenty_concurrent_identical_submits_create_one_job(aclient, stack):
    key = f"concurrent-{uuid.uuid4()}"
    results: list[dict] = []

    async def submit() -> None:
        results.append(await aclient.submit("noop", {"same": True}, idempotency_key=key))

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(submit)
    assert len({r["id"] for r in results}) == 1
    assert sum(not r["replay"] for r in results) == 1


def test_pagination_walks_every_job_once_newest_first(client, db):
    # a type of its own to filter on (no app defines it: written past the api's checks, due
    # in an hour so no worker sees it, deleted at the end)
    job_type = f"page-{uuid.uuid4().hex[:12]}"
    created = [insert_unchecked(db, job_type, {"n": n}, delay_seconds=3600) for n in range(23)]
    try:
        walk_pages(client, job_type, created)
    finally:
        delete_jobs(db, "type = %s", (job_type,))


def walk_pages(client, job_type: str, created: list[str]) -> None:
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = client.list(type=job_type, limit=5, cursor=cursor)
        seen.extend(j["id"] for j in page["jobs"])
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 5
    assert len(seen) == len(set(seen)) == 23
    assert seen == list(reversed(created))


def test_failing_job_retries_to_success(client, db):
    job = client.submit("fail", {"times": 2}, max_attempts=5)
    done = wait_status(client, job["id"], {"succeeded"}, timeout=90)
    assert done["attempt"] == 3
    outcomes = [
        r["outcome"]
        for r in db.execute(
            "SELECT outcome FROM attempts WHERE job_id = %s ORDER BY attempt", (job["id"],)
        )
    ]
    assert outcomes == ["failed", "failed", "succeeded"]


def test_job_failing_every_attempt_is_dead_with_a_dlq_message(client):
    job = client.submit("fail", {"times": 10}, max_attempts=2)
    dead = wait_status(client, job["id"], {"dead"}, timeout=90)
    assert dead["attempt"] == 2 and "failing on purpose" in dead["last_error"]
    headers, value = dlq_message(job["id"])
    assert headers["type"] == "fail" and headers["attempts"] == "2"
    assert "failing on purpose" in headers["last_error"]
    assert value["job_id"] == job["id"]


def test_a_stored_payload_that_does_not_fit_its_type_goes_straight_to_dead(client, db):
    # the SQL door checks the type, not the payload model: a payload its worker cannot decode
    # is poison, dead at its first attempt, with pydantic's own words
    job_id = db.execute(
        "SELECT leasework_enqueue('sleep', %s, max_attempts => 5)::text AS id",
        ('{"seconds": "soon"}',),
    ).fetchone()["id"]
    dead = wait_status(client, job_id, {"dead"}, timeout=60)
    assert dead["attempt"] == 1
    assert "payload does not fit type 'sleep'" in dead["last_error"]
    assert "payload.seconds" in dead["last_error"]


def test_a_permanent_error_goes_to_dead_after_one_attempt_and_a_plain_one_retries(client, db):
    permanent = client.submit("fail", {"times": 5, "permanent": True}, max_attempts=5)
    dead = wait_status(client, permanent["id"], {"dead"}, timeout=60)
    assert dead["attempt"] == 1 and dead["last_error"].startswith("Permanent: failing on purpose")
    plain = client.submit("fail", {"times": 1}, max_attempts=5)
    done = wait_status(client, plain["id"], {"succeeded"}, timeout=60)
    assert done["attempt"] == 2 and done["result"] == {"succeeded_on_attempt": 2}


def test_cancel_of_a_waiting_job_is_immediate_and_a_finished_job_answers_409(client):
    job = client.submit("noop", {}, delay_seconds=300)
    cancelled = client.cancel(job["id"])
    assert cancelled["status"] == "cancelled"
    with pytest.raises(ApiError) as caught:
        client.cancel(job["id"])
    assert caught.value.status == 409


def test_cancel_of_a_running_job_is_honoured_by_the_worker(client):
    job = client.submit("sleep", {"seconds": 60})
    wait_status(client, job["id"], {"running"}, timeout=30)
    requested = client.cancel(job["id"])
    assert requested["cancel_requested"] is True
    done = wait_status(client, job["id"], {"cancelled"}, timeout=30)
    assert done["finished_at"] is not None


def test_two_relays_at_once_deliver_every_job(stack, client, db):
    env = dict(os.environ)
    env.update(stack.app_env("relay"))
    env.update({"LEASEWORK_OPS_ADDR": "127.0.0.1:9192", "LEASEWORK_PROCESS_NAME": "relay-extra"})
    second = subprocess.Popen(
        [sys.executable, "-m", "leasework", "relay"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: httpx.get("http://127.0.0.1:9192/readyz", timeout=2).status_code == 200,
            60,
            "second relay ready",
        )
        jobs = [client.submit("noop", {"n": n}) for n in range(60)]
        for job in jobs:
            wait_status(client, job["id"], {"succeeded"}, timeout=90)
        ids = [j["id"] for j in jobs]
        # every row was acknowledged by Kafka and retired, by one relay or the other
        rows = db.execute(
            "SELECT count(*) AS n FROM outbox WHERE job_id = ANY(%s::uuid[])", (ids,)
        ).fetchone()
        assert rows["n"] == 0
    finally:
        second.terminate()
        second.wait(timeout=30)


@pytest.mark.parametrize(
    ("kwargs", "status", "slug"),
    [
        (
            {"content": b"{not json", "headers": {"Content-Type": "application/json"}},
            400,
            "malformed-json",
        ),
        (
            {"content": b"type=noop", "headers": {"Content-Type": "text/plain"}},
            415,
            "unsupported-media-type",
        ),
        ({"json": {"type": "noop", "payload": "x" * 2_000_000}}, 413, "body-too-large"),
        ({"json": {"type": "", "max_attempts": 0}}, 422, "invalid-fields"),
    ],
)
def test_bad_requests_get_problem_json(stack, kwargs, status, slug):
    kwargs = {**kwargs, "headers": auth(**kwargs.get("headers", {}))}
    response = httpx.post(f"{API_URL}/jobs", timeout=10, **kwargs)
    assert response.status_code == status
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["type"].endswith(slug) and problem["detail"]
    if status == 422:
        assert {e["field"] for e in problem["errors"]} == {"type", "max_attempts"}


def test_unknown_job_is_404_problem_and_openapi_is_served(stack):
    response = httpx.get(f"{API_URL}/jobs/{uuid.uuid4()}", timeout=5, headers=auth())
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")
    spec = httpx.get(f"{API_URL}/openapi.json", timeout=5).json()
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/cancel"} <= set(spec["paths"])


def relay_kafka_proxies(stack) -> tuple[str, ...]:
    """The proxies between the relay and Kafka: its own, or in secure mode the secured
    listeners' (which every process shares)."""
    suffix = "-secure" if stack.layout.mode() == "secure" else ""
    return tuple(f"kafka-{n}{suffix}" for n in (1, 2, 3))


def set_proxies_enabled(names, enabled: bool) -> None:
    for name in names:
        response = httpx.post(
            f"http://127.0.0.1:8474/proxies/{name}", json={"enabled": enabled}, timeout=5
        )
        response.raise_for_status()


def test_relay_keeps_rows_and_says_so_while_kafka_is_unreachable(stack, client, db):
    proxies = relay_kafka_proxies(stack)
    set_proxies_enabled(proxies, False)
    try:
        job = client.submit("noop", {"kafka": "down"})
        status, body = wait_for(
            lambda: (r := readyz(9102))[0] == 503 and r,
            30,
            "relay /readyz to report kafka unreachable",
        )
        assert "kafka" in json.dumps(body["unavailable"]), body
        # kept: a row leaves the outbox only once Kafka acknowledged it
        row = db.execute("SELECT id FROM outbox WHERE job_id = %s", (job["id"],)).fetchone()
        assert row is not None
    finally:
        set_proxies_enabled(proxies, True)
    wait_for(lambda: readyz(9102)[0] == 200, 60, "relay ready again")
    wait_status(client, job["id"], {"succeeded"}, timeout=90)


# ---------------------------------------------------------------- operations, in the store


@pytest.fixture
def tx(stack) -> Iterator[psycopg.Connection]:
    """A connection inside a transaction that is rolled back after the test."""
    with psycopg.connect(DIRECT_DSN, row_factory=dict_row) as connection:
        yield connection
        connection.rollback()


def job_in(tx: psycopg.Connection, status: str, job_type: str = "noop") -> uuid.UUID:
    """A job of ``job_type`` in ``status`` (finished now, when that is terminal)."""
    row = tx.execute(
        """INSERT INTO jobs (id, type, payload, status, max_attempts, attempt_budget,
                             timeout_seconds, run_at, finished_at)
           VALUES (%s, %s, '{}', %s, 3, 3, 60, now(),
                   CASE WHEN %s IN ('dead', 'cancelled', 'succeeded') THEN now() END)
           RETURNING id""",
        (uuid.uuid4(), job_type, status, status),
    ).fetchone()
    return row["id"]


def audit_of(conn: psycopg.Connection, target: str) -> list[tuple[str, str, dict]]:
    rows = conn.execute(
        "SELECT actor, action, detail FROM audit_log WHERE target = %s ORDER BY id", (target,)
    ).fetchall()
    return [(r["actor"], r["action"], r["detail"]) for r in rows]


ME = operations.Actor("test-operator", "api")


def test_a_cancel_and_a_retry_write_their_audit_row_in_their_own_transaction(tx):
    job_id = job_in(tx, "queued")
    assert operations.cancel(tx, job_id, ME).outcome == "cancelled"
    assert operations.retry(tx, job_id, ME, topic="jobs.ready").outcome == "retried"
    assert audit_of(tx, str(job_id)) == [
        ("test-operator", "cancel", {"via": "api", "outcome": "cancelled"}),
        ("test-operator", "retry", {"via": "api", "outcome": "retried"}),
    ]
    with psycopg.connect(DIRECT_DSN, row_factory=dict_row) as other:
        assert audit_of(other, str(job_id)) == []  # not committed: it goes with the change


def test_a_refused_or_idle_operation_writes_no_audit_row(tx):
    finished, queued, missing = job_in(tx, "succeeded"), job_in(tx, "queued"), uuid.uuid4()
    assert operations.cancel(tx, finished, ME).outcome == "finished"
    assert operations.cancel(tx, missing, ME).outcome == "missing"
    assert operations.retry(tx, queued, ME, topic="jobs.ready").outcome == "not-retryable"
    assert operations.retry(tx, missing, ME, topic="jobs.ready").outcome == "missing"
    for job_id in (finished, queued, missing):
        assert audit_of(tx, str(job_id)) == []


def test_a_bulk_retry_requeues_what_its_filter_counts_and_audits_it_once(tx):
    job_type = f"bulk.{uuid.uuid4().hex[:8]}"
    dead = [job_in(tx, "dead", job_type) for _ in range(3)]
    job_in(tx, "cancelled", job_type)  # another status: not selected
    job_filter = JobFilter("dead", job_type)
    assert console_queries.jobs_count(tx, job_filter, up_to=100) == 3
    bulk = operations.bulk_retry(job_filter, limit=2)
    assert operations.retry_matching(tx, bulk, ME, topic="jobs.ready").retried == 2
    statuses = tx.execute(
        "SELECT status, count(*) AS n FROM jobs WHERE id = ANY(%s) GROUP BY status", (dead,)
    ).fetchall()
    assert {r["status"]: r["n"] for r in statuses} == {"queued": 2, "dead": 1}
    target = operations.describe(job_filter)
    assert audit_of(tx, target) == [
        (
            "test-operator",
            "retry-many",
            {
                "via": "api",
                "filter": {"status": "dead", "type": job_type},
                "limit": 2,
                "retried": 2,
            },
        )
    ]
    nothing = operations.bulk_retry(JobFilter("dead", job_type + ".none"))
    assert operations.retry_matching(tx, nothing, ME, topic="jobs.ready").retried == 0
    assert audit_of(tx, operations.describe(nothing.jobs)) == []


def test_a_refused_cancel_through_the_api_writes_no_audit_row(client, db):
    job = client.submit("noop", {}, delay_seconds=300)
    client.cancel(job["id"])
    with pytest.raises(ApiError) as caught:
        client.cancel(job["id"])
    assert caught.value.status == 409
    actions = [a for _, a, _ in audit_of(db, job["id"])]
    assert actions == ["cancel"]


def test_a_pass_puts_free_jobs_on_one_partition_and_ordered_ones_by_their_key(client):
    """A batch of 20 jobs is one transaction, so one relay pass: without ordering keys they
    share one partition (Kafka's cost per pass, not per job); with an ordering key each goes
    to its key's partition, whatever pass carries it."""
    with ReadyTap() as tap:
        free = client.submit_many([{"type": "noop", "payload": {"n": n}} for n in range(20)])
        placed = {j: p.partition for j, p in tap.read({j["id"] for j in free}).items()}
        assert len(set(placed.values())) == 1, placed
        ordered = []
        for _ in range(2):  # the same keys in two requests, so in two passes
            ordered += client.submit_many(
                [
                    {"type": "noop", "payload": {"k": k}, "ordering_key": f"customer-{k}"}
                    for k in range(6)
                ]
            )
        placed = {j: p.partition for j, p in tap.read({j["id"] for j in ordered}).items()}
    by_key: dict[int, set[int]] = {}
    for index, job in enumerate(ordered):
        by_key.setdefault(index % 6, set()).add(placed[job["id"]])
    assert all(len(parts) == 1 for parts in by_key.values()), by_key  # one key, one partition
    assert len({next(iter(p)) for p in by_key.values()}) > 1  # six keys: hashed, not piled up
