"""The claim stage: from a batch of messages to the jobs this worker may run now.

A batch from the consume stage is sorted first (:func:`split`): an undecodable message and a
second message for a job already in the batch are settled at once (counted, their offsets
marked finished), so the same job twice in one batch runs once. The rest is claimed by the
:class:`Claimer` in three round trips whatever its size: the job rows in one query, the
leases in one Redis script (a fence per job), the ``running`` stamps in one statement (each
row still conditioned on ``queued`` and a fence above the stored one, its transaction one
round trip), the lease and the stamp in one thread hop. A message that names a type the app
defines without a rate limit skips the first: its job goes straight to the lease and the
stamp, whose condition decides, and only a job the stamp refuses is read (a job a wake-up
announced is read first all the same: a worker may have run it already). Messages for jobs
that are not ``queued`` are skipped (finished, cancelled, running elsewhere, not due: every
move back to ``queued`` writes a new outbox row, so a skipped message never strands a job);
jobs of a type this worker's app does not define are deferred (a rolling deploy). What
cannot be decided now (another worker holds the lease, Redis handed out a stale fence, a
dependency is unreachable, the whole batch's claim failed) goes to the slow path: that job
alone, claimed again with backoff until decided, or until the worker is stopping (then its
message is left unfinished for redelivery). Each started job goes, with its message and its
slot, to the job stage on a memory channel. :meth:`Claimer.claim` is the run_once a test
drives without Kafka.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum
from typing import Literal

import psycopg
import redis
import trio

from leasework import metrics, store
from leasework.app import App
from leasework.db import Database
from leasework.job import Job
from leasework.lease import Claim, Leases
from leasework.queues.priorities import HIGHEST
from leasework.ratelimit import RateLimits
from leasework.rates import Rate, limit_key
from leasework.service import Stopping
from leasework.states import Status
from leasework.worker.consumer import Consumed, unexpected
from leasework.worker.lane_gate import LaneGate, Waiter
from leasework.worker.offsets import Offsets
from leasework.worker.slots import Slots

log = logging.getLogger("leasework.worker.claim")

# a wake-up is acted on only by a queue that has claimed nothing for this long: between the
# jobs of a stream a queue is quiet for moments, and claiming each of its jobs twice over
# (the wake-up, then the message) cost the one-job-per-transaction door CPU in every process
IDLE_BEFORE_WAKE = 0.1
# a rate limit's reserved start this close to now is now (Redis answers in ms)
RATE_SLACK = 0.005
# a reserved start at most this far off is waited for in memory, the job's message held
# (no write); a later one is kept in Postgres, due RATE_LEAD s before it, so that the
# promoter's passes (every 0.5 s) do not bunch a limit's starts together
RATE_HOLD = 1.0
RATE_LEAD = 0.75
# a job claimed more than this long after its reserved start (an outage or a lag held it)
# has lost its slot and reserves a new one: run late, it would start in a bunch with the
# jobs whose starts follow its own
RATE_LATE = 0.1
# wake-ups remembered per queue (their jobs' messages are claimed the careful way); a wake-up
# is acted on only by an idle queue, and every worker hears all of them, so a few hundred
# cover the seconds between a wake-up and its job's message
ANNOUNCED_KEPT = 1024
# seconds the messages their lanes let in are gathered before they are claimed together
LET_IN_GATHER = 0.002


class Skip(StrEnum):
    """Why a message's job is not run by this worker now."""

    MISSING = "missing"
    NOT_QUEUED = "not-queued"  # its status is the metric's reason
    DEFERRED = "deferred"
    PAUSED = "paused"  # held until its queue is resumed
    LIMITED = "limited"  # held until its concurrency limit has room
    RATE = "rate"  # waiting for the start its rate limit reserved


@dataclass(frozen=True)
class Started:
    """A job stamped ``running`` under ``claim``; ``claimed_at`` is a lower bound (monotonic)
    of when its lease was set, which its handler's deadline counts from."""

    job: Job
    claim: Claim
    claimed_at: float


