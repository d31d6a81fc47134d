"""The worker process: a pipeline each message passes through once, in order.

    consume ──batches──► claim ──started──► job task: execute → complete → offsets

- consume (:mod:`leasework.worker.consumer`): one thread hop per batch of messages, each
  tracked in arrival order and decoded; a batch goes on the ``batches`` channel.
- claim (:mod:`leasework.worker.claim`): each batch in a task of its own, sorted (undecodable
  and duplicate messages settled), claimed in three round trips; what the batch could not
  decide takes the slow path, one job alone. Each started job goes on the ``started``
  channel with its message; a skipped one is settled there.
- execute (:mod:`leasework.worker.attempt`, deciding with :mod:`leasework.worker.outcome`):
  the handler under its lease-deadline and timeout scopes, renewed or cancelled by the
  heartbeat (:mod:`leasework.worker.heartbeat`), turned into a Completion.
- complete (:mod:`leasework.worker.completer`): the fenced batched write, then its metrics
  and log line (``record``).
- offsets (:mod:`leasework.worker.offsets`): the message is marked finished only now that its
  outcome is durable; a background loop stores the finished prefix of each partition for
  librdkafka to commit, and it is committed synchronously on revoke and at shutdown.

Consume and claim are long-lived tasks joined by the ``batches`` channel; the claim stage
hands each started job on the ``started`` channel to :meth:`Worker.run_jobs`, which starts a
task per job calling execute, complete and offsets in order. A task per job, not three
stages joined by more channels: a job's slot (:mod:`leasework.worker.slots`), taken when the
consumer asks Kafka for its message, is then given back in one place, when that task ends,
so the semaphore alone bounds the jobs in flight at ``worker_concurrency`` whichever stage
they are in. The channels' buffers are unbounded because the slots bound what is in them.

On stopping the consumer stops polling and closes ``batches``; the drain gives running jobs
75% of ``shutdown_timeout``, then cancels each (``CancelReason.SHUTDOWN``) and waits until
every slot is back, that is until every message is finished or left for redelivery. The
stages are then cancelled (nothing is left in them), the finished prefix stored and
committed, and the consumer closed.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import trio
from confluent_kafka import Consumer

from leasework.app import App
from leasework.config import UNSAFE_LEASE_MODE, Settings
from leasework.db import Database
from leasework.lease import Leases
from leasework.outcomes import RetryDefaults
from leasework.service import Stopping
from leasework.worker.attempt import Executor
from leasework.worker.claim import Claimer, ClaimStage, Started
from leasework.worker.completer import Completer, UnsafeCompleter, record
from leasework.worker.consumer import Consumed, consume, consumer_config, unexpected
from leasework.worker.heartbeat import CancelReason, Heartbeat, Presence, presence_loop
from leasework.worker.offsets import Offsets
from leasework.worker.slots import Slots

GRACEFUL_FRACTION = 0.75  # of shutdown_timeout, that running jobs get to finish


class Worker:
    """The stages of one worker process and the nursery that joins them; the services the
    stages share (the completer's batches, the heartbeat's renewals, the slots) live as long
    as the worker, the stages as long as one :meth:`run`."""

    def __init__(self, settings: Settings, db: Database, app: App) -> None:
        self.settings = settings
        self.db = db
        self.app = app
        self.name = settings.process_name
        self.leases = Leases(settings.redis)
        # the plain-TTL demonstration mode: no deadline scope, no fence condition
        self.unsafe = settings.lease_mode == UNSAFE_LEASE_MODE
        completer = UnsafeCompleter if self.unsafe else Completer
        self.completer = completer(
            self.db, self.leases, dlq_topic=settings.topic_dlq, worker=self.name
        )
        self.claimer = Claimer(
            db,
            self.leases,
            app,
            name=self.name,
            ttl=settings.lease_ttl,
            retry_base=settings.retry_base,
            retry_cap=settings.retry_cap,
        )
        self.executor = Executor(
            app,
            worker=self.name,
            ttl=settings.lease_ttl,
            defaults=RetryDefaults(settings.retry_base, settings.retry_cap),
            bounded_by_lease=not self.unsafe,
        )
        self.heartbeat = Heartbeat(
            db,
            self.leases,
            lambda: list(self.executor.running.values()),
            ttl=settings.lease_ttl,
            notices_loss=not self.unsafe,
        )
        self.slots = Slots(settings.worker_concurrency)

    async def run(self, stopping: Stopping) -> None:
        """Subscribe, run the pipeline and its background loops until ``stopping`` and the
        drain, commit the finished prefix, close the consumer."""
        topic = self.settings.topic_ready
        consumer = Consumer(consumer_config(self.settings))
        offsets = Offsets(consumer, topic)
        await trio.to_thread.run_sync(
            lambda: consumer.subscribe(
                [topic], on_assign=offsets.on_assign, on_revoke=offsets.on_revoke
            )
        )
        presence = Presence(
            self.name, self.app.name, datetime.now(UTC), self.settings.worker_concurrency
        )
        async with trio.open_nursery() as background:
            await background.start(self.completer.run)
            background.start_soon(self.heartbeat.run)
            background.start_soon(offsets.run)
            background.start_soon(
                presence_loop, self.db, presence, lambda: len(self.executor.running)
            )
            await self.pipeline(consumer, offsets, stopping)
            await offsets.store()
            await offsets.commit()
            background.cancel_scope.cancel()
        await trio.to_thread.run_sync(consumer.close)

    async def pipeline(self, consumer: Consumer, offsets: Offsets, stopping: Stopping) -> None:
        """consume → claim → job tasks until ``stopping``, then the drain."""
        batches_in, batches_out = trio.open_memory_channel[list[Consumed]](math.inf)
        started_in, started_out = trio.open_memory_channel[tuple[Consumed, Started]](math.inf)
        claim = ClaimStage(
            self.claimer, offsets, self.slots, stopping, started_in, ttl=self.settings.lease_ttl
        )
        async with trio.open_nursery() as stages:
            stages.start_soon(claim.run, batches_out)
            stages.start_soon(self.run_jobs, started_out, offsets)
            await consume(consumer, offsets, self.slots, stopping, batches_in)
            await self.drain(self.settings.shutdown_timeout * GRACEFUL_FRACTION)
            stages.cancel_scope.cancel()  # every slot is back: the stages hold nothing

    async def run_jobs(
        self, started: trio.MemoryReceiveChannel[tuple[Consumed, Started]], offsets: Offsets
    ) -> None:
        """A task per started job, until ``started`` is closed and those tasks are done."""
        async with trio.open_nursery() as jobs:
            async for message, job in started:
                jobs.start_soon(self.run_job, message, job, offsets)

    async def run_job(self, message: Consumed, started: Started, offsets: Offsets) -> None:
        """execute → complete → offsets for one job; its slot is given back at the end. The
        message is marked finished only once the outcome is durable."""
        try:
            completion = await self.executor.execute(started)
            finished = await self.completer.complete(completion, started.claim)
            record(started.job, completion.outcome, finished)
            offsets.finish(message.partition, message.offset)
        except Exception:  # a bug in this process, not the job's outcome: keep the worker
            unexpected(message)
        finally:
            self.slots.release()

    async def drain(self, graceful: float) -> None:
        """Running jobs get ``graceful`` seconds to finish; then each is cancelled (recorded
        ``failed`` for an immediate retry) and its outcome written before this returns."""
        with trio.move_on_after(graceful):
            await self.slots.idle()
        for running in list(self.executor.running.values()):
            running.cancel(CancelReason.SHUTDOWN)
        await self.slots.idle()
