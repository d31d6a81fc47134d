"""The consume stage: messages from ``jobs.ready`` in batches, one thread hop per batch.

The loop asks Kafka for as many messages as its queue has slots free (:func:`receive`), tracks
each one's (partition, offset) in arrival order (:mod:`leasework.worker.offsets`) and decodes
the job it wakes, takes a slot for each (:mod:`leasework.worker.slots`: the queue's priority
bands, a consumer each, share them) and hands the batch to the claim stage on a memory
channel. A message arrives here
exactly once and leaves as a :class:`Consumed`; nothing downstream talks to Kafka but the
offsets stage.

Where a partition starts is never left to librdkafka: ``auto.offset.reset`` is ``error``, so a
partition whose group has no committed offset, or whose offset Kafka no longer holds, stops
with an ``_AUTO_OFFSET_RESET`` event, and :class:`OffsetResets` (in the receiving thread)
logs and counts what happened and starts it again at the log start (:func:`judge_reset`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from leasework import metrics
from leasework.pacing import Pacer
from leasework.service import Stopping
from leasework.worker.offsets import Offsets
from leasework.worker.slots import Slots

if TYPE_CHECKING:
    from leasework.worker.feed import Feed

log = logging.getLogger("leasework.worker.consumer")

MAX_POLL = 500  # messages per consume() call, at most
GATHER = 0.02  # seconds between the hand-offs of two batches, at least (an upper bound on waiting)


@dataclass(frozen=True)
class Consumed:
    """One message taken from ``jobs.ready``: where it came from (what its offset is
    committed as), the job it wakes (None: undecodable) and the job's type as the message
    names it (None: not named; the claim then reads the job's row for it)."""

    partition: int
    offset: int
    job_id: uuid.UUID | None
    job_type: str | None = None
    generation: int = 0  # the feed's consumer it came through (Offsets.generation)


class PauseSwitch:
    """Stops and restarts fetching a consumer's whole assignment as its queue is paused and
    resumed (:mod:`leasework.queues.operations`). Used in the receiving thread only. While paused it
    pauses the assignment before every poll (a rebalance may have assigned more); librdkafka
    drops what it prefetched and, resumed, fetches again from what was consumed."""

    def __init__(self) -> None:
        self.paused = False

    def apply(self, consumer: Consumer, paused: bool) -> None:
        if paused:
            if assigned := consumer.assignment():
                consumer.pause(assigned)
            self.paused = True
        elif self.paused:
            if assigned := consumer.assignment():
                consumer.resume(assigned)
            self.paused = False


def receive(consumer: Consumer, at_most: int, pacer: Pacer, wait: float = 0.5) -> list[Message]:
    """Up to ``at_most`` messages, in one thread hop: wait (up to ``wait`` s) for the first,
    then for company only while ``pacer`` says the last batch left less than its window ago,
    so an idle worker claims a lone job at once and a steady stream becomes batches (each
    batch costs three round trips whatever its size). What is already fetched comes along
    either way. (Plain ``consume(n, timeout)`` waits for all ``n`` or the whole timeout: a
    trickle would sit out the timeout.)"""
    first = consumer.poll(wait)
    if first is None:
        return []
    batch = [first]
    if at_most > 1:
        batch += consumer.consume(at_most - 1, pacer.delay(time.monotonic()))
    pacer.started(time.monotonic())
    return batch


def read_message(message_value: bytes | None) -> tuple[uuid.UUID | None, str | None]:
    """The job id a ``jobs.ready`` message carries, or None when it carries none (not JSON,
    not an object, no ``job_id``, or one that is not a UUID's text), and the type it names
    (None when it names none, or carries no job id)."""
    try:
        value = json.loads(message_value or b"")
        job_id = value["job_id"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None, None
    if not isinstance(job_id, str):  # uuid.UUID(5) raises AttributeError, not ValueError
        return None, None
    try:
        parsed = uuid.UUID(job_id)
    except ValueError:
        return None, None
    job_type = value.get("type")
    return parsed, job_type if isinstance(job_type, str) else None


def arrived(messages: Sequence[Message], offsets: Offsets) -> list[Consumed]:
    """The batch of what was received: a consumer error is logged and dropped (it is no
    message), every message is tracked in arrival order and decoded."""
    batch = []
    for message in messages:
        if message.error() is not None:
            log.warning("consumer error", extra={"error": str(message.error())})
            continue
        partition, offset = message.partition(), message.offset()
        if offsets.tracker.start(partition, offset):
            log.warning(
                "partition rewound without a revoke: its offsets are tracked afresh",
                extra={"partition": partition, "offset": offset},
            )
        job_id, job_type = read_message(message.value())
        batch.append(Consumed(partition, offset, job_id, job_type, offsets.generation))
    return batch


# ------------------------------------------------------------------ offset resets

# why a partition had no usable offset: the ``reason`` of leasework_consumer_offset_resets_total
NO_COMMITTED_OFFSET = "no_committed_offset"  # a new group, or its committed offsets expired
OUT_OF_RANGE = "out_of_range"  # Kafka deleted records the group had not read yet
LOG_TRUNCATED = "log_truncated"  # the log ends before the group's offset (topic recreated,
# an unclean leader election)
OTHER = "other"  # anything else (the logged error says what)
RESET_REASONS = (NO_COMMITTED_OFFSET, OUT_OF_RANGE, LOG_TRUNCATED, OTHER)

# librdkafka reports every reset as _AUTO_OFFSET_RESET and says its cause only in the error's
# text, in that cause's own words (its own tests match the text the same way)
_NO_OFFSET_TEXT = KafkaError(KafkaError._NO_OFFSET).str()
_TRUNCATION_TEXT = KafkaError(KafkaError._LOG_TRUNCATION).str()

KAFKA_READ_TIMEOUT = 5.0  # seconds for a partition's watermarks, or the group's offsets
RESTART_COMPLAINTS_EVERY = 60.0  # seconds between two logs of the same failing restart


@dataclass(frozen=True)
class Reset:
    """Why a partition had no usable offset, and where its consumption resumes: an offset,
    or OFFSET_BEGINNING (librdkafka finds the log start) when the watermarks were unread."""

    reason: str
    resume_at: int

    @property
    def level(self) -> int:
        """A group's first start is normal (info); any other reset tells of records gone."""
        return logging.INFO if self.reason == NO_COMMITTED_OFFSET else logging.WARNING


def judge_reset(error: str, asked: int | None, low: int | None, high: int | None) -> Reset:
    """The reset of a partition from librdkafka's ``error`` text, the offset it asked for
    (None: none, as when the group has no committed offset) and the partition's log-start
    and high watermarks (None: unread). Consumption resumes at the log start whatever the
    reason: the earliest record Kafka still holds, so none it holds is skipped (at least
    once: a message of a finished job is skipped by the claim; the jobs of deleted records
    are the relay's recovery's). An asked offset within the watermarks (they moved since
    Kafka refused it) counts as out of range."""
    if _NO_OFFSET_TEXT in error:
        reason = NO_COMMITTED_OFFSET
    elif _TRUNCATION_TEXT in error:
        reason = LOG_TRUNCATED
    elif asked is None or asked < 0:
        reason = OTHER
    elif high is not None and high >= 0 and asked > high:
        reason = LOG_TRUNCATED
    else:
        reason = OUT_OF_RANGE
    return Reset(reason, low if low is not None and low >= 0 else OFFSET_BEGINNING)


def known_start(position: int, restarted: int | None, committed: int) -> int:
    """Where a partition of the assignment starts when the assignment is set again: where
    the consumer stands (after the last message it returned), else the later of where this
    consumer last started it and the group's committed offset (nothing below either is
    wanted: deleted, or done), else OFFSET_INVALID (librdkafka reads the committed offset;
    without one the partition reports a reset of its own)."""
    if position >= 0:
        return position
    known = [o for o in (restarted, committed) if o is not None and o >= 0]
    return max(known) if known else OFFSET_INVALID


Key = tuple[str, int]  # (topic, partition)


class OffsetResets:
    """Starts again, at the log start, each partition of one consumer that stopped for want
    of a usable offset (``auto.offset.reset`` is ``error``), and logs and counts each reset
    by queue, priority and reason. Used in the receiving thread only, after each poll.

    librdkafka stops such a partition and only a new assignment starts it again (seek()
    refuses a stopped partition: ``_STATE``). With the eager protocol (the default) the
    whole assignment is set again, each other partition where it stands
    (:func:`known_start`); with a cooperative one, the partition alone. A reset event can be
    late: the partition was started since (a rebalance, or this consumer for an earlier
    event); a seek to where it stands tells (it succeeds only on a running partition), and
    such an event is dropped. A restart that fails is tried again after the next poll."""

    def __init__(self, queue: str, band: int, stopped: threading.Event | None = None) -> None:
        self.queue = queue
        self.priority = str(band)
        # set when the worker stops: no partition is started again (nor its offsets read,
        # which may wait seconds on a cluster that does not answer); its next owner starts it
        self.stopped = stopped or threading.Event()
        self.restarted: dict[Key, int] = {}  # where this consumer last started a partition
        self.unfinished: dict[Key, int] = {}  # restarts that failed: partition -> offset
        self.complain_after = 0.0  # monotonic time before which a failed restart says no more

    def handle(self, consumer: Consumer, messages: list[Message]) -> list[Message]:
        """``messages`` without the reset events, each event's partition started again."""
        events: dict[Key, Message] = {}
        kept = []
        for message in messages:
            error = message.error()
            if isinstance(error, KafkaError) and error.code() == KafkaError._AUTO_OFFSET_RESET:
                events.setdefault((message.topic(), message.partition()), message)
            else:
                kept.append(message)
        if (events or self.unfinished) and not self.stopped.is_set():
            self.reset(consumer, events)
        return kept

    def reset(self, consumer: Consumer, events: dict[Key, Message]) -> None:
        assignment = consumer.assignment()
        assigned = {(tp.topic, tp.partition) for tp in assignment}
        self.unfinished = {k: o for k, o in self.unfinished.items() if k in assigned}
        for key in events.keys() - assigned:
            log.info(
                "offset reset of a partition no longer assigned: its new owner starts it",
                extra=self.where(key),
            )
        events = {k: m for k, m in events.items() if k in assigned}
        if not events and not self.unfinished:
            return
        positions = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(assignment)}
        unread = [tp for tp in assignment if positions.get((tp.topic, tp.partition), -1) < 0]
        committed = self.committed(consumer, unread)
        starts = {
            key: known_start(
                positions.get(key, OFFSET_INVALID),
                self.restarted.get(key),
                committed.get(key, OFFSET_INVALID),
            )
            for key in assigned
        }
        resume = dict(self.unfinished)
        for key, message in events.items():
            if self.stopped.is_set():
                return
            if self.running(consumer, key, starts[key]):
                log.debug("late offset reset event dropped", extra=self.where(key))
                continue
            resume[key] = self.judge(consumer, key, message)
        if resume:
            self.restart(consumer, [(tp.topic, tp.partition) for tp in assignment], starts, resume)

    def committed(self, consumer: Consumer, partitions: list[TopicPartition]) -> dict[Key, int]:
        """The group's committed offsets of ``partitions`` ({} when they cannot be read)."""
        if not partitions:
            return {}
        asked = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        try:
            found = consumer.committed(asked, timeout=KAFKA_READ_TIMEOUT)
        except KafkaException as exc:
            log.warning("committed offsets unread", extra={"error": str(exc)})
            return {}
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.error is None}

    @staticmethod
    def running(consumer: Consumer, key: Key, start: int) -> bool:
        """Whether the partition runs (was started since its event): seek() succeeds only
        then, and seeking where it stands changes nothing. Not known (False) without a
        known start."""
        if start < 0:
            return False
        try:
            consumer.seek(TopicPartition(*key, start))
        except KafkaException:
            return False  # stopped (_STATE), or being stopped
        return True

    def judge(self, consumer: Consumer, key: Key, message: Message) -> int:
        """Read the partition's watermarks, log and count its reset; where it resumes."""
        low = high = None
        try:
            marks = consumer.get_watermark_offsets(
                TopicPartition(*key), timeout=KAFKA_READ_TIMEOUT, cached=False
            )
        except KafkaException as exc:
            marks, unread = None, str(exc)
        else:
            unread = "timed out"
        if marks is not None:
            low, high = marks
        reset = judge_reset(str(message.error()), message.offset(), low, high)
        metrics.consumer_offset_resets.labels(self.queue, self.priority, reset.reason).inc()
        log.log(
            reset.level,
            RESET_MESSAGES[reset.reason],
            extra={
                **self.where(key),
                "reason": reset.reason,
                "asked_offset": message.offset(),
                "log_start_offset": low,
                "high_watermark": high,
                "resumed_at": reset.resume_at if reset.resume_at >= 0 else "log start",
                "watermarks_unread": None if marks is not None else unread,
                "error": str(message.error()),
            },
        )
        if reset.resume_at >= 0:
            self.restarted[key] = reset.resume_at
        return reset.resume_at

    def restart(
        self,
        consumer: Consumer,
        assigned: list[Key],
        starts: dict[Key, int],
        resume: dict[Key, int],
    ) -> None:
        """Start the ``resume`` partitions again at their offsets (see the class's text)."""
        let_go: set[Key] = set()  # unassigned, not yet assigned again (cooperative)
        try:
            try:
                consumer.assign([TopicPartition(*k, resume.get(k, starts[k])) for k in assigned])
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._STATE:
                    raise
                for key, offset in resume.items():  # cooperative: incremental changes only
                    consumer.incremental_unassign([TopicPartition(*key)])
                    let_go.add(key)
                    consumer.incremental_assign([TopicPartition(*key, offset)])
                    let_go.discard(key)
        except KafkaException as exc:
            if (now := time.monotonic()) >= self.complain_after:  # not after every poll
                self.complain_after = now + RESTART_COMPLAINTS_EVERY
                log.error(
                    "partitions an offset reset stopped were not started again: tried again "
                    "after each poll (one a cooperative assignment let go of waits for a "
                    "rebalance)",
                    extra={
                        "partitions": sorted(resume),
                        "let_go": sorted(let_go),
                        "error": str(exc),
                    },
                )
            self.unfinished = {k: o for k, o in resume.items() if k not in let_go}
        else:
            self.unfinished = {}
            self.complain_after = 0.0

    def where(self, key: Key) -> dict:
        return {
            "topic": key[0],
            "partition": key[1],
            "queue": self.queue,
            "priority": self.priority,
        }


