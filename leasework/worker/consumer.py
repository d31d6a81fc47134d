"""The consume stage: messages from ``jobs.ready`` in batches, one thread hop per batch.

The loop asks Kafka for as many messages as its queue has slots free (:func:`receive`), tracks
each one's (partition, offset) in arrival order (:mod:`leasework.worker.offsets`) and decodes
the job it wakes, takes a slot for each (:mod:`leasework.worker.slots`: the queue's priority
bands, a consumer each, share them) and hands the batch to the claim stage on a memory
channel. A message arrives here
exactly once and leaves as a :class:`Consumed`; nothing downstream talks to Kafka but the
offsets stage.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio
from confluent_kafka import Consumer, Message

from leasework import metrics
from leasework.config import Settings
from leasework.kafka import client_config
from leasework.pacing import Pacer
from leasework.priorities import HIGHEST, band_consumer_group
from leasework.queues import DEFAULT
from leasework.service import Stopping
from leasework.worker.offsets import Offsets
from leasework.worker.slots import Slots

log = logging.getLogger("leasework.worker.consumer")

MAX_POLL = 500  # messages per consume() call, at most
LOWER_BAND_FETCH_WAIT_MS = 3000  # a lower priority band's long poll (see consumer_config)
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


def consumer_config(settings: Settings, queue: str = DEFAULT, band: int = HIGHEST) -> dict:
    """The consumer of ``queue``'s topic of priority ``band``, in the band's own group."""
    config = {
        "group.id": band_consumer_group(settings.consumer_group, queue, band),
        # offsets are stored by the worker once a job's outcome is durable, and committed
        # by librdkafka in the background (plus synchronously on revoke and shutdown)
        "enable.auto.commit": True,
        "enable.auto.offset.store": False,
        "auto.commit.interval.ms": 1000,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 2_000,
        "max.poll.interval.ms": 300_000,
        "socket.connection.setup.timeout.ms": 5_000,
        "reconnect.backoff.max.ms": 2_000,
        # an idle partition waits on the broker (long poll), not in a tight fetch loop; a
        # message that arrives ends the wait at once (fetch.min.bytes 1), so neither
        # setting costs a lone job anything: a larger fetch.min.bytes would hold it for up
        # to fetch.wait.max.ms, and batches grow by themselves under load (the relay puts a
        # pass on few partitions, leasework.relay.placement)
        "fetch.min.bytes": 1,
        "fetch.wait.max.ms": 500,
    }
    if band != HIGHEST:
        # a lower band is idle most of the time: its long polls wait longer, so that each
        # idle band costs the brokers a fetch per broker every 3 s, not every half second
        # (a message that arrives still ends the wait at once)
        config["fetch.wait.max.ms"] = LOWER_BAND_FETCH_WAIT_MS
    base = client_config(settings.kafka_brokers, settings.process_name)
    return {**base, **config, **dict(settings.kafka_properties)}


class PauseSwitch:
    """Stops and restarts fetching a consumer's whole assignment as its queue is paused and
    resumed (:mod:`leasework.queue_ops`). Used in the receiving thread only. While paused it
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
        batch.append(Consumed(partition, offset, *read_message(message.value())))
    return batch


async def consume(
    consumer: Consumer,
    offsets: Offsets,
    slots: Slots,
    stopping: Stopping,
    batches: trio.MemorySendChannel[list[Consumed]],
    paused: Callable[[], bool] = lambda: False,
    band: int = HIGHEST,
) -> None:
    """Poll until ``stopping``, then close ``batches``. A poll asks for as many messages as
    the queue has slots free (one at least), holding none while it waits; what it received
    then takes slots as the priority ``band``'s (:meth:`Slots.take`: the highest band waiting
    is served first) and goes to the claim stage as they are granted, so each message of a
    batch holds a slot from there on; the channel's buffer is unbounded because the slots
    bound it. While ``paused()`` the assignment is not fetched (polling goes on: it keeps the
    membership). What was received and not yet granted a slot at ``stopping`` is dropped
    unfinished: it is redelivered."""
    limiter = trio.CapacityLimiter(1)
    pacer = Pacer(GATHER)  # used in the receiving thread only (the limiter admits one)
    switch = PauseSwitch()  # likewise

    def paused_receive(at_most: int, now_paused: bool) -> list[Message]:
        switch.apply(consumer, now_paused)
        return receive(consumer, at_most, pacer)

    async def cancel_at_stop(scope: trio.CancelScope) -> None:
        await stopping.wait()
        scope.cancel()

    async with batches, trio.open_nursery() as loop:
        loop.start_soon(cancel_at_stop, loop.cancel_scope)
        received: list[Consumed] = []
        while True:
            if not received:
                at_most = min(MAX_POLL, max(1, slots.available()))
                messages = await trio.to_thread.run_sync(
                    paused_receive, at_most, paused(), limiter=limiter
                )
                received = arrived(messages, offsets)
                continue
            granted = await slots.take(len(received), band)
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
