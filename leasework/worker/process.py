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

A lone job may come in by a shorter way (:mod:`leasework.worker.wakeup`): Postgres's
``NOTIFY leasework_ready`` at its insert's commit makes a quiet queue's claim stage claim it
by id (:meth:`Worker.wake`) before Kafka delivers it; its message is settled when it
arrives. A paused queue (:meth:`Worker.watch_pauses`) is neither fetched nor woken, and its
claims are refused by the stamp itself.

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

import logging
import math
import uuid
from datetime import UTC, datetime

import trio
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from leasework.app import App
from leasework.config import UNSAFE_LEASE_MODE, Settings
from leasework.db import Database
from leasework.kafka import client_config
from leasework.lease import Leases
from leasework.outcomes import RetryDefaults
from leasework.queues import DEFAULT
from leasework.queues.operations import ensure_queues, paused_queues
from leasework.queues.priorities import HIGHEST, LEVELS, band_topic, band_topics
from leasework.ratelimit import RateLimits
from leasework.service import Stopping
from leasework.worker.attempt import Executor
from leasework.worker.claim import Claimer, ClaimStage, Started
from leasework.worker.completer import Completer, UnsafeCompleter, record
from leasework.worker.consumer import Consumed, consume, unexpected
from leasework.worker.feed import Feed
from leasework.worker.heartbeat import CancelReason, Heartbeat, Presence, presence_loop
from leasework.worker.lane_gate import LaneGate
from leasework.worker.lanes import LaneConfig, Lanes
from leasework.worker.loop_guard import OVERRUN_GRACE, LoopGuard, trio_handlers
from leasework.worker.offsets import Offsets
from leasework.worker.slots import Slots
from leasework.worker.topic_watch import TopicWatch
from leasework.worker.wakeup import listen

GRACEFUL_FRACTION = 0.75  # of shutdown_timeout, that running jobs get to finish
PAUSE_READ = 0.5  # seconds between two reads of the paused queues

log = logging.getLogger("leasework.worker")


def served_queues(settings: Settings, app: App) -> tuple[str, ...]:
    """The queues a worker serves: ``LEASEWORK_QUEUES`` (``--queues``), else ``default`` and
    every queue its app's types name."""
    if settings.queues is not None:
        return settings.queues
    named = [t.queue for t in app if t.queue is not None]
    return tuple(dict.fromkeys([DEFAULT, *sorted(named)]))