RESET_MESSAGES = {
    NO_COMMITTED_OFFSET: "no committed offset for the partition (a new consumer group, or its "
    "offsets expired): consuming from the log start",
    OUT_OF_RANGE: "the consumer group's offset is out of range: Kafka deleted records the group "
    "had not read (retention, deleted records); consuming from the log start, the relay "
    "recovers their jobs",
    LOG_TRUNCATED: "the partition's log ends before the consumer group's offset (the topic was "
    "recreated, or an unclean leader election truncated it): consuming from the log start",
    OTHER: "no usable offset for the partition (the error says why): consuming from the log start",
}


async def consume(
    feed: Feed,
    slots: Slots,
    stopping: Stopping,
    batches: trio.MemorySendChannel[list[Consumed]],
    paused: Callable[[], bool] = lambda: False,
) -> None:
    """Poll ``feed``'s consumer until ``stopping``, then close ``batches``. A poll asks for
    as many messages as the queue has slots free (one at least), holding none while it
    waits; what it received then takes slots as the feed's priority band's
    (:meth:`Slots.take`: the highest band waiting is served first) and goes to the claim
    stage as they are granted, so each message of a batch holds a slot from there on; the
    channel's buffer is unbounded because the slots bound it. While ``paused()`` the
    assignment is not fetched (polling goes on: it keeps the membership). What was received
    and not yet granted a slot at ``stopping`` is dropped unfinished: it is redelivered. A
    partition without a usable offset is started again at its log start in the same thread
    hop (:class:`OffsetResets`). Between two polls, a feed whose topic was deleted and made
    again gets a new consumer (:meth:`Feed.renew`).

    At ``stopping`` a receive under way is abandoned, not awaited: its reads may wait
    seconds on a cluster that does not answer (an offset reset reads offsets and
    watermarks), and what it receives is dropped (redelivered). Its thread holds
    ``feed.in_use`` until it returns, so the consumer is closed only after it."""
    limiter = trio.CapacityLimiter(1)
    pacer = Pacer(GATHER)  # used in the receiving thread only (the limiter admits one)
    switch = PauseSwitch()  # likewise; both are the consumer's, made again with it
    stopped = threading.Event()  # stopping, as the receiving thread can see it
    resets = OffsetResets(feed.queue, feed.band, stopped)

    def paused_receive(at_most: int, now_paused: bool) -> list[Message]:
        with feed.in_use:
            if stopped.is_set():
                return []
            consumer = feed.consumer
            switch.apply(consumer, now_paused)
            return resets.handle(consumer, receive(consumer, at_most, pacer))

    async def cancel_at_stop(scope: trio.CancelScope) -> None:
        await stopping.wait()
        stopped.set()
        scope.cancel()

    async with batches, trio.open_nursery() as loop:
        loop.start_soon(cancel_at_stop, loop.cancel_scope)
        received: list[Consumed] = []
        while True:
            if not received:
                if feed.stale():
                    await feed.renew()
                    switch, resets = PauseSwitch(), OffsetResets(feed.queue, feed.band, stopped)
                at_most = min(MAX_POLL, max(1, slots.available()))
                messages = await trio.to_thread.run_sync(
                    paused_receive, at_most, paused(), limiter=limiter, abandon_on_cancel=True
                )
                received = arrived(messages, feed.offsets)
                continue
            granted = await slots.take(len(received), feed.band)
            batches.send_nowait(received[:granted])
            received = received[granted:]


def unexpected(message: Consumed | None) -> None:
    """A bug in this process, not the job's outcome (call it from an ``except``): count it
    and leave the message unfinished, so that its offset is not committed (None: a job a
    wake-up started, which has no message here)."""
    metrics.worker_errors.inc()
    where = {} if message is None else {"partition": message.partition, "offset": message.offset}
    log.exception(
        "unexpected error handling a message; left uncommitted for redelivery (a claimed "
        "job comes back through the reaper)",
        extra=where,
    )