@dataclass
class ClaimResult:
    """What became of a batch's claim, by job id."""

    started: list[Started] = field(default_factory=list)
    skipped: dict[uuid.UUID, Skip] = field(default_factory=dict)
    retry: list[uuid.UUID] = field(default_factory=list)
    reseeded: bool = False
    # jobs whose rate limit reserved them a later start (wall clock, epoch s): claim them then
    later: dict[uuid.UUID, float] = field(default_factory=dict)


@dataclass
class Claimer:
    """Claims a batch of jobs for the worker called ``name``, under leases of ``ttl`` s."""

    db: Database
    leases: Leases
    app: App
    _: KW_ONLY
    name: str
    ttl: float
    retry_base: float
    retry_cap: float
    # the rate limits' Redis script (None: a claimer of jobs without rate limits only)
    rates: RateLimits | None = None
    # the app's types without a rate limit: a job whose message names one is claimed without
    # its row read first (see claim)
    _direct: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._direct = frozenset(t.name for t in self.app if t.rate is None)

    async def claim(
        self,
        job_ids: list[uuid.UUID],
        reserved: Mapping[uuid.UUID, float] | None = None,
        types: Mapping[uuid.UUID, str] | None = None,
    ) -> ClaimResult:
        """Claim what can be claimed of ``job_ids`` (distinct, in message order); those of
        ``reserved`` had their rate limits' starts reserved (wall clock, epoch s) by this
        worker. ``types``: the type each job's message names, where it names one. A job
        whose message names a type this app defines without a rate limit goes straight to
        its lease and stamp, as a woken job does (:meth:`claim_woken`): the stamp's own
        condition (still ``queued``) decides, and a job it refuses is read then
        (:meth:`refused`). The others' rows are read first, in one query: jobs no longer
        queued are skipped without a lease, unknown types deferred, rate limits reserved.
        Redis and Postgres errors propagate: the caller waits and tries again."""
        outcome = ClaimResult()
        unique = list(dict.fromkeys(job_ids))
        named = types or {}
        direct = {
            j
            for j in unique
            if named.get(j) in self._direct and (not reserved or j not in reserved)
        }
        to_read = [j for j in unique if j not in direct]
        jobs = (
            {j.id: j for j in await self.db.read(store.jobs_get_many, to_read)} if to_read else {}
        )
        claimable, unknown = [], []
        for job_id in to_read:
            job = jobs.get(job_id)
            if job is None or job.status != Status.QUEUED:
                reason = "missing" if job is None else str(job.status)
                metrics.redeliveries_skipped.labels(reason).inc()
                outcome.skipped[job_id] = Skip.MISSING if job is None else Skip.NOT_QUEUED
            elif job.type not in self.app:
                unknown.append(job)
            else:
                claimable.append(job_id)
        if unknown:
            await self.defer(unknown)
            for job in unknown:
                outcome.skipped[job.id] = Skip.DEFERRED
        claimable = await self.wait_for_rates(claimable, jobs, outcome, reserved or {})
        if direct:
            go = direct.union(claimable)
            claimable = [j for j in unique if j in go]  # message order
        if not claimable:
            return outcome
        claimed_at = trio.current_time()  # before the claim is sent: a lower bound
        claims, stamped = await self.lease_and_stamp(claimable)
        won = {c.job_id: c for c in claims if c is not None}
        for job_id, claim in zip(claimable, claims, strict=True):
            if claim is None:
                metrics.lease_conflicts.inc()
                outcome.retry.append(job_id)  # another worker holds it; it expires by itself
        await self.settle_stamp(won, stamped, outcome, claimed_at)
        return outcome

    async def claim_woken(self, job_ids: list[uuid.UUID]) -> ClaimResult:
        """Claim jobs a wake-up named (:mod:`leasework.worker.wakeup`), of types this app
        defines: straight to the leases, without reading the rows first (the stamp's own
        condition, still ``queued``, decides). A lease another worker holds is not waited
        for: that worker, woken too, or the Kafka delivery has the job. Redis and Postgres
        errors propagate."""
        outcome = ClaimResult()
        claimed_at = trio.current_time()
        claims, stamped = await self.lease_and_stamp(job_ids)
        won = {c.job_id: c for c in claims if c is not None}
        await self.settle_stamp(won, stamped, outcome, claimed_at)
        return outcome

    async def lease_and_stamp(
        self, job_ids: list[uuid.UUID]
    ) -> tuple[list[Claim | None], store.Stamped]:
        """Win the jobs' leases in Redis (a claim per job, None where another worker holds
        it), then stamp those won in Postgres (:func:`store.jobs_start_many`), in one thread
        hop and one Postgres round trip (:meth:`Database.transact`): on a busy 2-core machine
        each hop and each round trip is a wait of the lone job to be scheduled, and a lease is
        worth nothing until its stamp. The pooled connection is taken before the lease (it
        waits one Redis round trip).

        If the stamp fails, the leases won are given back before the error propagates, so the
        claim that tries again (the slow path, or the Kafka delivery of a woken job) need not
        wait for them to expire. A stamp whose connection was lost may have committed all the
        same: its jobs are then ``running`` with nobody running them, as after a worker that
        died right after its stamp, and the reaper takes them back once their
        ``lease_expires_at`` passes (that attempt is spent; nothing runs twice)."""
        leased: list[Claim | None] = []

        def lease_then_stamp(conn: psycopg.Connection) -> store.Stamped:
            leased.extend(self.leases.store.claim_many(job_ids, self.name, self.ttl))
            won = [(c.job_id, c.fence) for c in leased if c is not None]
            return store.jobs_start_many(conn, won, worker=self.name, ttl=self.ttl)

        try:
            stamped = await self.db.transact(lease_then_stamp)
        except BaseException:
            won = [c for c in leased if c is not None]
            if won:
                with trio.CancelScope(shield=True):
                    try:
                        await self.leases.release_many(won)
                    except Exception:  # noqa: BLE001 - they expire by themselves
                        log.warning("lease release after a failed stamp failed")
            raise
        return leased, stamped

    async def settle_stamp(
        self, won: dict[uuid.UUID, Claim], stamped: store.Stamped, outcome: ClaimResult, at: float
    ) -> None:
        """What the stamp of the jobs whose leases were won did to each: started, held by a
        full concurrency limit (their leases given back; the finish that frees a slot, or the
        relay's pass, releases them), or refused."""
        if not won:
            return
        for job in stamped.started:
            outcome.started.append(Started(job, won[job.id], at))
        held = [won[job.id] for job in stamped.held]
        for claim in held:
            metrics.redeliveries_skipped.labels("limited").inc()
            outcome.skipped[claim.job_id] = Skip.LIMITED
        decided = {j.id for j in stamped.started} | {c.job_id for c in held}
        refused = [c for job_id, c in won.items() if job_id not in decided]
        if held:
            try:
                await self.leases.release_many(held)
            except Exception:  # noqa: BLE001 - they expire by themselves
                log.warning("lease release after a held stamp failed")
        if refused:
            await self.refused(refused, outcome)

    async def wait_for_rates(
        self,
        job_ids: list[uuid.UUID],
        jobs: dict[uuid.UUID, Job],
        outcome: ClaimResult,
        reserved: Mapping[uuid.UUID, float],
    ) -> list[uuid.UUID]:
        """The jobs of ``job_ids`` that may start now under their types' rate limits.

        A rate-limited job without a reservation gets one (:mod:`leasework.ratelimit`, one
        script for the batch). A start within :data:`RATE_HOLD` s is waited for here
        (``outcome.later``: the caller claims the job then, its message held meanwhile); a
        later one is kept in Postgres (``scheduled``, due :data:`RATE_LEAD` s before it, no
        attempt spent), and the job's next claim waits out the rest. ``reserved``: the starts
        this worker reserved for some of the jobs (a slot kept in Postgres is the job's
        ``rate_slot_at``). A job claimed more than :data:`RATE_LATE` s after its start
        reserves a new one. Redis unreachable raises (the claim waits)."""
        wall = time.time()
        rated: list[tuple[Job, str, Rate]] = []
        for job_id in job_ids:
            job = jobs[job_id]
            job_type = self.app.get(job.type)
            rate = job_type.rate if job_type is not None else None
            if rate is None:
                continue
            slot = reserved.get(job_id)
            if slot is None and job.rate_slot_at is not None:
                slot = job.rate_slot_at.timestamp()
            if slot is not None:
                if slot - wall > RATE_SLACK:  # early (due a little before its start): wait
                    outcome.later[job_id] = slot
                    continue
                if wall - slot <= RATE_LATE:  # its start: go
                    continue
            rated.append((job, limit_key(job.type, job.payload, rate), rate))
        if rated:
            if self.rates is None:
                raise RuntimeError("a claimer of rate-limited types needs rates=RateLimits(...)")
            await self.reserve_rates(rated, outcome)
        return [j for j in job_ids if j not in outcome.skipped and j not in outcome.later]

    async def reserve_rates(self, rated: list[tuple[Job, str, Rate]], outcome: ClaimResult) -> None:
        assert self.rates is not None

        async def floors(keys: list[str]) -> dict[str, int]:
            # a limit Redis lost starts after every start reserved for it: those Postgres
            # keeps, and those a worker may be waiting for in memory (within RATE_HOLD)
            kept = await self.db.read(store.rate_floors, keys)
            held = int((time.time() + RATE_HOLD) * 1000)
            return {k: max(kept.get(k, 0), held) for k in keys}

        reserved = await self.rates.reserve([(key, rate) for _, key, rate in rated], floors)
        waits = []
        for (job, key, rate), r in zip(rated, reserved, strict=True):
            if r.wait <= RATE_SLACK:
                continue
            if r.wait <= RATE_HOLD:
                outcome.later[job.id] = time.time() + r.wait
                continue
            why = f"waiting for its rate limit ({rate}, {key}): to start in {r.wait:.3f}s"
            due = r.start_ms - int(RATE_LEAD * 1000)
            waits.append((job.id, key, r.start_ms, due, why))
        metrics.rate_waits.inc(len(waits) + sum(1 for j, _, _ in rated if j.id in outcome.later))
        if waits:
            await self.db.run(store.jobs_wait_rate, waits)
            for job_id, *_ in waits:
                outcome.skipped[job_id] = Skip.RATE

    async def refused(self, refused: list[Claim], outcome: ClaimResult) -> None:
        """Leases won in Redis whose stamp Postgres refused: the job stopped being ``queued``
        meanwhile (skip it), its queue is paused (hold it until the resume), or Redis handed
        out a fence not above the stored one (its counter was lost): re-seed the counter
        above Postgres's largest fence and try again."""
        try:
            await self.leases.release_many(refused)
        except Exception:  # noqa: BLE001 - they expire by themselves
            log.warning("lease release after a refused stamp failed")
        now = {j.id: j for j in await self.db.run(store.jobs_get_many, [c.job_id for c in refused])}
        stale, waiting = [], []
        for claim in refused:
            job = now.get(claim.job_id)
            if job is not None and job.status == Status.QUEUED and job.fence >= claim.fence:
                stale.append((claim, job))
                outcome.retry.append(claim.job_id)
            elif job is not None and job.status == Status.QUEUED:
                waiting.append(claim.job_id)  # refused with a good fence: its queue is paused
            else:
                reason = "missing" if job is None else str(job.status)
                metrics.redeliveries_skipped.labels(reason).inc()
                outcome.skipped[claim.job_id] = Skip.MISSING if job is None else Skip.NOT_QUEUED
        if waiting:
            held = {j.id for j in await self.db.run(store.jobs_hold_paused, waiting)}
            for job_id in waiting:
                if job_id in held:
                    metrics.redeliveries_skipped.labels("paused").inc()
                    outcome.skipped[job_id] = Skip.PAUSED
                else:  # resumed meanwhile, or no longer queued: claimed again to decide
                    outcome.retry.append(job_id)
        if stale:
            floor = await self.db.run(store.fence_max)
            seeded = await self.leases.reseed(floor + 1)
            metrics.fence_reseeds.inc()
            outcome.reseeded = True
            claim, job = stale[0]
            log.error(
                "redis handed out a stale fence (counter lost?); stamp refused by postgres, "
                "counter re-seeded",
                extra={
                    "job_id": str(claim.job_id),
                    "token": claim.fence,
                    "stored_fence": job.fence,
                    "reseeded_to": seeded,
                    "jobs": len(stale),
                },
            )

    async def defer(self, jobs: list[Job]) -> None:
        """Types this worker's app does not define (a rolling deploy: a newer worker will):
        put the jobs back for later, spending no attempt, rather than killing them."""
        by_type: dict[str, list[uuid.UUID]] = {}
        for job in jobs:
            by_type.setdefault(job.type, []).append(job.id)
        for job_type, ids in by_type.items():
            reason = (
                f"deferred by {self.name}: its app ({self.app.name}) does not define type "
                f"{job_type!r}; a worker whose app does will run it"
            )
            defer = functools.partial(
                store.jobs_defer_many, base=self.retry_base, cap=self.retry_cap, reason=reason
            )
            deferred = await self.db.run(defer, ids)
            metrics.jobs_deferred.inc(len(deferred))
            for job in deferred:
                log.warning(
                    "job type not defined by this worker's app; deferred",
                    extra={
                        "job_id": str(job.id),
                        "type": job.type,
                        "deferrals": job.deferrals,
                        "run_at": job.run_at.isoformat(),
                    },
                )


