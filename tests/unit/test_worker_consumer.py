"""The consume stage against a scripted stand-in for confluent-kafka's consumer: decoding,
one thread hop per batch, never more messages asked for than free slots, consumer errors
dropped, every message tracked in arrival order."""

from __future__ import annotations

import json
import logging
import threading
import uuid

import pytest
import trio

from leasework.pacing import Pacer
from leasework.service import Stopping
from leasework.worker.consumer import (
    GATHER,
    Consumed,
    PauseSwitch,
    arrived,
    consume,
    read_message,
    receive,
)
from leasework.worker.feed import Feed
from leasework.worker.offsets import Offsets
from leasework.worker.slots import Slots


class Message:
    """What confluent_kafka.Message answers, for one message or one consumer error."""

    def __init__(self, partition: int, offset: int, value: bytes | None, error=None) -> None:
        self._partition, self._offset, self._value, self._error = partition, offset, value, error

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def error(self):
        return self._error


def message(
    offset: int, job_id: uuid.UUID | None = None, partition: int = 0, job_type: str | None = None
) -> Message:
    fields = {"job_id": str(job_id)} | ({"type": job_type} if job_type else {})
    value = b"garbage" if job_id is None else json.dumps(fields).encode()
    return Message(partition, offset, value)


class Kafka:
    """poll() and consume() hand out ``script`` in order, then nothing; calls are recorded."""

    def __init__(self, script: list[Message]) -> None:
        self.script = list(script)
        self.calls: list[tuple[str, int]] = []

    def poll(self, timeout: float):
        self.calls.append(("poll", 1))
        return self.script.pop(0) if self.script else None

    def consume(self, count: int, timeout: float) -> list[Message]:
        self.calls.append(("consume", count))
        taken, self.script = self.script[:count], self.script[count:]
        return taken


def test_a_message_is_read_for_its_job_id_and_the_type_it_names():
    job_id = uuid.uuid4()
    value = json.dumps({"job_id": str(job_id), "type": "noop", "attempt": 1}).encode()
    assert read_message(value) == (job_id, "noop")
    assert read_message(json.dumps({"job_id": str(job_id)}).encode()) == (job_id, None)
    assert read_message(json.dumps({"job_id": str(job_id), "type": 5}).encode()) == (job_id, None)
    assert read_message(json.dumps({"job_id": "x", "type": "noop"}).encode()) == (None, None)


@pytest.mark.parametrize(
    "value",
    [
        None,
        b"",
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'"a string"',
        b"{}",
        b'{"job_id": "not-a-uuid"}',
        b'{"job_id": null}',
        b'{"job_id": 5}',  # uuid.UUID(5) raises AttributeError
        b'{"job_id": ["a"]}',
        b"[" * 100_000,
    ],
)
def test_a_message_that_carries_no_job_id_is_read_as_none(value):
    assert read_message(value) == (None, None)


class Clocked(Kafka):
    """Also records the timeout each consume() was given."""

    def __init__(self, script: list[Message]) -> None:
        super().__init__(script)
        self.timeouts: list[float] = []

    def consume(self, count: int, timeout: float) -> list[Message]:
        self.timeouts.append(timeout)
        return super().consume(count, timeout)


def test_receive_waits_for_one_then_gathers_the_rest_in_one_call():
    kafka = Clocked([message(o) for o in range(10)])
    pacer = Pacer(GATHER)
    assert len(receive(kafka, 4, pacer)) == 4  # type: ignore[arg-type]
    assert kafka.calls == [("poll", 1), ("consume", 3)]
    kafka.calls.clear()
    assert len(receive(kafka, 1, pacer)) == 1  # type: ignore[arg-type]
    assert kafka.calls == [("poll", 1)]  # one slot: no consume() call at all


def test_an_idle_worker_takes_what_is_fetched_without_waiting_and_a_busy_one_gathers():
    kafka = Clocked([message(o) for o in range(10)])
    pacer = Pacer(GATHER)
    receive(kafka, 4, pacer)  # type: ignore[arg-type]
    assert kafka.timeouts == [0.0]  # idle: what is already fetched, at once
    receive(kafka, 4, pacer)  # type: ignore[arg-type]
    assert 0 < kafka.timeouts[1] <= GATHER  # right after a batch: the rest of the window


