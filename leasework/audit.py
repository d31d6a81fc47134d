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
``tick_twice``
    a schedule's tick has more than one job (the tick row should have let one insert only):
    the schedule fired twice for one instant. Every job of the tick is named.
``over_limit``
    more attempts of a concurrency limit's jobs (its type's, per key) ran at one instant
    than the limit allows (as the type registers it now): the claim's stamp should have held
    the job instead. Counted from the attempts' spans, started to finished (a reaped
    attempt's span ends when the reaper took it back, as its slot did).
``unique_twice``
    two jobs of one unique key certainly held it at the same time: an attempt of each ran at
    once, or one ran after the other finished in a state its key holds in. The unique index
    should have refused the second insert. Both jobs are named.

Effects and outcomes are checked for finished jobs (their attempts are closed); leases and
queues on what is waiting now; a finished job's tick and unique key against the other jobs
that carry them (whatever their state), so a double is found when the first of its jobs
finishes.

A job's insert time is not recorded (``created_at`` is its transaction's start, which may be
long before the insert, in a caller's transaction), so the key check asks only what the
attempts prove: two jobs of a key that ran one after the other, neither holding it once
finished, are not found even if the second was inserted while the first waited. The check
misses such a double rather than page on one that may not be.
"""

from __future__ import annotations

import bisect
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
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
    TICK_TWICE = "tick_twice"
    UNIQUE_TWICE = "unique_twice"
    OVER_LIMIT = "over_limit"


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
    Kind.TICK_TWICE: "one tick of a schedule, more than one job",
    Kind.UNIQUE_TWICE: "held its unique key at the same time as another job",
    Kind.OVER_LIMIT: "ran while its concurrency or rate limit was already full",
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
    schedule: str | None = None  # the schedule and tick it was fired for, if any
    tick_at: datetime | None = None
    unique_key: bytes | None = None  # its unique key, if it asked for one
    limit_key: str | None = None  # the concurrency limit it ran under, if its type has one
    queue: str = "default"  # the queue it ran in (a queue's cap is a limit too)
    rate_key: str | None = None  # the rate limit its starts count against, if any


@dataclass(frozen=True)
class TickJob:
    """A job that carries a schedule's tick (``schedule``, ``tick_at``)."""

    id: uuid.UUID
    schedule: str
    tick_at: datetime


@dataclass(frozen=True)
class KeyJob:
    """A job of a unique key and the spans in which it certainly held the key: each of its
    attempts (``started``, ``finished``; None: still running), and from its ``finished_at``
    on when it finished in one of its key's states (``holds_final``)."""

    id: uuid.UUID
    unique_key: bytes
    attempts: tuple[tuple[datetime, datetime | None], ...] = ()
    finished_at: datetime | None = None
    holds_final: bool = False

    def spans(self) -> list[tuple[datetime, datetime | None]]:
        final = [(self.finished_at, None)] if self.holds_final and self.finished_at else []
        return [*self.attempts, *final]


def _overlap(a: tuple[datetime, datetime | None], b: tuple[datetime, datetime | None]) -> bool:
    return (b[1] is None or a[0] < b[1]) and (a[1] is None or b[0] < a[1])


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


def check_ticks(jobs: Iterable[FinishedJob], tick_jobs: Iterable[TickJob]) -> list[Violation]:
    """Every job of a tick that has more than one, for the ticks of the finished ``jobs``
    (``tick_jobs``: every job of those ticks)."""
    of: dict[tuple[str, datetime], list[TickJob]] = {}
    for row in tick_jobs:
        of.setdefault((row.schedule, row.tick_at), []).append(row)
    found: dict[uuid.UUID, Violation] = {}
    for job in jobs:
        if job.schedule is None or job.tick_at is None:
            continue
        carried = of.get((job.schedule, job.tick_at), [])
        if len(carried) < 2:
            continue
        for row in carried:
            others = ", ".join(str(o.id) for o in carried if o.id != row.id)
            found[row.id] = Violation(
                Kind.TICK_TWICE,
                row.id,
                f"tick {job.tick_at.isoformat()} of schedule {job.schedule} has "
                f"{len(carried)} jobs: this one and {others}",
            )
    return list(found.values())


