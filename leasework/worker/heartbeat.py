"""The heartbeat: one loop renews every running lease of a worker, in one Redis script call
and one statement per tick (every TTL/3), and acts on each job alone: a renewal moves that
handler's deadline forward, a lost lease or a cancel request cancels that handler.

A renewal that fails (Redis or Postgres unreachable) leaves every deadline where it was: if
renewals keep failing, each handler is cancelled at its own deadline, which is the worker's
lower bound of when its lease is still valid.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import psycopg
import redis
import trio

from leasework import metrics, store
from leasework.db import Database
from leasework.lease import Claim, Leases
from leasework.store import operators

log = logging.getLogger("leasework.worker.heartbeat")

LEASE_MARGIN_FRACTION = 0.2  # a handler's deadline is renewal + TTL * (1 - margin)


def lease_deadline(renewed_at: float, ttl: float) -> float:
    """The worker's own lower bound of when its lease is still valid (monotonic clock)."""
    return renewed_at + ttl * (1 - LEASE_MARGIN_FRACTION)


class CancelReason(StrEnum):
    """Why a handler's scope was cancelled."""

    LEASE = "lease"  # the lease was lost or its deadline passed
    REQUEST = "request"  # a cancel was requested through the API
    SHUTDOWN = "shutdown"  # the worker is stopping


@dataclass
class RunningJob:
    """A handler in flight: its claim, the cancel scope whose deadline is its lease bound,
    and why that scope was cancelled, if it was."""

    claim: Claim
    scope: trio.CancelScope
    reason: CancelReason | None = None
    completing: bool = False  # the handler returned: its outcome is on its way to the store
    lane: str = "trio"  # where its handler runs (leasework.lanes)
    type: str = ""  # its job type (named when the loop guard sees the loop blocked)
    timeout: float = float("inf")  # its own timeout, seconds

    @property
    def job_id(self) -> uuid.UUID:
        return self.claim.job_id

    def cancel(self, reason: CancelReason) -> None:
        if self.reason is None:
            self.reason = reason
        self.scope.cancel()


@dataclass(frozen=True)
class Beat:
    """What one tick did, for tests: leases renewed, handlers cancelled, and whether the
    renewal failed as a whole."""

    renewed: int = 0
    lost: int = 0
    cancel_requested: int = 0
    failed: bool = False


class Heartbeat:
    def __init__(
        self,
        db: Database,
        leases: Leases,
        running: Callable[[], list[RunningJob]],
        *,
        ttl: float,
        notices_loss: bool = True,
    ) -> None:
        """``running()`` lists the handlers to renew; ``notices_loss=False`` is the plain-TTL
        demonstration, which neither cancels on a lost lease nor moves deadlines."""
        self.db = db
        self.leases = leases
        self.running = running
        self.ttl = ttl
        self.notices_loss = notices_loss

    async def run_once(self) -> Beat:
        jobs = [r for r in self.running() if not r.completing]
        if not jobs:
            return Beat()
        sent = trio.current_time()
        try:
            held = await self.leases.renew_many([r.claim for r in jobs], self.ttl)
            ours = await self.db.run(
                store.jobs_heartbeat_many, [(r.job_id, r.claim.fence) for r in jobs], self.ttl
            )
        except (redis.RedisError, psycopg.Error) as exc:
            metrics.lease_renewals.labels("error").inc(len(jobs))
            log.warning("lease renewal failed", extra={"jobs": len(jobs), "error": str(exc)[:200]})
            return Beat(failed=True)
        metrics.lease_renewal_seconds.observe(trio.current_time() - sent)
        renewed = lost = requested = 0
        for job, in_redis in zip(jobs, held, strict=True):
            if job.completing:
                continue  # returned meanwhile: nothing left to cancel
            if not (in_redis and job.job_id in ours):
                metrics.lease_renewals.labels("lost").inc()
                if not self.notices_loss:
                    continue  # a plain TTL lease does not notice that it lost the job
                log.warning(
                    "lease lost; cancelling the handler",
                    extra={"job_id": str(job.job_id), "fence": job.claim.fence},
                )
                metrics.lease_loss_cancellations.inc()
                job.cancel(CancelReason.LEASE)
                lost += 1
                continue
            metrics.lease_renewals.labels("ok").inc()
            if ours[job.job_id]:
                job.cancel(CancelReason.REQUEST)
                requested += 1
                continue
            renewed += 1
            if self.notices_loss:
                job.scope.deadline = lease_deadline(sent, self.ttl)
        return Beat(renewed, lost, requested)

    async def run(self) -> None:
        while True:
            await trio.sleep(self.ttl / 3)
            await self.run_once()


PRESENCE_EVERY = 5.0  # seconds between a worker's rows in `workers`


@dataclass(frozen=True)
class Presence:
    """What a worker says of itself in the ``workers`` table (the console's workers page)."""

    name: str
    app: str
    started_at: datetime
    capacity: int


async def presence_loop(db: Database, presence: Presence, running: Callable[[], int]) -> None:
    """Refresh this worker's row every PRESENCE_EVERY seconds, idle or not; an unreachable
    database skips a beat (the console then shows it as not seen lately)."""
    while True:
        try:
            await db.run(
                lambda conn: operators.worker_seen(
                    conn,
                    presence.name,
                    app=presence.app,
                    started_at=presence.started_at,
                    running=running(),
                    capacity=presence.capacity,
                )
            )
        except psycopg.Error as exc:
            log.info("cannot record presence", extra={"error": str(exc)[:200]})
        await trio.sleep(PRESENCE_EVERY)