def test_receive_of_nothing_does_not_gather():
    kafka = Kafka([])
    assert receive(kafka, 500, Pacer(GATHER), wait=0.0) == []  # type: ignore[arg-type]
    assert kafka.calls == [("poll", 1)]


def test_arrived_tracks_messages_in_order_and_drops_consumer_errors(caplog):
    offsets = Offsets(None, "jobs.ready")  # type: ignore[arg-type]
    job_id = uuid.uuid4()
    received = [
        message(7, job_id, job_type="noop"),
        Message(0, -1, None, error="broker down"),
        message(8),
    ]
    with caplog.at_level(logging.WARNING):
        batch = arrived(received, offsets)  # type: ignore[arg-type]
    assert batch == [Consumed(0, 7, job_id, "noop"), Consumed(0, 8, None)]
    assert offsets.tracker.in_flight() == 2
    assert [r.getMessage() for r in caplog.records] == ["consumer error"]
    offsets.finish(0, 8)
    assert offsets.tracker.positions() == {}  # 7 arrived first and still runs
    offsets.finish(0, 7)
    assert offsets.tracker.positions() == {0: 9}


def test_a_partition_fetched_again_from_an_older_offset_is_logged_and_tracked_afresh(caplog):
    offsets = Offsets(None, "jobs.ready")  # type: ignore[arg-type]
    arrived([message(5), message(6)], offsets)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        arrived([message(5)], offsets)  # type: ignore[arg-type]
    assert "partition rewound" in caplog.records[0].getMessage()
    assert offsets.tracker.in_flight() == 1


async def test_the_loop_asks_for_the_free_slots_and_waits_for_slots_with_what_it_received():
    ids = [uuid.uuid4() for _ in range(3)]
    error = Message(0, -1, None, error="transport failure")
    kafka = Kafka([message(0, ids[0]), message(1, ids[1]), error, message(2, ids[2])])
    offsets = Offsets(kafka, "jobs.ready")  # type: ignore[arg-type]
    slots, stopping = Slots(2), Stopping()
    send, batches = trio.open_memory_channel[list[Consumed]](10)
    with trio.fail_after(10):  # a hang is a failure
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, Feed.of(offsets), slots, stopping, send)
            first = await batches.receive()
            assert first == [Consumed(0, 0, ids[0]), Consumed(0, 1, ids[1])]
            assert kafka.calls == [("poll", 1), ("consume", 1)] and slots.held == 2
            await trio.sleep(0.05)
            # no free slot: a poll for one (the error is dropped), which waits for a slot
            assert kafka.calls[2:] == [("poll", 1), ("poll", 1)]
            assert slots.held == 2 and batches.statistics().current_buffer_used == 0
            slots.release()  # the first message is settled
            second = await batches.receive()
            assert second == [Consumed(0, 2, ids[2])] and slots.held == 2
            stopping.set("test")
            slots.release(2)
    assert slots.held == 0  # polls hold no slot
    with pytest.raises(trio.EndOfChannel):  # the stage closed its channel on its way out
        await batches.receive()


async def test_what_was_received_when_stopping_is_dropped_unfinished_for_redelivery():
    kafka = Kafka([message(0, uuid.uuid4()), message(1, uuid.uuid4())])
    offsets = Offsets(kafka, "jobs.ready")  # type: ignore[arg-type]
    slots, stopping = Slots(1), Stopping()
    send, batches = trio.open_memory_channel[list[Consumed]](10)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, Feed.of(offsets), slots, stopping, send)
            await batches.receive()
            await trio.sleep(0.05)  # the second waits for a slot
            stopping.set("test")
    assert slots.held == 1 and offsets.tracker.in_flight() == 2  # neither is finished


class Pausable:
    """A consumer's assignment and the pause and resume calls made on it."""

    def __init__(self, assigned: list[int]) -> None:
        self.assigned = assigned
        self.calls: list[tuple[str, list[int]]] = []

    def assignment(self) -> list[int]:
        return list(self.assigned)

    def pause(self, partitions: list[int]) -> None:
        self.calls.append(("pause", partitions))

    def resume(self, partitions: list[int]) -> None:
        self.calls.append(("resume", partitions))