def check_unique_keys(jobs: Iterable[FinishedJob], key_jobs: Iterable[KeyJob]) -> list[Violation]:
    """For each finished job with a key, the other jobs of its key that certainly held it at
    the same time (``key_jobs``: every job of those keys, with their spans): both named."""
    of: dict[bytes, list[KeyJob]] = {}
    for row in key_jobs:
        of.setdefault(row.unique_key, []).append(row)
    found: dict[uuid.UUID, Violation] = {}
    for job in jobs:
        if job.unique_key is None:
            continue
        holders = of.get(job.unique_key, [])
        mine = next((h for h in holders if h.id == job.id), None)
        if mine is None:
            continue
        for other in holders:
            if other.id == job.id or not any(
                _overlap(a, b) for a in mine.spans() for b in other.spans()
            ):
                continue
            for one, two in ((job.id, other.id), (other.id, job.id)):
                found.setdefault(
                    one,
                    Violation(
                        Kind.UNIQUE_TWICE,
                        one,
                        f"held its unique key {job.unique_key.hex()[:16]} at the same time as "
                        f"job {two} (both running, or one running after the other finished "
                        "in a state the key holds in)",
                    ),
                )
    return list(found.values())


@dataclass(frozen=True)
class LimitSpan:
    """An attempt of a job that ran under a concurrency limit: started, finished (None:
    still running)."""

    job_id: uuid.UUID
    limit_key: str
    started: datetime
    finished: datetime | None


def most_at_once(mine: LimitSpan, spans: Iterable[LimitSpan]) -> int:
    """The most of ``spans`` (its limit's attempts, ``mine`` among them) running at one
    instant while ``mine`` ran: the count peaks where one of them starts."""
    spans = list(spans)
    points = [s.started for s in spans if _overlap((s.started, s.started), _span(mine))]
    points.append(mine.started)
    return max(
        sum(1 for s in spans if s.started <= p and (s.finished is None or p < s.finished))
        for p in points
    )


def _span(s: LimitSpan) -> tuple[datetime, datetime | None]:
    return (s.started, s.finished)


def peaks(spans: Sequence[LimitSpan]) -> list[int]:
    """:func:`most_at_once` of each of ``spans`` (one limit's attempts) against them all, in
    O(n log n) rather than n times O(n): the running count at each start (starts so far less
    finishes so far), and for each span the most of those counts at the starts within it, by
    a sparse table of maxima. A queue's cap is one limit for every job of the queue, so a
    pass of 5,000 capped jobs took 18 s the quadratic way (measured, tools/bench/audit.py);
    the result is the same (tests/unit/test_audit.py checks it against
    :func:`most_at_once`)."""
    live = [s for s in spans if s.finished is None or s.started < s.finished]
    starts = sorted(s.started for s in live)
    finishes = sorted(s.finished for s in live if s.finished is not None)
    points = sorted(set(starts))
    counts = [bisect.bisect_right(starts, p) - bisect.bisect_right(finishes, p) for p in points]
    most = RangeMax(counts)
    result = []
    for s in spans:
        if s.finished is not None and s.finished <= s.started:  # the others at its start
            at = s.started
            result.append(bisect.bisect_right(starts, at) - bisect.bisect_right(finishes, at))
            continue
        lo = bisect.bisect_left(points, s.started)
        hi = len(points) if s.finished is None else bisect.bisect_left(points, s.finished)
        result.append(most(lo, hi))
    return result


