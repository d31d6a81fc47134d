"""The soak's goals, judged from its samples and the jobs table. Pure: no I/O, no clock.

- **Memory**: each process's RSS over the last window within ``tolerance`` (10 %) of the
  first window. A window is ten minutes, or a third of a shorter soak; its value is the
  median of the samples in it. A process restarted by a fault has a new pid, so the two
  windows must belong to one life (:func:`judged_span`): the whole soak when one pid spans
  both windows, else the process's longest life, less a warm-up after its start, with windows
  a third of it at most; shorter than three samples a window, it is not judged, and the
  report says so.
- **Descriptors and connections flat**: over the same span, the last window's median at most
  ``tolerance`` or ``slack`` (whichever is more) above the first's (a leak grows; a drop is
  shown, not judged). The Postgres server's own count (``pg_stat_activity``) is judged over
  the whole soak.
- **Scheduling delay**: the p99 of ``started_at - run_at`` over the jobs due outside every
  fault window, a window being from :data:`LEAD` before the fault took effect to ``settle``
  seconds after its heal; under a second.
- **Checker**: the chaos checker's verdict valid, 0 lost, 0 doubled.

Each goal is met (True), missed (False) or unknown (nothing to judge it on).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from chaos.checker import UNKNOWN, Validity, merge_valid
from chaos.history import FaultWindow
from chaos.rows import job_of, percentile

WINDOW = 600.0  # seconds: the goal's "first ten" and "last ten" minutes
RSS_TOLERANCE = 0.10
FLAT_TOLERANCE = 0.10
FD_SLACK = 3.0  # descriptors a process may hold more at the end (a Kafka reconnect, a log)
CONN_SLACK = 2.0  # connections likewise
WARMUP = 60.0  # seconds of a life that started during the soak left out (its caches filling)
MIN_SAMPLES = 3  # per window, for a judgement
DELAY_GOAL = 1.0  # seconds: p99 scheduling delay outside fault windows
LEAD = 1.0  # a job due this long before a fault took effect is still one it can hold up
SETTLE = 30.0  # default seconds after a heal still counted as the fault's


@dataclass(frozen=True)
class Reading:
    """One process at one sample: ``t`` seconds after the run's history time zero, its pid
    (None: not running), VmRSS, open descriptors, its TCP connections to Postgres, and its
    process tree (itself and descendants: how many, their summed RssAnon)."""

    t: float
    pid: int | None
    rss_kib: int | None = None
    fds: int | None = None
    pg_links: int | None = None
    tree: int | None = None
    tree_anon_kib: int | None = None


METRICS = ("rss_kib", "fds", "pg_links")


@dataclass(frozen=True)
class Windows:
    """The first and the last window of a soak of ``duration`` seconds."""

    duration: float
    window: float

    @classmethod
    def of(cls, duration: float, window: float = WINDOW) -> Windows:
        return cls(duration, min(window, duration / 3))

    @property
    def first(self) -> tuple[float, float]:
        return (0.0, self.window)

    @property
    def last(self) -> tuple[float, float]:
        return (self.duration - self.window, self.duration)


def _inside(readings: Iterable[Reading], span: tuple[float, float]) -> list[Reading]:
    low, high = span
    return [r for r in readings if low <= r.t <= high]


@dataclass(frozen=True)
class Life:
    """Consecutive readings of one pid."""

    pid: int
    readings: tuple[Reading, ...]
    started_in_run: bool  # an earlier life of the process, or its absence, came first

    @property
    def start(self) -> float:
        return self.readings[0].t

    @property
    def end(self) -> float:
        return self.readings[-1].t


def lives(readings: Sequence[Reading]) -> list[Life]:
    """The lives of one process, in order; a reading without a pid ends a life. A life
    started in the run unless it holds the process's first reading."""
    ordered = sorted(readings, key=lambda r: r.t)
    groups: list[list[Reading]] = []
    previous: int | None = None
    for reading in ordered:
        if reading.pid is not None:
            if reading.pid != previous or not groups:
                groups.append([])
            groups[-1].append(reading)
        previous = reading.pid
    return [Life(g[0].pid or 0, tuple(g), started_in_run=g[0] is not ordered[0]) for g in groups]


