"""The worker process: a Kafka consumer feeding a bounded set of concurrent job tasks.

Messages arrive in batches (``consume`` in one thread hop). The producer
(:mod:`leasework.worker.claim`) turns a batch into started jobs in three round trips; each job's
handler runs in a cancel scope of its own whose deadline is its lease's lower bound of
validity, moved by the heartbeat (:mod:`leasework.worker.heartbeat`: every lease of the worker in
one renewal); its outcome goes to the completer (:mod:`leasework.worker.completer`), which writes
outcomes in batches, each row fenced on its own. Only once a job's outcome is durable is its
offset marked finished; the finished prefix of each partition is stored and committed in the
background by librdkafka (and synchronously on revoke and shutdown), never per message.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
import redis
import trio
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from leasework import metrics
from leasework.app import App
from leasework.backoff import retry_or_dead
from leasework.config import UNSAFE_LEASE_MODE, Settings
from leasework.context import JobContext
from leasework.db import Database
from leasework.job import Job
from leasework.lease import Leases
from leasework.outcomes import Completion, Outcome
from leasework.service import Stopping
from leasework.states import Status
from leasework.worker.claim import Producer, Started
from leasework.worker.completer import Completer, Finished, UnsafeCompleter
from leasework.worker.execution import HandlerResult, call_handler, describe
from leasework.worker.heartbeat import (
    CancelReason,
    Heartbeat,
    Presence,
    RunningJob,
    lease_deadline,
    presence_loop,
)
from leasework.worker.offsets import OffsetTracker

log = logging.getLogger("leasework.worker.process")

MAX_POLL = 500  # messages per consume() call, at most
GATHER = 0.02  # seconds a batch waits for company after its first message
STORE_OFFSETS_EVERY = 0.2  # seconds between passing the finished prefix to librdkafka


class Abandoned(Exception):
    """The worker is stopping before it could claim the job: leave the message unfinished so
    its offset is not committed and the next owner of the partition gets it again."""


def consumer_config(settings: Settings) -> dict:
    return {
        "bootstrap.servers": ",".join(settings.kafka_brokers),
        "group.id": settings.consumer_group,
        "client.id": settings.process_name,
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
        # an idle partition waits on the broker (long poll), not in a tight fetch loop
        "fetch.wait.max.ms": 500,
    }


@dataclass(frozen=True)
class Delivery:
    """One message: where it came from and the job it wakes (None: undecodable)."""

    partition: int
    offset: int
    job_id: uuid.UUID | None


def receive(
    consumer: Consumer, at_most: int, wait: float = 0.5, gather: float = GATHER
) -> list[Message]:
    """Up to ``at_most`` messages, in one thread hop: wait (up to ``wait`` s) for the first,
    then up to ``gather`` s for company, so that a steady stream becomes batches (each batch
    costs three round trips whatever its size) at the price of a few milliseconds. (Plain
    ``consume(n, timeout)`` waits for all ``n`` or the whole timeout: a trickle would sit
    out the timeout.)"""
    first = consumer.poll(wait)
    if first is None:
        return []
    if at_most == 1:
        return [first]
    return [first, *consumer.consume(at_most - 1, gather)]


def decode(message_value: bytes | None) -> uuid.UUID | None:
    try:
        return uuid.UUID(json.loads(message_value or b"")["job_id"])
    except (ValueError, KeyError, TypeError):
        return None


class Worker:
    def __init__(self, settings: Settings, db: Database, app: App) -> None:
        self.settings = settings
        self.db = db
        self.app = app
        self.name = settings.process_name
        self.leases = Leases(*settings.redis_addr)
        # the plain-TTL demonstration mode: no deadline scope, no fence condition
        self.unsafe = settings.lease_mode == UNSAFE_LEASE_MODE
        completer = UnsafeCompleter if self.unsafe else Completer
        self.completer = completer(
            self.db, self.leases, dlq_topic=settings.topic_dlq, worker=self.name
        )
        self.producer = Producer(
            db,
            self.leases,
            app,
            name=self.name,
            ttl=settings.lease_ttl,
            retry_base=settings.retry_base,
            retry_cap=settings.retry_cap,
        )
        self.running: dict[uuid.UUID, RunningJob] = {}
        self.heartbeat = Heartbeat(
            db,
            self.leases,
            lambda: list(self.running.values()),
            ttl=settings.lease_ttl,
            notices_loss=not self.unsafe,
        )
        self.tracker = OffsetTracker()
        self.slots = trio.Semaphore(settings.worker_concurrency)
        self.consumer: Consumer | None = None
        self.poll_limiter = trio.CapacityLimiter(1)
        self.commit_limiter = trio.CapacityLimiter(1)
        self.offsets_wanted = trio.Event()
        self.stopping = Stopping()
        self.active = 0  # deliveries taken and not yet finished or abandoned
        self.idle = trio.Event()  # set while active == 0
        self.idle.set()

    # ------------------------------------------------------------ offsets

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("partitions assigned", extra={"partitions": [p.partition for p in partitions]})

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # runs inside consume(), in the poll thread: commit what is finished, then let go
        positions = trio.from_thread.run_sync(self.tracker.positions)
        revoked = {p.partition for p in partitions}
        topic = self.settings.topic_ready
        offsets = [TopicPartition(topic, p, o) for p, o in positions.items() if p in revoked]
        if offsets:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                log.warning("commit on revoke failed", extra={"error": str(exc)})
        for partition in revoked:
            trio.from_thread.run_sync(self.tracker.forget, partition)
        log.info("partitions revoked", extra={"partitions": sorted(revoked)})

    def finish(self, delivery: Delivery) -> None:
        """The delivery is done with (its job's outcome durable, or nothing to do)."""
        self.tracker.finish(delivery.partition, delivery.offset)
        self.offsets_wanted.set()

    async def store_offsets(self) -> None:
        """Hand the finished prefix of each partition to librdkafka, which commits it in the
        background; a partition revoked meanwhile is simply not stored."""
        ready = self.tracker.committable()
        if not ready or self.consumer is None:
            return
        consumer, topic = self.consumer, self.settings.topic_ready
        offsets = [TopicPartition(topic, p, o) for p, o in ready.items()]

        def store_them() -> str | None:
            try:
                consumer.store_offsets(offsets=offsets)
                return None
            except KafkaException as exc:
                return str(exc)

        error = await trio.to_thread.run_sync(store_them, limiter=self.commit_limiter)
        if error is None:
            for partition, offset in ready.items():
                self.tracker.committed(partition, offset)
        else:
            log.debug("offsets not stored", extra={"error": error})

    async def commit_now(self) -> None:
        """Synchronously commit every partition's finished prefix (shutdown)."""
        positions = self.tracker.positions()
        if not positions or self.consumer is None:
            return
        consumer, topic = self.consumer, self.settings.topic_ready
        offsets = [TopicPartition(topic, p, o) for p, o in positions.items()]

        def commit() -> str | None:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
                return None
            except KafkaException as exc:
                return str(exc)

        error = await trio.to_thread.run_sync(commit, limiter=self.commit_limiter)
        if error is not None:
            log.warning("final offset commit failed", extra={"error": error})

    async def offsets_loop(self) -> None:
        while True:
            await self.offsets_wanted.wait()
            self.offsets_wanted = trio.Event()
            await self.store_offsets()
            await trio.sleep(STORE_OFFSETS_EVERY)

    # ------------------------------------------------------------ a batch of deliveries

    def _taken(self, count: int) -> None:
        if self.active == 0:
            self.idle = trio.Event()
        self.active += count

    def _done(self) -> None:
        self.slots.release()
        self.active -= 1
        if self.active == 0:
            self.idle.set()

    async def handle_batch(self, deliveries: list[Delivery], nursery: trio.Nursery) -> None:
        """Claim the batch's jobs and start a task per job started; every delivery ends here
        (finished, or left for redelivery) or in a task started from here."""
        first: dict[uuid.UUID, Delivery] = {}
        for delivery in deliveries:
            if delivery.job_id is None:
                log.error("undecodable message skipped", extra={"offset": delivery.offset})
                metrics.redeliveries_skipped.labels("undecodable").inc()
                self._settle(delivery)
            elif delivery.job_id in first:  # the same job twice in one batch: run it once
                metrics.redeliveries_skipped.labels("duplicate").inc()
                self._settle(delivery)
            else:
                first[delivery.job_id] = delivery
        if not first:
            return
        try:
            claimed = await self.producer.claim(list(first))
        except Exception as exc:  # unreachable dependencies, or a bug: the slow path decides
            if isinstance(exc, redis.RedisError | psycopg.Error):
                log.warning(
                    "cannot claim a batch: a dependency is unreachable; claiming one by one",
                    extra={"jobs": len(first), "error": str(exc)[:200]},
                )
            else:
                log.exception("claiming a batch failed unexpectedly; claiming one by one")
            for delivery in first.values():
                nursery.start_soon(self.claim_one, delivery, nursery)
            return
        for started in claimed.started:
            nursery.start_soon(self.run_started, first[started.job.id], started)
        for job_id in claimed.skipped:
            self._settle(first[job_id])
        for job_id in claimed.retry:
            nursery.start_soon(self.claim_one, first[job_id], nursery)

    def _settle(self, delivery: Delivery) -> None:
        self.finish(delivery)
        self._done()

    async def claim_one(self, delivery: Delivery, nursery: trio.Nursery) -> None:
        """The slow path of one job the batch could not decide: wait while another worker
        holds its lease (it expires by itself), while Redis or Postgres is unreachable, or
        after a re-seeded fence counter, and claim again."""
        assert delivery.job_id is not None
        ttl = self.settings.lease_ttl
        backoff = 0.2
        try:
            while True:
                if self.stopping.is_set():
                    raise Abandoned(str(delivery.job_id))
                try:
                    claimed = await self.producer.claim([delivery.job_id])
                except (redis.RedisError, psycopg.Error) as exc:
                    log.warning(
                        "cannot claim: a dependency is unreachable; waiting",
                        extra={"job_id": str(delivery.job_id), "error": str(exc)[:200]},
                    )
                    await trio.sleep(backoff)
                    backoff = min(5.0, backoff * 2)
                    continue
                if claimed.started:
                    await self.run_started(delivery, claimed.started[0], release_slot=False)
                    break
                if claimed.skipped:
                    self.finish(delivery)
                    break
                if not claimed.reseeded:
                    await trio.sleep(min(ttl / 2, backoff))
                    backoff = min(ttl / 2, backoff * 2)
        except Abandoned:
            log.info(
                "message left for redelivery",
                extra={"partition": delivery.partition, "offset": delivery.offset},
            )
        except Exception:  # a bug in this process, not the job's outcome: keep the worker
            self.unexpected(delivery)
        finally:
            self._done()

    def unexpected(self, delivery: Delivery) -> None:
        metrics.worker_errors.inc()
        log.exception(
            "unexpected error handling a message; left uncommitted for redelivery (a claimed "
            "job comes back through the reaper)",
            extra={"partition": delivery.partition, "offset": delivery.offset},
        )

    # ------------------------------------------------------------ one job

    async def run_started(
        self, delivery: Delivery, started: Started, *, release_slot: bool = True
    ) -> None:
        try:
            completion = await self.execute(started)
            finished = await self.completer.complete(completion, started.claim)
            self.record(started.job, completion.outcome, finished)
            self.finish(delivery)
        except Exception:  # a bug in this process, not the job's outcome: keep the worker
            self.unexpected(delivery)
        finally:
            if release_slot:
                self._done()

    async def execute(self, started: Started) -> Completion:
        """Run the handler under its two scopes (lease deadline, job timeout) and turn what
        happened into the completion the completer writes."""
        job, claim = started.job, started.claim
        metrics.scheduling_delay.observe(job.scheduling_delay)
        job_type = self.app.get(job.type)
        assert job_type is not None, "unknown types are deferred before the claim"
        ctx = JobContext(
            job_id=job.id,
            type=job.type,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            fence=job.fence,
            worker=self.name,
            payload=job.payload,
        )
        ttl = self.settings.lease_ttl
        scope = trio.CancelScope(
            deadline=math.inf if self.unsafe else lease_deadline(started.claimed_at, ttl)
        )
        running = RunningJob(claim, scope)
        self.running[job.id] = running
        metrics.jobs_in_flight.inc()
        began = trio.current_time()
        handled: HandlerResult | None = None
        timed_out = False
        try:
            with scope:
                with trio.move_on_after(job.timeout_seconds) as timeout_scope:
                    handled = await call_handler(job_type, ctx)
                timed_out = timeout_scope.cancelled_caught
        finally:
            running.completing = True
            metrics.jobs_in_flight.dec()
            self.running.pop(job.id, None)
        metrics.execution_seconds.labels(metrics.type_label(job.type)).observe(
            trio.current_time() - began
        )
        if scope.cancelled_caught and running.reason is None:
            running.reason = CancelReason.LEASE
            metrics.lease_loss_cancellations.inc()
        outcome = self.outcome_of(job, handled, timed_out, running.reason)
        effects = tuple(ctx.effects) if outcome.status == Status.SUCCEEDED else ()

        def effect_failed(exc: Exception) -> Outcome:
            error = f"a fenced effect raised {describe(exc)}"
            return self.retry_outcome(job, error, permanent=job_type.is_permanent(exc))

        return Completion(job.id, job.fence, outcome, effects, effect_failed)

    def outcome_of(
        self,
        job: Job,
        handled: HandlerResult | None,
        timed_out: bool,
        cancelled_by: CancelReason | None,
    ) -> Outcome:
        """The attempt's outcome: ``handled`` is None when a scope cut the handler short."""
        if cancelled_by == CancelReason.REQUEST:
            return Outcome(Status.CANCELLED, "cancelled on request while running")
        permanent = False
        if cancelled_by == CancelReason.LEASE:
            error = "lease lost: handler cancelled at its lease deadline"
        elif cancelled_by == CancelReason.SHUTDOWN:
            error = "worker shut down before the handler finished"
        elif timed_out or handled is None:
            error = f"timed out after {job.timeout_seconds}s"
        elif handled.ok:
            return Outcome(Status.SUCCEEDED, result=handled.result)
        else:
            error, permanent = handled.error, handled.permanent
        return self.retry_outcome(
            job, error, permanent=permanent, immediate=cancelled_by == CancelReason.SHUTDOWN
        )

    def retry_outcome(
        self, job: Job, error: str, *, permanent: bool = False, immediate: bool = False
    ) -> Outcome:
        """``failed`` with the job's own backoff (else the settings'), or ``dead``."""
        decision = retry_or_dead(
            job.attempt,
            job.max_attempts,
            job.retry_base or self.settings.retry_base,
            job.retry_cap or self.settings.retry_cap,
            permanent=permanent,
            immediate=immediate,
        )
        return Outcome(decision.status, error, retry_in=decision.delay)

    def record(self, job: Job, intended: Outcome, finished: Finished) -> None:
        """Metrics and the log line of one written (or fence-rejected) outcome."""
        if finished.rejected:
            metrics.fence_rejections.inc()
            log.warning(
                "fenced write rejected: a newer claim holds the job; nothing committed",
                extra={"job_id": str(job.id), "fence": job.fence},
            )
            return
        status = finished.status
        job_type = metrics.type_label(job.type)
        metrics.jobs_executed.labels(job_type, str(status)).inc()
        if status == Status.FAILED:
            metrics.retries.labels(job_type).inc()
        elif status == Status.DEAD:
            metrics.dead_letters.labels(job_type).inc()
        if status != Status.SUCCEEDED or log.isEnabledFor(logging.DEBUG):
            log.info(
                "job finished",
                extra={
                    "job_id": str(job.id),
                    "status": str(status),
                    "attempt": job.attempt,
                    "fence": job.fence,
                    "error": intended.error if status == intended.status else "an effect raised",
                },
            )

    # ------------------------------------------------------------ the loop

    async def run(self, stopping: Stopping) -> None:
        self.stopping = stopping
        consumer = Consumer(consumer_config(self.settings))
        self.consumer = consumer
        await trio.to_thread.run_sync(
            lambda: consumer.subscribe(
                [self.settings.topic_ready], on_assign=self._on_assign, on_revoke=self._on_revoke
            )
        )
        graceful = self.settings.shutdown_timeout * 0.75
        async with trio.open_nursery() as background:
            await background.start(self.completer.run)
            background.start_soon(self.heartbeat.run)
            background.start_soon(self.offsets_loop)
            background.start_soon(
                presence_loop,
                self.db,
                Presence(
                    self.name, self.app.name, datetime.now(UTC), self.settings.worker_concurrency
                ),
                lambda: len(self.running),
            )
            async with trio.open_nursery() as jobs:
                await self.poll_until(stopping, jobs)
                await self.drain(graceful)
            await self.store_offsets()
            await self.commit_now()
            background.cancel_scope.cancel()
        await trio.to_thread.run_sync(consumer.close)
        self.consumer = None

    async def drain(self, graceful: float) -> None:
        """Running jobs get ``graceful`` seconds to finish; then each is cancelled (recorded
        ``failed`` for an immediate retry) and its outcome written before this returns."""
        with trio.move_on_after(graceful):
            await self.idle.wait()
        for running in list(self.running.values()):
            running.cancel(CancelReason.SHUTDOWN)
        await self.idle.wait()

    async def take_slots(self) -> int:
        """Wait for at least one free slot, then take every free one (up to MAX_POLL)."""
        await self.slots.acquire()
        taken = 1
        while taken < MAX_POLL:
            try:
                self.slots.acquire_nowait()
            except trio.WouldBlock:
                break
            taken += 1
        return taken

    async def poll_until(self, stopping: Stopping, jobs: trio.Nursery) -> None:
        consumer = self.consumer
        assert consumer is not None
        while not stopping.is_set():
            free = await self.take_slots()
            try:
                messages = await trio.to_thread.run_sync(
                    receive, consumer, free, limiter=self.poll_limiter
                )
            except BaseException:
                for _ in range(free):
                    self.slots.release()
                raise
            deliveries = []
            for message in messages:
                if message.error() is not None:
                    log.warning("consumer error", extra={"error": str(message.error())})
                    continue
                deliveries.append(self.arrived(message))
            for _ in range(free - len(deliveries)):
                self.slots.release()
            if deliveries:
                self._taken(len(deliveries))
                jobs.start_soon(self.handle_batch, deliveries, jobs)

    def arrived(self, message: Message) -> Delivery:
        partition, offset = message.partition(), message.offset()
        if self.tracker.start(partition, offset):
            log.warning(
                "partition rewound without a revoke: its offsets are tracked afresh",
                extra={"partition": partition, "offset": offset},
            )
        return Delivery(partition, offset, decode(message.value()))