class Abandoned(Exception):
    """The worker is stopping before it could claim the job: leave the message unfinished so
    its offset is not committed and the next owner of the partition gets it again."""


SkipReason = Literal["undecodable", "duplicate"]


@dataclass(frozen=True)
class Batch:
    """A batch of messages sorted before its claim: the message that stands for each job, in
    message order, and the ones settled without a claim, in message order, with why."""

    first: dict[uuid.UUID, Consumed]
    skipped: list[tuple[Consumed, SkipReason]]


async def cancel_on_stop(stopping: Stopping, scope: trio.CancelScope) -> None:
    await stopping.wait()
    scope.cancel()


def split(messages: list[Consumed]) -> Batch:
    """The first message of each job claims it; an undecodable one, or a later one for a job
    already in the batch (run it once), is skipped."""
    first: dict[uuid.UUID, Consumed] = {}
    skipped: list[tuple[Consumed, SkipReason]] = []
    for message in messages:
        if message.job_id is None:
            skipped.append((message, "undecodable"))
        elif message.job_id in first:
            skipped.append((message, "duplicate"))
        else:
            first[message.job_id] = message
    return Batch(first, skipped)


@dataclass
class ClaimStage:
    """Every message it receives ends here (finished, or left for redelivery) or goes on to
    ``started`` with its job, still holding its slot."""

    claimer: Claimer
    offsets: Offsets
    slots: Slots
    stopping: Stopping
    started: trio.MemorySendChannel[tuple[Consumed | None, Started]]
    _: KW_ONLY
    ttl: float
    # the lanes' admissions (None: every message is claimed as it comes), and the priority
    # band this stage's messages came from (a message let in by its lane takes a slot again)
    gate: LaneGate | None = None
    band: int = HIGHEST
    _claims: trio.Nursery | None = field(default=None, init=False)
    # when this queue last claimed anything (a batch or a woken job), trio time
    _last_claim: float = field(default=-math.inf, init=False)
    # the jobs wake-ups announced lately, oldest first: a worker (this one or another) may
    # have claimed them already, so their messages are claimed with the row read first
    _announced: dict[uuid.UUID, None] = field(default_factory=dict, init=False)
    # messages their lanes let in, with a slot again, gathered to be claimed as one batch
    _let_in: list[Consumed] = field(default_factory=list, init=False)

    async def run(self, batches: trio.MemoryReceiveChannel[list[Consumed]]) -> None:
        """Claim each batch in a task of its own (several batches may be claimed at once),
        until ``batches`` is closed and its claims decided; then close ``started``."""
        async with self.started, trio.open_nursery() as nursery:
            self._claims = nursery
            try:
                async for batch in batches:
                    nursery.start_soon(self.claim_batch, batch, nursery)
            finally:
                self._claims = None

    def wake(self, job_id: uuid.UUID) -> bool:
        """Claim a job a Postgres wake-up named (:mod:`leasework.worker.wakeup`) at once, if
        this queue is idle (nothing in flight, nothing claimed for :data:`IDLE_BEFORE_WAKE`
        s) and the worker is not stopping; the job holds
        a lent slot (:meth:`Slots.lend`). Returns whether a claim was begun; otherwise, and
        whenever the claim does not start the job, its Kafka message delivers it."""
        self._announced[job_id] = None
        if len(self._announced) > ANNOUNCED_KEPT:
            del self._announced[next(iter(self._announced))]
        if self._claims is None or self.stopping.is_set() or not self.slots.quiet():
            return False
        if trio.current_time() - self._last_claim < IDLE_BEFORE_WAKE:
            return False  # between jobs of a stream, not idle: Kafka brings the next ones
        self._last_claim = trio.current_time()
        self.slots.lend()
        self._claims.start_soon(self.claim_woken, job_id)
        return True

    async def claim_woken(self, job_id: uuid.UUID) -> None:
        handed_on = False
        try:
            claimed = await self.claimer.claim_woken([job_id])
            for started in claimed.started:
                self.started.send_nowait((None, started))
                handed_on = True
            metrics.wakeups.labels("started" if handed_on else "lost").inc()
        except Exception as exc:  # nothing lost: the job's Kafka message still delivers it
            metrics.wakeups.labels("error").inc()
            if isinstance(exc, redis.RedisError | psycopg.Error):
                log.info(
                    "cannot claim a woken job now; Kafka delivers it",
                    extra={"error": str(exc)[:200]},
                )
            else:
                log.exception("claiming a woken job failed unexpectedly; Kafka delivers it")
        finally:
            if not handed_on:
                self.slots.give_back_lent()

    def settle(self, message: Consumed) -> None:
        """Nothing to do for the message: mark it finished and give back its slot."""
        self.offsets.finish(message.partition, message.offset, message.generation)
        self.give_back(message)

    def give_back(self, message: Consumed) -> None:
        """The message's slot, and its lane's admission if it holds one."""
        self.slots.release()
        if self.gate is not None:
            self.gate.leave(message)

    def hold_back(self, first: dict[uuid.UUID, Consumed], nursery: trio.Nursery) -> None:
        """Take out of ``first`` the messages whose lanes are full (:mod:`.lane_gate`): each
        waits for its lane in a task of its own, its slot given back meanwhile (kept while
        the lane's waiting room is full)."""
        if self.gate is None:
            return
        for job_id, message in list(first.items()):
            lane = self.gate.lane(message.job_type)
            if lane is None or self.gate.holds(message) or self.gate.try_enter(message, lane):
                continue  # (a message let in by its lane holds its admission already)
            del first[job_id]
            keeps_slot = not self.gate.room_to_wait(lane)
            if not keeps_slot:
                self.slots.release()
            waiter = self.gate.line_up(message, lane)
            nursery.start_soon(self.wait_for_lane, waiter, keeps_slot, nursery)

    async def wait_for_lane(self, waiter: Waiter, keeps_slot: bool, nursery: trio.Nursery) -> None:
        """Until its lane admits the message and its queue has a slot for it again, then
        claim it with the others let in meanwhile (:meth:`claim_let_in`); at the worker's
        stop, leave it unfinished (it is redelivered) and give back what it holds."""
        assert self.gate is not None
        message = waiter.message
        assert isinstance(message, Consumed)
        admitted = False
        async with trio.open_nursery() as waiting:
            waiting.start_soon(cancel_on_stop, self.stopping, waiting.cancel_scope)
            await self.gate.wait(waiter)
            admitted = True
            if not keeps_slot:
                await self.slots.take(1, self.band)
                keeps_slot = True
            waiting.cancel_scope.cancel()
        if admitted and keeps_slot:
            self._let_in.append(message)
            if len(self._let_in) == 1:
                nursery.start_soon(self.claim_let_in, nursery)
            return
        if keeps_slot:
            self.slots.release()
        if admitted:
            self.gate.leave(message)

    async def claim_let_in(self, nursery: trio.Nursery) -> None:
        """Claim the messages their lanes let in as one batch: jobs end in batches (the
        completer's), so their lanes' rooms free in bursts; gathered for
        :data:`LET_IN_GATHER` s, a burst is claimed in three round trips, not one by one."""
        await trio.sleep(LET_IN_GATHER)
        batch, self._let_in = self._let_in, []
        await self.claim_batch(batch, nursery)

    async def claim_batch(self, messages: list[Consumed], nursery: trio.Nursery) -> None:
        self._last_claim = trio.current_time()
        metrics.claim_batch_size.observe(len(messages))
        batch = split(messages)
        for message, reason in batch.skipped:
            if reason == "undecodable":
                log.error("undecodable message skipped", extra={"offset": message.offset})
            metrics.redeliveries_skipped.labels(reason).inc()
            self.settle(message)
        self.hold_back(batch.first, nursery)
        if not batch.first:
            return
        types = {
            job_id: message.job_type
            for job_id, message in batch.first.items()
            if message.job_type is not None and job_id not in self._announced
        }
        try:
            claimed = await self.claimer.claim(list(batch.first), types=types)
        except Exception as exc:  # unreachable dependencies, or a bug: the slow path decides
            if isinstance(exc, redis.RedisError | psycopg.Error):
                log.warning(
                    "cannot claim a batch: a dependency is unreachable; claiming one by one",
                    extra={"jobs": len(batch.first), "error": str(exc)[:200]},
                )
            else:
                log.exception("claiming a batch failed unexpectedly; claiming one by one")
            for message in batch.first.values():
                nursery.start_soon(self.claim_one, message)
            return
        for started in claimed.started:
            self.started.send_nowait((batch.first[started.job.id], started))
        for job_id in claimed.skipped:
            self.settle(batch.first[job_id])
        for job_id in claimed.retry:
            nursery.start_soon(self.claim_one, batch.first[job_id])
        for job_id, slot in claimed.later.items():
            nursery.start_soon(self.claim_later, batch.first[job_id], slot)

    async def claim_later(self, message: Consumed, slot: float) -> None:
        """A job whose rate limit reserved it a later start (``slot``, wall clock): its
        message and slot held meanwhile, then claimed as the slow path does, with that
        start."""
        await trio.sleep(max(0.0, slot - time.time()))
        await self.claim_one(message, slot=slot)

    async def claim_one(self, message: Consumed, *, slot: float | None = None) -> None:
        """The slow path of one job the batch could not decide: its message is finished when
        the job is skipped, handed on when it is started, else left for redelivery."""
        handed_on = False
        try:
            started = await self.claim_alone(message, slot=slot)
            if started is None:
                self.offsets.finish(message.partition, message.offset, message.generation)
            else:
                self.started.send_nowait((message, started))
                handed_on = True
        except Abandoned:
            log.info(
                "message left for redelivery",
                extra={"partition": message.partition, "offset": message.offset},
            )
        except Exception:  # a bug in this process, not the job's outcome: keep the worker
            unexpected(message)
        finally:
            if not handed_on:
                self.give_back(message)

    async def claim_alone(self, message: Consumed, *, slot: float | None = None) -> Started | None:
        """Claim the message's job again and again until decided (None: skipped): wait while
        another worker holds its lease (it expires by itself), while Redis or Postgres is
        unreachable, after a re-seeded fence counter, or until the start its rate limit
        reserved (``slot``: the start reserved for it already, wall clock). Raises
        :class:`Abandoned` once the worker is stopping."""
        assert message.job_id is not None
        backoff = 0.2
        while True:
            if self.stopping.is_set():
                raise Abandoned(str(message.job_id))
            try:
                claimed = await self.claimer.claim(
                    [message.job_id], reserved=None if slot is None else {message.job_id: slot}
                )
            except (redis.RedisError, psycopg.Error) as exc:
                log.warning(
                    "cannot claim: a dependency is unreachable; waiting",
                    extra={"job_id": str(message.job_id), "error": str(exc)[:200]},
                )
                await trio.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                continue
            if claimed.started:
                return claimed.started[0]
            if claimed.skipped:
                return None
            if message.job_id in claimed.later:
                slot = claimed.later[message.job_id]
                await trio.sleep(max(0.0, slot - time.time()))
                continue
            if not claimed.reseeded:
                await trio.sleep(min(self.ttl / 2, backoff))
                backoff = min(self.ttl / 2, backoff * 2)