@dataclass(frozen=True)
class Span:
    """What one process is judged over: two windows of one life (``basis`` says which), or
    nothing (``basis`` says why)."""

    basis: str
    pid: int | None = None
    first: tuple[float, float] | None = None
    last: tuple[float, float] | None = None
    first_readings: tuple[Reading, ...] = ()
    last_readings: tuple[Reading, ...] = ()
    lives: int = 0

    @property
    def judged(self) -> bool:
        return self.first is not None


def judged_span(
    readings: Sequence[Reading],
    windows: Windows,
    *,
    warmup: float = WARMUP,
    min_samples: int = MIN_SAMPLES,
) -> Span:
    """The span of one life a process's goals are judged over (see the module's doc)."""
    all_lives = lives(readings)
    in_run = [life for life in all_lives if life.end >= 0.0 and life.start <= windows.duration]
    count = len(in_run)
    if not in_run:
        return Span("not judged: never seen running during the soak")
    for life in in_run:
        if life.start + (warmup if life.started_in_run else 0.0) > 0.0:
            continue  # it started (or warmed up) after the soak did
        first = _inside(life.readings, windows.first)
        last = _inside(life.readings, windows.last)
        if len(first) >= min_samples and len(last) >= min_samples:
            return Span(
                "whole soak",
                life.pid,
                windows.first,
                windows.last,
                tuple(first),
                tuple(last),
                count,
            )
    best: Span | None = None
    best_length = -1.0
    for life in in_run:
        low = max(0.0, life.start + (warmup if life.started_in_run else 0.0))
        high = min(windows.duration, life.end)
        length = high - low
        if length <= 0:
            continue
        width = min(windows.window, length / 3)
        first_span, last_span = (low, low + width), (high - width, high)
        first = _inside(life.readings, first_span)
        last = _inside(life.readings, last_span)
        if len(first) >= min_samples and len(last) >= min_samples and length > best_length:
            best_length = length
            best = Span(
                f"longest life: pid {life.pid}, {length / 60:.1f} min of {count} lives",
                life.pid,
                first_span,
                last_span,
                tuple(first),
                tuple(last),
                count,
            )
    if best is not None:
        return best
    longest = max(min(windows.duration, x.end) - max(0.0, x.start) for x in in_run)
    return Span(
        f"not judged: {count} lives, the longest {longest / 60:.1f} min, too short for "
        f"{min_samples} samples a window",
        lives=count,
    )


def median(readings: Iterable[Reading], metric: str) -> float | None:
    values = [getattr(r, metric) for r in readings if getattr(r, metric) is not None]
    return float(statistics.median(values)) if values else None


@dataclass(frozen=True)
class Compared:
    """One metric's first and last window (medians), their ratio, and the judgement."""

    metric: str
    first: float | None
    last: float | None
    ok: Validity
    why: str = ""

    @property
    def ratio(self) -> float | None:
        if self.first is None or self.last is None or self.first == 0:
            return None
        return self.last / self.first


def within(first: float, last: float, tolerance: float = RSS_TOLERANCE) -> bool:
    """``last`` within ``tolerance`` (a fraction) of ``first``, either way."""
    return first > 0 and abs(last / first - 1.0) <= tolerance + 1e-12


def flat(first: float, last: float, tolerance: float = FLAT_TOLERANCE, slack: float = 0.0) -> bool:
    """``last`` at most ``tolerance`` of ``first`` or ``slack`` (whichever is more) above it."""
    return last - first <= max(tolerance * first, slack) + 1e-12


def compare(
    metric: str,
    first: float | None,
    last: float | None,
    *,
    kind: Literal["within", "flat"],
    tolerance: float,
    slack: float = 0.0,
) -> Compared:
    if first is None or last is None:
        return Compared(metric, first, last, UNKNOWN, "no samples in a window")
    if kind == "within":
        ok = within(first, last, tolerance)
        change = (last / first - 1.0) * 100 if first else math.inf
        why = "" if ok else f"{'grew' if change > 0 else 'shrank'} {abs(change):.1f}%"
        return Compared(metric, first, last, ok, why)
    ok = flat(first, last, tolerance, slack)
    why = "" if ok else f"grew from {first:g} to {last:g}"
    return Compared(metric, first, last, ok, why)


