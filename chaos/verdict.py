"""The history checkers: pure functions from a history plus the tables read once the system
went quiet to findings and measures, composed by name into a :class:`Verdict`.

Nothing here does I/O or reads a clock; the same inputs always give the same verdict.

The promise being checked: every accepted job reaches a terminal state (at-least-once), no
job's effect is recorded twice (at-most-once effects), and a job whose type records an effect
(``ledger``; the example shop's ``send_receipt``, whose effect is the receipt recorded on its
order) that succeeded has exactly its one effect. A submit is *accepted* when it was
acknowledged (``ok``), or when its outcome was unknown (``info``) and its Idempotency-Key is
found in the jobs table: an unknown that did land must then finish like any other.

The checkers (:data:`HISTORY_CHECKERS`), each on the same :class:`Observed` run:

==============  ===========================================================================
``submits``     which submits were accepted; ``unkeyed``, ``mismatch``, ``rejected_landed``
``outcomes``    at-least-once: ``dead`` (not allowed to die), ``lost``, ``not_due`` (unknown)
``effects``     at-most-once: ``stray_effect``, ``doubled``
``executions``  attempts per job and redeliveries (measures only)
``recovery``    the first job finished after each fault was healed (measures only)
``empty``       ``empty`` (unknown): a run that accepted nothing shows nothing
``ticks``       the run's schedules, tick by tick (:mod:`chaos.ticks`): ``tick_missing``,
                ``tick_doubled``, ``tick_lost``, ``tick_skip``, ``tick_stray``, ``tick_dead``,
                ``tick_effect``, ``tick_not_due`` and ``tick_empty`` (unknown); nothing
                for a run without schedules
``unique``      the run's unique keys (:mod:`chaos.unique_keys`): ``unique_doubled``,
                ``unique_dropped``, ``unique_wrong_answer``, ``unique_created_twice``,
                ``unique_phantom`` and ``unique_empty`` (unknown); nothing for a run
                without a unique load
==============  ===========================================================================

:func:`chaos.judge.judge` then holds a verdict to a scenario's expectations.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from chaos.checker import UNKNOWN, Checked, Checker, Finding, Result, Validity, compose
from chaos.history import Op, Pair, fault_windows, submits_by_key
from chaos.rows import (
    ATTEMPT_COLUMNS,
    EFFECT_COLUMNS,
    EFFECT_KINDS,
    as_datetime,
    job_of,
    percentile,
    row_of,
)
from chaos.ticks import TickObservation, TickVerdict, check_ticks
from chaos.unique_keys import UniqueObservation, UniqueVerdict, check_unique
from leasework.states import TERMINAL, WAITING, Status


@dataclass(frozen=True)
class JobIssue:
    job_id: str | None
    key: str | None
    reason: str
    # for a doubled job: the kinds of effect it took more than once ("ledger", "email", ...)
    effects: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recovery:
    """For one fault: when it was healed and how long until the first job finished after."""

    fault: str
    target: str | None
    started: float
    stopped: float | None
    seconds: float | None


@dataclass(frozen=True)
class Verdict:
    valid: Validity
    problems: tuple[str, ...]
    findings: tuple[Finding, ...]
    # submits
    submitted: int  # distinct idempotency keys invoked
    accepted: int  # acknowledged + unknown_landed
    acknowledged: int  # answered 202
    unknown_landed: int  # outcome unknown, found in the table
    unknown_not_landed: int  # outcome unknown, not in the table: never happened, fine
    rejected: int  # answered 4xx only
    # outcomes of accepted jobs
    succeeded: int
    dead: int
    cancelled: int
    lost: int
    lost_jobs: tuple[JobIssue, ...]
    # effects
    doubled: int
    doubled_jobs: tuple[JobIssue, ...]
    stray_effects: int
    # executions (attempt rows of accepted jobs)
    executions: dict[int, int]  # executions per job -> number of jobs
    max_executions: int
    total_executions: int
    redeliveries: int
    fence_rejections: int | None
    # time
    recovery: tuple[Recovery, ...]
    scheduling_delay_p50: float | None
    scheduling_delay_p99: float | None
    quiet_at: float
    unmatched_jobs: int  # rows in the table no submit of this history asked for
    # run-relative finish times of every job (for the throughput figure); not in to_dict()
    finish_times: tuple[float, ...] = field(default=(), repr=False)
    # each history checker's result, by name (HISTORY_CHECKERS); not in to_dict()
    results: tuple[Result, ...] = field(default=(), repr=False)
    # the run's schedules, tick by tick (None: the run had none, or the checker crashed)
    ticks: TickVerdict | None = None
    # the run's unique keys (None: the run had no unique load, or the checker crashed)
    unique: UniqueVerdict | None = None

    @property
    def finished(self) -> int:
        return self.succeeded + self.dead + self.cancelled

    @property
    def max_recovery(self) -> float | None:
        seconds = [r.seconds for r in self.recovery if r.seconds is not None]
        return max(seconds) if seconds else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "problems": list(self.problems),
            "findings": [
                {"kind": p.kind, "valid": p.valid, "message": p.message} for p in self.findings
            ],
            "submitted": self.submitted,
            "accepted": self.accepted,
            "acknowledged": self.acknowledged,
            "unknown_landed": self.unknown_landed,
            "unknown_not_landed": self.unknown_not_landed,
            "rejected": self.rejected,
            "succeeded": self.succeeded,
            "dead": self.dead,
            "cancelled": self.cancelled,
            "finished": self.finished,
            "lost": self.lost,
            "lost_jobs": [vars(j) for j in self.lost_jobs],
            "doubled": self.doubled,
            "doubled_jobs": [vars(j) for j in self.doubled_jobs],
            "stray_effects": self.stray_effects,
            "executions": {str(k): v for k, v in self.executions.items()},
            "max_executions": self.max_executions,
            "total_executions": self.total_executions,
            "redeliveries": self.redeliveries,
            "fence_rejections": self.fence_rejections,
            "recovery": [vars(r) for r in self.recovery],
            "max_recovery": self.max_recovery,
            "scheduling_delay_p50": self.scheduling_delay_p50,
            "scheduling_delay_p99": self.scheduling_delay_p99,
            "quiet_at": self.quiet_at,
            "unmatched_jobs": self.unmatched_jobs,
            "ticks": self.ticks.to_dict() if self.ticks is not None else None,
            "unique": self.unique.to_dict() if self.unique is not None else None,
        }


def _seconds(moment: datetime, origin: datetime) -> float:
    return (moment - origin).total_seconds()


def _effects_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """``2 ledger effects (fences 3, 5)``, ``2 email effects (fences 3, 2)``: fences in the order
    the effects were made (a lower one after a higher: a stale attempt acted after a newer
    one); ``2 effects (receipt x2, no fence recorded)``."""
    fences = [r["fence"] for r in rows if r["fence"] is not None]
    kinds = Counter(str(r["kind"]) for r in rows)
    if len(fences) == len(rows):
        named = f"{next(iter(kinds))} " if len(kinds) == 1 else ""
        return f"{len(rows)} {named}effects (fences {', '.join(str(f) for f in fences)})"
    shown = ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items()))
    return f"{len(rows)} effects ({shown}, no fence recorded)"


# ---------------------------------------------------------------- the checkers' input


@dataclass
class _Submit:
    key: str
    value: dict[str, Any]  # the first invocation's value
    kinds: set[str]
    acked_ids: list[str]


def _acked_id(pair: Pair) -> str:
    assert pair.completion is not None
    job_id = pair.completion.value.get("job_id")
    return str(job_id) if job_id is not None else ""


@dataclass(frozen=True)
class Observed:
    """One run as the checkers see it: the history, the tables' rows by job, and the submits
    grouped by key with the job each landed as (``accepted``: acknowledged, or unknown and
    found in the table; the job None when an acknowledged key is missing from it)."""

    history: Sequence[Op]
    jobs: list[dict[str, Any]]
    by_key: dict[str | None, dict[str, Any]]
    by_id: dict[str, dict[str, Any]]
    effects_of: dict[str, list[dict[str, Any]]]
    attempts_of: dict[str, list[dict[str, Any]]]
    submits: dict[str, _Submit]
    accepted: list[tuple[_Submit, dict[str, Any] | None]]
    origin: datetime | None  # the wall-clock time of history time zero
    quiet_at: float  # history time
    quiet_wall: datetime | None
    ticks: TickObservation | None = None  # the run's schedules, if it had any
    unique: UniqueObservation | None = None  # the run's unique load, if it had one

    @classmethod
    def of(
        cls,
        history: Sequence[Op],
        jobs: Iterable[Mapping[str, Any]],
        effects: Iterable[Mapping[str, Any] | Sequence[Any]],
        attempts: Iterable[Mapping[str, Any] | Sequence[Any]],
        *,
        quiet_at: float,
        run_started_at: datetime | str | None,
        ticks: TickObservation | None = None,
        unique: UniqueObservation | None = None,
    ) -> Observed:
        origin = as_datetime(run_started_at)
        quiet_wall = origin + timedelta(seconds=quiet_at) if origin is not None else None
        if ticks is not None and ticks.quiet_at is None:
            ticks = dataclasses.replace(ticks, quiet_at=quiet_wall)
        table = [job_of(row) for row in jobs]
        by_key = {j["idempotency_key"]: j for j in table if j["idempotency_key"] is not None}
        effects_of: dict[str, list[dict[str, Any]]] = {}
        for row in effects:
            effect = row_of(row, EFFECT_COLUMNS)
            effects_of.setdefault(str(effect["job_id"]), []).append(effect)
        attempts_of: dict[str, list[dict[str, Any]]] = {}
        for row in attempts:
            attempt = row_of(row, ATTEMPT_COLUMNS)
            attempts_of.setdefault(str(attempt["job_id"]), []).append(attempt)
        submits = {
            key: _Submit(
                key=key,
                value=group[0].invoke.value,
                kinds={p.type for p in group},
                acked_ids=[_acked_id(p) for p in group if p.type == "ok" and _acked_id(p)],
            )
            for key, group in submits_by_key(history).items()
        }
        accepted = [
            (submit, by_key.get(submit.key))
            for submit in submits.values()
            if "ok" in submit.kinds or ("info" in submit.kinds and submit.key in by_key)
        ]
        return cls(
            history=history,
            jobs=table,
            by_key=by_key,
            by_id={j["id"]: j for j in table},
            effects_of=effects_of,
            attempts_of=attempts_of,
            submits=submits,
            accepted=accepted,
            origin=origin,
            quiet_at=quiet_at,
            quiet_wall=quiet_wall,
            ticks=ticks,
            unique=unique,
        )

    def finish_times(self) -> tuple[float, ...]:
        """Run-relative finish times of every job of the table, in order."""
        if self.origin is None:
            return ()
        origin = self.origin
        return tuple(
            sorted(_seconds(j["finished_at"], origin) for j in self.jobs if j["finished_at"])
        )


# ---------------------------------------------------------------- the checkers


def check_submits(run: Observed) -> Checked:
    """Which submits were accepted, and whether the table agrees with what the API said."""
    findings: list[Finding] = []
    for op in run.history:
        if op.f == "submit" and op.is_invoke and not isinstance(op.value.get("key"), str):
            findings.append(
                Finding(
                    "unkeyed",
                    UNKNOWN,
                    f"submit op #{op.index} carries no idempotency key: its job cannot be "
                    "matched against the table",
                )
            )
    acknowledged = unknown_landed = unknown_not_landed = rejected = 0
    for submit in run.submits.values():
        job = run.by_key.get(submit.key)
        if "ok" in submit.kinds:
            acknowledged += 1
            if job is None:
                continue  # lost: the outcomes checker's
            for acked in sorted(set(submit.acked_ids) - {job["id"]}):
                findings.append(
                    Finding(
                        "mismatch",
                        False,
                        f"mismatch: key {submit.key} was acknowledged as job {acked} but the "
                        f"table holds job {job['id']} under that key",
                    )
                )
        elif "info" in submit.kinds:
            if job is not None:
                unknown_landed += 1
            else:
                unknown_not_landed += 1
        else:
            rejected += 1
            if job is not None:
                findings.append(
                    Finding(
                        "rejected_landed",
                        False,
                        f"rejected_landed: key {submit.key} was only ever rejected (4xx) but "
                        f"job {job['id']} exists under it",
                    )
                )
    measures = {
        "submitted": len(run.submits),
        "accepted": len(run.accepted),
        "acknowledged": acknowledged,
        "unknown_landed": unknown_landed,
        "unknown_not_landed": unknown_not_landed,
        "rejected": rejected,
    }
    return Checked(tuple(findings), measures)


def check_outcomes(run: Observed) -> Checked:
    """At-least-once: every accepted job terminal when quiet (or not due yet), dead only if
    its submit allowed it, and a succeeded job of an effect type with its effect."""
    lost_jobs = [
        JobIssue(
            submit.acked_ids[0] if submit.acked_ids else None,
            submit.key,
            "acknowledged (2xx) but no job with its key is in the table",
        )
        for submit, job in run.accepted
        if job is None
    ]
    findings: list[Finding] = []
    counts: Counter[str] = Counter()
    not_due: list[dict[str, Any]] = []
    delays: list[float] = []
    for submit, job in run.accepted:
        if job is None:
            continue
        status = job["status"]
        counts[status] += 1
        if status not in TERMINAL:
            if (
                status in WAITING
                and run.quiet_wall is not None
                and job["run_at"] is not None
                and job["run_at"] > run.quiet_wall
            ):
                not_due.append(job)
            else:
                lost_jobs.append(
                    JobIssue(job["id"], submit.key, f"still {status} when the system was quiet")
                )
            continue
        if status == Status.DEAD and not submit.value.get("may_die", False):
            why = f" ({job['last_error']})" if job.get("last_error") else ""
            findings.append(
                Finding(
                    "dead",
                    False,
                    f"dead: job {job['id']} (key {submit.key}, type {job['type']}) is dead but "
                    f"its submit did not allow it to die{why}",
                )
            )
        if status == Status.SUCCEEDED:
            kind = EFFECT_KINDS.get(job["type"])
            if kind is not None and not any(
                e["kind"] == kind for e in run.effects_of.get(job["id"], ())
            ):
                lost_jobs.append(
                    JobIssue(
                        job["id"], submit.key, f"{job['type']} job succeeded without its effect"
                    )
                )
            if job["started_at"] is not None and job["run_at"] is not None:
                delays.append(_seconds(job["started_at"], job["run_at"]))
    for issue in lost_jobs:
        findings.append(
            Finding(
                "lost",
                False,
                f"lost: job {issue.job_id or '?'} (key {issue.key}): {issue.reason}",
            )
        )
    for job in not_due:
        findings.append(
            Finding(
                "not_due",
                UNKNOWN,
                f"not_due: job {job['id']} ({job['status']}) was not due yet when the system "
                f"was declared quiet; wait past its run_at ({job['run_at'].isoformat()})",
            )
        )
    measures = {
        "succeeded": counts[Status.SUCCEEDED],
        "dead": counts[Status.DEAD],
        "cancelled": counts[Status.CANCELLED],
        "lost": len(lost_jobs),
        "lost_jobs": tuple(lost_jobs),
        "scheduling_delay_p50": percentile(delays, 50),
        "scheduling_delay_p99": percentile(delays, 99),
    }
    return Checked(tuple(findings), measures)


def check_effects(run: Observed) -> Checked:
    """At-most-once effects: no job with more than one of a kind (a shop receipt is recorded
    on its order once and emailed once: two kinds), none of a job that did not succeed."""
    findings: list[Finding] = []
    doubled_jobs: list[JobIssue] = []
    stray = 0
    for job_id in sorted(run.effects_of):
        rows = run.effects_of[job_id]
        job = run.by_id.get(job_id)
        key = job["idempotency_key"] if job else None
        kinds = Counter(str(r["kind"]) for r in rows)
        repeated = [r for r in rows if kinds[str(r["kind"])] > 1]
        if repeated:
            doubled_jobs.append(
                JobIssue(
                    job_id,
                    key,
                    _effects_text(repeated),
                    tuple(sorted({str(r["kind"]) for r in repeated})),
                )
            )
        if job is None or job["status"] != Status.SUCCEEDED:
            stray += len(rows)
            state = "missing from the table" if job is None else f"{job['status']}"
            findings.append(
                Finding(
                    "stray_effect",
                    False,
                    f"stray_effect: job {job_id} has {len(rows)} effect(s) but is {state}; "
                    "effects commit only with a success",
                )
            )
    for issue in doubled_jobs:
        findings.append(
            Finding(
                "doubled",
                False,
                f"doubled: job {issue.job_id} (key {issue.key}) took effect more than once: "
                f"{issue.reason}",
            )
        )
    measures = {"doubled": len(doubled_jobs), "doubled_jobs": tuple(doubled_jobs)}
    return Checked(tuple(findings), {**measures, "stray_effects": stray})


def check_executions(run: Observed) -> Checked:
    """Handler runs per accepted job, and redeliveries: attempts run again after an earlier
    attempt that did not fail by itself (a lost lease, a killed worker)."""
    per_job: Counter[int] = Counter()
    redeliveries = 0
    for _, job in run.accepted:
        if job is None:
            continue
        rows = sorted(
            run.attempts_of.get(job["id"], []),
            key=lambda a: (a["attempt"] or 0, a["fence"] or 0, str(a["started_at"])),
        )
        per_job[len(rows)] += 1
        for earlier in rows[:-1]:
            if earlier["outcome"] != Status.FAILED:
                redeliveries += 1
    measures = {
        "executions": dict(sorted(per_job.items())),
        "max_executions": max(per_job, default=0),
        "total_executions": sum(n * jobs for n, jobs in per_job.items()),
        "redeliveries": redeliveries,
    }
    return Checked((), measures)


def check_recovery(run: Observed) -> Checked:
    """For each fault window: seconds from its heal to the first job finished after it."""
    finish_times = run.finish_times()
    recovery = []
    for window in fault_windows(run.history):
        seconds = None
        if window.stop is not None:
            after = [t for t in finish_times if t >= window.stop]
            seconds = round(after[0] - window.stop, 6) if after else None
        recovery.append(Recovery(window.fault, window.target, window.start, window.stop, seconds))
    return Checked((), {"recovery": tuple(recovery), "finish_times": finish_times})


def check_not_empty(run: Observed) -> Iterable[Finding]:
    if not run.accepted:
        yield Finding("empty", UNKNOWN, "empty: no submit was accepted, so the run shows nothing")


def check_schedule_ticks(run: Observed) -> Checked:
    """The run's schedules, tick by tick (:func:`chaos.ticks.check_ticks`); nothing to
    check for a run without schedules."""
    return check_ticks(run.ticks) if run.ticks is not None else Checked()


def check_unique_keys(run: Observed) -> Checked:
    """The run's unique keys (:func:`chaos.unique_keys.check_unique`); nothing to check for
    a run without a unique load."""
    return check_unique(run.unique) if run.unique is not None else Checked()


HISTORY_CHECKERS: Mapping[str, Checker[Observed]] = {
    "submits": check_submits,
    "outcomes": check_outcomes,
    "effects": check_effects,
    "executions": check_executions,
    "recovery": check_recovery,
    "empty": check_not_empty,
    "ticks": check_schedule_ticks,
    "unique": check_unique_keys,
}


def check(
    history: Sequence[Op],
    jobs: Iterable[Mapping[str, Any]],
    effects: Iterable[Mapping[str, Any] | Sequence[Any]],
    attempts: Iterable[Mapping[str, Any] | Sequence[Any]],
    *,
    quiet_at: float,
    run_started_at: datetime | str | None = None,
    fence_rejections: int | None = None,
    ticks: TickObservation | None = None,
    unique: UniqueObservation | None = None,
    checkers: Mapping[str, Checker[Observed]] = HISTORY_CHECKERS,
) -> Verdict:
    """Check a run: ``checkers`` (by default :data:`HISTORY_CHECKERS`) composed on it.

    ``history``: the run's operations. ``jobs``: rows of the jobs table once quiet (id, type,
    status, attempt, idempotency_key, run_at, started_at, finished_at, created_at; optionally
    max_attempts, last_error). ``effects``: rows (job_id, fence, kind). ``attempts``: rows
    (job_id, attempt, fence, worker, started_at, outcome). Rows may be mappings or tuples in
    that column order; timestamps datetimes or ISO strings (naive ones are UTC); a malformed
    row raises ValueError.

    ``quiet_at``: when the system was declared quiet, in history time (seconds since the run
    started). ``run_started_at``: the wall-clock time of history time zero; needed to place
    the tables' timestamps on the history's axis (recovery times, jobs not yet due at quiet).
    ``fence_rejections``: the count from the metrics, reported as is. ``ticks``: the run's
    schedules, their windows and rows (:class:`chaos.ticks.TickObservation`), if it had any;
    its quiet time defaults to ``quiet_at`` on the wall clock. ``unique``: the run's unique
    inserts and the jobs holding their keys (:class:`chaos.unique_keys.UniqueObservation`).
    """
    run = Observed.of(
        history,
        jobs,
        effects,
        attempts,
        quiet_at=quiet_at,
        run_started_at=run_started_at,
        ticks=ticks,
        unique=unique,
    )
    composed = compose(checkers, run)
    measured: dict[str, Any] = {}
    for result in composed:
        measured.update(result.measures)
    matched = {job["id"] for _, job in run.accepted if job is not None}
    keys = set(run.submits)
    findings = composed.findings
    return Verdict(
        valid=composed.valid,
        problems=tuple(f.message for f in findings),
        findings=findings,
        submitted=len(run.submits),
        accepted=len(run.accepted),
        acknowledged=measured.get("acknowledged", 0),
        unknown_landed=measured.get("unknown_landed", 0),
        unknown_not_landed=measured.get("unknown_not_landed", 0),
        rejected=measured.get("rejected", 0),
        succeeded=measured.get("succeeded", 0),
        dead=measured.get("dead", 0),
        cancelled=measured.get("cancelled", 0),
        lost=measured.get("lost", 0),
        lost_jobs=measured.get("lost_jobs", ()),
        doubled=measured.get("doubled", 0),
        doubled_jobs=measured.get("doubled_jobs", ()),
        stray_effects=measured.get("stray_effects", 0),
        executions=measured.get("executions", {}),
        max_executions=measured.get("max_executions", 0),
        total_executions=measured.get("total_executions", 0),
        redeliveries=measured.get("redeliveries", 0),
        fence_rejections=fence_rejections,
        recovery=measured.get("recovery", ()),
        scheduling_delay_p50=measured.get("scheduling_delay_p50"),
        scheduling_delay_p99=measured.get("scheduling_delay_p99"),
        quiet_at=quiet_at,
        unmatched_jobs=sum(
            1 for j in run.jobs if j["id"] not in matched and j["idempotency_key"] not in keys
        ),
        finish_times=measured.get("finish_times", ()),
        results=composed.results,
        ticks=measured.get("ticks"),
        unique=measured.get("unique"),
    )
