"""The foundation: the stack is real, readiness tells the truth, delivery survives faults."""

from __future__ import annotations

import time

import httpx

from devstack.services.kafka_admin import (
    cluster_metadata,
    elect_preferred_leaders,
    leaders_off_preferred,
)
from tests.integration.conftest import readyz, wait_for, wait_status

WORKER_PORT = 9101


def test_smoke_job_goes_through_outbox_kafka_and_worker(client, db):
    job = client.submit("noop", {"hello": "world"})
    assert job["status"] == "queued"
    done = wait_status(client, job["id"], {"succeeded"}, timeout=30)
    assert done["attempt"] == 1
    # Kafka acknowledged its outbox row, so the relay retired it
    outbox = db.execute("SELECT id FROM outbox WHERE job_id = %s", (job["id"],)).fetchall()
    assert outbox == []
    attempts = db.execute(
        "SELECT outcome, worker FROM attempts WHERE job_id = %s", (job["id"],)
    ).fetchall()
    assert [a["outcome"] for a in attempts] == ["succeeded"]


def test_every_process_serves_health_readiness_and_metrics(stack):
    for port in (8080, 9101, 9102, 9103):
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        status, body = readyz(port)
        assert status == 200, body
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "leasework_event_loop_lag_seconds_bucket" in metrics


def test_worker_readyz_flips_when_redis_stops_and_back_when_it_returns(stack):
    assert readyz(WORKER_PORT)[0] == 200
    stack.stop("redis")
    try:
        status, body = wait_for(
            lambda: (r := readyz(WORKER_PORT))[0] == 503 and r,
            20,
            "worker /readyz to report 503 with redis down",
        )
        assert "redis" in body["unavailable"], body
    finally:
        stack.start("redis")
    wait_for(lambda: readyz(WORKER_PORT)[0] == 200, 30, "worker /readyz back to 200")


def test_job_submitted_while_relay_is_down_is_delivered_once_it_starts(stack, client, db):
    stack.stop("relay")
    try:
        # an ordering key: no worker is woken by Postgres for it (its order is Kafka's), so
        # only the relay's publish can deliver it
        job = client.submit("noop", {"relay": "down"}, ordering_key="relay-down")
        # the API accepts while the relay is down; the job waits in the outbox (a row leaves
        # it only once Kafka acknowledged it)
        row = db.execute("SELECT id FROM outbox WHERE job_id = %s", (job["id"],)).fetchone()
        assert row is not None
        time.sleep(1.0)  # what a wake-up would have started by now (it takes milliseconds)
        assert client.get(job["id"])["status"] == "queued"
    finally:
        stack.start("relay")
    wait_status(client, job["id"], {"succeeded"}, timeout=60)


def test_a_lone_job_is_started_by_its_wakeup_and_its_kafka_message_settled(stack, client, db):
    """An idle worker claims a lone job when Postgres says it is ready (the relay is down,
    so Kafka cannot have delivered it); once the relay publishes it, its message finds the
    job finished and is settled: one attempt, the outbox row retired."""
    stack.stop("relay")
    try:
        job = client.submit("noop", {"wakeup": "relay down"})
        done = wait_status(client, job["id"], {"succeeded"}, timeout=30)
        assert done["attempt"] == 1
        row = db.execute("SELECT id FROM outbox WHERE job_id = %s", (job["id"],)).fetchone()
        assert row is not None, "the relay is down: its outbox row cannot have been published"
    finally:
        stack.start("relay")
    wait_for(
        lambda: not db.execute("SELECT 1 FROM outbox WHERE job_id = %s", (job["id"],)).fetchone(),
        60,
        "the relay to publish the job's outbox row",
    )
    time.sleep(2.0)  # its Kafka message is delivered in milliseconds, and must change nothing
    attempts = db.execute("SELECT outcome FROM attempts WHERE job_id = %s", (job["id"],)).fetchall()
    assert [a["outcome"] for a in attempts] == ["succeeded"]
    assert client.get(job["id"])["attempt"] == 1


def test_delivery_goes_on_while_one_kafka_broker_is_killed(stack, client):
    stack.kill("kafka-2")
    try:
        jobs = [client.submit("noop", {"n": n}) for n in range(20)]
        for job in jobs:
            wait_status(client, job["id"], {"succeeded"}, timeout=90)
    finally:
        stack.start("kafka-2")
        stack.wait_ready("kafka-2", timeout=120)


def _leaders() -> set[int]:
    return {p.leader for t in cluster_metadata().topics.values() for p in t.partitions.values()}


def test_after_a_broker_restart_its_partitions_are_led_by_their_preferred_replicas_again(stack):
    """A broker that comes back leads nothing until Kafka's imbalance check (every 300 s by
    default); after a fresh start the first broker up led all 112 partitions, and one broker
    took all the load of the bench's runs. `up` elects the preferred leaders back."""
    stack.kill("kafka-2")
    try:
        wait_for(lambda: 2 not in _leaders(), 60, "kafka-2's partitions led by other brokers")
    finally:
        stack.start("kafka-2")
        stack.wait_ready("kafka-2", timeout=120)
    stack.wait_kafka_cluster()
    off = wait_for(
        lambda: leaders_off_preferred(cluster_metadata()), 60, "kafka-2 in sync, leading nothing"
    )
    assert all(cluster_metadata().topics[t].partitions[p].replicas[0] == 2 for t, p in off), off
    moved, still_off = elect_preferred_leaders()
    assert still_off == 0 and moved > 0
    assert leaders_off_preferred(cluster_metadata()) == []
    assert 2 in _leaders()
