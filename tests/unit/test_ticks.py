"""The tick checker on hand-written schedules, rows and jobs: a clean run passes; a missing
tick, a tick recorded twice, two jobs for one tick, a skip with no reason or one its policy
does not allow, an effect twice, a job outside the window, a job never finished must each
fail; late ticks are counted, not failed; a job not due yet is unknown."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chaos.checker import UNKNOWN
from chaos.ticks import (
    ScheduleWindow,
    TickObservation,
    TickVerdict,
    check_ticks,
    skip_problem,
)
from leasework.schedules import Definition

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
EVERY_SECOND = Definition(
    name="chaos-s1", type="ledger", cron="* * * * * *", catch_up="all", catch_up_limit=1000
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def window(definition: Definition = EVERY_SECOND, due_by: float = 9, next_fire: float = 10):
    return ScheduleWindow(definition, T0, at(due_by), at(next_fire))


class Run:
    """A schedule's ten ticks (T0 to T0 + 9 s), each fired once with a ledger job that
    succeeded with its one effect: the clean run the tests then break."""

    def __init__(self, definition: Definition = EVERY_SECOND, ticks: int = 10) -> None:
        self.definition = definition
        self.windows: list[Any] = [window(definition, ticks - 1, ticks)]
        self.ticks: list[dict[str, Any]] = []
        self.jobs: list[dict[str, Any]] = []
        self.effects: list[dict[str, Any]] = []
        for i in range(ticks):
            self.fire(i)
        self.quiet_at: datetime | None = at(60)

    def fire(self, i: int, job: str | None = None, lateness: float = 0.01) -> str:
        job = job or f"j{i}"
        self.ticks.append(self.row(i, "fired", job_id=job, recorded=at(i + lateness)))
        self.add_job(job, i)
        return job

    def row(self, i: float, outcome: str, **fields: Any) -> dict[str, Any]:
        return {
            "schedule": self.definition.name,
            "nominal_at": at(i),
            "outcome": outcome,
            "reason": fields.get("reason"),
            "job_id": fields.get("job_id"),
            "source": "cron",
            "recorded_at": fields.get("recorded", at(i + 0.01)),
        }

    def add_job(self, job: str, i: float, status: str = "succeeded", effects: int = 1) -> None:
        self.jobs.append(
            {
                "id": job,
                "schedule": self.definition.name,
                "tick_at": at(i),
                "type": "ledger",
                "status": status,
                "run_at": at(i),
            }
        )
        self.effects += [{"job_id": job, "kind": "ledger", "fence": n + 1} for n in range(effects)]

    def drop(self, i: int) -> None:
        """Tick i was never recorded, and got no job."""
        self.ticks = [r for r in self.ticks if r["nominal_at"] != at(i)]
        self.jobs = [j for j in self.jobs if j["tick_at"] != at(i)]
        self.effects = [e for e in self.effects if e["job_id"] != f"j{i}"]

    def skip(self, i: int, reason: str | None, recorded: datetime | None = None) -> None:
        self.drop(i)
        self.ticks.append(self.row(i, "skipped", reason=reason, recorded=recorded or at(i + 0.01)))

    def check(self, late_seconds: float = 5.0):
        observed = TickObservation.of(
            self.windows,
            self.ticks,
            self.jobs,
            self.effects,
            quiet_at=self.quiet_at,
            late_seconds=late_seconds,
        )
        checked = check_ticks(observed)
        verdict = checked.measures["ticks"]
        assert isinstance(verdict, TickVerdict)
        return checked.findings, verdict


def kinds(findings) -> list[str]:
    return [f.kind for f in findings]


def test_a_clean_run_passes_with_its_counts():
    findings, verdict = Run().check()
    assert findings == ()
    (one,) = verdict.schedules
    assert (one.expected, one.fired, one.missing, one.doubled, one.late) == (10, 10, 0, 0, 0)
    assert (one.first, one.last) == (T0, at(9))
    assert verdict.total("fired") == 10 and verdict.skipped == {}
    assert verdict.doubled_jobs == set()
    assert one.to_dict()["first"] == T0.isoformat()
    assert verdict.to_dict()["totals"]["expected"] == 10


def test_a_missing_tick_fails():
    run = Run()
    run.drop(4)
    findings, verdict = run.check()
    assert kinds(findings) == ["tick_missing"] and findings[0].valid is False
    assert at(4).isoformat() in findings[0].message
    assert verdict.total("missing") == 1 and verdict.total("fired") == 9


def test_a_tick_recorded_twice_fails():
    run = Run()
    run.ticks.append(dict(run.ticks[3]))
    findings, verdict = run.check()
    assert kinds(findings) == ["tick_doubled"] and "2 tick rows" in findings[0].message
    assert verdict.total("doubled") == 1


def test_two_jobs_for_one_tick_fail_as_one_doubled_tick_and_nothing_else():
    """What the unsafe scheduler does: a second job for a recorded tick, which runs and
    takes its own effect. One finding, so a run that expects doubled ticks sees only them."""
    run = Run()
    run.add_job("j3-again", 3)
    findings, verdict = run.check()
    assert kinds(findings) == ["tick_doubled"]
    assert "2 jobs (j3, j3-again)" in findings[0].message
    assert verdict.total("doubled") == 1 and verdict.total("fired") == 10
    assert verdict.doubled_jobs == {"j3", "j3-again"}  # what the auditor must name


def test_a_skip_with_no_reason_fails():
    run = Run()
    run.skip(5, None)
    findings, verdict = run.check()
    assert kinds(findings) == ["tick_skip"] and "no reason" in findings[0].message
    assert verdict.skipped == {"(none)": 1} and verdict.total("bad_skips") == 1


def test_an_overlap_skip_is_allowed_only_by_an_overlap_policy():
    run = Run()
    run.skip(5, "overlap")
    findings, _ = run.check()
    assert kinds(findings) == ["tick_skip"] and "overlap policy is allow" in findings[0].message
    skipping = dataclasses.replace(EVERY_SECOND, overlap="skip")
    run = Run(skipping)
    run.skip(5, "overlap")
    run.skip(6, "overlap")
    findings, verdict = run.check()
    assert findings == () and verdict.skipped == {"overlap": 2}
    (one,) = verdict.schedules
    assert (one.fired, one.skipped_total, one.expected) == (8, 2, 10)


def test_a_catch_up_skip_under_all_needs_its_pass_to_have_run_the_limit():
    limited = dataclasses.replace(EVERY_SECOND, catch_up_limit=2)
    run = Run(limited)
    # one pass, recorded at T0 + 70 s: ticks 0..2 missed and skipped, only 3 ran later
    late = at(70)
    run.ticks = []
    for i in range(10):
        if i < 3:
            run.skip(i, "catch_up", recorded=late)
        else:
            run.ticks.append(run.row(i, "fired", job_id=f"j{i}", recorded=late))
    findings, verdict = run.check()
    assert findings == () and verdict.skipped == {"catch_up": 3}
    assert verdict.total("late") == 7  # counted, not a finding
    # the same skips in a pass that ran a single later tick: catch-up all broke its limit
    for r in run.ticks:
        if r["nominal_at"] > at(3):
            r["recorded_at"] = at(71)
    findings, _ = run.check()
    assert kinds(findings) == ["tick_skip"] * 3
    assert "ran only 1 later tick" in findings[0].message


def test_a_skipped_tick_that_ran_anyway_fails():
    run = Run(dataclasses.replace(EVERY_SECOND, overlap="skip"))
    run.skip(2, "overlap")
    run.add_job("j2-anyway", 2)
    findings, _ = run.check()
    assert kinds(findings) == ["tick_skip"] and "j2-anyway" in findings[0].message


def test_an_effect_twice_fails():
    run = Run()
    run.effects.append({"job_id": "j6", "kind": "ledger", "fence": 9})
    findings, verdict = run.check()
    assert kinds(findings) == ["tick_effect"] and "took effect 2 times" in findings[0].message
    assert verdict.total("effects_wrong") == 1


def test_a_succeeded_ledger_job_without_its_effect_fails():
    run = Run()
    run.effects = [e for e in run.effects if e["job_id"] != "j1"]
    findings, _ = run.check()
    assert kinds(findings) == ["tick_effect"] and "without its effect" in findings[0].message


def test_a_job_outside_the_window_or_of_no_recorded_tick_fails():
    run = Run()
    run.add_job("after", 15)  # beyond the window's last tick (9 s)
    findings, _ = run.check()
    assert kinds(findings) == ["tick_stray"] and "outside the window" in findings[0].message
    run = Run()
    run.add_job("half-second", 3.5)  # not on the calendar
    assert kinds(run.check()[0]) == ["tick_stray"]
    run = Run()
    run.ticks = [r for r in run.ticks if r["nominal_at"] != at(7)]  # job j7, no row
    findings, verdict = run.check()
    assert kinds(findings) == ["tick_missing"] and "yet job(s) j7 carry it" in findings[0].message
    run = Run()
    run.jobs[2]["id"] = "someone-else"  # the tick's row names j2
    run.effects[2]["job_id"] = "someone-else"
    assert kinds(run.check()[0]) == ["tick_stray"]


def test_a_job_not_finished_is_lost_unless_it_was_not_due_yet():
    run = Run()
    run.jobs[8]["status"] = "running"
    run.effects = [e for e in run.effects if e["job_id"] != "j8"]
    findings, verdict = run.check()
    assert kinds(findings) == ["tick_lost"] and findings[0].valid is False
    assert verdict.total("lost") == 1
    run = Run()
    run.jobs[9].update(status="scheduled", run_at=at(120))  # a fast clock's tick, 60 s ahead
    run.effects = [e for e in run.effects if e["job_id"] != "j9"]
    findings, verdict = run.check()
    assert kinds(findings) == ["tick_not_due"] and findings[0].valid == UNKNOWN
    run = Run()
    run.jobs = [j for j in run.jobs if j["id"] != "j0"]
    run.effects = [e for e in run.effects if e["job_id"] != "j0"]
    findings, _ = run.check()
    assert kinds(findings) == ["tick_lost"] and "not in the table" in findings[0].message


def test_a_dead_tick_job_fails():
    run = Run()
    run.jobs[1]["status"] = "dead"
    run.effects = [e for e in run.effects if e["job_id"] != "j1"]
    assert kinds(run.check()[0]) == ["tick_dead"]


def test_late_ticks_are_counted_not_failed():
    run = Run()
    run.ticks = []
    for i in range(10):
        run.ticks.append(
            run.row(i, "fired", job_id=f"j{i}", recorded=at(i + (8 if i in (3, 4) else 0.2)))
        )
    findings, verdict = run.check(late_seconds=5.0)
    assert findings == ()
    (one,) = verdict.schedules
    assert one.late == 2 and one.latest_seconds == 8.0
    # a tick the fast relay recorded a minute early is not late
    run.ticks[0]["recorded_at"] = at(-60)
    assert run.check()[1].total("late") == 2


def test_the_window_follows_the_next_fire_time_and_the_ticks_due():
    # handled up to 9 s, due by 9 s: ten ticks
    assert len(window(due_by=9, next_fire=10).nominal()) == 10
    # a relay 60 s fast handled ticks a minute ahead: they are in the window, due or not
    ahead = window(due_by=9, next_fire=70)
    assert ahead.last == at(69) and len(ahead.nominal()) == 70
    # the schedulers stalled at 5 s while 9 s was due: ticks 5 to 9 must still be there
    assert window(due_by=9, next_fire=5).nominal()[-1] == at(9)
    run = Run()
    run.windows = [window(due_by=12, next_fire=10)]
    findings, verdict = run.check()
    assert kinds(findings) == ["tick_missing"] * 3 and verdict.total("expected") == 13
    assert ScheduleWindow(EVERY_SECOND, T0).nominal() == ()
    assert ScheduleWindow.from_dict(ahead.to_dict()) == ahead


def test_nothing_expected_is_unknown_and_rows_of_another_schedule_are_stray():
    run = Run()
    run.windows = [ScheduleWindow(EVERY_SECOND, T0)]
    findings, _ = run.check()
    assert "tick_empty" in kinds(findings)
    assert {f.valid for f in findings if f.kind == "tick_empty"} == {UNKNOWN}
    run = Run()
    run.ticks.append({**run.ticks[0], "schedule": "someone-elses"})
    assert kinds(run.check()[0]) == ["tick_stray"]


def test_a_malformed_row_raises():
    run = Run()
    del run.ticks[0]["nominal_at"]
    with pytest.raises(KeyError):
        run.check()


def test_skip_reasons_by_policy():
    latest = dataclasses.replace(EVERY_SECOND, catch_up="latest", overlap="buffer_one")
    row = Run(latest).row(1, "skipped", reason="catch_up")
    from chaos.ticks import TickRow

    assert skip_problem(TickRow.of(row), latest, []) is None
    assert skip_problem(TickRow.of({**row, "reason": "overlap"}), latest, []) is None
    assert "does not record" in skip_problem(TickRow.of({**row, "reason": "boredom"}), latest, [])


# ---------------------------------------------------------------- composed and judged


UNSAFE_RELAY = '[[relays]]\nname = "relay"\nunsafe_scheduler = true\n'
SCHEDULE = '[[schedules]]\ncron = "* * * * * *"\n'


def judged(run: Run, expect: str = "", setup: str = ""):
    from chaos.judge import judge
    from chaos.loader import loads_scenario
    from chaos.verdict import check

    scenario = f'name = "s"\n[workload]\nrate = 1\nduration = 10\n{setup}[expect]\n{expect}\n'
    expected = loads_scenario(scenario).expect
    # as the runner does: the scenario says what counts as late
    observed = TickObservation.of(
        run.windows, run.ticks, run.jobs, run.effects, late_seconds=expected.late_tick_seconds
    )
    verdict = check([], [], [], [], quiet_at=60.0, run_started_at=T0, ticks=observed)
    return verdict, judge(verdict, expected)


def test_the_tick_checker_is_composed_with_the_history_checkers_by_name():
    verdict, judgement = judged(Run())
    assert "ticks" in [r.name for r in verdict.results]
    assert verdict.ticks is not None and verdict.ticks.total("fired") == 10
    assert verdict.to_dict()["ticks"]["totals"]["doubled"] == 0
    # the history checkers' own "empty" (no submit) is the only finding
    assert [f.kind for f in verdict.findings] == ["empty"]
    assert judgement.passed == UNKNOWN
    # the quiet time reaches the tick checker: a job due after it is not yet lost
    run = Run()
    run.jobs[9].update(status="scheduled", run_at=at(61))
    run.effects = [e for e in run.effects if e["job_id"] != "j9"]
    assert "tick_not_due" in [f.kind for f in judged(run)[0].findings]


def test_a_crashing_tick_checker_is_unknown_never_a_pass():
    from chaos.verdict import check

    broken = TickObservation(windows=("not a window",))  # type: ignore[arg-type]
    verdict = check([], [], [], [], quiet_at=1.0, ticks=broken)
    (crashed,) = [f for f in verdict.findings if f.kind == "crashed"]
    assert crashed.valid == UNKNOWN and "ticks checker raised" in crashed.message
    assert verdict.ticks is None and verdict.valid == UNKNOWN


def test_expectations_bound_missing_doubled_and_lost_ticks():
    run = Run()
    run.add_job("j3-again", 3)
    run.drop(5)
    _, judgement = judged(run)
    assert judgement.passed is False
    problems = " ".join(judgement.problems)
    assert "1 tick(s) doubled; at most 0" in problems and "1 tick(s) missing" in problems
    _, judgement = judged(run, "max_missing_ticks = 1\nmax_doubled_ticks = 1")
    assert not [p for p in judgement.problems if "tick" in p]


def test_the_unsafe_scheduler_s_run_must_show_a_doubled_tick():
    run = Run()
    run.add_job("j3-again", 3)
    unsafe = UNSAFE_RELAY + SCHEDULE
    _, judgement = judged(run, "expect_doubled_ticks = true", unsafe)
    assert not [p for p in judgement.problems if "tick" in p]
    _, judgement = judged(Run(), "expect_doubled_ticks = true", unsafe)
    assert judgement.passed is False
    assert any("could not have failed" in p for p in judgement.problems)


def test_late_ticks_fail_only_under_a_bound():
    run = Run()
    run.ticks[2]["recorded_at"] = at(2 + 30)
    _, judgement = judged(run)
    assert not [p for p in judgement.problems if "tick" in p]
    _, judgement = judged(run, "max_late_ticks = 0\nlate_tick_seconds = 10")
    assert any("1 tick(s) late; at most 0" in p and "10s" in p for p in judgement.problems)
    _, judgement = judged(run, "max_late_ticks = 0\nlate_tick_seconds = 40")
    assert not [p for p in judgement.problems if "tick" in p]
