"""The outbox relay: publishes the outbox to Kafka and deletes each row Kafka acknowledged.

A pass locks a batch with ``FOR UPDATE SKIP LOCKED`` (so any number of relays may run), each
topic's oldest rows in turn (a burst in one topic holds no other topic's rows behind it),
produces it (idempotent producer, ``acks=all``), waits for every delivery report and deletes
the acknowledged rows, all inside one transaction: the outbox holds only what is still to be
published. A crash between produce and commit leaves the rows in place, published again on
the next pass, which the worker's skip of jobs no longer queued makes harmless. Rows Kafka did
not acknowledge stay for the next pass; while that lasts the relay backs off and its
``/readyz`` says why (the ``outbox-relay`` condition). An idle relay waits for ``NOTIFY
leasework_outbox`` (a statement trigger on ``outbox``) or its tick, whichever comes first.
Passes are paced (:mod:`leasework.pacing`): a NOTIFY that finds the relay idle is published
at once; under load a pass starts ``gather`` seconds after the last one started, so a stream
of small commits becomes one produce request per window instead of one per commit.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

import psycopg
import trio
from confluent_kafka import KafkaException

from leasework import metrics, store, wakegate
from leasework.config import Settings
from leasework.db import Database
from leasework.kafka import BlockingPublisher
from leasework.listen import Listener
from leasework.pacing import Pacer
from leasework.relay.placement import PER_PARTITION, place
from leasework.relay.service import MAX_BACKOFF, Backoff, Pass, Setback, run_passes
from leasework.service import Stopping

log = logging.getLogger("leasework.relay.outbox")

NOTIFY_CHANNEL = "leasework_outbox"
HEALTH_CONDITION = "outbox-relay"  # the relay's /readyz names this while Kafka does not ack
# seconds between a relay's tries to arm its gate while an open transaction that skipped its
# NOTIFY holds a stripe: how late, at most, that transaction's rows are published after it
# commits (a NOTIFY from any other stripe wakes the relay at once)
POLL = 0.05
# seconds from asking for a pass to its commit before the pass is logged with where they went:
# a paced job waits for every pass in front of it (a stall of a second between insert and
# publish was seen in the bench's isolation row, cause not yet known)
SLOW_PASS = 0.5


@dataclass(frozen=True)
class OutboxConfig:
    # rows a pass publishes (LEASEWORK_RELAY_BATCH_SIZE), shared equally by the topics with
    # rows waiting; a topic that filled its share runs the next pass at once
    batch: int = 1000
    # seconds an idle relay waits for a NOTIFY before it looks anyway (LEASEWORK_RELAY_TICK)
    tick: float = 0.5
    # seconds between the starts of two passes, at least: a woken relay that passed less
    # than this ago lets rows gather for the rest of it, so a stream of small commits becomes
    # one produce request instead of many (each one costs every broker); an idle one goes
    # at once
    gather: float = 0.025
    # free messages (no ordering key) a pass puts on one partition before it uses another
    per_partition: int = PER_PARTITION
    # seconds to wait for the delivery reports of one batch
    publish_timeout: float = 20.0
    # after a failed pass, or one whose rows Kafka did not acknowledge
    backoff: Backoff = Backoff(0.2, MAX_BACKOFF)

    @classmethod
    def from_settings(cls, settings: Settings) -> OutboxConfig:
        return cls(batch=settings.relay_batch_size, tick=settings.relay_tick)


@dataclass(frozen=True)
class Published(Pass):
    """One pass: rows Kafka acknowledged (deleted), rows it did not (kept), the first
    delivery error, and whether some topic filled its share of the batch (rows may be left:
    the next pass runs at once)."""

    acknowledged: int
    unacknowledged: int
    error: str | None
    full: bool

    @property
    def more_waiting(self) -> bool:
        return self.full

    @property
    def setback(self) -> Setback | None:
        if not self.unacknowledged:
            return None
        return Setback(
            "kafka did not acknowledge outbox rows; kept for retry",
            {"failed": self.unacknowledged, "error": self.error},
        )


def slow_pass(
    began: float, marks: dict[str, float], ended: float, threshold: float = SLOW_PASS
) -> dict[str, float] | None:
    """Where a pass's seconds went, when it took over ``threshold`` (None otherwise): from
    ``began`` (the pass asked for a thread and a pooled connection) through the ``marks`` the
    pass left (``connected``, ``fetched``, ``published``, ``retired``: monotonic seconds; a
    pass that found nothing leaves the first two) to ``ended`` (committed)."""
    if ended - began <= threshold:
        return None
    steps = [("waited_for_connection", "connected"), ("fetch", "fetched")]
    steps += [("publish", "published"), ("retire", "retired")]
    split, last = {}, began
    for name, mark in steps:
        if mark not in marks:
            break
        split[f"{name}_s"] = round(marks[mark] - last, 3)
        last = marks[mark]
    split["commit_s"] = round(ended - last, 3)
    split["total_s"] = round(ended - began, 3)
    return split


class OutboxRelay:
    def __init__(
        self,
        db: Database,
        publisher: BlockingPublisher,
        config: OutboxConfig,
        health_conditions: dict[str, str],
        stopping: Stopping | None = None,
    ) -> None:
        self.db = db
        # a pass runs to its end at a stop (its rows retired as Kafka acknowledged them), until
        # the shutdown's deadline, where it is abandoned: its transaction never commits, so its
        # rows stay for the next relay (a redelivery, if Kafka had them: the fence absorbs it)
        self.stopping = stopping or Stopping()
        self.publisher = publisher
        self.config = config
        self.health_conditions = health_conditions
        self.pacer = Pacer(config.gather)
        self.rng = random.Random()
        self.listener = Listener(db, NOTIFY_CHANNEL, gate=wakegate.RELAY_GATE)
        self.published = False  # the last pass sent a produce request
        self.marks: dict[str, float] = {}  # the running pass's steps (slow_pass)

    def _pass(self, conn: psycopg.Connection) -> Published:
        marks = self.marks = {"connected": time.monotonic()}
        batch = store.outbox_fetch(conn, self.config.batch)
        marks["fetched"] = time.monotonic()
        rows = batch.messages
        if not rows:
            return Published(0, 0, None, False)
        messages = [(m.topic, m.key, m.value.encode(), m.headers) for m in rows]
        topics = [m.topic for m in rows]
        if changed := self.publisher.renew_if_recreated(topics):
            metrics.relay_producer_renewals.inc()
            log.warning(
                "a topic published to was deleted and made again (its id changed): the "
                "producer is replaced (the old one's records would time out)",
                extra={"topics": changed},
            )
        partitions = place(
            topics,
            [m.free for m in rows],
            self.publisher.partitions(topics),
            self.rng,
            self.config.per_partition,
        )
        deliveries = self.publisher.publish(
            messages, timeout=self.config.publish_timeout, partitions=partitions
        )
        marks["published"] = time.monotonic()
        acked = [m.id for m, d in zip(rows, deliveries, strict=True) if d.ok]
        store.outbox_retire(conn, acked)
        marks["retired"] = time.monotonic()
        failed = [d.error for d in deliveries if not d.ok]
        return Published(len(acked), len(failed), failed[0] if failed else None, batch.full)

    async def run_once(self) -> Published:
        """Publish one batch; the health condition says so while Kafka does not acknowledge."""
        began, clock = trio.current_time(), time.monotonic()
        self.marks = {}
        with self.stopping.finishing() as finishing:
            done = await self.db.run(self._pass, abandon_on_cancel=True)
        if finishing.cancelled_caught:
            log.warning(
                "outbox pass abandoned at the shutdown deadline (kafka did not acknowledge in "
                "time); its rows stay in the outbox for the next relay"
            )
            # the deadline is the whole process's: its cancel ends this task at once
            await trio.sleep_forever()
        if split := slow_pass(clock, self.marks, time.monotonic()):
            log.warning(
                "slow outbox pass",
                extra={"rows": done.acknowledged + done.unacknowledged, **split},
            )
        self.published = bool(done.acknowledged or done.unacknowledged)
        if self.published:  # a produce request went out
            self.pacer.started(began)
            metrics.relay_batch_size.observe(done.acknowledged + done.unacknowledged)
            # busy: the next pass comes anyway, so inserters need not NOTIFY (after the
            # publish: a lone job's rows are on their way before this costs a round trip)
            await self.listener.disarm()
        metrics.relay_published.inc(done.acknowledged)
        metrics.relay_publish_failures.inc(done.unacknowledged)
        metrics.relay_last_tick.set(time.time())
        if done.unacknowledged:
            self.health_conditions[HEALTH_CONDITION] = f"cannot publish to kafka: {done.error}"
        else:
            self.health_conditions.pop(HEALTH_CONDITION, None)
        return done

    async def until_rows_arrive(self) -> None:
        """After a pass that filled no topic's share of its batch: return when the next pass
        is due. That is after the pacer's gather when the pass published (the gate disarmed);
        after one that found nothing, once the gate was armed just now (to look once more), at a
        NOTIFY, or at the tick."""
        if self.published:  # more is likely on its way: it gathers, and nobody NOTIFYs
            await trio.sleep(self.pacer.delay(trio.current_time()))
            return
        listener = self.listener
        deadline = trio.current_time() + self.config.tick
        while True:
            if not listener.armed and await listener.arm():
                return  # rows of transactions that committed before it armed are visible now
            left = deadline - trio.current_time()
            if left <= 0:
                return  # the tick: a pass anyway
            if await listener.wait(left if listener.armed else min(POLL, left)):
                await trio.sleep(self.pacer.delay(trio.current_time()))
                return

    async def run(self) -> None:
        try:
            await run_passes(
                "outbox",
                self.run_once,
                interval=self.config.tick,
                backoff=self.config.backoff,
                idle=self.until_rows_arrive,
                expected=(psycopg.Error, KafkaException),
            )
        finally:
            await self.listener.aclose()
