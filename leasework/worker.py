"""The worker process: a Kafka consumer and a bounded set of concurrent job tasks.

Per message: stamp the job ``running`` under a new fence (only a ``queued`` job can be
stamped, so a redelivery of a finished or running job is skipped), run the handler in a
cancel scope whose deadline is the lease's lower bound of validity, renew the lease from a
heartbeat task, write the outcome and the handler's effects in one fenced transaction, and
only then mark the offset finished. Offsets are committed for the contiguous finished prefix
of each partition.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import uuid
from dataclasses import dataclass

import psycopg
import redis
import trio
from confluent_kafka import Consumer, KafkaException, TopicPartition

from leasework import metrics, store
from leasework.app import App
from leasework.backoff import retry_or_dead
from leasework.config import UNSAFE_LEASE_MODE, Settings
from leasework.context import JobContext
from leasework.db import Database
from leasework.execution import HandlerResult, call_handler, describe
from leasework.lease import Claim, Leases
from leasework.offsets import OffsetTracker
from leasework.service import Stopping
from leasework.states import Status

log = logging.getLogger("leasework.worker")

LEASE_MARGIN_FRACTION = 0.2  # the handler's deadline is claim + TTL * (1 - margin)


def lease_deadline(renewed_at: float, ttl: float) -> float:
    """The worker's own lower bound of when its lease is still valid (monotonic clock)."""
    return renewed_at + ttl * (1 - LEASE_MARGIN_FRACTION)


class Abandoned(Exception):
    """The worker is stopping before it could claim the job: leave the message unfinished so
    its offset is not committed and the next owner of the partition gets it again."""


class FenceRejected(Exception):
    """The fenced terminal write matched no row: a newer claim holds the job."""


def consumer_config(settings: Settings) -> dict:
    return {
        "bootstrap.servers": ",".join(settings.kafka_brokers),
        "group.id": settings.consumer_group,
        "client.id": settings.process_name,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 2_000,
        "max.poll.interval.ms": 300_000,
        "socket.connection.setup.timeout.ms": 5_000,
        "reconnect.backoff.max.ms": 2_000,
    }


@dataclass
class RunningJob:
    job_id: uuid.UUID
    fence: int
    scope: trio.CancelScope
    claim: Claim
    reason: str | None = None  # why the handler scope was cancelled


