"""The outbox relay: publishes the outbox to Kafka and deletes each row Kafka acknowledged.

A pass locks a batch with ``FOR UPDATE SKIP LOCKED`` (so any number of relays may run),
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

from leasework import metrics, store
from leasework.config import Settings
from leasework.db import Database
from leasework.kafka import BlockingPublisher
from leasework.listen import Listener
from leasework.pacing import Pacer
from leasework.relay.placement import PER_PARTITION, place
from leasework.relay.service import MAX_BACKOFF, Backoff, Pass, Setback, run_passes

log = logging.getLogger("leasework.relay.outbox")

NOTIFY_CHANNEL = "leasework_outbox"
HEALTH_CONDITION = "outbox-relay"  # the relay's /readyz names this while Kafka does not ack


@dataclass(frozen=True)
class OutboxConfig:
    # rows a pass publishes (LEASEWORK_RELAY_BATCH_SIZE); a full batch runs the next at once
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
    """One pass: rows Kafka acknowledged (deleted), rows it did not (kept), and the first
    delivery error."""

    acknowledged: int
    unacknowledged: int
    error: str | None
    batch: int

    @property
    def more_waiting(self) -> bool:
        return self.acknowledged >= self.batch

    @property
    def setback(self) -> Setback | None:
        if not self.unacknowledged:
            return None
        return Setback(
            "kafka did not acknowledge outbox rows; kept for retry",
            {"failed": self.unacknowledged, "error": self.error},
        )


class OutboxRelay:
    def __init__(
        self,
        db: Database,
        publisher: BlockingPublisher,
        config: OutboxConfig,
        health_conditions: dict[str, str],
    ) -> None:
        self.db = db
        self.publisher = publisher
        self.config = config
        self.health_conditions = health_conditions
        self.pacer = Pacer(config.gather)
        self.rng = random.Random()

    def _pass(self, conn: psycopg.Connection) -> Published:
        rows = store.outbox_fetch(conn, self.config.batch)
        if not rows:
            return Published(0, 0, None, self.config.batch)
        messages = [(m.topic, m.key, m.value.encode(), m.headers) for m in rows]
        topics = [m.topic for m in rows]
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
        acked = [m.id for m, d in zip(rows, deliveries, strict=True) if d.ok]
        store.outbox_retire(conn, acked)
        failed = [d.error for d in deliveries if not d.ok]
        return Published(len(acked), len(failed), failed[0] if failed else None, self.config.batch)

    async def run_once(self) -> Published:
        """Publish one batch; the health condition says so while Kafka does not acknowledge."""
        began = trio.current_time()
        done = await self.db.run(self._pass)
        if done.acknowledged or done.unacknowledged:  # a produce request went out
            self.pacer.started(began)
            metrics.relay_batch_size.observe(done.acknowledged + done.unacknowledged)
        metrics.relay_published.inc(done.acknowledged)
        metrics.relay_publish_failures.inc(done.unacknowledged)
        metrics.relay_last_tick.set(time.time())
        if done.unacknowledged:
            self.health_conditions[HEALTH_CONDITION] = f"cannot publish to kafka: {done.error}"
        else:
            self.health_conditions.pop(HEALTH_CONDITION, None)
        return done

    async def run(self) -> None:
        listener = Listener(self.db, NOTIFY_CHANNEL)

        async def until_rows_arrive() -> None:
            if await listener.wait(self.config.tick):
                await trio.sleep(self.pacer.delay(trio.current_time()))

        await run_passes(
            "outbox",
            self.run_once,
            interval=self.config.tick,
            backoff=self.config.backoff,
            idle=until_rows_arrive,
            expected=(psycopg.Error, KafkaException),
        )
