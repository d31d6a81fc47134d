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
    the job ran more attempts than its ``max_attempts``: the budget in force, since an
    operator's retry of a dead or cancelled job raises it (to its attempts so far plus its
    ``attempt_budget``) and nothing lowers it. The job's row and its attempts are read in
    one statement, so the budget is the one in force for the attempts read with it (read
    apart, a retry and its new attempt committed between the two reads made a job seem
    over its budget, and its outcome stale).
``overdue_lease``
    the job is ``running`` past its lease by more than the grace: the reaper is not taking
    leases back. The lease is the one its claim (or its latest heartbeat) recorded,
    ``lease_expires_at``, under the TTL of the worker that wrote it: a TTL changed since
    changes nothing about it.
``stuck_queued``
    the job has been due for longer than the bound, with no outbox row waiting and no
    attempt started since: it was published and never delivered (or never published). Due
    since the later of its ``run_at`` and its insert: a job inserted with a ``run_at`` long
    past (a backfilled tick) has waited only since it exists.
``vanished``
    the job's row was deleted other than by the pruner: recorded by the delete itself (a
    trigger, migration 0009), counted by the auditor's next pass.
``tick_twice``
    a schedule's tick has more than one job (the tick row should have let one insert only):
    the schedule fired twice for one instant. Every job of the tick is named. A schedule
    deleted and created again under its name (the api's way to change one) is another
    schedule: its ticks are new, and a backfill may rightly give an instant the deleted one
    fired a job again, so jobs created on either side of a deletion of the name (recorded by
    the delete, migration 0025) are not counted together.
``over_limit``
    an attempt started while more attempts of its concurrency limit (its type's, per key, or
    its queue's cap) ran, itself included, than the limit in force at that start allowed:
    the limit the claim's stamp applied, recorded on the attempt (migration 0025), so a cap
    lowered while jobs ran judges only the starts after it by the new one. Counted from the
    attempts' spans, started to finished (a reaped attempt's span ends when the reaper took
    it back, as its slot did). Or an attempt started with more starts of its rate limit's
    key within the rate's period up to it than the rate in force then allowed (the rate
    recorded on the attempt; only the starts made under that same rate count). An attempt
    from before migration 0025 has nothing recorded and is judged against the limits as
    they are now.
``unique_twice``
    two jobs of one unique key certainly held it at the same time: an attempt of each ran at
    once, or one ran after the other finished in a state its key holds in. The unique index
    should have refused the second insert. Both jobs are named. The states a job's key holds
    in are the ones its insert recorded (``unique_states``, from the policy then), so a
    policy changed between two jobs of a key judges each by its own.

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
    type: str | None = None  # its type (its rate now, for an attempt that recorded none)


@dataclass(frozen=True)
class TickJob:
    """A job that carries a schedule's tick (``schedule``, ``tick_at``), and when it was
    created (its insert's transaction's start)."""

    id: uuid.UUID
    schedule: str
    tick_at: datetime
    created_at: datetime | None = None


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

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None) -> RateRule | None:
        """The rule of a rate as ``job_types.rate`` holds it (``{"count", "per", "burst",
        "key"}``); None for none."""
        if not isinstance(spec, Mapping):
            return None
        return cls(int(spec["count"]), float(spec["per"]), int(spec.get("burst") or 1))


@dataclass(frozen=True)
class AttemptRow:
    """An attempt of a finished job, and the limits its claim's stamp applied to it
    (``limits_recorded``; migration 0025): its type's concurrency limit, its queue's cap, its
    type's rate (None: none was in force). An attempt opened before that records none."""

    job_id: uuid.UUID
    attempt: int
    fence: int
    outcome: str | None
    effects_committed: bool
    limits_recorded: bool = False
    key_limit: int | None = None
    queue_limit: int | None = None
    rate: RateRule | None = None


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


