"""Judging a run on hand-written evidence: the harness's own checks (evidence that the faults
hit, a crash, interference, the drain bound, the API's 503 contract) and their composition
with the expectations into one judgement."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from chaos.auditor import AuditorView
from chaos.checker import UNKNOWN, compose
from chaos.judge import EXPECTATIONS, HARNESS, Evidence, harness_findings, judge_run
from chaos.loader import loads_scenario
from chaos.messages import MessageView
from chaos.pauses import PauseView, PauseWindow, windows_of
from chaos.scenario import Expectations
from chaos.shop import shop_view
from chaos.ticks import ScheduleTicks, TickVerdict
from chaos.verdict import JobIssue, Verdict, check
from chaos.workload import ClientView, Drain

VIEW = ClientView(10, 0, 0, 0, 0, 0, 1, ())


def expectations(text: str) -> Expectations:
    return loads_scenario(
        f'name = "s"\n[workload]\nrate = 1\nduration = 10\n[expect]\n{text}\n'
    ).expect


def empty_verdict() -> Verdict:
    """A run that accepted nothing: no redeliveries, one ``empty`` finding (unknown)."""
    return check([], [], [], [], quiet_at=0.0)


def harness(expect: str = "", **seen) -> tuple:
    return harness_findings(Evidence(empty_verdict(), expectations(expect), view=VIEW, **seen))


def test_harness_demands_evidence_that_the_fault_hit():
    findings = harness("min_redeliveries = 1\nmin_unknown_landed = 2\n")
    assert [f.kind for f in findings] == ["evidence", "evidence"]
    assert all(f.valid == UNKNOWN for f in findings)
    (f,) = harness("min_duplicate_messages = 1\n", messages=MessageView(10, 0, 0))
    assert "produced twice" in f.message
    assert harness("min_duplicate_messages = 1\n", messages=MessageView(10, 2, 1)) == ()
    (unread,) = harness("min_duplicate_messages = 1\n")  # Kafka could not be read
    assert unread.message.startswith("evidence: unknown message(s) produced twice")


def test_a_fence_downstream_run_demands_a_refused_stale_call():
    refused = shop_view([], [], [], [{"job_id": "a", "fence": 1, "highest": 2}])
    assert harness("min_mail_refusals = 1\n", shop=refused) == ()
    (none,) = harness("min_mail_refusals = 1\n", shop=shop_view([], []))
    assert none.valid == UNKNOWN and "0 call(s) refused as stale" in none.message
    (unread,) = harness("min_mail_refusals = 1\n")  # the shop was not read
    assert unread.message.startswith("evidence: unknown call(s) refused")


def found(*pairs: tuple[str, str]) -> AuditorView:
    return AuditorView(True, 6.0, tuple({"kind": k, "job_id": j, "detail": "d"} for k, j in pairs))


def test_with_the_fence_on_the_auditor_must_find_nothing_among_the_runs_jobs():
    assert harness(auditor=AuditorView(True, 6.0)) == ()
    (bad,) = harness(auditor=found(("stale_outcome", "j1")))
    assert bad.kind == "auditor" and bad.valid is False and "stale_outcome j1" in bad.message
    (late,) = harness(auditor=AuditorView(False, 30.0))
    assert late.valid == UNKNOWN and "did not pass the run's last finished job" in late.message


def test_with_the_fence_off_the_auditor_must_find_every_job_the_checker_doubled():
    doubled = dataclasses.replace(
        empty_verdict(),
        doubled=3,
        doubled_jobs=(
            JobIssue("j1", "k1", "2 ledger effects (fences 1, 2)", ("ledger",)),
            JobIssue("j2", "k2", "2 ledger effects (fences 3, 4)", ("ledger",)),
            JobIssue("j3", "k3", "2 email effects (fences 4, 3)", ("email",)),  # the mail's
        ),
    )

    def judged(view: AuditorView) -> tuple:
        return harness_findings(
            Evidence(doubled, expectations(""), view=VIEW, auditor=view, fencing=False)
        )

    both = found(("effects_twice", "j1"), ("succeeded_twice", "j2"), ("stale_outcome", "j2"))
    assert judged(both) == ()
    (missed,) = judged(found(("effects_twice", "j1")))
    assert missed.valid is False and "missed 1 of the 2 job(s)" in missed.message
    assert "j2" in missed.message


def test_the_auditor_must_name_every_job_of_a_doubled_tick_and_nothing_else():
    ticks = TickVerdict(
        (ScheduleTicks("run-s1", "allow", None, None, 3, doubled=1, doubled_jobs=("t1", "t2")),)
    )
    doubled_tick = dataclasses.replace(empty_verdict(), ticks=ticks)

    def judged(view: AuditorView) -> tuple:
        return harness_findings(Evidence(doubled_tick, expectations(""), view=VIEW, auditor=view))

    assert judged(found(("tick_twice", "t1"), ("tick_twice", "t2"))) == ()
    (missed,) = judged(found(("tick_twice", "t1")))
    assert missed.valid is False and "missed 1 of the 2 job(s) of the ticks" in missed.message
    # with the fence on, anything else it finds is still a finding
    (other,) = judged(found(("tick_twice", "t1"), ("tick_twice", "t2"), ("tick_twice", "t9")))
    assert "found 1 violation(s)" in other.message and "t9" in other.message


def test_an_expected_alert_already_firing_at_the_start_proves_nothing():
    expect = 'alerts = ["LeaseworkFenceRejections", "LeaseworkRelayStalled"]\n'
    findings = harness(expect, firing_at_start={"LeaseworkFenceRejections"})
    assert len(findings) == 1 and findings[0].valid == UNKNOWN
    assert "LeaseworkFenceRejections" in findings[0].message
    assert len(harness(expect, firing_at_start=None)) == 2


def test_another_user_of_the_stack_makes_the_run_unknown():
    (finding,) = harness(meddling=["worker-1 was restarted (pid 1 -> 2) by no fault"])
    assert finding.kind == "interference" and finding.valid == UNKNOWN
    (crash,) = harness(crashed=["relay died"])
    assert crash.kind == "crash" and crash.valid is False


def test_harness_bounds_the_drain_and_holds_the_api_to_its_503():
    drains = [Drain("sigkill", "worker-1", 20.0, 50, 12.5), Drain("x", None, 30.0, 5, 3.0)]
    view = ClientView(10, 0, 0, 0, 0, 0, 1, ("k1",))
    findings = harness_findings(
        Evidence(empty_verdict(), expectations("recovery_seconds = 10\n"), view=view, drains=drains)
    )
    assert sorted(f.kind for f in findings) == ["api_contract", "drain"]
    assert all(f.valid is False for f in findings)


def test_a_run_is_judged_on_its_expectations_then_on_the_harness_checks_by_name():
    evidence = Evidence(
        empty_verdict(),
        expectations("max_lost = 0\n"),
        view=VIEW,
        meddling=["something"],
        crashed=["relay died"],
    )
    judgement = judge_run(evidence)
    assert [r.name for r in judgement.results] == [*EXPECTATIONS, *HARNESS]
    assert judgement.passed is False  # the crash outranks the unknowns
    # each finding keeps its kind; the expectations' come first
    assert [f.kind for f in judgement.findings] == ["empty", "crash", "interference"]
    assert judgement.problems == tuple(f.message for f in judgement.findings)
    assert [f.kind for f in judgement.findings_of(HARNESS)] == ["crash", "interference"]
    by_name = {r.name: r.valid for r in judgement.results}
    assert by_name["history"] == UNKNOWN and by_name["crash"] is False
    assert by_name["lost"] is True and by_name["drain"] is True
    # without the crash the run shows nothing either way: unknown, never a pass
    assert judge_run(Evidence(empty_verdict(), Expectations(), view=VIEW)).passed == UNKNOWN


def test_an_expected_alert_that_fired_must_also_have_reached_the_api_through_alertmanager():
    expect = expectations('alerts = ["LeaseworkRelayStalled", "LeaseworkOutboxBacklog"]\n')
    verdict = empty_verdict()

    def delivery(fired, delivered):
        composed = compose(
            EXPECTATIONS,
            Evidence(verdict, expect, alerts_fired=fired, alerts_delivered=delivered),
        )
        return composed["alerts_delivered"]

    both = ["LeaseworkRelayStalled", "LeaseworkOutboxBacklog"]
    assert delivery(both, both).valid is True
    (lost,) = delivery(both, ["LeaseworkRelayStalled"]).findings
    assert lost.kind == "alert_not_delivered" and lost.valid is False
    assert "LeaseworkOutboxBacklog fired in Prometheus" in lost.message
    # notifications not read: unknown, never a pass
    (unread,) = delivery(both, None).findings
    assert unread.kind == "alert_not_delivered" and unread.valid == UNKNOWN
    # an alert that did not fire is the `alerts` judge's finding, not a second one here
    assert delivery(["LeaseworkRelayStalled"], ["LeaseworkRelayStalled"]).valid is True
    assert delivery(None, None).valid is True  # alerts not read at all: `alerts` says so
    judgement = judge_run(
        Evidence(verdict, expect, alerts_fired=both, alerts_delivered=[], view=VIEW)
    )
    kinds = [f.kind for f in judgement.findings]
    assert kinds.count("alert_not_delivered") == 2 and judgement.passed is False


def test_the_auditor_column_says_what_was_found_or_that_it_did_not_get_there():
    assert AuditorView(True, 5.0).cell() == "0 found"
    assert AuditorView(False, 30.0).cell() == "not reached"
    view = found(("effects_twice", "j1"), ("stale_outcome", "j1"), ("effects_twice", "j2"))
    assert view.cell() == "2 job(s): effects_twice 2, stale_outcome 1"
    assert view.to_dict()["by_kind"] == {"effects_twice": 2, "stale_outcome": 1}


def test_a_pause_holds_only_when_nothing_started_inside_it_and_it_held_jobs_back():
    t0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    t1 = t0 + timedelta(seconds=12)

    def found(*windows: PauseWindow) -> list[str]:
        return [f.message for f in harness(pauses=PauseView(windows)) if f.kind == "pauses"]

    assert found(PauseWindow("default", t0, t1, held_back=30)) == []
    (inside,) = found(PauseWindow("default", t0, t1, ["j1", "j2"], held_back=30))
    assert "2 job(s) of queue default started while it was paused" in inside
    (never,) = found(PauseWindow("default", t0, None, held_back=0))
    assert "never resumed" in never
    (idle,) = found(PauseWindow("default", t0, t1, held_back=0))
    assert "held back none" in idle


def test_pause_windows_pair_each_pause_with_the_resume_after_it():
    t0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
    t1, t2 = t0 + timedelta(seconds=5), t0 + timedelta(seconds=9)

    def entry(action: str, queue: str, key: str, at: datetime) -> dict:
        return {"action": action, "target": f"queue:{queue}", "detail": {key: at.isoformat()}}

    entries = [
        entry("queue-pause", "default", "paused_at", t0),
        entry("queue-pause", "emails", "paused_at", t1),
        entry("queue-resume", "default", "resumed_at", t2),
        entry("queue-resume", "reports", "resumed_at", t2),  # paused before the run: no window
    ]
    assert windows_of(entries) == [("default", t0, t2), ("emails", t1, None)]


def test_a_run_without_lost_record_recovery_must_lose_jobs_and_one_with_it_must_not():
    from chaos.judge import lost_bound

    unsafe = loads_scenario(
        'name = "s"\n[workload]\nrate = 1\nduration = 10\n'
        '[[relays]]\nname = "relay"\nrecovery = false\n[expect]\nexpect_lost = true\n'
    ).expect
    lost = dataclasses.replace(empty_verdict(), lost=3)
    assert list(lost_bound(Evidence(lost, unsafe, view=VIEW))) == []
    (nothing,) = lost_bound(Evidence(empty_verdict(), unsafe, view=VIEW))
    assert nothing.valid is False and "could not have failed" in nothing.message
    (safe,) = lost_bound(Evidence(lost, expectations("max_lost = 0\n"), view=VIEW))
    assert safe.valid is False and "3 job(s) lost" in safe.message
