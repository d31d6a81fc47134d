"""The pruner: keeps the tables bounded by deleting what has been finished for long enough.

Finished jobs go after their state's retention (``LEASEWORK_RETAIN_SUCCEEDED``, ``_DEAD``,
``_CANCELLED``), taking their outbox rows, attempts and effects with them; outbox rows Kafka
acknowledged go after ``LEASEWORK_RETAIN_OUTBOX``, audit entries after ``_RETAIN_AUDIT``,
Alertmanager's notifications after ``_RETAIN_ALERTS``. Each pass deletes in batches claimed
with ``FOR UPDATE SKIP LOCKED``, so several relays prune side by side without waiting on each
other. A pruned job's idempotency key is free again: a replay after the retention makes a new
job (the README says so).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import trio

from leasework import metrics, store
from leasework.config import Settings
from leasework.db import Database
from leasework.service import pass_failed
from leasework.states import Status
from leasework.store.relay import rows_prune

log = logging.getLogger("leasework.relay.pruner")

BATCH = 1000  # rows per statement: short transactions, bounded lock time


@dataclass(frozen=True)
class Retention:
    """Seconds each kind of row is kept; None keeps it for ever."""

    succeeded: float | None
    dead: float | None
    cancelled: float | None
    outbox: float | None
    audit: float | None = None
    alerts: float | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Retention:
        return cls(
            succeeded=settings.retain_succeeded,
            dead=settings.retain_dead,
            cancelled=settings.retain_cancelled,
            outbox=settings.retain_outbox,
            audit=settings.retain_audit,
            alerts=settings.retain_alerts,
        )

    def of_jobs(self) -> dict[Status, float | None]:
        return {
            Status.SUCCEEDED: self.succeeded,
            Status.DEAD: self.dead,
            Status.CANCELLED: self.cancelled,
        }

    def of_tables(self) -> dict[str, float | None]:
        """The tables pruned by age alone (store.relay.AGED_TABLES), by name."""
        return {"outbox": self.outbox, "audit_log": self.audit, "alert_notifications": self.alerts}


@dataclass(frozen=True)
class PruneCounts:
    jobs: dict[Status, int]
    outbox: int
    # rows deleted from each table of Retention.of_tables whose retention is not 'never'
    tables: dict[str, int]


class Pruner:
    def __init__(self, db: Database, retention: Retention, *, batch: int = BATCH) -> None:
        self.db = db
        self.retention = retention
        self.batch = batch

    async def _drain(self, count: Callable[[int], None], fn: Callable[..., int], *args) -> int:
        """Run the prune statement ``fn(conn, *args, batch)`` until a batch comes back short;
        ``count`` hears each batch's deletions. Returns the total."""
        total = 0
        while True:
            deleted = await self.db.run(fn, *args, self.batch)
            total += deleted
            count(deleted)
            if deleted < self.batch:
                return total

    async def run_once(self) -> PruneCounts:
        """Delete everything past its retention now, a batch at a time; returns the counts."""
        jobs: dict[Status, int] = {}
        for status, keep in self.retention.of_jobs().items():
            if keep is not None:
                jobs[status] = await self._drain(
                    metrics.jobs_pruned.labels(str(status)).inc, store.jobs_prune, status, keep
                )
        tables: dict[str, int] = {}
        for table, keep in self.retention.of_tables().items():
            if keep is not None:
                tables[table] = await self._drain(
                    metrics.rows_pruned.labels(table).inc, rows_prune, table, keep
                )
        return PruneCounts(jobs, tables.get("outbox", 0), tables)

    async def run(self, interval: float) -> None:
        while True:
            try:
                counts = await self.run_once()
                if any(counts.jobs.values()) or any(counts.tables.values()):
                    jobs = {str(k): v for k, v in counts.jobs.items()}
                    log.info("pruned", extra={"jobs": jobs, **counts.tables})
            except Exception as exc:  # the loop must outlive any one pass
                pass_failed("pruner", exc)
            await trio.sleep(interval)