@dataclass(frozen=True)
class ProcessGoals:
    name: str
    span: Span
    rss: Compared
    fds: Compared
    pg_links: Compared
    tree_anon: tuple[float | None, float | None]  # first and last window, KiB (not judged)

    @property
    def valid(self) -> Validity:
        return merge_valid(self.rss.ok, self.fds.ok, self.pg_links.ok)


def _unjudged(metric: str, why: str) -> Compared:
    return Compared(metric, None, None, UNKNOWN, why)


def process_goals(
    name: str,
    readings: Sequence[Reading],
    windows: Windows,
    *,
    warmup: float = WARMUP,
    min_samples: int = MIN_SAMPLES,
) -> ProcessGoals:
    """One process's memory, descriptor and connection goals over its judged span."""
    span = judged_span(readings, windows, warmup=warmup, min_samples=min_samples)
    if not span.judged:
        return ProcessGoals(
            name,
            span,
            _unjudged("rss_kib", span.basis),
            _unjudged("fds", span.basis),
            _unjudged("pg_links", span.basis),
            (None, None),
        )
    first, last = span.first_readings, span.last_readings

    def both(metric: str) -> tuple[float | None, float | None]:
        return median(first, metric), median(last, metric)

    return ProcessGoals(
        name,
        span,
        compare("rss_kib", *both("rss_kib"), kind="within", tolerance=RSS_TOLERANCE),
        compare("fds", *both("fds"), kind="flat", tolerance=FLAT_TOLERANCE, slack=FD_SLACK),
        compare(
            "pg_links", *both("pg_links"), kind="flat", tolerance=FLAT_TOLERANCE, slack=CONN_SLACK
        ),
        both("tree_anon_kib"),
    )


def server_connections(points: Sequence[tuple[float, int]], windows: Windows) -> Compared:
    """Postgres's own count of client connections (``pg_stat_activity``), whole soak."""

    def in_window(span: tuple[float, float]) -> float | None:
        values = [n for t, n in points if span[0] <= t <= span[1]]
        return float(statistics.median(values)) if values else None

    return compare(
        "connections",
        in_window(windows.first),
        in_window(windows.last),
        kind="flat",
        tolerance=FLAT_TOLERANCE,
        slack=CONN_SLACK,
    )


# ---------------------------------------------------------------- scheduling delay


@dataclass(frozen=True)
class Delay:
    """One job's scheduling delay: ``due`` seconds after the run's history time zero,
    ``seconds`` from due to started, and whether a fault window holds its due time."""

    due: float
    seconds: float
    in_fault: bool


def job_delays(
    jobs: Iterable[Mapping[str, Any]],
    windows: Sequence[FaultWindow],
    run_started_at: datetime,
    *,
    settle: float = SETTLE,
    lead: float = LEAD,
) -> list[Delay]:
    """``started_at - run_at`` of every job that started, by due time. A job is in a fault
    when its ``run_at`` lies in ``[start - lead, stop + settle]`` of a window (a window never
    healed holds to the end)."""
    spans = [(w.start - lead, math.inf if w.stop is None else w.stop + settle) for w in windows]
    out = []
    for row in jobs:
        job = job_of(row)
        if job["run_at"] is None or job["started_at"] is None:
            continue
        due = (job["run_at"] - run_started_at).total_seconds()
        seconds = (job["started_at"] - job["run_at"]).total_seconds()
        out.append(Delay(due, seconds, any(low <= due <= high for low, high in spans)))
    return sorted(out, key=lambda d: d.due)


@dataclass(frozen=True)
class DelayGoal:
    jobs: int
    outside: int
    p99_outside: float | None
    p99_all: float | None
    p99_inside: float | None
    settle: float
    ok: Validity
    why: str = ""

    @property
    def share_outside(self) -> float | None:
        return self.outside / self.jobs if self.jobs else None


def delay_goal(
    delays: Sequence[Delay], *, settle: float = SETTLE, goal: float = DELAY_GOAL
) -> DelayGoal:
    outside = [d.seconds for d in delays if not d.in_fault]
    inside = [d.seconds for d in delays if d.in_fault]
    p99 = percentile(outside, 99)
    if p99 is None:
        ok: Validity = UNKNOWN
        why = "no job was due outside the fault windows"
    else:
        ok = p99 < goal
        why = "" if ok else f"p99 {p99:.3f}s is not under {goal:g}s"
    return DelayGoal(
        len(delays),
        len(outside),
        p99,
        percentile([d.seconds for d in delays], 99),
        percentile(inside, 99),
        settle,
        ok,
        why,
    )


