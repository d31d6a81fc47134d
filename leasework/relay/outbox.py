"""The outbox relay: publishes the outbox to Kafka and deletes each row Kafka acknowledged.

A pass locks a batch with ``FOR UPDATE SKIP LOCKED`` (so any number of relays may run),
produces it (idempotent producer, ``acks=all``), waits for every delivery report and deletes
the acknowledged rows, all inside one transaction: the outbox holds only what is still to be
published. A crash between produce and commit leaves the rows in place, published again on
the next pass, which the worker's skip of jobs no longer queued makes harmless. Rows Kafka did
not acknowledge stay for the next pass; while that lasts the relay backs off and its
``/readyz`` says why (the ``outbox-relay`` condition). An idle relay waits for ``NOTIFY
leasework_outbox`` (a statement trigger on ``outbox``) or its tick, whichever comes first;
only an idle relay is notified (:class:`IdleGate`), a busy one passes again anyway. Passes
are paced (:mod:`leasework.pacing`): a NOTIFY that finds the relay idle is published
at once; under load a pass starts ``gather`` seconds after the last one started, so a stream
of small commits becomes one produce request per window instead of one per commit.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from enum import StrEnum

import psycopg
import trio
from confluent_kafka import KafkaException
from psycopg.rows import tuple_row

from leasework import metrics, store
from leasework.config import Settings
from leasework.db import Database
from leasework.kafka import BlockingPublisher
from leasework.listen import Listener
from leasework.pacing import Pacer
from leasework.relay.placement import PER_PARTITION, place
from leasework.relay.service import MAX_BACKOFF, Backoff, Pass, Setback, pass_failed, run_passes

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
        gate = IdleGate(Listener(self.db, NOTIFY_CHANNEL))

        async def until_rows_arrive() -> None:
            """After a pass that left nothing waiting: arm the gate (and pass once more if a
            row committed before it was armed, which told nobody), then wait for a NOTIFY or
            the tick; while an inserting transaction keeps it from arming, pass again a
            window later."""
            if not gate.armed():
                try:
                    state = await gate.arm()
                except Exception as exc:  # no listening connection now: poll, try again
                    pass_failed("outbox idle gate", exc, (psycopg.Error,))
                    state = Idle.PENDING
                if state is Idle.ARMED_WITH_ROWS:
                    return
                if state is Idle.PENDING:
                    await trio.sleep(max(self.config.gather, self.pacer.delay(trio.current_time())))
                    return
            if await gate.listener.wait(self.config.tick):
                await gate.disarm()
                await trio.sleep(self.pacer.delay(trio.current_time()))

        await run_passes(
            "outbox",
            self.run_once,
            interval=self.config.tick,
            backoff=self.config.backoff,
            idle=until_rows_arrive,
            expected=(psycopg.Error, KafkaException),
        )


IDLE_LOCK = (7305004, 1)  # the advisory lock of an idle relay (migration 0012 names it too)


class Idle(StrEnum):
    """What arming the gate found."""

    ARMED = "armed"  # this relay holds the idle lock: every insert from now on notifies
    ARMED_WITH_ROWS = "armed-with-rows"  # armed, and rows committed before it wait: pass
    OTHER = "other"  # another relay's listening connection holds it: inserts notify as well
    PENDING = "pending"  # an inserting transaction holds it shared: its rows come unannounced


def _arm(conn: psycopg.Connection) -> Idle:
    cur = conn.cursor(row_factory=tuple_row)
    if cur.execute("SELECT pg_try_advisory_lock(%s, %s)", IDLE_LOCK).fetchone()[0]:
        # a statement of its own, so its snapshot is taken once the lock is held: it sees
        # every row whose insert told nobody (each held the lock shared until its commit)
        waiting = cur.execute("SELECT EXISTS (SELECT 1 FROM outbox)").fetchone()[0]
        return Idle.ARMED_WITH_ROWS if waiting else Idle.ARMED
    held = cur.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
        "AND classid = %s::int::oid AND objid = %s::int::oid AND objsubid = 2 "
        "AND mode = 'ExclusiveLock' AND granted)",
        IDLE_LOCK,
    ).fetchone()[0]
    return Idle.OTHER if held else Idle.PENDING


def _disarm(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pg_advisory_unlock(%s, %s)", IDLE_LOCK)


class IdleGate:
    """Whether inserts tell the relay (and idle workers) about their rows: only while some
    relay is idle, that is holds :data:`IDLE_LOCK` exclusively on its listening connection
    (the outbox trigger notifies only when its shared try on the lock fails). A NOTIFY makes
    notifying commits wait for one another, so a busy relay is not told: it passes again
    anyway. The lock lives with the listening session: a lost connection drops it (the
    trigger stops notifying and the relay, reconnected, arms again)."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self._armed_in: int | None = None  # the listening session that holds the lock

    def armed(self) -> bool:
        return self._armed_in is not None and self._armed_in == self.listener.session

    async def arm(self) -> Idle:
        state = await self.listener.call(_arm)
        held = state in (Idle.ARMED, Idle.ARMED_WITH_ROWS)
        self._armed_in = self.listener.session if held else None
        return state

    async def disarm(self) -> None:
        """Busy again: inserts stop notifying (a lost connection has dropped the lock)."""
        if self.armed():
            self._armed_in = None
            try:
                await self.listener.call(_disarm)
            except psycopg.Error:
                pass  # the connection is gone, and its lock with it
