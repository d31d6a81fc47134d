"""Metrics on every process: present, scraped by Prometheus, and never labelled by anything
that grows with the number of jobs."""

from __future__ import annotations

import re
import uuid
from typing import get_args

import httpx

from chaos.promql import scrape
from devstack.layout import STACK_APP
from leasework import queues
from leasework.app import load_app
from leasework.audit import Kind
from leasework.delivery_marks import Reason as LostRecordReason
from leasework.queues.priorities import LEVELS
from leasework.relay.pruner import Retention
from leasework.schedules import SkipReason as TickSkipReason
from leasework.states import Status
from leasework.worker.claim import SkipReason
from leasework.worker.consumer import RESET_REASONS
from tests.integration.conftest import insert_unchecked, wait_for, wait_status

PROCESSES = {"api": 8080, "relay": 9102, "worker-1": 9101, "worker-2": 9103}
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def series() -> dict[str, set[str]]:  # process -> every sample's name{labels}
    return {name: set(scrape(port)) for name, port in PROCESSES.items()}


def run_batch(client, db, size: int) -> None:
    ids, unknown = [], []
    for n in range(size):
        ids.append(client.submit("noop", {"n": n})["id"])
        ids.append(client.submit("fail", {"times": 1}, max_attempts=3)["id"])
        ids.append(client.submit("ledger", {}, idempotency_key=str(uuid.uuid4()))["id"])
        # a type no app defines (the api refuses it; a rolling deploy can still store one)
        unknown.append(insert_unchecked(db, f"unknown-{uuid.uuid4().hex[:8]}"))
    for job_id in ids:
        wait_status(client, job_id, {"succeeded", "dead"}, timeout=120)
    try:
        for job_id in unknown:
            wait_for(lambda j=job_id: client.get(j)["deferrals"] >= 1, 60, f"{job_id} deferred")
    finally:
        # no worker will ever know these types: left, each would be deferred and published
        # again for good (165 of them cycled through the stack's relay and workers, and one
        # landed in another test's empty outbox)
        for job_id in unknown:
            client.cancel(job_id)


LABEL_DOMAINS = {
    "type": set(load_app(STACK_APP).names) | {"other"},
    "outcome": {s.value for s in Status},
    "reason": {s.value for s in Status}
    | {"missing", "paused", "limited"}  # held by a pause or a concurrency limit
    | set(get_args(SkipReason))  # a message the claim stage settles at once
    | {"malformed", "unknown_prefix", "wrong_secret", "refused_again", "throttled"}  # tokens
    | {"body-too-large", "body-timeout", "busy"}  # bodies the guard refused
    | {r.value for r in TickSkipReason}  # a schedule's skipped tick
    | {str(r) for r in LostRecordReason}  # how the relay knew a waiting job's record was lost
    | set(RESET_REASONS),  # why a worker's partition had no usable offset
    "partition": {str(p) for p in range(12)},
    "priority": {str(p) for p in LEVELS},
    # the pruner's, by final state; the guard's refusals
    "status": {"succeeded", "dead", "cancelled", "401", "403"},
    # the tables the pruner ages out, as it names them
    "table": set(Retention(succeeded=None, dead=None, cancelled=None).of_tables()),
    # how a schedule's tick came to fire (schedule_ticks.source)
    "source": {"cron", "catch_up", "trigger", "backfill"},
    "dependency": {"postgres", "redis", "kafka"},
    "result": {"ok", "lost", "error"} | {"started", "busy"},  # and a worker's wake-ups
    "kind": {str(k) for k in Kind},  # the auditor's invariants
}
SAMPLE_LABELS = {"le", "quantile"}  # histogram buckets: a fixed set per metric
# labels whose values are names an operator chose (a schedule's): bounded by how many the
# operators made, not by the number of jobs; a value must still look like such a name
NAME_LABELS = {
    "schedule": re.compile(r"[A-Za-z0-9_.:-]{1,100}"),
    "queue": queues.NAME_PATTERN,  # the consumer lag's, by queue and priority band
}
LABEL = re.compile(r'(\w+)="([^"]*)"')


def test_no_label_grows_with_the_number_of_jobs(stack, client, db):
    """Every label takes its values from a bounded domain, so more jobs cannot mean more
    series: a job id, a payload value or an unregistered type name as a label fails here."""
    run_batch(client, db, 5)
    after = series()
    for process in PROCESSES:
        for sample in after[process]:
            assert not UUID.search(sample), f"{process}: labelled with an id: {sample}"
            if not sample.startswith("leasework_"):
                continue  # the client library's process and GC metrics
            for label, value in LABEL.findall(sample):
                if label in SAMPLE_LABELS:
                    continue
                if label in NAME_LABELS:
                    assert NAME_LABELS[label].fullmatch(value), f"{process}: not a name: {sample}"
                    continue
                assert label in LABEL_DOMAINS, f"{process}: unexpected label {label}: {sample}"
                assert value in LABEL_DOMAINS[label], f"{process}: unbounded value: {sample}"


def test_the_slo_histogram_and_core_counters_are_exported(stack, client):
    job = client.submit("noop", {})
    wait_status(client, job["id"], {"succeeded"}, timeout=30)
    worker_series = set(scrape(9101)) | set(scrape(9103))
    assert any(
        s.startswith('leasework_scheduling_delay_seconds_bucket{le="5.0"}') for s in worker_series
    )
    for name in (
        "leasework_jobs_executed_total",
        "leasework_fence_rejections_total",
        "leasework_lease_expirations_total",
        "leasework_jobs_in_flight",
        "leasework_lease_renewal_seconds_bucket",
    ):
        assert any(s.startswith(name) for s in worker_series), name
    relay_series = set(scrape(9102))
    for name in ("leasework_outbox_pending", "leasework_relay_last_tick_timestamp_seconds"):
        assert any(s.startswith(name) for s in relay_series), name


def test_prometheus_scrapes_every_process_and_loaded_the_rules(stack):
    def targets_up():
        active = httpx.get("http://127.0.0.1:9090/api/v1/targets", timeout=5).json()["data"][
            "activeTargets"
        ]
        up = {t["labels"].get("instance") for t in active if t["health"] == "up"}
        return set(PROCESSES) <= up and up

    wait_for(targets_up, 30, "Prometheus to report every leasework process up")
    groups = httpx.get("http://127.0.0.1:9090/api/v1/rules", timeout=5).json()["data"]["groups"]
    alerts = {r["name"] for g in groups for r in g["rules"] if r["type"] == "alerting"}
    assert {"LeaseworkRelayStalled", "LeaseworkOutboxBacklog", "LeaseworkConsumerLag"} <= alerts
