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


class Logged:
    """A stand-in listener that logs when it arms its gate, waits and stops listening."""

    limiter = trio.CapacityLimiter(1)
    log: list[tuple[float, str]]

    def __init__(self, db: object, channel: str, gate: int | None = None) -> None:
        self.listening = False
        self.armed = False

    async def arm(self) -> bool:
        self.armed = True
        self.log.append((trio.current_time(), "arm"))
        return True

    async def wait(self, at_most: float) -> list[str]:
        self.listening = True
        self.log.append((trio.current_time(), "wait"))
        return []

    async def unlisten(self) -> None:
        self.listening = False
        self.armed = False  # the real one lets go of the gate
        self.log.append((trio.current_time(), "unlisten"))

    async def aclose(self) -> None:
        pass


async def test_a_worker_busy_for_a_second_stops_listening_and_listens_again_once_quiet(
    monkeypatch, autojump_clock
):
    log: list[tuple[float, str]] = []
    log_ = log

    class Heard(Logged):
        """A listener that hears nothing."""

        log = log_

        async def wait(self, at_most: float) -> list[str]:
            await super().wait(at_most)
            await trio.sleep(at_most)
            return []

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
    # it holds the gate while it listens (inserters send their wake-ups), and arms again
    # once it listens again
    arms = [t for t, what in events if what == "arm"]
    assert arms[0] == 0.0 and [t for t in arms if 4.0 <= t <= 4.1]
    assert not [t for t in arms if unlistened[0] < t < 4.0]


def test_twenty_wakeups_within_a_second_are_a_stream():
    gauge = wakeup.StreamGauge()
    assert not any(gauge.add(t / 10, 1) for t in range(19))  # 19 over 1.8 s: sparse
    assert not gauge.add(2.0, 5)  # the ones before t=1.0 have left the window
    assert gauge.add(2.05, 10)  # 8 + 5 + 10 within the second up to 2.05: a stream
    assert not gauge.add(2.1, 1)  # counted afresh after a stream was called


async def test_a_worker_that_hears_a_stream_stops_listening_for_two_seconds(
    monkeypatch, autojump_clock
):
    log: list[tuple[float, str]] = []
    log_ = log

    class Loud(Logged):
        """A listener that hears five wake-ups every 50 ms."""

        log = log_

        async def wait(self, at_most: float) -> list[str]:
            await super().wait(at_most)
            await trio.sleep(0.05)
            return [payload(*[["jobs.ready", str(uuid.uuid4()), "noop"] for _ in range(5)])]

    monkeypatch.setattr(wakeup, "Listener", Loud)
    stopping = Stopping()

    async def stop_later() -> None:
        await trio.sleep(3.0)
        stopping.set("test")

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_later)
        await wakeup.listen(
            None,  # type: ignore[arg-type]
            {"jobs.ready": "default"},
            {"noop"},
            lambda q, j: False,
            stopping,
        )
    events = [(round(t - start, 2), what) for t, what in log]
    unlistened = [t for t, what in events if what == "unlisten"]
    assert unlistened and unlistened[0] <= 0.25  # four waits hear twenty
    waits = [t for t, what in events if what == "wait"]
    assert not [t for t in waits if unlistened[0] < t < unlistened[0] + 2.0]  # deaf meanwhile
    assert [t for t in waits if unlistened[0] + 2.0 <= t <= unlistened[0] + 2.1]  # then again
