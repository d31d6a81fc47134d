"""Named queues without servers: names, topics, groups, a worker's queues, a type's queue and
a submit's, as every door checks and writes them."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from leasework.app import App, AppError
from leasework.config import ConfigError, load
from leasework.queues import consumer_group, name_error, parse_queues, ready_topic
from leasework.queues.operations import Actor, QueueError, set_concurrency
from leasework.submission import Defaults, JobRequest, insert_row, request_errors
from leasework.worker.process import served_queues


def test_a_queue_name_is_a_short_lower_case_topic_tail():
    for good in ("default", "emails", "a", "bulk_2", "x-y", "a" * 48):
        assert name_error(good) is None, good
    for bad in ("", "Emails", "-x", "_x", "a.b", "a b", "a" * 49, None, 5, "é"):
        assert name_error(bad) is not None, bad


def test_the_default_queue_keeps_the_topic_and_group_of_before_queues():
    assert ready_topic("jobs.ready", "default") == "jobs.ready"
    assert ready_topic("jobs.ready", "emails") == "jobs.ready.emails"
    assert consumer_group("leasework-workers", "default") == "leasework-workers"
    assert consumer_group("leasework-workers", "emails") == "leasework-workers.emails"


def test_a_workers_queues_are_listed_once_each_and_a_bad_one_is_named():
    assert parse_queues(" emails, default ,emails") == ("emails", "default")
    with pytest.raises(ValueError, match="'Bad'"):
        parse_queues("emails,Bad")
    with pytest.raises(ValueError, match="at least one"):
        parse_queues(" , ")


def app_with_queues() -> App:
    app = App(name="t")

    @app.job("plain")
    async def plain(ctx) -> None:
        return None

    @app.job("mail", queue="emails")
    async def mail(ctx) -> None:
        return None

    return app


def test_a_worker_serves_default_and_its_types_queues_unless_told_otherwise():
    app = app_with_queues()
    assert served_queues(load("worker", {"LEASEWORK_APP": "leasework.demo:app"}), app) == (
        "default",
        "emails",
    )
    told = load("worker", {"LEASEWORK_APP": "x:app", "LEASEWORK_QUEUES": "emails"})
    assert served_queues(told, app) == ("emails",)
    with pytest.raises(ConfigError, match="LEASEWORK_QUEUES"):
        load("worker", {"LEASEWORK_APP": "x:app", "LEASEWORK_QUEUES": "Emails"})


def test_a_type_names_a_valid_queue_and_a_submit_may_name_another():
    with pytest.raises(AppError, match="queue 'E-mails'"):
        App(name="t").job("x", queue="E-mails")(_handler)
    app = app_with_queues()
    defaults = Defaults()
    assert insert_row(JobRequest("mail"), app, defaults)["default_queue"] == "emails"
    assert "queue" not in insert_row(JobRequest("mail"), app, defaults)
    told = insert_row(JobRequest("mail", queue="bulk"), app, defaults)
    assert told["queue"] == "bulk" and "default_queue" not in told
    assert "default_queue" not in insert_row(JobRequest("plain"), app, defaults)
    (error,) = request_errors(JobRequest("plain", payload={}, queue="Not Valid"), app)
    assert error.field == "queue" and "lower-case" in error.message


async def _handler(ctx) -> None:
    return None


def test_a_queue_concurrency_outside_a_whole_number_is_refused_before_any_write():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(QueueError, match="whole number"):
            set_concurrency(None, "emails", bad, Actor("t", "test"))  # type: ignore[arg-type]


class Order(BaseModel):
    customer_id: str


def test_a_types_concurrency_limit_is_checked_when_declared_and_registered_as_json():
    app = App(name="limits")

    @app.job(concurrency=1, concurrency_key="customer_id")
    async def charge(ctx, payload: Order) -> None: ...

    @app.job(concurrency=3)
    async def report(ctx) -> None: ...

    rows = {r["name"]: r["concurrency"] for r in app.registry_rows()}
    assert rows["charge"] == {"limit": 1, "key": "customer_id"}
    assert rows["report"] == {"limit": 3, "key": None}
    for bad, why in (
        ({"concurrency": 0}, "at least 1"),
        ({"concurrency": True}, "at least 1"),
        ({"concurrency_key": "customer_id"}, "needs concurrency="),
        ({"concurrency": 1, "concurrency_key": "nosuch"}, "not a field of its payload"),
    ):
        with pytest.raises(AppError, match=why):

            @App(name="bad").job(**bad)
            async def wrong(ctx, payload: Order) -> None: ...
