"""The offsets stage: which Kafka offsets may be committed, and committing them.

Several messages of one partition run at once and finish in any order; an offset may be
committed only once every message received before it on that partition has finished, or a
crash would skip the unfinished ones. :class:`OffsetTracker` keeps, per partition, the
offsets in the order they arrived and answers the next offset to commit (Kafka's
convention: the last finished offset of the contiguous prefix, plus one). Offsets are taken
in arrival order, so gaps in the log (compaction, control records) need no special case.

:class:`Offsets` is the stage around it: a message is marked finished there once its job's
outcome is durable (or nothing was to be done); a background loop hands the finished prefix
of each partition to librdkafka (``store_offsets``, every 200 ms), which commits it every
second; on revoke (in the poll thread) and on shutdown the prefix is committed synchronously.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import trio
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

log = logging.getLogger("leasework.worker.offsets")

STORE_OFFSETS_EVERY = 0.2  # seconds between passing the finished prefix to librdkafka


@dataclass
class _Partition:
    arrived: deque[int] = field(default_factory=deque)
    finished: set[int] = field(default_factory=set)
    next_commit: int | None = None
    committed: int | None = None


class OffsetTracker:
    def __init__(self) -> None:
        self._partitions: dict[int, _Partition] = {}

    def start(self, partition: int, offset: int) -> bool:
        """Track a message that arrived; True when it rewound the partition. librdkafka
        rewinds a partition by itself (it was lost and fetched again from the committed
        offset, with no revoke this side saw): the partition's tracking starts over. A
        message of the old run that finishes later only ever stands for work already done,
        so counting it in the new prefix never commits past unfinished work."""
        state = self._partitions.setdefault(partition, _Partition())
        rewound = bool(state.arrived) and offset <= state.arrived[-1]
        if rewound:
            state = self._partitions[partition] = _Partition(committed=state.committed)
        state.arrived.append(offset)
        return rewound

    def finish(self, partition: int, offset: int) -> None:
        state = self._partitions.get(partition)
        if state is None:
            return  # revoked meanwhile: nothing of ours to commit
        state.finished.add(offset)
        while state.arrived and state.arrived[0] in state.finished:
            done = state.arrived.popleft()
            state.finished.discard(done)
            state.next_commit = done + 1

    def committable(self) -> dict[int, int]:
        """Partition -> next offset, for partitions whose finished prefix grew since the last
        call to :meth:`committed`."""
        return {
            partition: state.next_commit
            for partition, state in self._partitions.items()
            if state.next_commit is not None and state.next_commit != state.committed
        }

    def committed(self, partition: int, next_offset: int) -> None:
        if (state := self._partitions.get(partition)) is not None:
            state.committed = next_offset

    def forget(self, partition: int) -> None:
        """The partition was revoked: its offsets are another consumer's to commit now."""
        self._partitions.pop(partition, None)

    def in_flight(self) -> int:
        return sum(len(s.arrived) for s in self._partitions.values())

    def positions(self) -> dict[int, int]:
        """Partition -> next offset of the finished prefix, whether stored already or not:
        what a synchronous commit (revoke, shutdown) sends."""
        return {
            partition: state.next_commit
            for partition, state in self._partitions.items()
            if state.next_commit is not None
        }


