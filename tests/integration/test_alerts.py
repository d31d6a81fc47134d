"""Alerts against the real system: Prometheus evaluates dashboards/rules, and each fault
below must make its alert fire (checked through Prometheus's API).

Every test judges alerts on a Prometheus of its own, started for it with an empty TSDB and
the stack's targets and rules (``Stack.scratch_prometheus``). The stack's long-lived
Prometheus remembers earlier work: its SLO-burn windows reach back 30 minutes to 3 days and
its counter alerts 10 minutes, so a chaos run half an hour earlier would make a healthy
window "fire" LeaseworkSLOBurnSlow, and an alert still firing from an earlier fault would
let a test pass that its own fault never triggered. A scratch Prometheus has seen only the
test's window, so what fires there was caused there.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
import trio

from chaos.alerts import fired_between, firing_now, wait_for_alerts
from devstack.layout import KAFKA_NODE_IDS, KAFKA_WORKERS
from leasework.client import AsyncClient
from tests.integration.conftest import API_URL, wait_status


@pytest.fixture
def prometheus(stack, tmp_path):
    """URL of a fresh Prometheus that has scraped every leasework process at least once."""
    with stack.scratch_prometheus(tmp_path) as url:
        assert not firing_now(url=url), "a Prometheus with an empty TSDB cannot be firing"
        yield url


def warm_up(client, count: int = 48) -> None:
    """Run a burst through every worker before a window starts, so the consumer group has
    formed: on a stack just brought up, the first jobs wait for the group's rebalance."""
    ids = [client.submit("noop", {"warm_up": n})["id"] for n in range(count)]
    for job_id in ids:
        wait_status(client, job_id, {"succeeded"}, timeout=120)


def test_a_healthy_run_under_load_fires_no_alert(stack, client, tmp_path):
    """Two minutes of steady load with nothing broken: no alert may fire. First in this
    file, so the faults below cannot leak into its window."""
    warm_up(client)
    with stack.scratch_prometheus(tmp_path) as url:
        start = time.time()
        ids: list[str] = []
        while time.time() - start < 120:
            ids.append(client.submit("noop", {"healthy": True})["id"])
            ids.append(client.submit("ledger", {})["id"])
            time.sleep(0.1)
        for job_id in ids[-20:]:
            wait_status(client, job_id, {"succeeded"}, timeout=60)
        time.sleep(4)  # one more evaluation after the last job
        fired = fired_between(start, time.time(), url=url)
    assert not fired, f"alerts fired on a healthy run: {fired}"


def test_relay_killed_fires_relay_stalled_and_outbox_backlog(stack, client, prometheus):
    expected = {"LeaseworkRelayStalled", "LeaseworkOutboxBacklog"}
    start = time.time()
    stack.kill("relay")
    try:
        job = client.submit("noop", {"alert": "relay-killed"})
        fired = wait_for_alerts(expected, start, timeout=180, url=prometheus)
    finally:
        stack.start("relay")
        stack.wait_ready("relay", timeout=60)
    assert expected <= fired.keys(), fired
    wait_status(client, job["id"], {"succeeded"}, timeout=60)


def test_a_run_of_dead_jobs_fires_dead_letters(stack, client, prometheus):
    start = time.time()
    for _ in range(3):  # permanent errors: dead at the first attempt
        client.submit("fail", {"times": 1, "permanent": True})
    fired = wait_for_alerts({"LeaseworkDeadLetters"}, start, timeout=120, url=prometheus)
    assert "LeaseworkDeadLetters" in fired, fired


# every worker's own Kafka proxies (kafka-N-worker-M); the relay's kafka-N stay up
WORKER_KAFKA_PROXIES = tuple(
    f"kafka-{n}-{worker}" for n in KAFKA_NODE_IDS for worker in KAFKA_WORKERS
)


def set_enabled(proxies, enabled: bool) -> None:
    for name in proxies:
        httpx.post(
            f"http://127.0.0.1:8474/proxies/{name}", json={"enabled": enabled}, timeout=5
        ).raise_for_status()


async def submit_many(count: int, tag: str) -> list[str]:
    ids: list[str] = []
    limiter = trio.Semaphore(16)
    async with AsyncClient(API_URL, timeout=30) as client:

        async def one(n: int) -> None:
            async with limiter:
                ids.append((await client.submit("noop", {"lag": tag, "n": n}))["id"])

        async with trio.open_nursery() as nursery:
            for n in range(count):
                nursery.start_soon(one, n)
    return ids


def test_workers_kafka_link_cut_fires_consumer_lag(stack, client, prometheus):
    start = time.time()
    set_enabled(WORKER_KAFKA_PROXIES, False)
    try:
        ids = trio.run(submit_many, 1200, uuid.uuid4().hex[:8])
        fired = wait_for_alerts({"LeaseworkConsumerLag"}, start, timeout=240, url=prometheus)
    finally:
        set_enabled(WORKER_KAFKA_PROXIES, True)
    assert "LeaseworkConsumerLag" in fired, fired
    for job_id in ids[-20:]:
        wait_status(client, job_id, {"succeeded"}, timeout=180)
