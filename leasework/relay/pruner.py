"""The pruner: keeps the tables bounded by deleting what has been finished for long enough.

Finished jobs go after their state's retention (``LEASEWORK_RETAIN_SUCCEEDED``, ``_DEAD``,
``_CANCELLED``), taking their outbox rows, attempts and effects with them; audit entries
(and the auditor's violations) go after ``_RETAIN_AUDIT``, Alertmanager's notifications
after ``_RETAIN_ALERTS``, schedules' recorded ticks and deletions after ``_RETAIN_TICKS`` (a
pruned tick can be backfilled again; the scheduler never goes back to it). (The outbox needs no
retention of its own: the relay deletes each row once Kafka acknowledged it.) Each pass
deletes in batches claimed with ``FOR UPDATE SKIP LOCKED``, so several relays prune side by
side without waiting on each other, until a batch comes back short. A pruned job's
idempotency key is free again: a replay after the retention makes a new job (the README says
so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from leasework import metrics, store
from leasework.config import Settings
from leasework.db import Database
from leasework.relay.service import Backoff, Pass, run_passes
from leasework.states import Status
from leasework.store.relay import rows_prune

log = logging.getLogger("leasework.relay.pruner")

BATCH = 1000  # rows per statement: short transactions, bounded lock time


@dataclass(frozen=True, kw_only=True)
class Retention:
    """Seconds each kind of row is kept; None keeps it for ever."""

    succeeded: float | None
    dead: float | None
    cancelled: float | None
    audit: float | None = None
    alerts: float | None = None
    ticks: float | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Retention:
        return cls(
            succeeded=settings.retain_succeeded,
            dead=settings.retain_dead,
            cancelled=settings.retain_cancelled,
            audit=settings.retain_audit,
            alerts=settings.retain_alerts,
            ticks=settings.retain_ticks,
        )

    def of_jobs(self) -> dict[Status, float | None]:
        return {
            Status.SUCCEEDED: self.succeeded,
            Status.DEAD: self.dead,
            Status.CANCELLED: self.cancelled,
        }

    def of_tables(self) -> dict[str, float | None]:
        """The tables pruned by age alone (store.relay.AGED_TABLES), by name."""
        return {
            "audit_log": self.audit,
            "alert_notifications": self.alerts,
            "schedule_ticks": self.ticks,
            "invariant_violations": self.audit,  # the auditor's findings: kept as long
            # when each schedule was deleted (the auditor tells a name's incarnations apart
            # by it): needed only while ticks of the deleted one may still be audited
            "schedule_deletions": self.ticks,
        }


@dataclass(frozen=True)
class PrunerConfig:
    # how long each kind of row is kept
    retention: Retention
    # rows deleted per statement
    batch: int = BATCH
    # seconds between passes (LEASEWORK_PRUNE_INTERVAL)
    interval: float = 60.0
    # after a failed pass: the interval (already longer than MAX_BACKOFF)
    backoff: Backoff = Backoff.from_interval(60.0)

    @classmethod
    def from_settings(cls, settings: Settings) -> PrunerConfig:
        return cls(
            Retention.from_settings(settings),
            interval=settings.prune_interval,
            backoff=Backoff.from_interval(settings.prune_interval),
        )


@dataclass(frozen=True)
class PruneCounts(Pass):
    """One pass: jobs deleted per final state, and rows deleted from each table of
    Retention.of_tables whose retention is not 'never'. A pass drains everything past its
    retention, so nothing more is waiting when it ends."""

    jobs: dict[Status, int]
    tables: dict[str, int]


class Pruner:
    def __init__(self, db: Database, config: PrunerConfig) -> None:
        self.db = db
        self.config = config

    async def _drain(self, count: Callable[[int], None], fn: Callable[..., int], *args) -> int:
        """Run the prune statement ``fn(conn, *args, batch)`` until a batch comes back short;
        ``count`` hears each batch's deletions. Returns the total."""
        total = 0
        while True:
            deleted = await self.db.run(fn, *args, self.config.batch)
            total += deleted
            count(deleted)
            if deleted < self.config.batch:
                return total

    async def run_once(self) -> PruneCounts:
        """Delete everything past its retention now, a batch at a time; returns the counts."""
        retention = self.config.retention
        jobs: dict[Status, int] = {}
        for status, keep in retention.of_jobs().items():
            if keep is not None:
                jobs[status] = await self._drain(
                    metrics.jobs_pruned.labels(str(status)).inc, store.jobs_prune, status, keep
                )
        tables: dict[str, int] = {}
        for table, keep in retention.of_tables().items():
            if keep is not None:
                tables[table] = await self._drain(
                    metrics.rows_pruned.labels(table).inc, rows_prune, table, keep
                )
        if any(jobs.values()) or any(tables.values()):
            log.info("pruned", extra={"jobs": {str(k): v for k, v in jobs.items()}, **tables})
        return PruneCounts(jobs, tables)

    async def run(self) -> None:
        await run_passes(
            "pruner", self.run_once, interval=self.config.interval, backoff=self.config.backoff
        )