class Offsets:
    """The offsets of one consumer's run: tracked on arrival, marked finished by the stages,
    stored and committed from here alone."""

    def __init__(self, consumer: Consumer, topic: str) -> None:
        self.consumer = consumer
        self.topic = topic
        self.tracker = OffsetTracker()
        # which consumer the offsets are of: a message carries the generation it arrived in
        # (Consumed.generation), and one of an earlier consumer finishes nothing here
        self.generation = 0
        # the partitions a renewed consumer starts at the log start on its first assignment
        # of each (None: a consumer that starts where the group committed, as any does)
        self._from_log_start: set[int] | None = None
        self._limiter = trio.CapacityLimiter(1)
        self._wanted = trio.Event()

    def finish(self, partition: int, offset: int, generation: int = 0) -> None:
        """The message is done with (its job's outcome durable, or nothing to do); one that
        arrived through an earlier consumer (``generation``) has no offset here to commit."""
        if generation != self.generation:
            return
        self.tracker.finish(partition, offset)
        self._wanted.set()

    def exclusive(self) -> trio.CapacityLimiter:
        """Held (``async with``), no offset is stored or committed meanwhile."""
        return self._limiter

    def replace(self, consumer: Consumer) -> None:
        """Count the offsets of ``consumer`` from now on, in place of the one the topic was
        deleted and made again under (call it holding :meth:`exclusive`, the old consumer
        closed): nothing of the old one is tracked, stored or committed any more, and
        ``consumer`` starts each partition at the log start the first time it is assigned it
        (its group's committed offsets may be the old topic's: the consumer that is replaced
        stored and committed offsets of the old topic until it was, and the new topic's
        offsets start again from 0)."""
        self.consumer = consumer
        self.tracker = OffsetTracker()
        self.generation += 1
        self._from_log_start = set()

    def _partitions(self, offsets: dict[int, int]) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p, o) for p, o in offsets.items()]

    async def store(self) -> None:
        """Hand the finished prefix of each partition to librdkafka, which commits it in the
        background; a partition revoked meanwhile is simply not stored."""
        ready = self.tracker.committable()
        if not ready:
            return
        consumer, offsets = self.consumer, self._partitions(ready)

        def store_them() -> str | None:
            try:
                consumer.store_offsets(offsets=offsets)
                return None
            except KafkaException as exc:
                return str(exc)

        error = await trio.to_thread.run_sync(store_them, limiter=self._limiter)
        if error is None:
            for partition, offset in ready.items():
                self.tracker.committed(partition, offset)
        else:
            log.debug("offsets not stored", extra={"error": error})

    async def commit(self) -> None:
        """Synchronously commit every partition's finished prefix (shutdown). Abandoned when
        the shutdown's deadline passes: librdkafka retries a commit for as long as the group's
        coordinator does not answer, and an uncommitted offset only means a redelivery."""
        positions = self.tracker.positions()
        if not positions:
            return
        consumer, offsets = self.consumer, self._partitions(positions)

        def commit() -> str | None:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
                return None
            except KafkaException as exc:
                return str(exc)

        try:
            error = await trio.to_thread.run_sync(
                commit, limiter=self._limiter, abandon_on_cancel=True
            )
        except trio.Cancelled:
            log.warning(
                "final offset commit abandoned at the shutdown deadline (kafka did not answer); "
                "the messages after the last committed offset will be delivered again"
            )
            raise
        if error is not None:
            log.warning("final offset commit failed", extra={"error": error})

    async def run(self) -> None:
        """Store the finished prefix whenever it grew, at most every STORE_OFFSETS_EVERY s."""
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            await self.store()
            await trio.sleep(STORE_OFFSETS_EVERY)

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Runs inside ``consume()``, in the poll thread. A renewed consumer (:meth:`replace`)
        starts each partition it was not assigned before at the log start."""
        log.info("partitions assigned", extra={"partitions": [p.partition for p in partitions]})
        started = self._from_log_start
        if started is None:
            return
        fresh = {p.partition for p in partitions} - started
        if not fresh:
            return
        starts = [
            TopicPartition(
                p.topic, p.partition, OFFSET_BEGINNING if p.partition in fresh else p.offset
            )
            for p in partitions
        ]
        try:
            consumer.assign(starts)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._STATE:
                raise
            consumer.incremental_assign(starts)  # a cooperative protocol: this change only
        started |= fresh
        log.info(
            "partitions of a topic made again start at its log start",
            extra={"partitions": sorted(fresh)},
        )

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Runs inside ``consume()``, in the poll thread: commit what is finished, then let
        go (the revoked partitions' offsets are the next owner's)."""
        positions = trio.from_thread.run_sync(self.tracker.positions)
        revoked = {p.partition for p in partitions}
        offsets = self._partitions({p: o for p, o in positions.items() if p in revoked})
        if offsets:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                log.warning("commit on revoke failed", extra={"error": str(exc)})
        for partition in revoked:
            trio.from_thread.run_sync(self.tracker.forget, partition)
        log.info("partitions revoked", extra={"partitions": sorted(revoked)})