@dataclass(frozen=True)
class Bucket:
    """Delays of the jobs due in [start, start + width): p99 of all, and of those outside
    the fault windows (None: none)."""

    start: float
    width: float
    p99_all: float | None
    p99_outside: float | None


def delay_buckets(delays: Sequence[Delay], duration: float, count: int = 60) -> list[Bucket]:
    width = max(duration / count, 1.0)
    out = []
    for i in range(math.ceil(duration / width)):
        low, high = i * width, (i + 1) * width
        inside = [d for d in delays if low <= d.due < high]
        out.append(
            Bucket(
                low,
                width,
                percentile([d.seconds for d in inside], 99),
                percentile([d.seconds for d in inside if not d.in_fault], 99),
            )
        )
    return out


# ---------------------------------------------------------------- all of them


@dataclass(frozen=True)
class Goal:
    """One line of the verdict: what, met or not (or unknown), and why."""

    name: str
    ok: Validity
    detail: str


@dataclass(frozen=True)
class Checked:
    """The checker's side: its validity, lost and doubled jobs, and the runner's judgement
    of the scenario's expectations (with its problems)."""

    valid: Validity
    lost: int
    doubled: int
    expectations: Validity
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class SoakGoals:
    processes: tuple[ProcessGoals, ...]
    connections: Compared
    delay: DelayGoal
    checked: Checked
    goals: tuple[Goal, ...] = field(default=())

    @property
    def valid(self) -> Validity:
        return merge_valid(*(g.ok for g in self.goals))

    @property
    def missed(self) -> list[Goal]:
        return [g for g in self.goals if g.ok is False]

    @property
    def unknown(self) -> list[Goal]:
        return [g for g in self.goals if g.ok == UNKNOWN]


def _metric_goal(name: str, what: str, compared: Compared, span: Span) -> Goal:
    if compared.ok == UNKNOWN:
        return Goal(f"{what} {name}", UNKNOWN, compared.why or span.basis)
    detail = f"{compared.first:g} -> {compared.last:g} ({span.basis})"
    if compared.why:
        detail = f"{compared.why}: {detail}"
    return Goal(f"{what} {name}", compared.ok, detail)


def judge(
    processes: Sequence[ProcessGoals],
    connections: Compared,
    delay: DelayGoal,
    checked: Checked,
) -> SoakGoals:
    """Every goal, in the order the report lists them."""
    goals = [
        Goal(
            "checker",
            merge_valid(checked.valid, False if checked.lost or checked.doubled else True),
            f"verdict {checked.valid}, {checked.lost} lost, {checked.doubled} doubled",
        ),
        Goal(
            "expectations",
            checked.expectations,
            "; ".join(checked.problems[:5]) or "the scenario's expectations and harness checks",
        ),
        Goal(
            "p99 delay outside faults",
            delay.ok,
            delay.why
            or f"{delay.p99_outside:.3f}s over {delay.outside} of {delay.jobs} jobs "
            f"(settle {delay.settle:g}s)",
        ),
        Goal(
            "connections postgres (server)",
            connections.ok,
            connections.why or f"{connections.first:g} -> {connections.last:g} (whole soak)",
        ),
    ]
    for p in processes:
        kib = p.rss
        rss = Compared(
            "rss_mib",
            None if kib.first is None else round(kib.first / 1024, 1),
            None if kib.last is None else round(kib.last / 1024, 1),
            kib.ok,
            kib.why,
        )
        goals.append(_metric_goal(p.name, "RSS MiB", rss, p.span))
        goals.append(_metric_goal(p.name, "fds", p.fds, p.span))
        if p.pg_links.first or p.pg_links.last:  # a process that talks to Postgres
            goals.append(_metric_goal(p.name, "pg connections", p.pg_links, p.span))
    return SoakGoals(tuple(processes), connections, delay, checked, tuple(goals))


def exit_code(goals: SoakGoals) -> int:
    """0 every goal met; 1 one missed (or the checker invalid); 2 none missed, one unknown."""
    if goals.missed:
        return 1
    return 2 if goals.unknown else 0
