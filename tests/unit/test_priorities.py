"""Priorities (pure): what a submit may ask, each band's topic and group, and the row every
door writes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from leasework.api.jobs import job_view
from leasework.api.openapi import SUBMIT_OPTIONS, openapi_document
from leasework.api.validation import job_request
from leasework.app import App, AppError
from leasework.client import batch_item, submit_body
from leasework.enqueue import job as enqueue_job
from leasework.job import Job
from leasework.queues.priorities import (
    band_consumer_group,
    band_group,
    band_of_topic,
    band_topic,
    band_topics,
    priority_error,
)
from leasework.states import Status
from leasework.submission import Defaults, JobRequest, insert_row, request_errors


@pytest.mark.parametrize("good", [0, 1, 2, 3])
def test_a_priority_is_an_integer_from_0_to_3(good):
    assert priority_error(good) is None


@pytest.mark.parametrize("bad", [4, -1, True, "1", 1.5, None])
def test_anything_else_is_refused_saying_what_a_priority_is(bad):
    assert "from 0 (the highest, and the default) to 3" in priority_error(bad)


def test_band_0_is_the_queues_topic_and_group_and_the_others_cannot_be_another_queues():
    assert band_topic("jobs.ready", "default", 0) == "jobs.ready"
    assert band_topic("jobs.ready", "emails", 0) == "jobs.ready.emails"
    assert band_topic("jobs.ready", "default", 2) == "jobs.ready.default.p2"
    assert band_topics("jobs.ready", "emails") == [
        "jobs.ready.emails",
        "jobs.ready.emails.p1",
        "jobs.ready.emails.p2",
        "jobs.ready.emails.p3",
    ]
    # a queue's name holds no '.', so no band of default is the topic of a queue "p1"
    assert (
        band_topic("jobs.ready", "p1", 0)
        == "jobs.ready.p1"
        != band_topic("jobs.ready", "default", 1)
    )
    assert band_group("leasework-workers", 0) == "leasework-workers"
    assert band_group("leasework-workers.emails", 3) == "leasework-workers.emails.p3"
    assert band_consumer_group("leasework-workers", "default", 0) == "leasework-workers"
    assert band_consumer_group("leasework-workers", "emails", 2) == "leasework-workers.emails.p2"


@pytest.mark.parametrize("queue", ["default", "emails", "p1", "a-b_c9"])
@pytest.mark.parametrize("priority", [0, 1, 2, 3])
def test_a_bands_topic_reads_back_as_its_queue_and_priority(queue, priority):
    assert band_of_topic("jobs.ready", band_topic("jobs.ready", queue, priority)) == (
        queue,
        priority,
    )


@pytest.mark.parametrize(
    "topic",
    [
        "jobs.dlq",  # the dead letters: no queue's
        "__consumer_offsets",
        "jobs.readyx",
        "jobs.ready.default",  # default's band 0 is jobs.ready itself
        "jobs.ready.emails.p0",  # band 0 has no suffix
        "jobs.ready.emails.p4",
        "jobs.ready.emails.p01",
        "jobs.ready.emails.x",
        "jobs.ready.Emails",  # no queue may have that name
        "jobs.ready.emails.p1.x",
        "jobs.ready.",
    ],
)
def test_a_topic_that_is_no_band_reads_as_none(topic):
    assert band_of_topic("jobs.ready", topic) is None


def _app() -> App:
    app = App()

    @app.job("bulk", priority=3)
    async def bulk(ctx) -> None: ...

    @app.job("plain")
    async def plain(ctx) -> None: ...

    return app


def test_the_row_carries_the_asked_priority_else_the_types_else_none():
    app = _app()
    asked = insert_row(JobRequest("bulk", priority=1), app, Defaults())
    assert asked["priority"] == 1 and "default_priority" not in asked
    typed = insert_row(JobRequest("bulk"), app, Defaults())
    assert typed["default_priority"] == 3 and "priority" not in typed
    plain = insert_row(JobRequest("plain"), app, Defaults())
    assert "priority" not in plain and "default_priority" not in plain  # the insert's 0
    assert {r["name"]: r["priority"] for r in app.registry_rows()} == {"bulk": 3, "plain": None}


@pytest.mark.parametrize("bad", [4, -1, True, "1", 1.5])
def test_every_door_refuses_a_priority_that_is_none(bad):
    errors = request_errors(JobRequest("plain", priority=bad), _app())
    assert [e.field for e in errors] == ["priority"]
    refused = job_request({"type": "plain", "priority": bad}, _app())
    assert isinstance(refused, list) and [e.field for e in refused] == ["priority"]


def test_the_api_takes_a_priority_and_its_document_says_which():
    accepted = job_request({"type": "plain", "priority": 2}, _app())
    assert isinstance(accepted, JobRequest) and accepted.priority == 2
    schema = SUBMIT_OPTIONS["priority"]
    assert schema["type"] == ["integer", "null"]
    assert (schema["minimum"], schema["maximum"]) == (0, 3)


def test_a_type_declaring_a_priority_that_is_none_is_refused_at_declaration():
    app = App()
    with pytest.raises(AppError, match="bulk: priority 9 must be an integer from 0"):

        @app.job("bulk", priority=9)
        async def bulk(ctx) -> None: ...


@pytest.mark.parametrize("bad", [4, -1, True, "1", 1.5])
def test_the_refusal_says_what_a_priority_is(bad):
    (error,) = request_errors(JobRequest("plain", priority=bad), _app())
    assert error.field == "priority"
    assert (
        error.message
        == "must be an integer from 0 (the highest, and the default) to 3 (the lowest)"
    )


def test_a_type_declaring_a_boolean_priority_is_refused_too():
    with pytest.raises(AppError, match="bulk: priority True must be an integer from 0"):
        App().job("bulk", priority=True)(_handler)


def test_the_api_takes_a_whole_number_priority_and_a_batch_item_may_ask_one():
    accepted = job_request({"type": "plain", "priority": 3.0}, _app())
    assert isinstance(accepted, JobRequest) and accepted.priority == 3
    item = job_request({"type": "plain", "priority": 1}, _app(), batch_item=True)
    assert isinstance(item, JobRequest) and item.priority == 1
    left_out = job_request({"type": "plain", "priority": None}, _app())
    assert isinstance(left_out, JobRequest) and left_out.priority is None


def test_the_document_offers_a_priority_to_every_types_submit_and_shows_the_jobs():
    schemas = openapi_document(_app())["components"]["schemas"]
    for name in ("Submit.bulk", "Submit.plain", "BatchItem.bulk"):
        assert schemas[name]["properties"]["priority"] == SUBMIT_OPTIONS["priority"]
    assert "starts first" in SUBMIT_OPTIONS["priority"]["description"]
    shown = schemas["Job"]["properties"]["priority"]
    assert (shown["type"], shown["minimum"], shown["maximum"]) == ("integer", 0, 3)


def test_the_job_view_shows_its_priority():
    now = datetime.now(UTC)
    job = Job(
        id=uuid.uuid4(),
        type="bulk",
        payload={},
        status=Status.QUEUED,
        run_at=now,
        attempt=0,
        max_attempts=3,
        timeout_seconds=30,
        fence=0,
        lease_owner=None,
        lease_expires_at=None,
        idempotency_key=None,
        ordering_key=None,
        last_error=None,
        cancel_requested=False,
        created_at=now,
        updated_at=now,
        started_at=None,
        finished_at=None,
        result=None,
        retry_base=None,
        retry_cap=None,
        deferrals=0,
        attempt_budget=3,
        priority=2,
    )
    view = job_view(job)
    assert view["priority"] == 2 and view["queue"] == "default"


def test_the_client_and_enqueue_carry_a_priority_only_when_asked():
    assert submit_body("bulk", {}, priority=2)["priority"] == 2
    assert submit_body("bulk", {}, priority=0)["priority"] == 0  # 0 is asked, not left out
    assert "priority" not in submit_body("bulk", {})
    assert batch_item({"type": "bulk", "priority": 1})["priority"] == 1
    assert enqueue_job("bulk", {}, priority=1).priority == 1
    assert enqueue_job("bulk", {}).priority is None


async def _handler(ctx) -> None:
    return None
