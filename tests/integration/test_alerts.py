"""Alerts against the real system: the local Prometheus evaluates dashboards/rules, and each
fault below must make its alert fire (checked through Prometheus's API). An alert counts only
if it was quiet when the fault began, so an alert left firing by earlier work cannot make a
test pass."""

from __future__ import annotations

import time
import uuid

import pytest

from chaos.alerts import firing_now, wait_for_alerts
from tests.integration.conftest import wait_status


def require_quiet(names: set[str]) -> None:
    loud = names & firing_now()
    if loud:
        pytest.skip(
            f"{sorted(loud)} already firing from earlier work (counter alerts look back 10 "
            "minutes); run on a quiet stack, as `just test` does on a fresh one"
        )


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
