"""The pruner: keeps the tables bounded by deleting what has been finished for long enough.

Finished jobs go after their state's retention (``LEASEWORK_RETAIN_SUCCEEDED``, ``_DEAD``,
``_CANCELLED``), taking their outbox rows, attempts and effects with them; outbox rows Kafka
acknowledged go after ``LEASEWORK_RETAIN_OUTBOX``. Each pass deletes in batches claimed with
``FOR UPDATE SKIP LOCKED``, so several relays prune side by side without waiting on each
other. A pruned job's idempotency key is free again: a replay after the retention makes a new
job (the README says so).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from leasework import metrics, store
from leasework.config import Settings
from leasework.db import Database
from leasework.service import pass_failed
from leasework.states import Status

log = logging.getLogger("leasework.pruner")

BATCH = 1000  # rows per statement: short transactions, bounded lock time


@dataclass(frozen=True)
class Retention:
    """Seconds each kind of finished row is kept; None keeps it for ever."""

    succeeded: float | None
    dead: float | None
    cancelled: float | None
    outbox: float | None

    @classmethod
    def from_settings(cls, settings: Settings) -> Retention:
        return cls(
            succeeded=settings.retain_succeeded,
            dead=settings.retain_dead,
            cancelled=settings.retain_cancelled,
            outbox=settings.retain_outbox,
        )

    def of_jobs(self) -> dict[Status, float | None]:
        return {
            Status.SUCCEEDED: self.succeeded,
            Status.DEAD: self.dead,
            Status.CANCELLED: self.cancelled,
        }


@dataclass(frozen=True)
class PruneCounts:
    jobs: dict[Status, int]
    outbox: int


class Pruner:
    def __init__(self, db: Database, retention: Retention, *, batch: int = BATCH) -> None:
        self.db = db
        self.retention = retention
        self.batch = batch

    async def run_once(self) -> PruneCounts:
        """Delete everything past its retention now, a batch at a time; returns the counts."""
        counts: dict[Status, int] = {}
        for status, keep in self.retention.of_jobs().items():
            if keep is None:
                continue
            counts[status] = 0
            while True:
                deleted = await self.db.run(store.jobs_prune, status, keep, self.batch)
                counts[status] += deleted
                metrics.jobs_pruned.labels(str(status)).inc(deleted)
                if deleted < self.batch:
                    break
        outbox = 0
        if self.retention.outbox is not None:
            while True:
                deleted = await self.db.run(store.outbox_prune, self.retention.outbox, self.batch)
                outbox += deleted
                if deleted < self.batch:
                    break
        return PruneCounts(counts, outbox)

    async def run(self, interval: float) -> None:
        while True:
            try:
                counts = await self.run_once()
                if any(counts.jobs.values()) or counts.outbox:
                    log.info(
                        "pruned",
                        extra={
                            "jobs": {str(k): v for k, v in counts.jobs.items()},
                            "outbox": counts.outbox,
                        },
                    )
            except Exception as exc:  # the loop must outlive any one pass
                pass_failed("pruner", exc)
            await trio.sleep(interval)
