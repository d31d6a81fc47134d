"""Priorities (pure): what a submit may ask, each band's topic and group, and the row every
door writes."""

from __future__ import annotations

import pytest

from leasework.api.openapi import SUBMIT_OPTIONS
from leasework.api.validation import job_request
from leasework.app import App, AppError
from leasework.priorities import band_group, band_topic, band_topics, priority_error
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