def test_a_paused_queue_pauses_its_whole_assignment_before_every_poll_and_resumes_once():
    consumer, switch = Pausable([0, 1]), PauseSwitch()
    switch.apply(consumer, False)  # not paused: nothing to do
    switch.apply(consumer, True)
    consumer.assigned = [0, 1, 2]  # a rebalance gave it one more while paused
    switch.apply(consumer, True)
    switch.apply(consumer, False)
    switch.apply(consumer, False)
    assert consumer.calls == [("pause", [0, 1]), ("pause", [0, 1, 2]), ("resume", [0, 1, 2])]


class Renewing(Feed):
    """A feed whose topic is made again after ``stale_after`` polls: renew() swaps in
    ``replacement`` as Feed.renew does (Offsets.replace)."""

    def __init__(self, offsets: Offsets, replacement: Kafka, stale_after: int) -> None:
        vars(self).update(vars(Feed.of(offsets)))
        self.replacement, self.stale_after, self.renewals = replacement, stale_after, 0

    def stale(self) -> bool:
        return self.renewals == 0 and len(self.consumer.calls) >= self.stale_after

    async def renew(self) -> None:
        self.renewals += 1
        self.offsets.replace(self.replacement)  # type: ignore[arg-type, union-attr]


async def test_a_stale_feed_is_renewed_between_polls_and_what_then_arrives_is_the_new_ones():
    ids = [uuid.uuid4() for _ in range(3)]
    old, new = Kafka([message(40, ids[0])]), Kafka([message(0, ids[1]), message(1, ids[2])])
    offsets = Offsets(old, "jobs.ready")  # type: ignore[arg-type]
    feed = Renewing(offsets, new, stale_after=2)  # the old consumer's message, then an idle poll
    slots, stopping = Slots(10), Stopping()
    send, batches = trio.open_memory_channel[list[Consumed]](10)
    got: list[Consumed] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, feed, slots, stopping, send)
            while len(got) < 3:
                got += await batches.receive()
            stopping.set("test")
    assert feed.renewals == 1
    assert got[0] == Consumed(0, 40, ids[0], generation=0)
    assert got[1:] == [Consumed(0, 0, ids[1], generation=1), Consumed(0, 1, ids[2], generation=1)]
    offsets.finish(0, 40, got[0].generation)  # the old consumer's: nothing to commit
    assert offsets.tracker.positions() == {}
    offsets.finish(0, 0, got[1].generation)
    assert offsets.tracker.positions() == {0: 1}


class Unanswered(Kafka):
    """A consumer whose poll waits on a cluster that does not answer until ``answer`` is
    set (as an offset reset's watermark read waits its timeout); close() is recorded with
    whether a poll was under way then (librdkafka does not allow that)."""

    def __init__(self) -> None:
        super().__init__([])
        self.polling, self.answer = threading.Event(), threading.Event()
        self.closed_under_a_poll: bool | None = None

    def poll(self, timeout: float):
        self.polling.set()
        self.answer.wait(30)
        self.polling.clear()
        return None

    def close(self) -> None:
        self.closed_under_a_poll = self.polling.is_set()


async def test_a_stop_does_not_wait_for_a_receive_that_waits_on_kafka_and_the_close_waits_for_it():
    kafka = Unanswered()
    feed = Feed.of(Offsets(kafka, "jobs.ready"))  # type: ignore[arg-type]
    slots, stopping = Slots(1), Stopping()
    send, _ = trio.open_memory_channel[list[Consumed]](10)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, feed, slots, stopping, send)
            await trio.to_thread.run_sync(kafka.polling.wait)
            began = trio.current_time()
            stopping.set("test")
        assert trio.current_time() - began < 1.0  # the receive was abandoned, not awaited
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed.close)
            await trio.sleep(0.2)
            assert kafka.closed_under_a_poll is None  # the close waits for the receive
            kafka.answer.set()
    assert kafka.closed_under_a_poll is False