class RangeMax:
    """The most of ``values[lo:hi]`` in O(1) after O(n log n) (a sparse table: level ``j``
    holds the most of each run of ``2**j``)."""

    def __init__(self, values: Sequence[int]) -> None:
        self.table = [list(values)]
        while 2 ** len(self.table) <= len(values):
            last, half = self.table[-1], 2 ** (len(self.table) - 1)
            self.table.append([max(last[i], last[i + half]) for i in range(len(last) - half)])

    def __call__(self, lo: int, hi: int) -> int:
        """The most of ``values[lo:hi]``; 0 for an empty range."""
        if hi <= lo:
            return 0
        level = (hi - lo).bit_length() - 1
        return max(self.table[level][lo], self.table[level][hi - 2**level])


def check_limits(
    jobs: Iterable[FinishedJob], spans: Iterable[LimitSpan], limits: Mapping[str, int]
) -> list[Violation]:
    """Each finished job with a limit key one of whose attempts ran while more attempts of
    its key were running than its type's limit (``limits``, by type; a queue's cap is the
    limit ``@<queue>``, see :func:`queue_capped`) allows. ``spans``: every attempt of the
    jobs of those keys that may overlap."""
    of: dict[str, list[LimitSpan]] = {}
    for s in spans:
        of.setdefault(s.limit_key, []).append(s)
    # the most at once while each attempt ran, by (limit key, job id): computed per key once
    most_of: dict[tuple[str, uuid.UUID], int] = {}
    for key, key_spans in of.items():
        for s, most in zip(key_spans, peaks(key_spans), strict=True):
            most_of[key, s.job_id] = max(most_of.get((key, s.job_id), 0), most)
    found = []
    for job in jobs:
        limit = limits.get((job.limit_key or "").split("/", 1)[0])
        if job.limit_key is None or limit is None:
            continue
        most = most_of.get((job.limit_key, job.id), 0)
        if most > limit:
            found.append(
                Violation(
                    Kind.OVER_LIMIT,
                    job.id,
                    f"ran while {most} attempts of its limit {job.limit_key} ran at once; its "
                    f"limit is {limit}",
                )
            )
    return found


def queue_capped(jobs: Iterable[FinishedJob], caps: Mapping[str, int]) -> list[FinishedJob]:
    """The jobs of the queues ``caps`` caps, each as a job of the limit ``@<queue>`` (the
    name a held job's ``held_for`` gives a queue's cap), for :func:`check_limits` with
    :func:`cap_limits`."""
    return [replace(j, limit_key=f"@{j.queue}") for j in jobs if j.queue in caps]


def cap_limits(caps: Mapping[str, int]) -> dict[str, int]:
    """Queue caps as :func:`check_limits` takes limits."""
    return {f"@{queue}": cap for queue, cap in caps.items()}


@dataclass(frozen=True)
class RateStart:
    """An attempt's start that counts against a rate limit."""

    job_id: uuid.UUID
    rate_key: str
    started: datetime


@dataclass(frozen=True)
class RateRule:
    """A type's rate limit as the auditor holds starts to it: ``count`` per ``per`` seconds,
    ``burst`` at once."""

    count: int
    per: float
    burst: int

    @property
    def allowed(self) -> int:
        """The most starts any window of ``per`` seconds may hold: GCRA hands out one per
        ``per / count`` seconds after up to ``burst`` at once, so ``count`` plus ``burst``
        (one more than the steady rate for the window's two ends, and the burst's head)."""
        return self.count + self.burst


def most_in_window(mine: datetime, starts: Iterable[datetime], per: float) -> int:
    """The most of ``starts`` (``mine`` among them) within a window of ``per`` seconds,
    half-open, that holds ``mine``."""
    width = timedelta(seconds=per)
    near = sorted(t for t in starts if mine - width < t < mine + width)
    return max(
        (sum(1 for t in near if first <= t < first + width) for first in near if first <= mine),
        default=0,
    )


