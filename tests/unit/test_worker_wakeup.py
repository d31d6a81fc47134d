"""The idle fast path's pure parts: what a wake-up says, and which ones a worker acts on."""

from __future__ import annotations

import json
import uuid

import trio

from leasework.service import Stopping
from leasework.worker import wakeup
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


async def test_a_worker_busy_for_a_second_stops_listening_and_listens_again_once_quiet(
    monkeypatch, autojump_clock
):
    log: list[tuple[float, str]] = []

    class Heard:
        """A listener that hears nothing: when it waits and when it stops listening."""

        limiter = trio.CapacityLimiter(1)

        def __init__(self, db: object, channel: str) -> None:
            self.listening = False

        async def wait(self, at_most: float) -> list[str]:
            self.listening = True
            log.append((trio.current_time(), "wait"))
            await trio.sleep(at_most)
            return []

        async def unlisten(self) -> None:
            self.listening = False
            log.append((trio.current_time(), "unlisten"))

        def close(self) -> None:
            pass

    monkeypatch.setattr(wakeup, "Listener", Heard)
    busy = [False]
    stopping = Stopping()

    async def script() -> None:
        await trio.sleep(1.0)
        busy[0] = True  # from t=1: every queue busy
        await trio.sleep(3.0)
        busy[0] = False  # from t=4: quiet again
        await trio.sleep(1.0)
        stopping.set("test")

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(script)
        await wakeup.listen(None, {}, set(), lambda q, j: False, stopping, lambda: not busy[0])  # type: ignore[arg-type]
    events = [(round(t - start, 2), what) for t, what in log]
    unlistened = [t for t, what in events if what == "unlisten"]
    assert len(unlistened) == 1 and 2.0 <= unlistened[0] <= 2.5  # a second busy, then at once
    waits = [t for t, what in events if what == "wait"]
    assert not [t for t in waits if unlistened[0] < t < 4.0]  # not listening while busy
    assert [t for t in waits if 4.0 <= t <= 4.1]  # listening again within a look of quiet
