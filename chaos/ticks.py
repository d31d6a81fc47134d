"""The tick checker: a pure function from what a run's schedules should have done (the
nominal instants their calendars give in the window the harness watched) and what they did
(the recorded ``schedule_ticks``, the jobs carrying ``schedule`` and ``tick_at``, the effects
ledger) to findings and counts. Nothing here does I/O or reads a clock.

The promise being checked (docs/design-decisions.md, "Exactly once per tick"), each broken
promise a finding of its own kind:

================  =========================================================================
``tick_missing``  a nominal tick of the window has no tick row (its jobs, if any, named)
``tick_doubled``  a tick has more than one row, or a fired tick more than one job
``tick_lost``     a fired tick whose job is not in the table, or was still waiting or
                  running when the system was quiet
``tick_skip``     a skip with no reason, a reason its schedule's policy does not allow, or a
                  skipped tick that has a job anyway
``tick_stray``    a row or a job for a tick outside the window (or not on the calendar), or
                  a tick's job other than the one its row names
``tick_dead``     a tick's job that ended dead or cancelled
``tick_effect``   a tick's job that took effect twice, a succeeded ledger job without its
                  effect, an effect of a job that did not succeed
``tick_not_due``  (unknown) a tick's job not yet due when the system was declared quiet
``tick_empty``    (unknown) no tick was expected at all: the run shows nothing
================  =========================================================================

Allowed skips: reason ``overlap`` only under the ``skip`` or ``buffer_one`` overlap policy;
reason ``catch_up`` under the ``skip`` or ``latest`` catch-up policy, and under ``all`` only in
a pass (the ticks one transaction recorded share ``recorded_at``) that ran at least
``catch_up_limit`` later ticks. Late ticks (fired more than ``late_seconds`` after their
nominal instant, on the database's clock) are counted, never a finding here: a scenario may
bound them (:mod:`chaos.judge`).

The window of a schedule (:class:`ScheduleWindow`) runs from its first tick (its next fire
time when the harness created it) to the later of ``due_by``, the last tick due when the
load ended (the harness waited for it to be handled before pausing the schedule), and the
last tick before its next fire time when the tables were read: the scheduler moves that time
past a tick only in the transaction that records it, so every tick before it must have a row.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from chaos.checker import UNKNOWN, Checked, Finding, Validity
from chaos.rows import EFFECT_KINDS, as_datetime
from leasework.schedules import CatchUp, Definition, Overlap, SkipReason
from leasework.states import TERMINAL, WAITING, Status

# more nominal ticks than this in one window is a harness error, not a run
MAX_WINDOW_TICKS = 1_000_000
DEFAULT_LATE_SECONDS = 5.0


def _instant(value: Any, what: str) -> datetime:
    moment = as_datetime(value)
    if moment is None:
        raise ValueError(f"{what} is missing")
    return moment


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class ScheduleWindow:
    """One schedule of a run: its definition, its first tick, the last tick due when the
    load ended (``due_by``; None: the load ended before the first tick), and its next fire
    time when the tables were read (None: its calendar has no further tick)."""

    definition: Definition
    first: datetime
    due_by: datetime | None = None
    next_fire_at: datetime | None = None

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def last(self) -> datetime | None:
        """The window's last nominal tick (None: the window holds none)."""
        ends = [self.due_by] if self.due_by is not None else []
        if self.next_fire_at is not None and self.next_fire_at > self.first:
            # ticks are whole seconds: the last one strictly before the next fire time
            before, _ = self.definition.calendar.latest(
                self.first, self.next_fire_at - timedelta(seconds=1), 1
            )
            ends += before
        return max(ends) if ends else None

    def nominal(self) -> tuple[datetime, ...]:
        """The calendar's ticks from the first to the last, oldest first."""
        last = self.last
        if last is None or last < self.first:
            return ()
        ticks, dropped = self.definition.calendar.latest(self.first, last, MAX_WINDOW_TICKS)
        if dropped:
            raise ValueError(f"schedule {self.name}: more than {MAX_WINDOW_TICKS} ticks")
        return tuple(ticks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "definition": dataclasses.asdict(self.definition),
            "first": self.first.isoformat(),
            "due_by": self.due_by.isoformat() if self.due_by else None,
            "next_fire_at": self.next_fire_at.isoformat() if self.next_fire_at else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScheduleWindow:
        return cls(
            Definition(**data["definition"]),
            _instant(data["first"], "a window's first tick"),
            as_datetime(data.get("due_by")),
            as_datetime(data.get("next_fire_at")),
        )


@dataclass(frozen=True)
class TickRow:
    """A row of ``schedule_ticks``."""

    schedule: str
    nominal_at: datetime
    outcome: str  # fired | skipped
    reason: str | None
    job_id: str | None
    source: str
    recorded_at: datetime | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> TickRow:
        return cls(
            str(row["schedule"]),
            _instant(row["nominal_at"], "a tick row's nominal_at"),
            str(row["outcome"]),
            _text(row.get("reason")),
            _text(row.get("job_id")),
            str(row.get("source") or ""),
            as_datetime(row.get("recorded_at")),
        )


@dataclass(frozen=True)
class TickJob:
    """A job a schedule inserted (``jobs.schedule`` set)."""

    id: str
    schedule: str
    tick_at: datetime | None
    type: str
    status: str
    run_at: datetime | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> TickJob:
        return cls(
            str(row["id"]),
            str(row["schedule"]),
            as_datetime(row.get("tick_at")),
            str(row["type"]),
            str(row["status"]),
            as_datetime(row.get("run_at")),
        )


@dataclass(frozen=True)
class TickEffect:
    """A row of the effects ledger of a schedule's job."""

    job_id: str
    kind: str
    fence: int | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> TickEffect:
        return cls(str(row["job_id"]), str(row["kind"]), row.get("fence"))


@dataclass(frozen=True)
class TickObservation:
    """What the tick checker is given: the windows, the rows, and when the system was
    declared quiet (wall clock; None: unknown, so nothing counts as not due yet)."""

    windows: tuple[ScheduleWindow, ...]
    ticks: tuple[TickRow, ...] = ()
    jobs: tuple[TickJob, ...] = ()
    effects: tuple[TickEffect, ...] = ()
    quiet_at: datetime | None = None
    late_seconds: float = DEFAULT_LATE_SECONDS

    @classmethod
    def of(
        cls,
        windows: Iterable[ScheduleWindow | Mapping[str, Any]],
        ticks: Iterable[Mapping[str, Any]] = (),
        jobs: Iterable[Mapping[str, Any]] = (),
        effects: Iterable[Mapping[str, Any]] = (),
        *,
        quiet_at: datetime | None = None,
        late_seconds: float = DEFAULT_LATE_SECONDS,
    ) -> TickObservation:
        """From table rows (mappings; timestamps datetimes or ISO strings, as in
        ``tables.json``); a malformed row raises ValueError or KeyError."""
        return cls(
            tuple(
                w if isinstance(w, ScheduleWindow) else ScheduleWindow.from_dict(w) for w in windows
            ),
            tuple(TickRow.of(r) for r in ticks),
            tuple(TickJob.of(r) for r in jobs),
            tuple(TickEffect.of(r) for r in effects),
            quiet_at,
            late_seconds,
        )

    @classmethod
    def from_tables(
        cls, tables: Mapping[str, Any], *, late_seconds: float = DEFAULT_LATE_SECONDS
    ) -> TickObservation | None:
        """From the rows the harness read (:mod:`chaos.schedules`, ``tables.json``): the
        windows under ``schedules``, then ``schedule_ticks``, ``schedule_jobs`` and
        ``schedule_effects``; None for a run without schedules."""
        if not tables.get("schedules"):
            return None
        return cls.of(
            tables["schedules"],
            tables.get("schedule_ticks", ()),
            tables.get("schedule_jobs", ()),
            tables.get("schedule_effects", ()),
            late_seconds=late_seconds,
        )


# ---------------------------------------------------------------- the counts


@dataclass(frozen=True)
class ScheduleTicks:
    """One schedule's counts."""

    name: str
    policy: str
    first: datetime | None
    last: datetime | None
    expected: int
    fired: int = 0
    skipped: Mapping[str, int] = field(default_factory=dict)  # by reason
    missing: int = 0
    doubled: int = 0
    late: int = 0
    lost: int = 0
    dead: int = 0
    stray: int = 0
    bad_skips: int = 0
    effects_wrong: int = 0
    not_due: int = 0
    latest_seconds: float | None = None  # the most a fired tick was recorded after its instant
    doubled_jobs: tuple[str, ...] = ()  # every job of a tick that had more than one

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["first"] = self.first.isoformat() if self.first else None
        data["last"] = self.last.isoformat() if self.last else None
        data["skipped"] = dict(self.skipped)
        return data


# the counts a run's total adds up over its schedules
SUMMED = (
    "expected",
    "fired",
    "missing",
    "doubled",
    "late",
    "lost",
    "dead",
    "stray",
    "bad_skips",
    "effects_wrong",
    "not_due",
)


@dataclass(frozen=True)
class TickVerdict:
    """Every schedule's counts, and their totals (``total("doubled")``)."""

    schedules: tuple[ScheduleTicks, ...]
    late_seconds: float = DEFAULT_LATE_SECONDS

    def total(self, name: str) -> int:
        if name not in SUMMED:
            raise ValueError(f"{name!r} is not a count of ticks; one of {', '.join(SUMMED)}")
        return sum(getattr(s, name) for s in self.schedules)

    @property
    def doubled_jobs(self) -> frozenset[str]:
        """Every job of every doubled tick (the auditor must name each)."""
        return frozenset(j for s in self.schedules for j in s.doubled_jobs)

    @property
    def skipped(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for s in self.schedules:
            counts.update(s.skipped)
        return dict(sorted(counts.items()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "late_seconds": self.late_seconds,
            "totals": {name: self.total(name) for name in SUMMED} | {"skipped": self.skipped},
            "schedules": [s.to_dict() for s in self.schedules],
        }


def policy_text(d: Definition) -> str:
    catch_up = f"{d.catch_up}" + (f" up to {d.catch_up_limit}" if d.catch_up is CatchUp.ALL else "")
    return f"{d.cron} ({d.timezone}), overlap {d.overlap}, catch-up {catch_up}"


# ---------------------------------------------------------------- the checks


def _when(t: datetime | None) -> str:
    return t.isoformat() if t is not None else "no tick_at"


def skip_problem(row: TickRow, d: Definition, same_pass: Sequence[TickRow]) -> str | None:
    """Why a skipped tick's reason is not one its schedule's policy allows; None if it is.
    ``same_pass``: the schedule's rows recorded in the same transaction (same
    ``recorded_at``), which tell whether catch-up ``all`` had run its limit of later ticks."""
    if not row.reason:
        return "skipped with no reason recorded"
    if row.reason == SkipReason.OVERLAP:
        if d.overlap is Overlap.ALLOW:
            return "skipped for overlap, but its overlap policy is allow"
        return None
    if row.reason == SkipReason.CATCH_UP:
        if d.catch_up is not CatchUp.ALL:
            return None
        if row.recorded_at is None:
            return "skipped by catch-up all, and its pass cannot be told (no recorded_at)"
        ran_later = sum(
            1
            for r in same_pass
            if r.nominal_at > row.nominal_at
            and not (r.outcome == "skipped" and r.reason == SkipReason.CATCH_UP)
        )
        if ran_later < d.catch_up_limit:
            return (
                f"skipped by catch-up all up to {d.catch_up_limit}, but its pass ran only "
                f"{ran_later} later tick(s)"
            )
        return None
    return f"skipped for {row.reason!r}, a reason leasework does not record"


def job_problems(
    job: TickJob, effects: Sequence[TickEffect], quiet_at: datetime | None
) -> Iterator[tuple[str, str]]:
    """(kind, what) for each promise one tick's job broke: finished, succeeded, once."""
    status = job.status
    if status not in TERMINAL:
        if status in WAITING and quiet_at is not None and job.run_at and job.run_at > quiet_at:
            yield "tick_not_due", f"job {job.id} was {status}, not due until {_when(job.run_at)}"
        else:
            yield "tick_lost", f"job {job.id} was still {status} when the system was quiet"
    elif status != Status.SUCCEEDED:
        yield "tick_dead", f"job {job.id} ended {status}"
    kind = EFFECT_KINDS.get(job.type)
    if len(effects) > 1:
        fences = ", ".join(str(e.fence) for e in effects)
        yield "tick_effect", f"job {job.id} took effect {len(effects)} times (fences {fences})"
    if status == Status.SUCCEEDED and kind is not None and not any(e.kind == kind for e in effects):
        yield "tick_effect", f"{job.type} job {job.id} succeeded without its effect"
    if effects and status != Status.SUCCEEDED:
        yield "tick_effect", f"job {job.id} has {len(effects)} effect(s) but is {status}"


# findings that say "not shown" rather than "broken"
_VALIDITY: Mapping[str, Validity] = {"tick_not_due": UNKNOWN}
# the count of ScheduleTicks a finding adds to, where it is not the kind's own name
_COUNTS: Mapping[str, str] = {"tick_skip": "bad_skips", "tick_effect": "effects_wrong"}


class _Schedule:
    """The checks of one schedule, accumulating findings and counts."""

    def __init__(self, window: ScheduleWindow, observed: TickObservation) -> None:
        self.window = window
        self.quiet_at = observed.quiet_at
        self.late_seconds = observed.late_seconds
        self.findings: list[Finding] = []
        self.counts: Counter[str] = Counter()
        self.skipped: Counter[str] = Counter()
        self.latest: float | None = None
        self.doubled_jobs: list[str] = []
        name = window.name
        self.rows: dict[datetime, list[TickRow]] = defaultdict(list)
        for r in observed.ticks:
            if r.schedule == name:
                self.rows[r.nominal_at].append(r)
        self.jobs: dict[datetime | None, list[TickJob]] = defaultdict(list)
        for j in observed.jobs:
            if j.schedule == name:
                self.jobs[j.tick_at].append(j)
        self.effects: dict[str, list[TickEffect]] = defaultdict(list)
        for e in observed.effects:
            self.effects[e.job_id].append(e)

    def find(self, kind: str, tick: datetime | None, what: str) -> None:
        valid: Validity = _VALIDITY.get(kind, False)
        text = f"{kind}: schedule {self.window.name}, tick {_when(tick)}: {what}"
        self.findings.append(Finding(kind, valid, text))
        self.counts[_COUNTS.get(kind, kind.removeprefix("tick_"))] += 1

    def check(self) -> ScheduleTicks:
        expected = self.window.nominal()
        for tick in expected:
            self.tick(tick, self.rows.get(tick, []), self.jobs.get(tick, []))
        outside = sorted((set(self.rows) | {t for t in self.jobs if t is not None}) - set(expected))
        bounds = f"[{_when(expected[0])}, {_when(expected[-1])}]" if expected else "(empty)"
        for tick in outside:
            rows, jobs = self.rows.get(tick, []), self.jobs.get(tick, [])
            self.find(
                "tick_stray",
                tick,
                f"{len(rows)} row(s) and {len(jobs)} job(s) for a tick outside the window "
                f"{bounds} or off its calendar",
            )
        for job in self.jobs.get(None, []):
            self.find("tick_stray", None, f"job {job.id} names the schedule but no tick")
        counted = {name: self.counts[name] for name in SUMMED if name != "expected"}
        return ScheduleTicks(
            name=self.window.name,
            policy=policy_text(self.window.definition),
            first=expected[0] if expected else None,
            last=expected[-1] if expected else None,
            expected=len(expected),
            skipped=dict(sorted(self.skipped.items())),
            latest_seconds=self.latest,
            doubled_jobs=tuple(self.doubled_jobs),
            **counted,
        )

    def tick(self, tick: datetime, rows: list[TickRow], jobs: list[TickJob]) -> None:
        if not rows:
            carried = f"; yet job(s) {', '.join(j.id for j in jobs)} carry it" if jobs else ""
            self.find("tick_missing", tick, f"no tick row{carried}")
            return
        if len(rows) > 1:
            self.find("tick_doubled", tick, f"{len(rows)} tick rows")
            return
        (row,) = rows
        if row.outcome == "skipped":
            self.skipped[row.reason or "(none)"] += 1
            same_pass = [
                r for rs in self.rows.values() for r in rs if r.recorded_at == row.recorded_at
            ]
            problem = skip_problem(row, self.window.definition, same_pass)
            if problem is None and jobs:
                problem = f"skipped, yet job(s) {', '.join(j.id for j in jobs)} carry it"
            if problem is not None:
                self.find("tick_skip", tick, problem)
            return
        if row.outcome != "fired":
            self.find("tick_skip", tick, f"outcome {row.outcome!r}: neither fired nor skipped")
            return
        self.counts["fired"] += 1
        if row.recorded_at is not None:
            seconds = (row.recorded_at - tick).total_seconds()
            self.latest = seconds if self.latest is None else max(self.latest, seconds)
            if seconds > self.late_seconds:
                self.counts["late"] += 1
        if len(jobs) > 1:
            ids = ", ".join(j.id for j in jobs)
            self.find("tick_doubled", tick, f"{len(jobs)} jobs ({ids}) for one tick")
            self.doubled_jobs += [j.id for j in jobs]
        elif not jobs:
            self.find("tick_lost", tick, f"fired, but its job {row.job_id} is not in the table")
        elif jobs[0].id != row.job_id:
            self.find(
                "tick_stray", tick, f"job {jobs[0].id} carries it, its row names {row.job_id}"
            )
        for job in jobs:
            for kind, what in job_problems(job, self.effects.get(job.id, []), self.quiet_at):
                self.find(kind, tick, what)


def check_ticks(observed: TickObservation) -> Checked:
    """Every schedule of ``observed`` checked tick by tick; measures ``{"ticks":
    TickVerdict}``."""
    findings: list[Finding] = []
    schedules = []
    for window in observed.windows:
        one = _Schedule(window, observed)
        schedules.append(one.check())
        findings += one.findings
    known = {w.name for w in observed.windows}
    for name in sorted({r.schedule for r in observed.ticks} - known):
        findings.append(
            Finding(
                "tick_stray", False, f"tick_stray: rows of schedule {name}, not one of the run's"
            )
        )
    for name in sorted({j.schedule for j in observed.jobs} - known):
        findings.append(
            Finding(
                "tick_stray", False, f"tick_stray: jobs of schedule {name}, not one of the run's"
            )
        )
    verdict = TickVerdict(tuple(schedules), observed.late_seconds)
    if verdict.total("expected") == 0:
        findings.append(
            Finding(
                "tick_empty",
                UNKNOWN,
                "tick_empty: no tick was due in any window: the run shows nothing about schedules",
            )
        )
    return Checked(tuple(findings), {"ticks": verdict})