def window_peaks(starts: Sequence[datetime], per: float) -> list[int]:
    """:func:`most_in_window` of each of ``starts`` (one rate key's) against them all, in
    O(n log n): the count of the window opened by each start, and for each start the most of
    those over the starts that open a window holding it (within ``per`` seconds before it).
    A rate with no key is one key for all of its type's jobs, which the count by each job in
    turn made quadratic (as :func:`peaks` says of a queue's cap)."""
    width = timedelta(seconds=per)
    ordered = sorted(starts)
    counts = [
        bisect.bisect_left(ordered, t + width) - bisect.bisect_left(ordered, t) for t in ordered
    ]
    most = RangeMax(counts)
    return [
        most(bisect.bisect_right(ordered, t - width), bisect.bisect_right(ordered, t))
        for t in starts
    ]


def check_rates(
    jobs: Iterable[FinishedJob], starts: Iterable[RateStart], rules: Mapping[str, RateRule]
) -> list[Violation]:
    """Each finished job with a rate key one of whose attempts started within a window of
    its rate (``rules``, by type) holding more starts of its key than the rate allows
    (:attr:`RateRule.allowed`). ``starts``: every start of those keys near theirs."""
    of: dict[str, list[RateStart]] = {}
    for s in starts:
        of.setdefault(s.rate_key, []).append(s)
    # the most in a window while each start ran, by (rate key, job id): per key once
    most_of: dict[tuple[str, uuid.UUID], int] = {}
    for key, key_starts in of.items():
        rule = rules.get(key.split("/", 1)[0])
        if rule is None:
            continue
        times = [s.started for s in key_starts]
        for s, most in zip(key_starts, window_peaks(times, rule.per), strict=True):
            most_of[key, s.job_id] = max(most_of.get((key, s.job_id), 0), most)
    found = []
    for job in jobs:
        rule = rules.get((job.rate_key or "").split("/", 1)[0])
        if job.rate_key is None or rule is None:
            continue
        most = most_of.get((job.rate_key, job.id), 0)
        if most > rule.allowed:
            found.append(
                Violation(
                    Kind.OVER_LIMIT,
                    job.id,
                    f"started with {most} starts of its rate limit {job.rate_key} within "
                    f"{rule.per:g}s; its rate allows {rule.allowed} ({rule.count} per "
                    f"{rule.per:g}s, burst {rule.burst})",
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
        schedule=row.get("schedule"),
        tick_at=row.get("tick_at"),
        unique_key=bytes(row["unique_key"]) if row.get("unique_key") is not None else None,
        limit_key=row.get("limit_key"),
        queue=row.get("queue") or "default",
        rate_key=row.get("rate_key"),
    )


def tick_job(row: Mapping[str, Any]) -> TickJob:
    return TickJob(id=row["id"], schedule=row["schedule"], tick_at=row["tick_at"])


def key_jobs(
    rows: Iterable[Mapping[str, Any]], attempts: Iterable[Mapping[str, Any]]
) -> list[KeyJob]:
    """The jobs of some keys (id, unique_key, finished_at, holds_final) with their attempts
    (job_id, started_at, finished_at)."""
    spans: dict[uuid.UUID, list[tuple[datetime, datetime | None]]] = {}
    for a in attempts:
        if a["started_at"] is not None:
            spans.setdefault(a["job_id"], []).append((a["started_at"], a["finished_at"]))
    return [
        KeyJob(
            id=r["id"],
            unique_key=bytes(r["unique_key"]),
            attempts=tuple(spans.get(r["id"], ())),
            finished_at=r["finished_at"],
            holds_final=bool(r["holds_final"]),
        )
        for r in rows
    ]


def attempt_row(row: Mapping[str, Any]) -> AttemptRow:
    return AttemptRow(
        job_id=row["job_id"],
        attempt=int(row["attempt"]),
        fence=int(row["fence"]),
        outcome=row["outcome"],
        effects_committed=bool(row["effects_committed"]),
    )