class Worker:
    """The stages of one worker process and the nursery that joins them; the services the
    stages share (the completer's batches, the heartbeat's renewals, each queue's slots)
    live as long as the worker, the stages as long as one :meth:`run`."""

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
            self.db,
            self.leases,
            dlq_topic=settings.topic_dlq,
            ready_topic=settings.topic_ready,
            worker=self.name,
        )
        self.claimer = Claimer(
            db,
            self.leases,
            app,
            name=self.name,
            ttl=settings.lease_ttl,
            retry_base=settings.retry_base,
            retry_cap=settings.retry_cap,
            rates=RateLimits(self.leases.client, self.leases.limiter),
        )
        lanes = LaneConfig.from_settings(settings)
        self.lanes = Lanes(app, lanes)
        # how the lanes' capacities and the queues' slots compose (leasework/worker/lane_gate.py)
        self.gate = LaneGate.of_app(app, lanes.capacity, settings.worker_concurrency)
        self.executor = Executor(
            app,
            worker=self.name,
            ttl=settings.lease_ttl,
            defaults=RetryDefaults(settings.retry_base, settings.retry_cap),
            bounded_by_lease=not self.unsafe,
            lanes=self.lanes,
        )
        self.heartbeat = Heartbeat(
            db,
            self.leases,
            lambda: list(self.executor.running.values()),
            ttl=settings.lease_ttl,
            notices_loss=not self.unsafe,
        )
        # the leases' keeper while the loop is blocked (not in the plain-TTL demonstration,
        # whose heartbeat does not notice a lost lease either)
        self.guard = (
            None
            if self.unsafe
            else LoopGuard(
                db,
                self.leases,
                lambda: list(self.executor.running.values()),
                ttl=settings.lease_ttl,
                loop_bound=self.executor.loop_bound,
                overdue_threads=lambda now: self.lanes.overdue_threads(now, OVERRUN_GRACE),
                handlers=trio_handlers(app),
            )
        )
        self.queues = served_queues(settings, app)
        # each queue's own slots: a queue runs up to worker_concurrency jobs, and a flooded
        # or idle queue never holds another's (an idle consumer's poll holds its free slots)
        self.slots_of = {q: Slots(settings.worker_concurrency) for q in self.queues}
        self.claim_stages: dict[str, ClaimStage] = {}  # each queue's, while its pipeline runs
        self.paused: frozenset[str] = frozenset()  # the paused queues, read every PAUSE_READ s

    async def ensure_queues(self, topics: bool = False) -> None:
        """Create the queues this worker serves that do not exist yet (topics, then row; with
        ``topics``, every served queue's missing topics too), trying again every 2 s while
        Postgres or Kafka cannot be reached."""
        settings = self.settings

        def ensure(conn) -> list[str]:
            return ensure_queues(
                conn,
                settings.kafka_brokers,
                f"{self.name}-queues",
                settings.topic_ready,
                self.queues,
                created_by=f"worker {self.name}",
                extra=settings.kafka_properties,
                topics=topics,
            )

        while True:
            try:
                made = await self.db.run(ensure)
            except Exception as exc:  # unreachable, or Kafka refused: said, tried again
                log.warning("cannot create the queues yet", extra={"error": str(exc)[:300]})
                await trio.sleep(2.0)
                continue
            if made:
                log.info("queues created", extra={"queues": made})
            return

    async def topics_missing(self) -> bool:
        """Whether a served queue's topic is not in the cluster (or the cluster could not
        say): then the queues are made before subscribing."""
        topics = [t for q in self.queues for t in band_topics(self.settings.topic_ready, q)]

        def missing() -> bool:
            admin = AdminClient(
                client_config(
                    self.settings.kafka_brokers,
                    f"{self.name}-queues",
                    self.settings.kafka_properties,
                )
            )
            try:
                known = admin.list_topics(timeout=5.0).topics
            except KafkaException:
                return True
            return any(t not in known for t in topics)

        return await trio.to_thread.run_sync(missing)

    async def run(self, stopping: Stopping) -> None:
        """Open the lanes the app's handlers run in (:mod:`leasework.worker.lanes`), start the
        loop guard (:mod:`leasework.worker.loop_guard`), then :meth:`consume_until`
        ``stopping``; the guard stops and the lanes close last."""
        async with self.lanes.open():
            if self.guard is None:
                await self.consume_until(stopping)
                return
            trio.lowlevel.add_instrument(self.guard)
            thread = self.guard.start()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.guard.beat)
                    await self.consume_until(stopping)
                    nursery.cancel_scope.cancel()
            finally:
                self.guard.stop()
                trio.lowlevel.remove_instrument(self.guard)
                await trio.to_thread.run_sync(thread.join)

    async def consume_until(self, stopping: Stopping) -> None:
        """Subscribe to each priority band of each served queue (a consumer of its own, in
        the band's group), run a pipeline per band and the shared background loops until
        ``stopping`` and the drain, commit each band's finished prefix, close the
        consumers."""
        if await self.topics_missing():
            # before subscribing: a band's consumer needs its topic
            await self.ensure_queues(topics=True)
            ensure_later = None
        else:
            ensure_later = self.ensure_queues  # (their rows, if made by hand: not urgent)
        # the topics' ids are read before subscribing: a topic made again after this read is
        # one its consumer subscribed to before, or a new id the feed takes as its first
        watch = TopicWatch(
            self.settings,
            [t for q in self.queues for t in band_topics(self.settings.topic_ready, q)],
            self.settings.topic_check_every,
        )
        await watch.read()
        feeds = []
        for queue in self.queues:
            for band in LEVELS:
                feed = Feed(
                    self.settings,
                    queue,
                    band,
                    band_topic(self.settings.topic_ready, queue, band),
                    watch,
                )
                await feed.open()
                feeds.append(feed)
        presence = Presence(
            self.name, self.app.name, datetime.now(UTC), self.settings.worker_concurrency
        )
        async with trio.open_nursery() as background:
            await background.start(self.completer.run)
            background.start_soon(self.heartbeat.run)
            background.start_soon(watch.run)
            if ensure_later is not None:
                background.start_soon(ensure_later)
            for feed in feeds:
                background.start_soon(feed.offsets.run)
            background.start_soon(
                presence_loop, self.db, presence, lambda: len(self.executor.running)
            )
            await background.start(self.watch_pauses)
            if self.settings.worker_wakeups:
                queue_of_topic = {
                    t: q for q in self.queues for t in band_topics(self.settings.topic_ready, q)
                }
                background.start_soon(
                    listen,
                    self.db,
                    queue_of_topic,
                    # a rate-limited job waits for Kafka: its reservation is the claim's
                    {t.name for t in self.app if t.rate is None},
                    self.wake,
                    stopping,
                    self.quiet,
                )
            async with trio.open_nursery() as pipelines:
                for feed in feeds:
                    pipelines.start_soon(self.pipeline, feed, stopping)
            for feed in feeds:
                await feed.offsets.store()
                await feed.offsets.commit()
            background.cancel_scope.cancel()
        # Leaving the group is a courtesy to the other workers (their rebalance starts at
        # once); it waits on the group's coordinator, so the shutdown's deadline abandons it
        # (the session timeout then lets the group know).
        try:
            for feed in feeds:
                await feed.close()
        except trio.Cancelled:
            log.warning("kafka consumers not closed by the shutdown deadline; left as they are")
            raise

    async def pipeline(self, feed: Feed, stopping: Stopping) -> None:
        """consume → claim → job tasks of one queue's priority band until ``stopping``, then
        the drain (of every queue: the graceful time and the cancels are the worker's). The
        bands of a queue share its slots."""
        queue, offsets = feed.queue, feed.offsets
        slots = self.slots_of[queue]
        batches_in, batches_out = trio.open_memory_channel[list[Consumed]](math.inf)
        started_in, started_out = trio.open_memory_channel[tuple[Consumed | None, Started]](
            math.inf
        )
        claim = ClaimStage(
            self.claimer,
            offsets,
            slots,
            stopping,
            started_in,
            ttl=self.settings.lease_ttl,
            gate=self.gate,
            band=feed.band,
        )
        if feed.band == HIGHEST:
            self.claim_stages[queue] = claim  # the one a wake-up of the queue's claims in
        async with trio.open_nursery() as stages:
            stages.start_soon(claim.run, batches_out)
            stages.start_soon(self.run_jobs, started_out, offsets, slots)
            await consume(feed, slots, stopping, batches_in, lambda: queue in self.paused)
            await self.drain(self.settings.shutdown_timeout * GRACEFUL_FRACTION)
            stages.cancel_scope.cancel()  # every slot is back: the stages hold nothing

    async def run_jobs(
        self,
        started: trio.MemoryReceiveChannel[tuple[Consumed | None, Started]],
        offsets: Offsets,
        slots: Slots,
    ) -> None:
        """A task per started job, until ``started`` is closed and those tasks are done."""
        async with trio.open_nursery() as jobs:
            async for message, job in started:
                jobs.start_soon(self.run_job, message, job, offsets, slots)

    async def run_job(
        self, message: Consumed | None, started: Started, offsets: Offsets, slots: Slots
    ) -> None:
        """execute → complete → offsets for one job; its slot is given back at the end. The
        message is marked finished only once the outcome is durable (a job a wake-up started
        has none: its Kafka message is settled when it arrives, finding the job running or
        finished)."""
        try:
            completion = await self.executor.execute(started)
            finished = await self.completer.complete(completion, started.claim)
            record(started.job, completion.outcome, finished)
            if message is not None:
                offsets.finish(message.partition, message.offset, message.generation)
        except Exception:  # a bug in this process, not the job's outcome: keep the worker
            unexpected(message)
        finally:
            if message is None:
                slots.give_back_lent()
            else:
                slots.release()
                self.gate.leave(message)

    def blocked_by(self) -> str | None:
        """The job type that blocked the loop, for the loop-lag warning (the guard's)."""
        return None if self.guard is None else self.guard.blocked_by()

    def quiet(self) -> bool:
        """Whether some queue of this worker, not paused, has nothing in flight."""
        return any(self.slots_of[q].quiet() for q in self.queues if q not in self.paused)

    def wake(self, queue: str, job_id: uuid.UUID) -> bool:
        """A wake-up for ``queue``'s job: claimed at once if the queue is quiet."""
        stage = self.claim_stages.get(queue)
        return stage is not None and queue not in self.paused and stage.wake(job_id)

    async def watch_pauses(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Read which queues are paused every :data:`PAUSE_READ` s (started once the first
        read answered or failed: a worker that cannot read Postgres claims nothing anyway).
        A failed read keeps the last answer; the claim's own check is what guarantees that
        no job of a paused queue starts."""
        started = False
        while True:
            try:
                self.paused = frozenset(await self.db.read(paused_queues))
            except Exception as exc:  # unreachable: the claims fail too; said, tried again
                log.warning("cannot read the paused queues", extra={"error": str(exc)[:200]})
            if not started:
                task_status.started()
                started = True
            await trio.sleep(PAUSE_READ)

    async def idle(self) -> None:
        """Until every queue's slots are all back."""
        for slots in self.slots_of.values():
            await slots.idle()

    async def drain(self, graceful: float) -> None:
        """Running jobs get ``graceful`` seconds to finish; then each is cancelled (recorded
        ``failed`` for an immediate retry) and its outcome written before this returns."""
        with trio.move_on_after(graceful):
            await self.idle()
        for running in list(self.executor.running.values()):
            running.cancel(CancelReason.SHUTDOWN)
        await self.idle()
