"""Alerts against the real system: Prometheus evaluates dashboards/rules, and each fault
below must make its alert fire (checked through Prometheus's API) and reach someone: its
notification must arrive through the stack's Alertmanager at the api's webhook, which records
it in ``alert_notifications`` (read straight from Postgres).

Every test judges alerts on a Prometheus of its own, started for it with an empty TSDB and
the stack's targets and rules (``Stack.scratch_prometheus``). The stack's long-lived
Prometheus remembers earlier work: its SLO-burn windows reach back 30 minutes to 3 days and
its counter alerts 10 minutes, so a chaos run half an hour earlier would make a healthy
window "fire" LeaseworkSLOBurnSlow, and an alert still firing from an earlier fault would
let a test pass that its own fault never triggered. A scratch Prometheus has seen only the
test's window, so what fires there was caused there. Its alerts carry a ``scratch_run``
label of the test's own, so the notifications it caused are told apart from the stack
Prometheus's and from earlier tests'.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import httpx
import pytest
import trio

from chaos.alerts import (
    fired_between,
    firing_now,
    read_deliveries,
    wait_for_alerts,
    wait_for_deliveries,
)
from devstack.layout import KAFKA_NODE_IDS, KAFKA_WORKERS
from leasework.client import AsyncClient
from tests.integration.conftest import API_URL, wait_status


@dataclass(frozen=True)
class Scratch:
    """A fresh Prometheus: its URL, and the ``scratch_run`` label its alerts carry."""

    url: str
    run: str


@pytest.fixture
def prometheus(stack, tmp_path):
    """A fresh Prometheus that has scraped every leasework process at least once."""
    run = f"test-{uuid.uuid4().hex[:12]}"
    with stack.scratch_prometheus(tmp_path, run=run) as url:
        assert not firing_now(url=url), "a Prometheus with an empty TSDB cannot be firing"
        yield Scratch(url, run)


def assert_delivered(names: set[str], prometheus: Scratch, since: float) -> None:
    """Each alert of ``names`` reached the api's webhook through Alertmanager: a firing
    notification from this test's Prometheus, received since ``since``."""
    delivered = wait_for_deliveries(names, prometheus.run, since)
    assert names <= delivered.keys(), f"fired, but no notification of {names - delivered.keys()}"


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
    run = f"test-{uuid.uuid4().hex[:12]}"
    with stack.scratch_prometheus(tmp_path, run=run) as url:
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
        delivered = read_deliveries(run, start)
    assert not fired, f"alerts fired on a healthy run: {fired}"
    assert not delivered, f"notifications of a healthy run: {delivered}"


def test_relay_killed_fires_relay_stalled_and_outbox_backlog(stack, client, prometheus):
    expected = {"LeaseworkRelayStalled", "LeaseworkOutboxBacklog"}
    start = time.time()
    stack.kill("relay")
    try:
        job = client.submit("noop", {"alert": "relay-killed"})
        fired = wait_for_alerts(expected, start, timeout=180, url=prometheus.url)
        assert expected <= fired.keys(), fired
        assert_delivered(expected, prometheus, start)  # while the relay is still down
    finally:
        stack.start("relay")
        stack.wait_ready("relay", timeout=60)
    wait_status(client, job["id"], {"succeeded"}, timeout=60)


def test_a_run_of_dead_jobs_fires_dead_letters(stack, client, prometheus):
    start = time.time()
    for _ in range(3):  # permanent errors: dead at the first attempt
        client.submit("fail", {"times": 1, "permanent": True})
    fired = wait_for_alerts({"LeaseworkDeadLetters"}, start, timeout=120, url=prometheus.url)
    assert "LeaseworkDeadLetters" in fired, fired
    assert_delivered({"LeaseworkDeadLetters"}, prometheus, start)


def test_an_alert_fired_while_alertmanager_is_down_is_delivered_once_it_is_back(
    stack, client, prometheus
):
    """Prometheus keeps a firing alert and sends it again every minute (its resend delay):
    an Alertmanager that was down when the alert fired still delivers it once it is back,
    while the alert is still firing."""
    start = time.time()
    stack.stop("alertmanager")
    try:
        for _ in range(3):
            client.submit("fail", {"times": 1, "permanent": True})
        fired = wait_for_alerts({"LeaseworkDeadLetters"}, start, timeout=120, url=prometheus.url)
        assert "LeaseworkDeadLetters" in fired, fired
        time.sleep(5)  # Prometheus has tried to send it, and failed
        assert not read_deliveries(prometheus.run, start), "delivered with Alertmanager down"
    finally:
        stack.start("alertmanager")
    back = time.time()
    delivered = wait_for_deliveries({"LeaseworkDeadLetters"}, prometheus.run, start, 90.0)
    assert "LeaseworkDeadLetters" in delivered, "not delivered after Alertmanager returned"
    assert delivered["LeaseworkDeadLetters"].received_at >= back


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
        fired = wait_for_alerts({"LeaseworkConsumerLag"}, start, timeout=240, url=prometheus.url)
        assert "LeaseworkConsumerLag" in fired, fired
        # while the links are still cut: the lag drains within seconds once they return, and
        # an alert that resolves before its first notification got through is never sent
        assert_delivered({"LeaseworkConsumerLag"}, prometheus, start)
    finally:
        set_enabled(WORKER_KAFKA_PROXIES, True)
    for job_id in ids[-20:]:
        wait_status(client, job_id, {"succeeded"}, timeout=180)
