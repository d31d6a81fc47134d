"""The reaper: running jobs whose lease expired are taken back, a batch at a time.

Each pass locks the expired rows (``FOR UPDATE SKIP LOCKED``, so several relays reap side by
side), decides in Python what becomes of each with the worker's own retry-or-dead decision
(:func:`leasework.backoff.retry_or_dead`: ``failed`` with the job's backoff, else
``LEASEWORK_RETRY_BASE``/``_CAP``, or ``dead`` after its last attempt) and writes the whole
batch in one statement, in the same transaction. The fence is left as it is, so the lost
worker's late terminal write matches nothing.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg

from leasework import metrics, store
from leasework.config import Settings
from leasework.db import Database
from leasework.job import Job
from leasework.outcomes import Completion, RetryDefaults, retry_outcome
from leasework.relay.service import Backoff, Pass, run_passes
from leasework.states import Status, transition

log = logging.getLogger("leasework.relay.reaper")


@dataclass(frozen=True)
class ReaperConfig:
    # where a job that dies goes (LEASEWORK_TOPIC_DLQ's jobs.dlq)
    dlq_topic: str
    # the backoff of a job whose type sets none (LEASEWORK_RETRY_BASE, _CAP), in seconds
    retry_base: float
    retry_cap: float
    # expired leases taken back per statement
    batch: int = 200
    # seconds between passes, a full batch or not
    interval: float = 1.0
    # after a failed pass: the interval, doubling up to MAX_BACKOFF
    backoff: Backoff = Backoff.from_interval(1.0)

    @classmethod
    def from_settings(cls, settings: Settings) -> ReaperConfig:
        return cls(
            dlq_topic=settings.topic_dlq,
            retry_base=settings.retry_base,
            retry_cap=settings.retry_cap,
        )


@dataclass(frozen=True)
class Reaped(Pass):
    """One pass: expired jobs sent back to wait for a retry, and jobs that died. The next
    pass waits the interval even after a full batch (as the reaper always has)."""

    failed: int
    dead: int


def expired_outcome(job: Job, config: ReaperConfig, rng: random.Random | None = None) -> Completion:
    """What becomes of a running ``job`` whose lease expired, under the fence it ran with:
    ``failed`` with a retry delay (its own backoff, else the config's), or ``dead`` after
    its last attempt; the error names the lost worker and its fence."""
    error = f"lease of {job.lease_owner} expired (fence {job.fence})"
    outcome = retry_outcome(job, error, RetryDefaults(config.retry_base, config.retry_cap), rng=rng)
    transition(job.status, outcome.status)
    return Completion(job.id, job.fence, outcome)


def expired_outcomes(
    expired: Iterable[Job], config: ReaperConfig, rng: random.Random | None = None
) -> list[Completion]:
    """:func:`expired_outcome` of each of a batch of expired jobs."""
    return [expired_outcome(job, config, rng) for job in expired]


class Reaper:
    def __init__(self, db: Database, config: ReaperConfig) -> None:
        self.db = db
        self.config = config

    def _pass(self, conn: psycopg.Connection) -> list[tuple[uuid.UUID, Status]]:
        """The jobs taken back, longest expired first, with the status each was given."""
        decided = expired_outcomes(store.jobs_expired(conn, self.config.batch), self.config)
        written = store.jobs_reap_many(conn, decided, dlq_topic=self.config.dlq_topic)
        return [(c.job_id, written[c.job_id]) for c in decided if c.job_id in written]

    async def run_once(self) -> Reaped:
        """Take back one batch of expired leases; returns how many failed and how many died."""
        reaped = await self.db.run(self._pass)
        for job_id, status in reaped:
            metrics.lease_expirations.inc()
            log.warning(
                "lease expired; job requeued", extra={"job_id": str(job_id), "status": str(status)}
            )
        dead = sum(1 for _, status in reaped if status == Status.DEAD)
        return Reaped(failed=len(reaped) - dead, dead=dead)

    async def run(self) -> None:
        await run_passes(
            "reaper", self.run_once, interval=self.config.interval, backoff=self.config.backoff
        )