def check_ticks(
    jobs: Iterable[FinishedJob],
    tick_jobs: Iterable[TickJob],
    deletions: Mapping[str, Iterable[datetime]] | None = None,
) -> list[Violation]:
    """Every job of a tick that has more than one, for the ticks of the finished ``jobs``
    (``tick_jobs``: every job of those ticks). ``deletions``: when schedules of those names
    were deleted (migration 0025); the jobs of a name created on either side of a deletion
    were two schedules' (the deleted one's, the one created after it), and each schedule's
    ticks are counted on their own."""
    ends = {name: sorted(times) for name, times in (deletions or {}).items()}
    # each tick's jobs by which schedule of its name made them (the deletions before each)
    of: dict[tuple[str, datetime], dict[int, list[TickJob]]] = {}
    made_by: dict[uuid.UUID, int] = {}
    for row in tick_jobs:
        gone = ends.get(row.schedule, [])
        which = 0 if row.created_at is None else bisect.bisect_right(gone, row.created_at)
        of.setdefault((row.schedule, row.tick_at), {}).setdefault(which, []).append(row)
        made_by[row.id] = which
    found: dict[uuid.UUID, Violation] = {}
    for job in jobs:
        if job.schedule is None or job.tick_at is None:
            continue
        for which, carried in of.get((job.schedule, job.tick_at), {}).items():
            if len(carried) < 2 or made_by.get(job.id, which) != which:
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
    still running), and the limit its claim's stamp applied (``recorded``, migration 0025;
    ``limit`` None: none was in force). One opened before that records nothing."""

    job_id: uuid.UUID
    limit_key: str
    started: datetime
    finished: datetime | None
    recorded: bool = False
    limit: int | None = None

    @property
    def ran(self) -> bool:
        """Whether it held a slot for any time (a span finishing where or before it started
        did not, at least to the clock's resolution)."""
        return self.finished is None or self.started < self.finished


def running_at_start(mine: LimitSpan, spans: Iterable[LimitSpan]) -> int:
    """How many of ``spans`` (its limit's attempts, ``mine`` among them) were running when
    ``mine`` started, itself included: started at or before that instant and not finished
    by it (an attempt that finished at that very instant had freed its slot)."""
    at = mine.started
    return sum(
        1
        for s in spans
        if s is mine or (s.started <= at and (s.finished is None or at < s.finished))
    )


def running_at_starts(spans: Sequence[LimitSpan]) -> list[int]:
    """:func:`running_at_start` of each of ``spans`` (one limit's attempts) against them all,
    in O(n log n) rather than n times O(n): at each start, the starts so far less the
    finishes so far. A queue's cap is one limit for every job of the queue, so a pass of
    5,000 capped jobs took 18 s the quadratic way (measured, tools/bench/audit.py);
    tests/unit/test_audit.py checks the two agree."""
    starts = sorted(s.started for s in spans if s.ran)
    finishes = sorted(s.finished for s in spans if s.ran and s.finished is not None)
    return [
        bisect.bisect_right(starts, s.started)
        - bisect.bisect_right(finishes, s.started)
        + (0 if s.ran else 1)  # (itself, not among the spans that held a slot)
        for s in spans
    ]


def check_limits(
    jobs: Iterable[FinishedJob], spans: Iterable[LimitSpan], limits: Mapping[str, int]
) -> list[Violation]:
    """Each finished job with a limit key one of whose attempts started while more attempts
    of its key ran, itself included, than the limit in force at that start: the one its
    claim's stamp applied (recorded on the attempt), else, for an attempt from before
    migration 0025, its type's limit as registered now (``limits``, by type; a queue's cap is
    the limit ``@<queue>``, see :func:`queue_capped`). An attempt its stamp recorded no limit
    for is not judged (none held it), yet counts against the others while it runs.
    ``spans``: every attempt of the jobs of those keys that may have run at their starts."""
    wanted = {j.id: j.limit_key for j in jobs if j.limit_key is not None}
    of: dict[str, list[LimitSpan]] = {}
    for s in spans:
        of.setdefault(s.limit_key, []).append(s)
    # each job's worst start: (running at it, the limit then, recorded or as now)
    worst: dict[uuid.UUID, tuple[int, int, bool]] = {}
    for key, key_spans in of.items():
        for s, running in zip(key_spans, running_at_starts(key_spans), strict=True):
            if wanted.get(s.job_id) != key:
                continue
            limit = s.limit if s.recorded else limits.get(key.split("/", 1)[0])
            if limit is None or running <= limit:
                continue
            seen = worst.get(s.job_id)
            if seen is None or running - limit > seen[0] - seen[1]:
                worst[s.job_id] = (running, limit, s.recorded)
    return [
        Violation(
            Kind.OVER_LIMIT,
            job_id,
            f"started while {running} attempts of its limit {wanted[job_id]} ran (itself "
            f"included); the limit {'its claim applied' if recorded else 'as set now'} is "
            f"{limit}",
        )
        for job_id, (running, limit, recorded) in worst.items()
    ]


def limit_judged(rows: Iterable[AttemptRow], value: str, limited_now: bool) -> bool:
    """Whether any of a job's attempts (``rows``) has a limit to be held to: one its stamp
    recorded (``value``, the attempt's field: ``key_limit``, ``queue_limit``, ``rate``), or,
    recorded nothing (before migration 0025), one in force now (``limited_now``)."""
    return any(getattr(r, value) is not None if r.limits_recorded else limited_now for r in rows)


def queue_capped(
    jobs: Iterable[FinishedJob], caps: Mapping[str, int], attempts: Iterable[AttemptRow] = ()
) -> list[FinishedJob]:
    """The jobs to hold to their queue's cap, each as a job of the limit ``@<queue>`` (the
    name a held job's ``held_for`` gives a queue's cap), for :func:`check_limits` with
    :func:`cap_limits`: those one of whose ``attempts`` was stamped under a cap, or, opened
    before migration 0025, is in a queue ``caps`` caps now."""
    of: dict[uuid.UUID, list[AttemptRow]] = {}
    for row in attempts:
        of.setdefault(row.job_id, []).append(row)
    return [
        replace(j, limit_key=f"@{j.queue}")
        for j in jobs
        if limit_judged(of.get(j.id, []), "queue_limit", j.queue in caps)
    ]


def cap_limits(caps: Mapping[str, int]) -> dict[str, int]:
    """Queue caps as :func:`check_limits` takes limits."""
    return {f"@{queue}": cap for queue, cap in caps.items()}


@dataclass(frozen=True)
class RateStart:
    """An attempt's start that counts against a rate limit: its key, and the rate its claim
    recorded (``recorded``, migration 0025; ``rule`` None: none was in force). One opened
    before that records nothing."""

    job_id: uuid.UUID
    rate_key: str
    started: datetime
    recorded: bool = False
    rule: RateRule | None = None


def started_within(mine: datetime, starts: Iterable[datetime], per: float) -> int:
    """How many of ``starts`` (``mine`` among them) fall in the ``per`` seconds up to
    ``mine``, itself included: after ``mine - per``, at or before ``mine``."""
    width = timedelta(seconds=per)
    return sum(1 for t in starts if mine - width < t <= mine)


def started_within_each(starts: Sequence[datetime], per: float) -> list[int]:
    """:func:`started_within` of each of ``starts`` (one rate's) against them all, in
    O(n log n). A rate with no key is one key for all of its type's jobs, which the count by
    each start in turn made quadratic (as :func:`running_at_starts` says of a queue's cap).
    A window of ``per`` seconds holds more starts than a rate allows exactly when the
    window that ends at its last start does, so the starts found are those that broke it."""
    width = timedelta(seconds=per)
    ordered = sorted(starts)
    return [
        bisect.bisect_right(ordered, t) - bisect.bisect_right(ordered, t - width) for t in starts
    ]


def check_rates(
    jobs: Iterable[FinishedJob], starts: Iterable[RateStart], rules: Mapping[str, RateRule]
) -> list[Violation]:
    """Each finished job one of whose attempts started with more starts of its rate key in
    the rate's period up to it, itself included, than the rate in force at that start
    allows (:attr:`RateRule.allowed`): the rate its claim recorded, else, for an attempt
    from before migration 0025, its type's as registered now (``rules``, by type). Only the
    starts made under that same rate count: a changed rate starts a new pace (its limiter
    hands out starts at the new interval from where the old one was), and the bound holds
    within each. ``starts``: every start of those keys within a period before theirs."""
    wanted = {j.id for j in jobs}
    of: dict[tuple[str, RateRule], list[RateStart]] = {}
    for s in starts:
        rule = s.rule if s.recorded else rules.get(s.rate_key.split("/", 1)[0])
        if rule is not None:
            of.setdefault((s.rate_key, rule), []).append(s)
    worst: dict[uuid.UUID, tuple[int, str, RateRule]] = {}
    for (key, rule), key_starts in of.items():
        counts = started_within_each([s.started for s in key_starts], rule.per)
        for s, most in zip(key_starts, counts, strict=True):
            if s.job_id in wanted and most > rule.allowed:
                if s.job_id not in worst or most > worst[s.job_id][0]:
                    worst[s.job_id] = (most, key, rule)
    return [
        Violation(
            Kind.OVER_LIMIT,
            job_id,
            f"started with {most} starts of its rate limit {key} within {rule.per:g}s; its "
            f"rate allows {rule.allowed} ({rule.count} per {rule.per:g}s, burst {rule.burst})",
        )
        for job_id, (most, key, rule) in worst.items()
    ]


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
        type=row.get("type"),
    )


def tick_job(row: Mapping[str, Any]) -> TickJob:
    return TickJob(
        id=row["id"],
        schedule=row["schedule"],
        tick_at=row["tick_at"],
        created_at=row.get("created_at"),
    )


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
        limits_recorded=bool(row.get("limits_recorded")),
        key_limit=row.get("key_limit"),
        queue_limit=row.get("queue_limit"),
        rate=RateRule.of(row.get("rate")),
    )
