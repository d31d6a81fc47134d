"""The auditor's invariants: the promise, checked on rows of the live tables (pure).

The chaos harness proves the promise on a test stack; the auditor checks the same things
about a team's own jobs, on their running system (:mod:`leasework.relay.auditor` runs it
incrementally; ``leasework audit`` over a window). Each finding is a :class:`Violation` of
one :class:`Kind`:

``effects_twice``
    more than one attempt of the job committed its fenced effects (``ctx.fenced``): the job
    took effect twice.
``effects_without_success``
    an attempt committed effects but its recorded outcome is not ``succeeded``: effects
    commit only with the success they belong to.
``succeeded_twice``
    more than one attempt of the job recorded ``succeeded`` (success is final: no operator
    retries a succeeded job).
``stale_outcome``
    the job's outcome was written under a fence older than its newest attempt's, or it
    succeeded while its current attempt recorded something else: a stale worker's write won.
``over_budget``
    the job ran more attempts than its ``max_attempts``.
``overdue_lease``
    the job is ``running`` past its lease by more than the grace: the reaper is not taking
    leases back.
``stuck_queued``
    the job has been due for longer than the bound, with no outbox row waiting and no
    attempt started since: it was published and never delivered (or never published).
``vanished``
    the job's row was deleted other than by the pruner: recorded by the delete itself (a
    trigger, migration 0009), counted by the auditor's next pass.

Effects and outcomes are checked for finished jobs (their attempts are closed); leases and
queues on what is waiting now.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from leasework.states import Status


class Kind(StrEnum):
    EFFECTS_TWICE = "effects_twice"
    EFFECTS_WITHOUT_SUCCESS = "effects_without_success"
    SUCCEEDED_TWICE = "succeeded_twice"
    STALE_OUTCOME = "stale_outcome"
    OVER_BUDGET = "over_budget"
    OVERDUE_LEASE = "overdue_lease"
    STUCK_QUEUED = "stuck_queued"
    VANISHED = "vanished"


# what each kind means for an operator, in a line (the report's and the console's legend)
MEANING: dict[Kind, str] = {
    Kind.EFFECTS_TWICE: "fenced effects committed by more than one attempt",
    Kind.EFFECTS_WITHOUT_SUCCESS: "effects committed by an attempt that did not succeed",
    Kind.SUCCEEDED_TWICE: "more than one attempt recorded success",
    Kind.STALE_OUTCOME: "the outcome was written under a fence that was no longer current",
    Kind.OVER_BUDGET: "more attempts than max_attempts",
    Kind.OVERDUE_LEASE: "running past its lease plus the grace",
    Kind.STUCK_QUEUED: "due long ago, neither waiting in the outbox nor started",
    Kind.VANISHED: "deleted, not by the pruner (recorded by the delete itself)",
}


@dataclass(frozen=True)
class FinishedJob:
    """A finished job as the auditor reads it."""

    id: uuid.UUID
    status: Status
    fence: int
    attempt: int
    max_attempts: int
    finished_at: datetime


@dataclass(frozen=True)
class AttemptRow:
    job_id: uuid.UUID
    attempt: int
    fence: int
    outcome: str | None
    effects_committed: bool


@dataclass(frozen=True)
class Violation:
    kind: Kind
    job_id: uuid.UUID
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "job_id": str(self.job_id), "detail": self.detail}


def _fences(rows: Iterable[AttemptRow]) -> str:
    return ", ".join(str(r.fence) for r in sorted(rows, key=lambda r: r.fence))


def check_finished(jobs: Iterable[FinishedJob], attempts: Iterable[AttemptRow]) -> list[Violation]:
    """The effects, outcome and budget invariants of finished jobs, given all their attempts."""
    of: dict[uuid.UUID, list[AttemptRow]] = {}
    for row in attempts:
        of.setdefault(row.job_id, []).append(row)
    found: list[Violation] = []
    for job in jobs:
        rows = of.get(job.id, [])
        committed = [r for r in rows if r.effects_committed]
        if len(committed) > 1:
            found.append(
                Violation(
                    Kind.EFFECTS_TWICE,
                    job.id,
                    f"{len(committed)} attempts committed effects (fences {_fences(committed)})",
                )
            )
        stray = [r for r in committed if r.outcome != Status.SUCCEEDED]
        if stray:
            found.append(
                Violation(
                    Kind.EFFECTS_WITHOUT_SUCCESS,
                    job.id,
                    "effects committed by attempt(s) that recorded "
                    + ", ".join(f"{r.outcome or 'no outcome'} (fence {r.fence})" for r in stray),
                )
            )
        succeeded = [r for r in rows if r.outcome == Status.SUCCEEDED]
        if len(succeeded) > 1:
            found.append(
                Violation(
                    Kind.SUCCEEDED_TWICE,
                    job.id,
                    f"{len(succeeded)} attempts recorded success (fences {_fences(succeeded)})",
                )
            )
        newest = max((r.fence for r in rows), default=None)
        current = [r for r in rows if r.fence == job.fence]
        if newest is not None and job.fence < newest:
            found.append(
                Violation(
                    Kind.STALE_OUTCOME,
                    job.id,
                    f"{job.status} written under fence {job.fence}, "
                    f"after an attempt under fence {newest} had started",
                )
            )
        elif job.status == Status.SUCCEEDED and all(r.outcome != job.status for r in current):
            # (a dead or cancelled job's last attempt may rightly say otherwise: the reaper
            # closes it lease_expired, an operator cancels a job waiting for its retry)
            found.append(
                Violation(
                    Kind.STALE_OUTCOME,
                    job.id,
                    f"the job succeeded but its attempt under fence {job.fence} recorded "
                    f"{current[0].outcome if current else 'nothing (no such attempt)'}",
                )
            )
        if job.attempt > job.max_attempts or len(rows) > job.max_attempts:
            found.append(
                Violation(
                    Kind.OVER_BUDGET,
                    job.id,
                    f"{max(job.attempt, len(rows))} attempts, max_attempts {job.max_attempts}",
                )
            )
    return found


def overdue_lease(job_id: uuid.UUID, overdue_seconds: float, owner: str | None) -> Violation:
    return Violation(
        Kind.OVERDUE_LEASE,
        job_id,
        f"running {overdue_seconds:.0f}s past its lease (held by {owner or 'nobody'})",
    )


def stuck_queued(job_id: uuid.UUID, due_seconds: float) -> Violation:
    return Violation(
        Kind.STUCK_QUEUED,
        job_id,
        f"queued and due for {due_seconds:.0f}s, no longer in the outbox (published) and "
        "not started since",
    )


@dataclass(frozen=True)
class AuditReport:
    """One audit: the finished jobs checked (those finished in ``since``..``through``), the
    waiting ones looked at, and what was found."""

    jobs_checked: int
    since: datetime | None
    through: datetime | None
    violations: tuple[Violation, ...]

    def by_kind(self) -> dict[str, int]:
        counts = Counter(str(v.kind) for v in self.violations)
        return {str(k): counts.get(str(k), 0) for k in Kind}

    @property
    def valid(self) -> bool:
        return not self.violations

    def text(self, *, limit: int = 50) -> str:
        """The report as the chaos checker prints one: counts by kind, then each violation."""
        window = (
            f"finished {self.since.isoformat() if self.since else 'from the start'} "
            f"through {self.through.isoformat() if self.through else 'now'}"
        )
        lines = [
            f"audit: {self.jobs_checked} finished job(s) checked ({window}), and the jobs "
            "running or waiting now",
            "",
            f"{'invariant':<26} {'violations':>10}  meaning",
        ]
        for kind, count in self.by_kind().items():
            lines.append(f"{kind:<26} {count:>10}  {MEANING[Kind(kind)]}")
        lines.append("")
        for v in self.violations[:limit]:
            lines.append(f"- {v.kind}: job {v.job_id}: {v.detail}")
        if len(self.violations) > limit:
            lines.append(f"- ... and {len(self.violations) - limit} more")
        lines.append(
            "result: VALID, nothing found"
            if self.valid
            else f"result: INVALID, {len(self.violations)} violation(s)"
        )
        return "\n".join(lines)


def finished_job(row: Mapping[str, Any]) -> FinishedJob:
    return FinishedJob(
        id=row["id"],
        status=Status(row["status"]),
        fence=int(row["fence"]),
        attempt=int(row["attempt"]),
        max_attempts=int(row["max_attempts"]),
        finished_at=row["finished_at"],
    )


def attempt_row(row: Mapping[str, Any]) -> AttemptRow:
    return AttemptRow(
        job_id=row["job_id"],
        attempt=int(row["attempt"]),
        fence=int(row["fence"]),
        outcome=row["outcome"],
        effects_committed=bool(row["effects_committed"]),
    )
