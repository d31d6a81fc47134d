"""The application API on the real stack: a user's own job type (the example shop's
``send_receipt``), enqueued inside the user's own transaction through every door, batch
submit, results, retries, deferral during a rolling deploy, the pruner, ``leasework.testing``
and ``leasework dev``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest
import trio
from psycopg.rows import dict_row, tuple_row

import leasework
from chaos.runner import topic_end_offsets, topic_messages
from devstack.layout import POSTGRES_DSN, SHOP_URL, STACK_APP
from examples.shop.jobs import Receipt
from examples.shop.jobs import app as shop_app
from leasework import testing
from leasework.db import Database
from leasework.doors import sync_door
from leasework.relay.pruner import Pruner, PrunerConfig, Retention
from leasework.states import Status
from tests.integration.conftest import DIRECT_DSN, delete_jobs, wait_for, wait_status


def new_order(conn: psycopg.Connection, email: str = "ada@example.com") -> int:
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(
            "INSERT INTO shop_orders (email, amount_cents) VALUES (%s, 1200) RETURNING id",
            (email,),
        )
        return cur.fetchone()[0]


def order(db, order_id: int) -> dict:
    return db.execute("SELECT * FROM shop_orders WHERE id = %s", (order_id,)).fetchone()


def messages_for(job_ids: set[str], since: dict[int, int]) -> list[dict]:
    """jobs.ready messages published after the offsets ``since`` that wake one of ``job_ids``."""
    return [m for m in topic_messages(since, "jobs.ready") if m.get("job_id") in job_ids]


# ---------------------------------------------------------------- in the caller's transaction


def test_rollback_of_the_callers_transaction_leaves_no_job_and_no_message(client, db):
    since = topic_end_offsets("jobs.ready")
    with psycopg.connect(DIRECT_DSN) as conn:
        order_id = new_order(conn)
        job_id = leasework.enqueue(
            conn, "send_receipt", Receipt(order_id=order_id, email="ada@example.com"), app=shop_app
        )
        # inside the transaction the job and its outbox row exist...
        assert conn.execute("SELECT count(*) FROM outbox WHERE job_id = %s", (job_id,)).fetchone()[
            0
        ]
        conn.rollback()
    # ...after the rollback neither does, nor the order
    assert (
        db.execute("SELECT count(*) AS n FROM jobs WHERE id = %s", (job_id,)).fetchone()["n"] == 0
    )
    assert order(db, order_id) is None
    # a committed job enqueued afterwards is relayed; the rolled-back one never was
    later = client.submit("noop", {"after": str(job_id)})
    wait_status(client, later["id"], {"succeeded"}, timeout=60)
    assert messages_for({str(job_id)}, since) == []
    assert messages_for({later["id"]}, since)  # the check above could have seen a message


def test_commit_runs_the_users_job_once_with_one_effect_in_the_users_table(client, db):
    with psycopg.connect(DIRECT_DSN) as conn:  # commits on exit
        order_id = new_order(conn, "grace@example.com")
        job_id = leasework.enqueue(
            conn,
            "send_receipt",
            {"order_id": order_id, "email": "grace@example.com"},
            app=shop_app,
            idempotency_key=f"order-{order_id}",
        )
    result = client.wait(job_id, timeout=60)
    assert result["sent_to"] == "grace@example.com"
    row = order(db, order_id)
    assert row["receipts_recorded"] == 1 and row["receipt_job_id"] == job_id
    assert row["receipt_message_id"] == result["message_id"]
    mail = db.execute(
        "SELECT calls FROM shop_mail WHERE idempotency_key = %s", (f"leasework:{job_id}",)
    ).fetchall()
    assert [m["calls"] for m in mail] == [1]
    job = client.get(job_id)
    assert job["attempt"] == 1 and job["max_attempts"] == 5 and job["timeout_seconds"] == 30


def test_the_shops_endpoint_places_the_order_and_its_receipt_in_one_transaction(client, db):
    key = f"shop-{uuid.uuid4()}"
    body = {"email": "alan@example.com", "amount_cents": 990}
    placed = httpx.post(f"{SHOP_URL}/orders", json=body, headers={"Idempotency-Key": key})
    assert placed.status_code == 201, placed.text
    again = httpx.post(f"{SHOP_URL}/orders", json=body, headers={"Idempotency-Key": key})
    assert again.status_code == 200 and again.json()["order_id"] == placed.json()["order_id"]
    client.wait(placed.json()["receipt_job_id"], timeout=60)
    assert order(db, placed.json()["order_id"])["receipts_recorded"] == 1


def test_enqueue_replays_a_key_refuses_a_conflict_and_checks_the_payload(db):
    key = f"enqueue-{uuid.uuid4()}"
    with psycopg.connect(DIRECT_DSN, autocommit=True) as conn:
        first = leasework.enqueue(conn, "noop", {"a": 1}, idempotency_key=key)
        assert leasework.enqueue(conn, "noop", {"a": 1}, idempotency_key=key) == first
        with pytest.raises(leasework.IdempotencyConflict, match=str(first)):
            leasework.enqueue(conn, "noop", {"a": 2}, idempotency_key=key)
        with pytest.raises(leasework.InvalidJob, match="payload.order_id"):
            leasework.enqueue(conn, "send_receipt", {"order_id": "x", "email": "a@b"}, app=shop_app)
        with pytest.raises(leasework.UnknownJobType, match="no api or worker registered"):
            leasework.enqueue(conn, "never_registered_type", {})


def test_enqueue_remembers_a_registered_type_but_never_a_missing_one(db):
    name = f"late_type_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(DIRECT_DSN, autocommit=True) as conn:
        with pytest.raises(leasework.UnknownJobType, match=name):
            leasework.enqueue(conn, name, {})
        conn.execute("INSERT INTO job_types (name, registered_by) VALUES (%s, 'test')", (name,))
        try:
            job_id = leasework.enqueue(conn, name, {}, delay=3600)
            # seen registered once, the next enqueue of it asks Postgres nothing more
            enqueue_module = sys.modules["leasework.enqueue"]
            assert name in enqueue_module._REGISTERED[sync_door(conn).database()]
            assert leasework.enqueue(conn, name, {}, delay=3600) != job_id
        finally:
            delete_jobs(conn, "type = %s", (name,))
            conn.execute("DELETE FROM job_types WHERE name = %s", (name,))


def test_enqueue_many_is_all_or_nothing_inside_the_callers_transaction(db):
    tag = uuid.uuid4().hex
    key = f"many-{tag}"
    with psycopg.connect(DIRECT_DSN) as conn:
        leasework.enqueue(conn, "noop", {"first": True}, idempotency_key=key)
        conn.commit()
        kept = leasework.enqueue(conn, "noop", {"kept": tag})
        jobs = [leasework.job("noop", {"tag": tag, "n": n}) for n in range(5)]
        jobs.append(leasework.job("noop", {"other": True}, idempotency_key=key))  # conflicts
        with pytest.raises(leasework.IdempotencyConflict):
            leasework.enqueue_many(conn, jobs)
        # the batch is undone, the caller's transaction is not: its earlier job survives
        conn.commit()
        ids = leasework.enqueue_many(
            conn, [{"job_type": "noop", "payload": {"n": n}} for n in range(3)]
        )
        conn.commit()
    assert (
        db.execute("SELECT count(*) AS n FROM jobs WHERE payload->>'tag' = %s", (tag,)).fetchone()[
            "n"
        ]
        == 0
    )
    assert db.execute("SELECT count(*) AS n FROM jobs WHERE id = %s", (kept,)).fetchone()["n"] == 1
    assert len(set(ids)) == 3


def test_the_async_twin_enqueues_in_an_asyncio_applications_transaction(client, db):
    async def app_code() -> tuple[uuid.UUID, uuid.UUID]:
        async with await psycopg.AsyncConnection.connect(DIRECT_DSN) as conn:
            kept = await leasework.enqueue_async(conn, "echo", {"hello": "asyncio"}, app=None)
            await conn.commit()
            dropped = (await leasework.enqueue_many_async(conn, [leasework.job("noop")]))[0]
            await conn.rollback()
            return kept, dropped

    kept, dropped = asyncio.run(app_code())
    assert client.wait(kept, timeout=60) == {"hello": "asyncio"}
    assert (
        db.execute("SELECT count(*) AS n FROM jobs WHERE id = %s", (dropped,)).fetchone()["n"] == 0
    )


def test_the_sql_function_enqueues_in_any_languages_transaction(client, db):
    with psycopg.connect(DIRECT_DSN, row_factory=dict_row) as conn:
        order_id = new_order(conn, "sql@example.com")
        job_id = conn.execute(
            "SELECT leasework_enqueue('send_receipt', %s, delay => '1 second') AS id",
            (json.dumps({"order_id": order_id, "email": "sql@example.com"}),),
        ).fetchone()["id"]
        rolled_back = conn.execute("SELECT leasework_enqueue('noop') AS id").fetchone()["id"]
        conn.commit()
        conn.execute("SELECT leasework_enqueue('noop')")
        conn.rollback()
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="unknown job type"):
            conn.execute("SELECT leasework_enqueue('nope')")
        conn.rollback()
        key = f"sql-{uuid.uuid4()}"
        first = conn.execute(
            "SELECT leasework_enqueue('noop', idempotency_key => %s) AS id", (key,)
        )
        first_id = first.fetchone()["id"]
        again = conn.execute(
            "SELECT leasework_enqueue('noop', idempotency_key => %s) AS id", (key,)
        )
        assert again.fetchone()["id"] == first_id
        with pytest.raises(psycopg.errors.UniqueViolation, match="different request"):
            conn.execute(
                "SELECT leasework_enqueue('noop', '{\"x\": 1}', idempotency_key => %s)", (key,)
            )
        conn.rollback()
    done = wait_status(client, str(job_id), {"succeeded"}, timeout=60)
    assert done["max_attempts"] == 5 and done["timeout_seconds"] == 30  # the type's, registered
    assert order(db, order_id)["receipts_recorded"] == 1
    assert client.get(str(rolled_back))["status"] in {"queued", "running", "succeeded"}


def test_the_same_request_through_two_doors_is_one_job(client, db):
    key = f"doors-{uuid.uuid4()}"
    via_http = client.submit("noop", {"n": 1}, idempotency_key=key, delay_seconds=5)
    via_sql = db.execute(
        "SELECT leasework_enqueue('noop', '{\"n\": 1}', delay => '5 seconds', "
        "idempotency_key => %s)::text AS id",
        (key,),
    ).fetchone()["id"]
    with psycopg.connect(DIRECT_DSN) as conn:
        via_python = leasework.enqueue(conn, "noop", {"n": 1}, idempotency_key=key, delay=5.0)
    assert via_http["id"] == via_sql == str(via_python)


# ---------------------------------------------------------------- batch, results, retries


def test_a_batch_of_a_thousand_runs_every_job_and_one_bad_item_refuses_all(client, db):
    tag = uuid.uuid4().hex
    bad = [{"type": "noop", "payload": {"tag": tag}} for _ in range(999)]
    bad.append({"type": "sleep", "payload": {"seconds": "forever"}})
    with pytest.raises(leasework.ApiError) as caught:
        client.submit_many(bad)
    assert caught.value.status == 422
    assert [e["field"] for e in caught.value.problem["errors"]] == ["jobs[999].payload.seconds"]
    count = "SELECT count(*) AS n FROM jobs WHERE payload->>'tag' = %s"
    assert db.execute(count, (tag,)).fetchone()["n"] == 0

    accepted = client.submit_many(
        [{"type": "noop", "payload": {"tag": tag, "n": n}} for n in range(1000)]
    )
    assert len(accepted) == len({j["id"] for j in accepted}) == 1000
    assert db.execute(count, (tag,)).fetchone()["n"] == 1000
    wait_for(
        lambda: db.execute(count + " AND status = 'succeeded'", (tag,)).fetchone()["n"] == 1000,
        180,
        "all 1000 batch jobs to succeed",
    )


def test_a_batch_item_reusing_a_key_for_another_request_refuses_the_batch(client, db):
    key = f"batch-{uuid.uuid4()}"
    client.submit("noop", {"v": 1}, idempotency_key=key)
    tag = uuid.uuid4().hex
    jobs = [
        {"type": "noop", "payload": {"tag": tag}},
        {"type": "noop", "payload": {"v": 2}, "idempotency_key": key},
    ]
    with pytest.raises(leasework.ApiError) as caught:
        client.submit_many(jobs)
    assert caught.value.status == 409 and caught.value.problem["index"] == 1
    assert (
        db.execute("SELECT count(*) AS n FROM jobs WHERE payload->>'tag' = %s", (tag,)).fetchone()[
            "n"
        ]
        == 0
    )


def test_wait_returns_the_result_or_raises_with_the_last_error(client):
    echoed = client.submit("echo", {"answer": 42})
    assert client.wait(echoed["id"], timeout=60) == {"answer": 42}
    doomed = client.submit("fail", {"times": 3}, max_attempts=1)
    with pytest.raises(leasework.JobFailed, match="failing on purpose") as caught:
        client.wait(doomed["id"], timeout=60)
    assert caught.value.status == "dead"
    sleeper = client.submit("sleep", {"seconds": 30})
    with pytest.raises(leasework.WaitTimeout):
        client.wait(sleeper["id"], timeout=0.5)
    client.cancel(sleeper["id"])


def test_a_result_too_large_is_a_clear_error(client):
    job = client.submit("echo", {"blob": "x" * 70_000})
    dead = wait_status(client, job["id"], {"dead"}, timeout=60)
    assert dead["attempt"] == 1 and "over the 65536-byte limit" in dead["last_error"]


def test_retry_gives_a_dead_job_a_fresh_budget_and_it_succeeds(client):
    job = client.submit("fail", {"times": 2}, max_attempts=2)
    dead = wait_status(client, job["id"], {"dead"}, timeout=60)
    assert dead["attempt"] == 2
    retried = client.retry(job["id"])
    assert retried["status"] == "queued" and retried["max_attempts"] == 4
    done = wait_status(client, job["id"], {"succeeded"}, timeout=60)
    assert done["attempt"] == 3 and done["result"] == {"succeeded_on_attempt": 3}
    with pytest.raises(leasework.ApiError) as caught:
        client.retry(job["id"])
    assert caught.value.status == 409


def test_retry_brings_back_a_cancelled_job_and_bulk_retry_goes_by_filter(client, db):
    waiting = client.submit("noop", {}, delay_seconds=600)
    client.cancel(waiting["id"])
    assert client.retry(waiting["id"])["status"] == "queued"
    wait_status(client, waiting["id"], {"succeeded"}, timeout=60)

    since = datetime.now(UTC) - timedelta(seconds=1)
    doomed = [client.submit("fail", {"times": 1}, max_attempts=1)["id"] for _ in range(3)]
    for job_id in doomed:
        wait_status(client, job_id, {"dead"}, timeout=60)
    retried = client.retry_many(type="fail", status="dead", finished_after=since.isoformat())
    assert retried >= 3
    for job_id in doomed:
        wait_status(client, job_id, {"succeeded"}, timeout=60)  # attempt 2 > times 1


def test_a_worker_that_does_not_know_a_type_defers_it_until_one_that_does_joins(stack, client, db):
    older = {"LEASEWORK_APP": "leasework.demo:app"}  # a deploy that has not reached the workers
    for worker in ("worker-1", "worker-2"):
        stack.restart(worker, extra_env=older)
    try:
        with psycopg.connect(DIRECT_DSN) as conn:
            order_id = new_order(conn, "rolling@example.com")
            job_id = str(
                leasework.enqueue(
                    conn,
                    "send_receipt",
                    {"order_id": order_id, "email": "rolling@example.com"},
                    app=shop_app,
                )
            )
        deferred = wait_for(
            lambda: (j := client.get(job_id))["deferrals"] >= 1 and j, 60, "the receipt deferred"
        )
        assert deferred["status"] in {"scheduled", "queued"} and deferred["attempt"] == 0
        assert "does not define type 'send_receipt'" in deferred["last_error"]
    finally:
        for worker in ("worker-1", "worker-2"):
            stack.restart(worker)  # the stack's app again, with the shop's types
    done = wait_status(client, job_id, {"succeeded"}, timeout=120)
    assert done["attempt"] == 1  # deferrals spent no attempt
    assert order(db, order_id)["receipts_recorded"] == 1


# ---------------------------------------------------------------- the pruner


async def test_the_pruner_deletes_finished_jobs_past_their_retention_and_nothing_else(client, db):
    old = [client.submit("noop", {"prune": True})["id"] for _ in range(3)]
    keep = client.submit("noop", {"prune": False})["id"]
    for job_id in (*old, keep):
        await trio.to_thread.run_sync(lambda j=job_id: wait_status(client, j, {"succeeded"}))
    db.execute(
        "UPDATE jobs SET finished_at = now() - interval '2 days' WHERE id = ANY(%s::uuid[])", (old,)
    )
    database = Database(POSTGRES_DSN, max_size=2)
    await database.open()
    try:
        day = 86400.0
        retention = Retention(succeeded=day, dead=day, cancelled=day)
        counts = await Pruner(database, PrunerConfig(retention, batch=2)).run_once()
    finally:
        await database.close()
    assert counts.jobs[Status.SUCCEEDED] >= 3
    gone = db.execute("SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[])", (old,))
    assert gone.fetchone()["n"] == 0
    assert (
        db.execute(
            "SELECT count(*) AS n FROM attempts WHERE job_id = ANY(%s::uuid[])", (old,)
        ).fetchone()["n"]
        == 0
    )
    assert client.get(keep)["status"] == "succeeded"


# ---------------------------------------------------------------- testing a user's handler


async def test_leasework_testing_runs_a_handler_with_a_real_context_and_fenced_effects(db):
    with psycopg.connect(DIRECT_DSN) as conn:
        order_id = new_order(conn, "test@example.com")
        run = await testing.run_job(
            shop_app,
            "send_receipt",
            Receipt(order_id=order_id, email="test@example.com"),
            conn=conn,
        )
        assert run.succeeded and run.result["sent_to"] == "test@example.com"
        assert run.effects_applied == 1
        assert (
            conn.execute(
                "SELECT receipts_recorded FROM shop_orders WHERE id = %s", (order_id,)
            ).fetchone()[0]
            == 1
        )
        missing = await testing.run_job(
            shop_app, "send_receipt", {"order_id": 10**9, "email": "no@example.com"}, conn=conn
        )
        assert missing.status == Status.DEAD and "OrderMissing" in missing.error
        conn.rollback()  # the test's own transaction: nothing it did remains
    assert order(db, order_id) is None
    with pytest.raises(leasework.InvalidJob, match="payload.email"):
        await testing.run_job(shop_app, "send_receipt", {"order_id": 1})


# ---------------------------------------------------------------- processes and the CLI


def run_cli(
    *args: str, env: dict | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "leasework", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (
            ["worker", "--app", "no_such_module:app"],
            {},
            "--app='no_such_module:app': cannot import",
        ),
        (
            ["api"],
            {"LEASEWORK_APP": "leasework.demo:nothing"},
            "LEASEWORK_APP='leasework.demo:nothing'",
        ),
        (["worker"], {"LEASEWORK_APP": ""}, "LEASEWORK_APP is not set"),
    ],
)
def test_an_app_that_cannot_be_loaded_stops_the_process_with_status_2(args, env, says):
    done = run_cli(*args, env={"LEASEWORK_OPS_ADDR": "127.0.0.1:9199", **env})
    assert done.returncode == 2, done.stderr
    assert says in done.stderr


def test_the_cli_submits_a_jsonl_file_waits_and_retries(client, tmp_path):
    lines = [
        {"type": "echo", "payload": {"n": 1}},
        {"type": "noop", "idempotency_key": f"cli-{uuid.uuid4()}"},
        {"type": "fail", "payload": {"times": 1}, "max_attempts": 1},
    ]
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    done = run_cli("submit", "--file", str(path))
    assert done.returncode == 0, done.stderr
    accepted = [json.loads(line) for line in done.stdout.splitlines()]
    assert [a["line"] for a in accepted] == [1, 2, 3]
    waited = run_cli("wait", accepted[0]["id"], "--timeout", "60")
    assert waited.returncode == 0 and json.loads(waited.stdout) == {"n": 1}
    failed = run_cli("wait", accepted[2]["id"], "--timeout", "60")
    assert failed.returncode == 1 and "ended dead" in failed.stderr
    retried = run_cli("retry", accepted[2]["id"])
    assert retried.returncode == 0 and json.loads(retried.stdout)["status"] == "queued"

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "noop"}\n{"type": "sleep", "payload": {"seconds": -1}}\n')
    refused = run_cli("submit", "--file", str(bad))
    assert refused.returncode == 1 and "line 2.payload.seconds" in refused.stderr


def _outbox_rows(job_id: str) -> int:
    with psycopg.connect(DIRECT_DSN, autocommit=True, row_factory=tuple_row) as conn:
        found = conn.execute("SELECT count(*) FROM outbox WHERE job_id = %s", (job_id,))
        return found.fetchone()[0]


@contextlib.contextmanager
def _dev_process(stack, tmp_path, **extra_env: str):
    """``leasework dev`` with the stack's app on port 8001, ready, one job run through it and
    its outbox row published; killed on the way out if it is still running.

    The job can finish before its row is published: a stack worker's wake-up claims it
    without Kafka. Right after a fresh stack starts, the relay's first publish may still wait
    for its producer id (``Coordinator load in progress``); a test that stopped the brokers
    then found that pass holding the relay, and its own job's row never fetched (a CI run)."""
    env = {
        **os.environ,
        **stack.app_env("api"),
        "LEASEWORK_OPS_ADDR": "127.0.0.1:8001",
        "LEASEWORK_PROCESS_NAME": "dev-test",
        "LEASEWORK_KAFKA_BROKERS": stack.app_env("worker-1")["LEASEWORK_KAFKA_BROKERS"],
        **extra_env,
    }
    log = (tmp_path / "dev.log").open("wb")
    dev = subprocess.Popen(
        [sys.executable, "-m", "leasework", "dev", "--app", STACK_APP],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: httpx.get("http://127.0.0.1:8001/readyz", timeout=2).status_code == 200,
            60,
            "leasework dev ready",
        )
        with leasework.Client("http://127.0.0.1:8001") as dev_client:
            job = dev_client.submit("echo", {"from": "dev"})
            assert dev_client.wait(job["id"], timeout=60) == {"from": "dev"}
        wait_for(lambda: _outbox_rows(job["id"]) == 0, 60, "the first job's row published")
        yield dev
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        log.close()


