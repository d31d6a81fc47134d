"""The producer: from a batch of Kafka messages to the jobs this worker may run now.

One batch costs three round trips whatever its size: the job rows in one query, the leases
in one Redis script (a fence per job), the ``running`` stamps in one statement (each row
still conditioned on ``queued`` and a fence above the stored one). Messages for jobs that are
not ``queued`` are skipped (finished, cancelled, running elsewhere, not due: every move back
to ``queued`` writes a new outbox row, so a skipped message never strands a job); jobs of a
type this worker's app does not define are deferred (a rolling deploy). What cannot be
decided now (another worker holds the lease, Redis handed out a stale fence, a dependency is
unreachable) is handed back as ``retry``: the worker tries those again, one by one, with
backoff. :meth:`Producer.claim` is the run_once a test drives without Kafka.
"""

from __future__ import annotations

import functools
import logging
import uuid
from dataclasses import dataclass, field
from enum import StrEnum

import trio

from leasework import metrics, store
from leasework.app import App
from leasework.db import Database
from leasework.job import Job
from leasework.lease import Claim, Leases
from leasework.states import Status

log = logging.getLogger("leasework.worker.claim")


class Skip(StrEnum):
    """Why a message's job is not run by this delivery."""

    MISSING = "missing"
    NOT_QUEUED = "not-queued"  # its status is the metric's reason
    DEFERRED = "deferred"


@dataclass(frozen=True)
class Started:
    """A job stamped ``running`` under ``claim``; ``claimed_at`` is a lower bound (monotonic)
    of when its lease was set, which its handler's deadline counts from."""

    job: Job
    claim: Claim
    claimed_at: float


@dataclass
class Claimed:
    """What became of a batch, by job id."""

    started: list[Started] = field(default_factory=list)
    skipped: dict[uuid.UUID, Skip] = field(default_factory=dict)
    retry: list[uuid.UUID] = field(default_factory=list)
    reseeded: bool = False


class Producer:
    def __init__(
        self,
        db: Database,
        leases: Leases,
        app: App,
        *,
        name: str,
        ttl: float,
        retry_base: float,
        retry_cap: float,
    ) -> None:
        self.db = db
        self.leases = leases
        self.app = app
        self.name = name
        self.ttl = ttl
        self.retry_base = retry_base
        self.retry_cap = retry_cap

    async def claim(self, job_ids: list[uuid.UUID]) -> Claimed:
        """Claim what can be claimed of ``job_ids`` (distinct, in message order). Redis and
        Postgres errors propagate: the caller waits and tries again."""
        outcome = Claimed()
        unique = list(dict.fromkeys(job_ids))
        jobs = {j.id: j for j in await self.db.run(store.jobs_get_many, unique)}
        claimable, unknown = [], []
        for job_id in unique:
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
        if not claimable:
            return outcome
        claimed_at = trio.current_time()  # before the claim is sent: a lower bound
        claims = await self.leases.claim_many(claimable, self.name, self.ttl)
        won = {c.job_id: c for c in claims if c is not None}
        for job_id, claim in zip(claimable, claims, strict=True):
            if claim is None:
                metrics.lease_conflicts.inc()
                outcome.retry.append(job_id)  # another worker holds it; it expires by itself
        stamp = functools.partial(store.jobs_start_many, worker=self.name, ttl=self.ttl)
        started = {
            j.id: j for j in await self.db.run(stamp, [(c.job_id, c.fence) for c in won.values()])
        }
        refused = [c for job_id, c in won.items() if job_id not in started]
        for job_id, job in started.items():
            outcome.started.append(Started(job, won[job_id], claimed_at))
        if refused:
            await self.refused(refused, outcome)
        return outcome

    async def refused(self, refused: list[Claim], outcome: Claimed) -> None:
        """Leases won in Redis whose stamp Postgres refused: the job stopped being ``queued``
        meanwhile (skip it), or Redis handed out a fence not above the stored one (its
        counter was lost): re-seed the counter above Postgres's largest fence and try again."""
        try:
            await self.leases.release_many(refused)
        except Exception:  # noqa: BLE001 - they expire by themselves
            log.warning("lease release after a refused stamp failed")
        now = {j.id: j for j in await self.db.run(store.jobs_get_many, [c.job_id for c in refused])}
        stale = []
        for claim in refused:
            job = now.get(claim.job_id)
            if job is not None and job.status == Status.QUEUED and job.fence >= claim.fence:
                stale.append((claim, job))
                outcome.retry.append(claim.job_id)
            else:
                reason = "missing" if job is None else str(job.status)
                metrics.redeliveries_skipped.labels(reason).inc()
                outcome.skipped[claim.job_id] = Skip.NOT_QUEUED
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
