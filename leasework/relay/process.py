"""The relay process: the outbox relay, the promoter, the reaper and the pruner in one
nursery, beside two gauge loops (outbox backlog, consumer lag).

Each loop claims its rows with ``FOR UPDATE SKIP LOCKED``, so any number of relays may run.
The outbox relay marks a row published only after Kafka acknowledged it (idempotent
producer, ``acks=all``); a crash in between publishes the row again on the next pass, which
the worker's skip of finished jobs makes harmless.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import psycopg
import trio
from confluent_kafka import KafkaException

from leasework import metrics, store
from leasework.config import Settings
from leasework.db import Database
from leasework.kafka import BlockingPublisher
from leasework.relay.pruner import Pruner, Retention
from leasework.service import Stopping, pass_failed

log = logging.getLogger("leasework.relay.process")

NOTIFY_CHANNEL = "leasework_outbox"
PUBLISH_TIMEOUT = 20.0  # seconds to wait for delivery reports of one batch
MAX_BACKOFF = 5.0
GATHER = 0.025  # seconds a busy relay lets rows gather before its next pass


class OutboxRelay:
    def __init__(
        self, db: Database, publisher: BlockingPublisher, batch_size: int, tick: float
    ) -> None:
        self.db = db
        self.publisher = publisher
        self.batch_size = batch_size
        self.tick = tick
        self.last_error: str | None = None

    def _pass(self, conn: psycopg.Connection) -> tuple[int, int]:
        rows = store.outbox_fetch(conn, self.batch_size)
        if not rows:
            return 0, 0
        messages = [(m.topic, m.key, m.value.encode(), m.headers) for m in rows]
        deliveries = self.publisher.publish(messages, timeout=PUBLISH_TIMEOUT)
        acked = [m.id for m, d in zip(rows, deliveries, strict=True) if d.ok]
        store.outbox_retire(conn, acked)
        failed = [d.error for d in deliveries if not d.ok]
        self.last_error = failed[0] if failed else None
        return len(acked), len(failed)

    async def run_once(self) -> tuple[int, int]:
        """Publish one batch; returns (acknowledged, not acknowledged)."""
        published, failed = await self.db.run(self._pass)
        metrics.relay_published.inc(published)
        metrics.relay_publish_failures.inc(failed)
        metrics.relay_last_tick.set(time.time())
        return published, failed

    async def run(self, health_conditions: dict[str, str]) -> None:
        listener = NotificationListener(self.db)
        backoff = 0.0
        while True:
            try:
                published, failed = await self.run_once()
            except Exception as exc:  # a failed pass keeps its rows; the relay must live on
                published, failed = 0, 0
                self.last_error = f"{type(exc).__name__}: {exc}"
                backoff = min(MAX_BACKOFF, max(0.2, backoff * 2))
                if isinstance(exc, psycopg.Error | KafkaException):
                    log.warning("outbox pass failed", extra={"error": str(exc)[:300]})
                else:
                    log.exception("outbox pass failed unexpectedly (a bug); retrying")
                await trio.sleep(backoff)
                continue
            if failed:
                health_conditions["outbox-relay"] = f"cannot publish to kafka: {self.last_error}"
                backoff = min(MAX_BACKOFF, max(0.2, backoff * 2))
                log.warning(
                    "kafka did not acknowledge outbox rows; kept for retry",
                    extra={"failed": failed, "error": self.last_error, "backoff": backoff},
                )
                await trio.sleep(backoff)
                continue
            health_conditions.pop("outbox-relay", None)
            backoff = 0.0
            if published >= self.batch_size:
                continue  # more waiting
            if await listener.wait(self.tick):
                # let a few milliseconds of rows gather, so a stream of small commits becomes
                # one produce request instead of many (each one costs every broker)
                await trio.sleep(GATHER)


class NotificationListener:
    """Waits for NOTIFY on the outbox channel, at most ``timeout`` seconds (the fallback tick).

    The listening connection lives in a worker thread; losing it only costs immediacy: the
    tick still finds the rows, and the connection is made again on the next wait.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self.conn: psycopg.Connection | None = None
        self.limiter = trio.CapacityLimiter(1)

    def _wait(self, timeout: float) -> bool:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = self.db.connect(autocommit=True)
                self.conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            notified = any(True for _ in self.conn.notifies(timeout=timeout, stop_after=1))
            if notified:
                # drain whatever else has arrived already: one pass handles them all (a
                # deadline of zero reads what is buffered and stops)
                for _ in self.conn.notifies(timeout=0.0):
                    pass
            return notified
        except psycopg.Error:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            time.sleep(timeout)
            return False

    async def wait(self, at_most: float) -> bool:
        return await trio.to_thread.run_sync(self._wait, at_most, limiter=self.limiter)