def test_leasework_dev_runs_all_roles_in_one_process_and_stops_on_ctrl_c(stack, client, tmp_path):
    with _dev_process(stack, tmp_path) as dev:
        dev.send_signal(signal.SIGINT)
        assert dev.wait(timeout=40) == 0, (tmp_path / "dev.log").read_text()[-2000:]


SHUTDOWN_TIMEOUT = 1  # seconds: the `leasework dev` of the tests that stop Kafka under it


def _sigint_while_kafka_is_stopped(
    stack, dev: subprocess.Popen, tmp_path, before_signal=lambda: None
) -> str:
    """SIGINT ``dev`` with all three brokers SIGSTOPped (``before_signal`` runs once they
    are); it must exit with status 0 within its shutdown timeout plus 3 s (the deadline, then
    the process's exit). Returns its log."""
    brokers = ["kafka-1", "kafka-2", "kafka-3"]
    try:
        for broker in brokers:
            stack.pause(broker)
        before_signal()
        dev.send_signal(signal.SIGINT)
        began = time.monotonic()
        try:
            code = dev.wait(timeout=SHUTDOWN_TIMEOUT + 20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running {SHUTDOWN_TIMEOUT + 20} s after SIGINT")
        took = time.monotonic() - began
    finally:
        for broker in brokers:
            stack.resume(broker)
    log = (tmp_path / "dev.log").read_text()
    assert code == 0, log[-2000:]
    assert took < SHUTDOWN_TIMEOUT + 3, f"stopped {took:.1f} s after SIGINT"
    return log


def _dev_through_kafka(stack, tmp_path):
    """``leasework dev`` with the short shutdown timeout, without wake-ups of its own: its
    worker's jobs come through Kafka, so it has joined its groups."""
    return _dev_process(
        stack,
        tmp_path,
        LEASEWORK_SHUTDOWN_TIMEOUT=str(SHUTDOWN_TIMEOUT),
        LEASEWORK_WORKER_WAKEUPS="false",
    )


def test_a_worker_stops_within_its_shutdown_timeout_while_kafka_does_not_answer(
    stack, client, tmp_path
):
    """The final offset commit and the consumers' leaving the group wait on the group's
    coordinator; with every broker stopped they took 5 s or more, or never returned (a CI
    run's `leasework dev` outlived its 20 s shutdown timeout by more than 20 s while a broker
    loaded its groups).
    The shutdown's deadline abandons them: uncommitted offsets are only redeliveries."""
    with _dev_through_kafka(stack, tmp_path) as dev:
        log = _sigint_while_kafka_is_stopped(stack, dev, tmp_path)
        # what the deadline cut short is said (the commit, or the consumers' leaving the group)
        assert "abandoned at the shutdown deadline" in log or "not closed by the shutdown" in log


def _held_by_a_relay(db, job_id: str) -> bool:
    """The job's outbox row exists and a relay's pass holds it (its publish is under way)."""
    with db.transaction():
        rows = db.execute("SELECT count(*) AS n FROM outbox WHERE job_id = %s", (job_id,))
        free = db.execute(
            "SELECT 1 FROM outbox WHERE job_id = %s FOR UPDATE SKIP LOCKED", (job_id,)
        ).fetchall()
        return rows.fetchone()["n"] == 1 and not free


def test_the_relay_stops_within_the_shutdown_timeout_while_its_publish_waits_on_kafka(
    stack, client, db, tmp_path
):
    """A relay pass holds its rows while Kafka acknowledges them, and a publish gives up only
    at the producer's message timeout (15 s). Its thread was waited for at shutdown: a CI
    run's `leasework dev` stopped 14.9 s after SIGINT with a 1 s timeout. The deadline
    abandons it: the pass's transaction never commits, so its rows stay in the outbox for the
    next relay (Kafka may have them already: a redelivery, which the fence absorbs).
    The stack's relay is stopped, so the row is this process's relay's to publish."""
    stack.stop("relay")
    try:
        with _dev_through_kafka(stack, tmp_path) as dev:
            job: dict = {}

            def submit_and_wait_for_the_publish() -> None:
                with leasework.Client("http://127.0.0.1:8001") as dev_client:
                    job.update(dev_client.submit("echo", {"from": "dev", "kafka": "stopped"}))
                wait_for(lambda: _held_by_a_relay(db, job["id"]), 10, "the relay's publish")

            log = _sigint_while_kafka_is_stopped(
                stack, dev, tmp_path, submit_and_wait_for_the_publish
            )
            assert "outbox pass abandoned at the shutdown deadline" in log, log[-2000:]
            # nothing lost: the row is still there, free, for the next relay
            assert not _held_by_a_relay(db, job["id"])
            assert _outbox_rows(job["id"]) == 1
    finally:
        stack.start("relay")
    assert wait_status(client, job["id"], {"succeeded"}, timeout=60)["status"] == "succeeded"
