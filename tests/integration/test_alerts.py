"""Alerts against the real system: the local Prometheus evaluates dashboards/rules, and each
fault below must make its alert fire (checked through Prometheus's API). An alert counts only
if it was quiet when the fault began, so an alert left firing by earlier work cannot make a
test pass."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
import trio

from chaos.alerts import fired_between, firing_now, wait_for_alerts
from leasework.client import AsyncClient
from tests.integration.conftest import API_URL, wait_status


def require_quiet(names: set[str]) -> None:
    loud = names & firing_now()
    if loud:
        pytest.skip(
            f"{sorted(loud)} already firing from earlier work (counter alerts look back 10 "
            "minutes); run on a quiet stack, as `just test` does on a fresh one"
        )


def test_a_healthy_run_under_load_fires_no_new_alert(stack, client):
    """Two minutes of steady load with nothing broken: no alert may start firing. First in
    this file, so the faults below cannot leak into its window."""
    start = time.time()
    before = firing_now()
    ids: list[str] = []
    while time.time() - start < 120:
        ids.append(client.submit("noop", {"healthy": True})["id"])
        ids.append(client.submit("ledger", {})["id"])
        time.sleep(0.1)
    for job_id in ids[-20:]:
        wait_status(client, job_id, {"succeeded"}, timeout=60)
    time.sleep(4)  # one more evaluation after the last job
    new = {name for name in fired_between(start, time.time()) if name not in before}
    assert not new, f"alerts fired on a healthy run: {sorted(new)}"


def test_relay_killed_fires_relay_stalled_and_outbox_backlog(stack, client):
    expected = {"LeaseworkRelayStalled", "LeaseworkOutboxBacklog"}
    require_quiet(expected)
    start = time.time()
    stack.kill("relay")
    try:
        job = client.submit("noop", {"alert": "relay-killed"})
        fired = wait_for_alerts(expected, start, timeout=180)
    finally:
        stack.start("relay")
        stack.wait_ready("relay", timeout=60)
    assert expected <= fired.keys(), fired
    wait_status(client, job["id"], {"succeeded"}, timeout=60)


def test_a_run_of_dead_jobs_fires_dead_letters(stack, client):
    require_quiet({"LeaseworkDeadLetters"})
    start = time.time()
    job_type = f"poison-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        client.submit(job_type, {})
    fired = wait_for_alerts({"LeaseworkDeadLetters"}, start, timeout=120)
    assert "LeaseworkDeadLetters" in fired, fired


WORKER_KAFKA_PROXIES = ("kafka-1-workers", "kafka-2-workers", "kafka-3-workers")


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


def test_workers_kafka_link_cut_fires_consumer_lag(stack, client):
    require_quiet({"LeaseworkConsumerLag"})
    start = time.time()
    set_enabled(WORKER_KAFKA_PROXIES, False)
    try:
        ids = trio.run(submit_many, 1200, uuid.uuid4().hex[:8])
        fired = wait_for_alerts({"LeaseworkConsumerLag"}, start, timeout=240)
    finally:
        set_enabled(WORKER_KAFKA_PROXIES, True)
    assert "LeaseworkConsumerLag" in fired, fired
    for job_id in ids[-20:]:
        wait_status(client, job_id, {"succeeded"}, timeout=180)