async def promoter_loop(db: Database, settings: Settings) -> None:
    while True:
        try:
            count = await db.run(store.jobs_promote_due, 500, settings.topic_ready)
            metrics.promoted.inc(count)
            if count >= 500:
                continue
        except Exception as exc:  # the loop must outlive any one pass
            pass_failed("promoter", exc)
        await trio.sleep(settings.relay_tick)


async def reaper_loop(db: Database, settings: Settings) -> None:
    while True:
        try:
            reaped = await db.run(
                lambda conn: store.jobs_reap_expired(
                    conn,
                    200,
                    retry_base=settings.retry_base,
                    retry_cap=settings.retry_cap,
                    dlq_topic=settings.topic_dlq,
                )
            )
            for job in reaped:
                metrics.lease_expirations.inc()
                log.warning(
                    "lease expired; job requeued",
                    extra={"job_id": str(job.id), "status": str(job.status)},
                )
        except Exception as exc:  # the loop must outlive any one pass
            pass_failed("reaper", exc)
        await trio.sleep(1.0)


async def outbox_gauge_loop(db: Database) -> None:
    """Export the outbox backlog. The api runs this loop too, so the backlog stays visible
    while every relay is down (the case the backlog alert exists for)."""
    while True:
        try:
            pending, age = await db.run(store.outbox_pending)
            metrics.outbox_pending.set(pending)
            metrics.outbox_oldest_age.set(age)
        except psycopg.Error:
            pass
        await trio.sleep(2.0)


LAG_EVERY = 5.0  # seconds between consumer-lag samples


async def consumer_lag_loop(settings: Settings) -> None:
    """Export the workers' consumer-group lag per partition, measured from outside the group
    by a long-lived child process (see :mod:`leasework.relay.lagprobe` for why a child), restarted
    when it dies."""
    command = [
        sys.executable,
        "-m",
        "leasework.relay.lagprobe",
        ",".join(settings.kafka_brokers),
        settings.consumer_group,
        settings.topic_ready,
        str(LAG_EVERY),
    ]
    while True:
        try:
            await read_lag_samples(command)
        except OSError as exc:
            log.warning("consumer lag probe could not run", extra={"error": str(exc)[:200]})
        await trio.sleep(LAG_EVERY)


async def read_lag_samples(command: list[str]) -> None:
    """Run the probe and export each JSON line it prints, until it exits."""
    child = await trio.lowlevel.open_process(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        buffer = b""
        async for chunk in child.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                export_lag_sample(line)
    finally:
        with trio.CancelScope(shield=True):
            child.kill()
            await child.wait()
    log.debug("consumer lag probe exited", extra={"returncode": child.returncode})


def export_lag_sample(line: bytes) -> None:
    try:
        sample = json.loads(line)
    except ValueError:
        return
    if not isinstance(sample, dict) or "error" in sample:
        return  # one missed sample
    for partition, lag in sample.items():
        metrics.consumer_lag.labels(str(partition)).set(lag)


async def run(settings: Settings, db: Database, conditions: dict[str, str], stopping: Stopping):
    publisher = BlockingPublisher(settings.kafka_brokers, settings.process_name)
    relay = OutboxRelay(db, publisher, settings.relay_batch_size, settings.relay_tick)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay.run, conditions)
        nursery.start_soon(promoter_loop, db, settings)
        nursery.start_soon(reaper_loop, db, settings)
        nursery.start_soon(
            Pruner(db, Retention.from_settings(settings)).run, settings.prune_interval
        )
        nursery.start_soon(outbox_gauge_loop, db)
        nursery.start_soon(consumer_lag_loop, settings)
        await stopping.wait()
        # threads finish the batch they hold (a to_thread call is not abandoned), then stop
        nursery.cancel_scope.cancel()
    await trio.to_thread.run_sync(publisher.close)
