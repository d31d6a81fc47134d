"""The auditor: the promise checked continuously on the live tables (:mod:`leasework.audit`
holds the invariants, :mod:`leasework.store.audit` the statements).

Each pass, in one transaction: lock the auditor's row (``SKIP LOCKED``: with several relays,
one audits and the others skip the pass), check up to ``batch`` finished jobs after the
watermark, in (finished_at, id) order, with all their attempts, look at the running and
waiting jobs that break a bound now, count the jobs the delete trigger recorded as vanished
since the last pass, record what was found (a violation once per kind and job) and advance
the watermark. Finished jobs are taken only ``settle`` seconds after they
finished, so a finish whose transaction has not committed yet is not overtaken; a stale
write that finishes a job again moves its finished_at on, so it is checked again. The cost
of a pass follows its batch (``jobs_finished_idx``), not the size of the table.

The counts go to metrics (``leasework_audit_*``); the alert ``LeaseworkInvariantViolated``
fires on any new violation; ``leasework audit`` runs the same check over a window.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import psycopg

from leasework import metrics
from leasework.audit import Kind, Violation
from leasework.config import Settings
from leasework.db import Database
from leasework.relay.service import Backoff, Pass, run_passes
from leasework.store import audit as store_audit

log = logging.getLogger("leasework.relay.auditor")

BATCH = 5000


@dataclass(frozen=True)
class AuditorConfig:
    # seconds between passes when idle (LEASEWORK_AUDIT_INTERVAL; None, "never": no auditor)
    interval: float | None = 5.0
    # finished jobs per pass
    batch: int = BATCH
    # a finished job is checked this long after finished_at at the earliest
    settle: float = 5.0
    # a running job past its lease by more than this is a violation (the reaper is not working)
    lease_grace: float = 60.0
    # a queued job due longer than this, published and never started, is a violation
    stuck_after: float = 900.0
    backoff: Backoff = Backoff.from_interval(5.0)

    @classmethod
    def from_settings(cls, settings: Settings) -> AuditorConfig:
        interval = settings.audit_interval
        return cls(
            interval=interval,
            lease_grace=settings.audit_lease_grace,
            stuck_after=settings.audit_stuck_after,
            backoff=Backoff.from_interval(interval or 5.0),
        )


@dataclass(frozen=True)
class AuditPass(Pass):
    """One pass: finished jobs checked, the violations found that were new, the watermark
    after it; ``skipped`` when another relay's pass held the auditor's row."""

    checked: int
    found: tuple[Violation, ...]
    through: datetime | None
    skipped: bool = False
    full: bool = False

    @property
    def more_waiting(self) -> bool:
        return self.full


def audit_pass(conn: psycopg.Connection, config: AuditorConfig) -> AuditPass:
    """One pass, in the caller's transaction (blocking)."""
    done = store_audit.audit_pass(
        conn,
        batch=config.batch,
        settle=config.settle,
        lease_grace=config.lease_grace,
        stuck_after=config.stuck_after,
    )
    through = done.watermark.finished_at if done.watermark is not None else None
    return AuditPass(
        done.checked, done.found, through, done.skipped, full=done.checked >= config.batch
    )


class Auditor:
    def __init__(self, db: Database, config: AuditorConfig) -> None:
        self.db = db
        self.config = config
        for kind in Kind:  # every series exists from the start: the alert sees the first one
            metrics.audit_violations.labels(str(kind))

    async def run_once(self) -> AuditPass:
        done = await self.db.run(audit_pass, self.config)
        if done.skipped:
            return done
        metrics.audit_jobs_checked.inc(done.checked)
        for violation in done.found:
            metrics.audit_violations.labels(str(violation.kind)).inc()
            log.error(
                "invariant violated",
                extra={
                    "kind": str(violation.kind),
                    "job_id": str(violation.job_id),
                    "detail": violation.detail,
                },
            )
        if done.through is not None:
            metrics.audit_watermark.set(done.through.timestamp())
        metrics.audit_last_pass.set_to_current_time()
        return done

    async def run(self) -> None:
        if self.config.interval is None:
            log.info("auditor off (LEASEWORK_AUDIT_INTERVAL=never)")
            return
        await run_passes(
            "auditor", self.run_once, interval=self.config.interval, backoff=self.config.backoff
        )
