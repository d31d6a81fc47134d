"""The idle fast path's pure parts: what a wake-up says, and which ones a worker acts on."""

from __future__ import annotations

import json
import uuid

from leasework.worker.wakeup import Wakeup, addressed, parse

A, B = uuid.uuid4(), uuid.uuid4()


def payload(*items: object) -> str:
    return json.dumps(list(items))


def test_a_payload_names_each_jobs_topic_id_and_type():
    assert parse(payload(["jobs.ready", str(A), "noop"], ["jobs.ready.emails", str(B), "x"])) == [
        Wakeup("jobs.ready", A, "noop"),
        Wakeup("jobs.ready.emails", B, "x"),
    ]


def test_what_is_not_a_wakeup_is_left_to_kafka():
    assert parse("") == [] and parse("{") == [] and parse('{"a": 1}') == []
    assert parse("[" * 5000) == []  # too deep for json: no RecursionError escapes
    assert parse(
        payload(
            ["jobs.ready", "not a uuid", "noop"],
            ["jobs.ready", str(A)],  # too short
            ["jobs.ready", 5, "noop"],
            "jobs.ready",
            ["jobs.ready", str(B), "noop"],
        )
    ) == [Wakeup("jobs.ready", B, "noop")]


def test_a_worker_acts_on_its_queues_topics_and_its_apps_types_each_job_once():
    topics = {"jobs.ready": "default", "jobs.ready.emails": "emails"}
    C, D = uuid.uuid4(), uuid.uuid4()
    payloads = [
        payload(["jobs.ready", str(A), "noop"], ["jobs.ready.reports", str(B), "noop"]),
        payload(["jobs.ready.emails", str(C), "notify"], ["jobs.ready", str(D), "unknown"]),
        payload(["jobs.ready", str(A), "noop"]),  # the same job again
    ]
    assert addressed(payloads, topics, {"noop", "notify"}) == [("default", A), ("emails", C)]