class Worker:
    def __init__(self, settings: Settings, db: Database, app: App) -> None:
        self.settings = settings
        self.db = db
        self.app = app
        self.name = settings.process_name
        self.leases = Leases(*settings.redis_addr, limit=settings.worker_concurrency + 2)
        # the plain-TTL demonstration mode: no deadline scope, no fence condition
        self.unsafe = settings.lease_mode == UNSAFE_LEASE_MODE
        self.tracker = OffsetTracker()
        self.capacity = trio.Semaphore(settings.worker_concurrency)
        self.consumer: Consumer | None = None
        self.poll_limiter = trio.CapacityLimiter(1)
        self.commit_limiter = trio.CapacityLimiter(1)
        self.running: dict[uuid.UUID, RunningJob] = {}
        self.commit_wanted = trio.Event()
        self.stopping = Stopping()
        self.active = 0  # message tasks started and not yet finished
        self.idle = trio.Event()  # set while active == 0
        self.idle.set()

    # ------------------------------------------------------------ consumer and offsets

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("partitions assigned", extra={"partitions": [p.partition for p in partitions]})

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # runs inside poll(), in the poll thread: commit what is finished, then let go
        ready = trio.from_thread.run_sync(self.tracker.committable)
        revoked = {p.partition for p in partitions}
        topic = self.settings.topic_ready
        offsets = [TopicPartition(topic, p, o) for p, o in ready.items() if p in revoked]
        if offsets:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                log.warning("commit on revoke failed", extra={"error": str(exc)})
        for partition in revoked:
            trio.from_thread.run_sync(self.tracker.forget, partition)
        log.info("partitions revoked", extra={"partitions": sorted(revoked)})

    async def commit_ready(self) -> None:
        ready = self.tracker.committable()
        if not ready or self.consumer is None:
            return
        offsets = [TopicPartition(self.settings.topic_ready, p, o) for p, o in ready.items()]
        consumer = self.consumer

        def commit() -> str | None:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
                return None
            except KafkaException as exc:
                return str(exc)

        error = await trio.to_thread.run_sync(commit, limiter=self.commit_limiter)
        if error is None:
            for partition, offset in ready.items():
                self.tracker.committed(partition, offset)
        else:
            log.warning("offset commit failed; will retry", extra={"error": error})

    async def commit_loop(self) -> None:
        while True:
            with trio.move_on_after(1.0):
                await self.commit_wanted.wait()
            self.commit_wanted = trio.Event()
            await self.commit_ready()

    # ------------------------------------------------------------ one job

    async def handle_message(self, partition: int, offset: int, value: bytes | None) -> None:
        try:
            await self._handle_message(partition, offset, value)
        except Abandoned:
            log.info(
                "message left for redelivery", extra={"partition": partition, "offset": offset}
            )
            return
        except Exception:  # a bug in this process, not the job's outcome: keep the worker
            metrics.worker_errors.inc()
            log.exception(
                "unexpected error handling a message; left uncommitted for redelivery (a "
                "claimed job comes back through the reaper)",
                extra={"partition": partition, "offset": offset},
            )
            return
        self.tracker.finish(partition, offset)
        self.commit_wanted.set()

    async def _handle_message(self, partition: int, offset: int, value: bytes | None) -> None:
        try:
            job_id = uuid.UUID(json.loads(value or b"")["job_id"])
        except (ValueError, KeyError, TypeError):
            log.error(
                "undecodable message skipped",
                extra={"partition": partition, "offset": offset, "value": repr(value)[:200]},
            )
            metrics.redeliveries_skipped.labels("undecodable").inc()
            return
        await self.process(job_id)

    async def claim(self, job_id: uuid.UUID) -> tuple[Claim, dict, float] | None:
        """Take the Redis lease and stamp the job ``running`` under its fence.

        Returns None when the job is not ours to run (not queued: finished, cancelled,
        running elsewhere, not due). Waits while another worker holds the lease (it expires by
        itself) and while Redis is unreachable; re-seeds the fence counter when Postgres
        refuses a token that is not above the stored fence.
        """
        ttl = self.settings.lease_ttl
        backoff = 0.2
        while True:
            if self.stopping.is_set():
                raise Abandoned(str(job_id))
            try:
                claimed = await self._claim_once(job_id, ttl)
            except (redis.RedisError, psycopg.Error) as exc:
                log.warning(
                    "cannot claim: a dependency is unreachable; waiting",
                    extra={"job_id": str(job_id), "error": str(exc)[:200]},
                )
                await trio.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                continue
            if claimed == "held":
                metrics.lease_conflicts.inc()
                await trio.sleep(min(ttl / 2, backoff))
                backoff = min(ttl / 2, backoff * 2)
                continue
            return claimed

    async def _claim_once(self, job_id: uuid.UUID, ttl: float):
        """None (not ours to run), "held" (another worker holds the lease) or
        (claim, job, claim time);
        loops only after re-seeding a stale fence counter."""
        while True:
            current = await self.db.run(store.job_get, job_id)
            if current is None or current["status"] != Status.QUEUED:
                reason = "missing" if current is None else current["status"]
                metrics.redeliveries_skipped.labels(reason).inc()
                return None
            if current["type"] not in self.app:
                await self.defer(current)
                return None
            # before the claim is sent: a lower bound of when the lease was set
            claimed_at = trio.current_time()
            claim = await self.leases.claim(job_id, self.name, ttl)
            if claim is None:
                return "held"
            stamp = functools.partial(store.job_start, worker=self.name, fence=claim.fence, ttl=ttl)
            job = await self.db.run(stamp, job_id)
            if job is not None:
                return claim, job, claimed_at
            await self.release(claim)
            current = await self.db.run(store.job_get, job_id)
            if current is not None and current["status"] == Status.QUEUED:
                if current["fence"] >= claim.fence:
                    floor = await self.db.run(store.fence_max)
                    seeded = await self.leases.reseed(floor + 1)
                    metrics.fence_reseeds.inc()
                    log.error(
                        "redis handed out a stale fence (counter lost?); stamp refused by "
                        "postgres, counter re-seeded",
                        extra={
                            "job_id": str(job_id),
                            "token": claim.fence,
                            "stored_fence": current["fence"],
                            "reseeded_to": seeded,
                        },
                    )
                continue

    async def defer(self, job: dict) -> None:
        """A type this worker's app does not define (a rolling deploy: a newer worker will):
        put the job back for later, spending no attempt, rather than killing it."""
        reason = (
            f"deferred by {self.name}: its app ({self.app.name}) does not define type "
            f"{job['type']!r}; a worker whose app does will run it"
        )
        defer = functools.partial(
            store.job_defer,
            base=self.settings.retry_base,
            cap=self.settings.retry_cap,
            reason=reason,
        )
        deferred = await self.db.run(defer, job["id"])
        if deferred is not None:
            metrics.jobs_deferred.inc()
            log.warning(
                "job type not defined by this worker's app; deferred",
                extra={
                    "job_id": str(job["id"]),
                    "type": job["type"],
                    "deferrals": deferred["deferrals"],
                    "run_at": deferred["run_at"].isoformat(),
                },
            )

    async def release(self, claim: Claim) -> None:
        try:
            await self.leases.release(claim)
        except redis.RedisError as exc:
            # the lease expires by itself within its TTL
            log.warning(
                "lease release failed", extra={"job_id": str(claim.job_id), "error": str(exc)[:200]}
            )

    async def process(self, job_id: uuid.UUID) -> None:
        claimed = await self.claim(job_id)
        if claimed is None:
            return
        claim, job, claimed_at = claimed
        try:
            await self.run_claimed(job, claim, claimed_at)
        finally:
            await self.release(claim)

    async def run_claimed(self, job: dict, claim: Claim, claimed_at: float) -> None:
        job_id = job["id"]
        fence = job["fence"]
        metrics.scheduling_delay.observe(
            max(0.0, (job["started_at"] - job["run_at"]).total_seconds())
        )
        job_type = self.app.get(job["type"])
        assert job_type is not None, "unknown types are deferred before the claim"
        ctx = JobContext(
            job_id=job_id,
            type=job["type"],
            attempt=job["attempt"],
            max_attempts=job["max_attempts"],
            fence=fence,
            worker=self.name,
            payload=job["payload"],
        )
        ttl = self.settings.lease_ttl
        lease_scope = trio.CancelScope(
            deadline=math.inf if self.unsafe else lease_deadline(claimed_at, ttl)
        )
        running = RunningJob(job_id, fence, lease_scope, claim)
        self.running[job_id] = running
        metrics.jobs_in_flight.inc()
        started = trio.current_time()
        handled: HandlerResult | None = None
        timed_out = False
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.heartbeat, running)
                with lease_scope:
                    with trio.move_on_after(job["timeout_seconds"]) as timeout_scope:
                        handled = await call_handler(job_type, ctx)
                    timed_out = timeout_scope.cancelled_caught
                nursery.cancel_scope.cancel()
        finally:
            metrics.jobs_in_flight.dec()
            self.running.pop(job_id, None)
        metrics.execution_seconds.labels(metrics.type_label(job["type"])).observe(
            trio.current_time() - started
        )
        if lease_scope.cancelled_caught and running.reason is None:
            running.reason = "lease"
            metrics.lease_loss_cancellations.inc()
        outcome = self.outcome_of(job, handled, timed_out, running.reason)
        await self.finish(job, outcome, ctx.effects if outcome.status == Status.SUCCEEDED else [])

    def outcome_of(
        self,
        job: dict,
        handled: HandlerResult | None,
        timed_out: bool,
        cancelled_by: str | None,
    ) -> store.Outcome:
        """The attempt's outcome: ``handled`` is None when a scope cut the handler short."""
        if cancelled_by == "request":
            return store.Outcome(Status.CANCELLED, "cancelled on request while running")
        permanent = False
        if cancelled_by == "lease":
            error = "lease lost: handler cancelled at its lease deadline"
        elif cancelled_by == "shutdown":
            error = "worker shut down before the handler finished"
        elif timed_out or handled is None:
            error = f"timed out after {job['timeout_seconds']}s"
        elif handled.ok:
            return store.Outcome(Status.SUCCEEDED, result=handled.result)
        else:
            error, permanent = handled.error, handled.permanent
        return self.retry_outcome(
            job, error, permanent=permanent, immediate=cancelled_by == "shutdown"
        )

    def retry_outcome(
        self, job: dict, error: str, *, permanent: bool = False, immediate: bool = False
    ) -> store.Outcome:
        """``failed`` with the job's own backoff (else the settings'), or ``dead``."""
        decision = retry_or_dead(
            job["attempt"],
            job["max_attempts"],
            job["retry_base"] or self.settings.retry_base,
            job["retry_cap"] or self.settings.retry_cap,
            permanent=permanent,
            immediate=immediate,
        )
        return store.Outcome(decision.status, error, retry_in=decision.delay)

    async def finish(self, job: dict, outcome: store.Outcome, effects: list) -> None:
        job_id, fence = job["id"], job["fence"]

        finish_write = store.job_finish_unfenced if self.unsafe else store.job_finish
        definition = self.app.get(job["type"])

        def effect_failed(exc: Exception) -> store.Outcome:
            error = f"a fenced effect raised {describe(exc)}"
            permanent = definition is not None and definition.is_permanent(exc)
            return self.retry_outcome(job, error, permanent=permanent)

        def write(conn: psycopg.Connection) -> dict:
            row = finish_write(
                conn,
                job_id,
                fence,
                outcome,
                dlq_topic=self.settings.topic_dlq,
                effects=effects,
                effect_failed=effect_failed,
            )
            if row is None:
                raise FenceRejected(f"job {job_id}: fence {fence} no longer holds")
            return row

        job_type = metrics.type_label(job["type"])
        while True:
            try:
                written = await self.db.run(write)
                # an effect that raised changed the outcome on the way
                outcome = store.Outcome(Status(written["status"]), written["last_error"])
                break
            except FenceRejected:
                metrics.fence_rejections.inc()
                log.warning(
                    "fenced write rejected: a newer claim holds the job; nothing committed",
                    extra={"job_id": str(job_id), "fence": fence},
                )
                return
            except psycopg.Error as exc:
                # the outcome is not durable yet: keep trying; the offset stays uncommitted
                log.warning(
                    "could not record outcome; retrying",
                    extra={"job_id": str(job_id), "error": str(exc)[:300]},
                )
                await trio.sleep(1.0)
        metrics.jobs_executed.labels(job_type, str(outcome.status)).inc()
        if outcome.status == Status.FAILED:
            metrics.retries.labels(job_type).inc()
        elif outcome.status == Status.DEAD:
            metrics.dead_letters.labels(job_type).inc()
        log.info(
            "job finished",
            extra={
                "job_id": str(job_id),
                "status": str(outcome.status),
                "attempt": job["attempt"],
                "fence": fence,
                "error": outcome.error,
            },
        )

    async def heartbeat(self, running: RunningJob) -> None:
        """Renew the lease every TTL/3 and move the handler's deadline forward on success;
        cancel the handler when the lease is gone or a cancel was requested. A renewal that
        fails leaves the deadline where it was: it cancels if renewals keep failing."""
        ttl = self.settings.lease_ttl
        while True:
            await trio.sleep(ttl / 3)
            sent = trio.current_time()
            try:
                held = await self.leases.renew(running.claim, ttl)
                ours, cancel_requested = await self.db.run(
                    store.job_heartbeat, running.job_id, running.fence, ttl
                )
            except (redis.RedisError, psycopg.Error) as exc:
                metrics.lease_renewals.labels("error").inc()
                log.warning(
                    "lease renewal failed",
                    extra={"job_id": str(running.job_id), "error": str(exc)[:200]},
                )
                continue
            metrics.lease_renewal_seconds.observe(trio.current_time() - sent)
            if not (held and ours):
                metrics.lease_renewals.labels("lost").inc()
                if self.unsafe:
                    continue  # a plain TTL lease does not notice that it lost the job
                log.warning(
                    "lease lost; cancelling the handler",
                    extra={"job_id": str(running.job_id), "fence": running.fence},
                )
                running.reason = "lease"
                metrics.lease_loss_cancellations.inc()
                running.scope.cancel()
                return
            metrics.lease_renewals.labels("ok").inc()
            if cancel_requested:
                running.reason = "request"
                running.scope.cancel()
                return
            if not self.unsafe:
                running.scope.deadline = lease_deadline(sent, ttl)

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
        async with trio.open_nursery() as jobs:
            async with trio.open_nursery() as background:
                background.start_soon(self.commit_loop)
                await self.poll_until(stopping, jobs)
                # drain: running jobs get most of the shutdown timeout, then are cancelled
                with trio.move_on_after(graceful):
                    await self.idle.wait()
                for running in list(self.running.values()):
                    running.reason = "shutdown"
                    running.scope.cancel()
                await self.idle.wait()
                await self.commit_ready()
                background.cancel_scope.cancel()
        await trio.to_thread.run_sync(consumer.close)
        self.consumer = None

    async def poll_until(self, stopping: Stopping, jobs: trio.Nursery) -> None:
        consumer = self.consumer
        assert consumer is not None
        while not stopping.is_set():
            await self.capacity.acquire()
            try:
                message = await trio.to_thread.run_sync(
                    consumer.poll, 0.5, limiter=self.poll_limiter
                )
            except BaseException:
                self.capacity.release()
                raise
            if message is None:
                self.capacity.release()
                continue
            if message.error() is not None:
                self.capacity.release()
                log.warning("consumer error", extra={"error": str(message.error())})
                continue
            partition, offset = message.partition(), message.offset()
            self.tracker.start(partition, offset)
            jobs.start_soon(self._run_and_release, partition, offset, message.value())

    async def _run_and_release(self, partition: int, offset: int, value: bytes | None) -> None:
        if self.active == 0:
            self.idle = trio.Event()
        self.active += 1
        try:
            await self.handle_message(partition, offset, value)
        finally:
            self.capacity.release()
            self.active -= 1
            if self.active == 0:
                self.idle.set()
