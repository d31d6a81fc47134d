"""The chaos checker on hand-written histories and tables: runs that must fail, runs that must
pass, Jepsen's composition ranking, judging against expectations (the history's own format
is tested in test_history.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chaos.checker import UNKNOWN, Checked, Finding, compose, merge_valid, rank
from chaos.history import (
    Op,
    fault_windows,
    nemesis_value,
    pairs,
    submit_ok_value,
    submit_value,
)
from chaos.judge import judge
from chaos.scenario import Expectations
from chaos.shop import email_effects, receipt_effects, shop_view
from chaos.verdict import HISTORY_CHECKERS, Verdict, check, percentile

T0 = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Run:
    """A hand-written run: history ops and the three tables, built side by side."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.jobs: list[dict[str, Any]] = []
        self.effects: list[dict[str, Any]] = []
        self.attempts: list[dict[str, Any]] = []
        self.fence = 0

    def op(self, t: float, process: int | str, type_: str, f: str, value: dict, error=None):
        self.ops.append(Op(len(self.ops), t, process, type_, f, value, error))  # type: ignore[arg-type]

    def submit(
        self,
        key: str,
        outcomes: tuple[str, ...] = ("ok",),
        *,
        t: float = 1.0,
        job_type: str = "noop",
        may_die: bool = False,
        process: int = 0,
        job_id: str | None = None,
    ) -> None:
        """One invocation per outcome (the workload retries unknowns with the same key)."""
        value = submit_value(key, job_type, {}, may_die=may_die)
        for n, outcome in enumerate(outcomes):
            self.op(t + n, process, "invoke", "submit", value)
            if outcome == "ok":
                done = submit_ok_value(value, job_id or f"job-{key}", "queued")
                self.op(t + n + 0.01, process, "ok", "submit", done)
            elif outcome == "fail":
                self.op(t + n + 0.01, process, "fail", "submit", value, "HTTP 409: conflict")
            elif outcome == "info":
                self.op(t + n + 0.5, process, "info", "submit", value, "timeout")
            # "open": invoked, never completed (the history ends)

    def job(
        self,
        key: str,
        status: str = "succeeded",
        *,
        job_type: str = "noop",
        run_at: float = 1.0,
        finished_at: float | None = 3.0,
        outcomes: tuple[str, ...] = ("succeeded",),
        effects: int | None = None,
        job_id: str | None = None,
    ) -> str:
        job_id = job_id or f"job-{key}"
        started = run_at + 0.5
        self.jobs.append(
            {
                "id": job_id,
                "type": job_type,
                "status": status,
                "attempt": len(outcomes),
                "idempotency_key": key,
                "run_at": at(run_at),
                "started_at": at(started) if outcomes else None,
                "finished_at": at(finished_at) if finished_at is not None else None,
                "created_at": at(0.5),
            }
        )
        for n, outcome in enumerate(outcomes, start=1):
            self.fence += 1
            self.attempts.append(
                {
                    "job_id": job_id,
                    "attempt": n,
                    "fence": self.fence,
                    "worker": f"worker-{1 + n % 2}",
                    "started_at": at(started),
                    "outcome": outcome,
                }
            )
        if effects is None:
            effects = 1 if job_type == "ledger" and status == "succeeded" else 0
        for _ in range(effects):
            self.effects.append({"job_id": job_id, "fence": self.fence, "kind": "ledger"})
        return job_id

    def fault(self, fault: str, target: str | None, start: float, stop: float) -> None:
        self.op(start, "nemesis", "invoke", "nemesis", nemesis_value(fault, "start", target))
        self.op(start + 0.1, "nemesis", "info", "nemesis", nemesis_value(fault, "start", target))
        self.op(stop, "nemesis", "invoke", "nemesis", nemesis_value(fault, "stop", target))
        self.op(stop + 0.1, "nemesis", "info", "nemesis", nemesis_value(fault, "stop", target))

    def check(self, quiet_at: float = 60.0, **kw: Any) -> Verdict:
        kw.setdefault("run_started_at", T0)
        return check(self.ops, self.jobs, self.effects, self.attempts, quiet_at=quiet_at, **kw)


def kinds(verdict: Verdict) -> set[str]:
    return {p.kind for p in verdict.findings}


# ---------------------------------------------------------------- histories that must fail


def test_an_accepted_job_that_never_finished_is_lost():
    run = Run()
    run.submit("a")
    run.job("a")
    run.submit("b", t=2.0)
    run.job("b", "queued", finished_at=None, outcomes=())
    verdict = run.check()
    assert verdict.valid is False
    assert verdict.accepted == 2 and verdict.succeeded == 1 and verdict.lost == 1
    assert verdict.lost_jobs[0].key == "b"
    assert any("lost" in p and "queued" in p for p in verdict.problems)


def test_an_acknowledged_job_missing_from_the_table_is_lost():
    run = Run()
    run.submit("a")
    verdict = run.check()
    assert verdict.valid is False and verdict.lost == 1
    assert "no job with its key" in verdict.lost_jobs[0].reason


def test_a_doubled_effect_fails():
    run = Run()
    run.submit("a", job_type="ledger")
    run.job("a", job_type="ledger", outcomes=("lease_expired", "succeeded"), effects=2)
    verdict = run.check()
    assert verdict.valid is False
    assert verdict.doubled == 1 and verdict.lost == 0
    assert "2 ledger effects" in verdict.doubled_jobs[0].reason
    assert kinds(verdict) == {"doubled"}


def test_an_unknown_submit_that_landed_must_finish():
    run = Run()
    run.submit("ok")
    run.job("ok")
    run.submit("u", ("info",), t=5.0)
    # it landed, ran once, the lease expired and the retry never came
    run.job("u", "failed", run_at=6.0, finished_at=None, outcomes=("lease_expired",))
    verdict = run.check()
    assert verdict.valid is False
    assert verdict.accepted == 2 and verdict.unknown_landed == 1
    assert verdict.lost == 1 and verdict.lost_jobs[0].key == "u"


def test_a_ledger_job_that_succeeded_without_its_effect_is_lost():
    run = Run()
    run.submit("l", job_type="ledger")
    run.job("l", job_type="ledger", effects=0)
    verdict = run.check()
    assert verdict.valid is False and verdict.lost == 1
    assert verdict.lost_jobs[0].reason == "ledger job succeeded without its effect"


def test_a_dead_job_that_was_not_allowed_to_die_fails():
    run = Run()
    run.submit("f", job_type="fail", may_die=False)
    run.job("f", "dead", job_type="fail", outcomes=("failed", "failed", "dead"))
    verdict = run.check()
    assert verdict.valid is False
    assert verdict.dead == 1 and verdict.lost == 0
    assert kinds(verdict) == {"dead"}


def test_an_effect_of_a_job_that_did_not_succeed_fails():
    run = Run()
    run.submit("l", job_type="ledger", may_die=True)
    run.job("l", "dead", job_type="ledger", outcomes=("dead",), effects=1)
    verdict = run.check()
    assert verdict.valid is False and verdict.stray_effects == 1
    assert kinds(verdict) == {"stray_effect"}


def test_a_rejected_submit_whose_job_exists_fails():
    run = Run()
    run.submit("ok")
    run.job("ok")
    run.submit("r", ("fail",), t=3.0)
    run.job("r")
    verdict = run.check()
    assert verdict.valid is False and kinds(verdict) == {"rejected_landed"}
    assert verdict.rejected == 1 and verdict.accepted == 1


def test_an_acknowledged_id_that_is_not_the_tables_fails():
    run = Run()
    run.submit("a", job_id="job-elsewhere")
    run.job("a")
    verdict = run.check()
    assert verdict.valid is False and kinds(verdict) == {"mismatch"}


def receipt_run(receipts: int, **job: Any) -> Run:
    """One order through the shop whose receipt job succeeded after a stalled attempt; the
    order holds ``receipts`` recorded receipts, as the runner reads them from shop_orders."""
    run = Run()
    run.fault("sigstop", "worker-1", 2.0, 27.0)
    run.submit("o", job_type="send_receipt")
    job.setdefault("outcomes", ("lease_expired", "succeeded"))
    job_id = run.job("o", job_type="send_receipt", finished_at=30.0, effects=0, **job)
    orders = [{"order_id": 1, "job_id": job_id, "receipts_recorded": receipts}]
    run.effects += receipt_effects(orders)
    return run


def test_a_receipt_recorded_twice_is_doubled():
    verdict = receipt_run(2).check()
    assert verdict.valid is False
    assert verdict.doubled == 1 and verdict.lost == 0 and verdict.redeliveries == 1
    assert kinds(verdict) == {"doubled"}
    assert verdict.doubled_jobs[0].reason == "2 effects (receipt x2, no fence recorded)"
    assert judge(verdict, Expectations()).passed is False
    assert judge(verdict, Expectations(expect_doubled=True)).passed is True


def test_a_receipt_job_that_succeeded_without_its_receipt_is_lost():
    verdict = receipt_run(0).check()
    assert verdict.valid is False and verdict.lost == 1
    assert verdict.lost_jobs[0].reason == "send_receipt job succeeded without its effect"


def test_a_receipt_recorded_once_after_a_stalled_attempt_passes():
    verdict = receipt_run(1).check()
    assert verdict.valid is True, verdict.problems
    assert (verdict.doubled, verdict.lost, verdict.stray_effects) == (0, 0, 0)
    assert verdict.redeliveries == 1 and verdict.executions == {2: 1}
    assert judge(verdict, Expectations(min_redeliveries=1)).passed is True


def test_a_ledger_effect_does_not_stand_in_for_a_receipt():
    run = receipt_run(0)
    run.effects.append({"job_id": "job-o", "fence": 2, "kind": "ledger"})
    verdict = run.check()
    assert verdict.lost == 1 and verdict.doubled == 0


def test_the_shop_view_counts_emails_against_mail_calls():
    orders = [
        {"order_id": 1, "job_id": "a", "receipts_recorded": 1},
        {"order_id": 2, "job_id": "b", "receipts_recorded": 2},
        {"order_id": 3, "job_id": "c", "receipts_recorded": 0},
    ]
    mail = [
        {"idempotency_key": "leasework:a", "job_id": "a", "calls": 1},
        {"idempotency_key": "leasework:b", "job_id": "b", "calls": 2},
    ]
    assert [e["job_id"] for e in receipt_effects(orders)] == ["a", "b", "b"]
    assert all(
        e == {"job_id": e["job_id"], "fence": None, "kind": "receipt"}
        for e in receipt_effects(orders)
    )
    emails = [
        {"job_id": "a", "fence": 1},
        {"job_id": "b", "fence": 3},
        {"job_id": "b", "fence": 2},  # after fence 3: a stale attempt's email
        {"job_id": "b", "fence": 4},  # a newer attempt after the first's landed: a repeat
    ]
    refused = [{"job_id": "c", "fence": 1, "highest": 2}]
    view = shop_view(orders, mail, emails, refused)
    assert view.to_dict() == {
        "orders": 3,
        "receipts_recorded": 3,
        "orders_without_receipt": 1,
        "orders_doubled": 1,
        "emails": 4,
        "mail_calls": 3,
        "emails_called_again": 1,
        "jobs_emailed_twice": 1,
        "stale_emails": 1,
        "mail_refusals": 1,
        "keyed_emails": 2,
        "guard": "key,fence",
    }
    assert email_effects(emails)[2] == {"job_id": "b", "fence": 2, "kind": "email"}


def test_a_receipt_emailed_twice_is_doubled_and_an_email_beside_its_receipt_is_not():
    once = receipt_run(1)
    once.effects += email_effects([{"job_id": "job-o", "fence": 2}])
    verdict = once.check()
    assert verdict.valid is True and verdict.doubled == 0, verdict.problems
    twice = receipt_run(1)
    twice.effects += email_effects(
        [{"job_id": "job-o", "fence": 2}, {"job_id": "job-o", "fence": 1}]
    )
    verdict = twice.check()
    assert verdict.valid is False and verdict.doubled == 1
    # the fences in the order sent: the stale attempt's email came after the newer one's
    assert verdict.doubled_jobs[0].reason == "2 email effects (fences 2, 1)"
    assert verdict.doubled_jobs[0].effects == ("email",)  # the judge leaves these to the shop


# ---------------------------------------------------------------- histories that must pass


def test_a_clean_run_passes_with_its_measures():
    run = Run()
    run.fault("sigstop", "worker-1", 10.0, 20.0)
    for i in range(4):
        run.submit(f"n{i}", t=float(i), process=i % 2)
        run.job(f"n{i}", run_at=float(i), finished_at=15.0 + i * 4)
    run.submit("l", t=5.0, job_type="ledger")
    run.job("l", job_type="ledger", run_at=5.0, finished_at=6.0)
    verdict = run.check(fence_rejections=0)
    assert verdict.valid is True, verdict.problems
    assert verdict.problems == ()
    assert (verdict.submitted, verdict.accepted, verdict.succeeded) == (5, 5, 5)
    assert verdict.lost == verdict.doubled == verdict.redeliveries == 0
    assert verdict.executions == {1: 5} and verdict.max_executions == 1
    assert verdict.fence_rejections == 0
    # healed at 20.1; jobs finished at 15, 19, 23, 27: the first after healing is 23
    (recovery,) = verdict.recovery
    assert (recovery.fault, recovery.target) == ("sigstop", "worker-1")
    assert recovery.started == pytest.approx(10.1) and recovery.stopped == pytest.approx(20.1)
    assert recovery.seconds == pytest.approx(2.9)
    assert verdict.scheduling_delay_p50 == pytest.approx(0.5)
    assert verdict.scheduling_delay_p99 == pytest.approx(0.5)
    assert verdict.finish_times == (6.0, 15.0, 19.0, 23.0, 27.0)


def test_an_unknown_submit_that_never_landed_is_fine():
    run = Run()
    run.submit("a")
    run.job("a")
    run.submit("gone", ("info",), t=2.0)
    run.submit("open", ("open",), t=9.0, process=1)
    verdict = run.check()
    assert verdict.valid is True, verdict.problems
    assert verdict.accepted == 1 and verdict.unknown_not_landed == 2


def test_an_unknown_submit_retried_under_its_key_counts_once():
    run = Run()
    run.submit("a", ("info", "info", "ok"))
    run.job("a")
    verdict = run.check()
    assert verdict.valid is True, verdict.problems
    assert verdict.submitted == verdict.accepted == verdict.acknowledged == 1


def test_a_retried_fail_job_passes_and_retries_are_not_redeliveries():
    run = Run()
    run.submit("f", job_type="fail")
    run.job("f", job_type="fail", outcomes=("failed", "failed", "succeeded"))
    verdict = run.check()
    assert verdict.valid is True, verdict.problems
    assert verdict.executions == {3: 1} and verdict.total_executions == 3
    assert verdict.redeliveries == 0


def test_a_fail_job_allowed_to_die_may_be_dead():
    run = Run()
    run.submit("f", job_type="fail", may_die=True)
    run.job("f", "dead", job_type="fail", outcomes=("failed", "dead"))
    verdict = run.check()
    assert verdict.valid is True, verdict.problems
    assert verdict.dead == 1


def test_an_attempt_after_a_lost_lease_is_a_redelivery():
    run = Run()
    run.submit("l", job_type="ledger")
    run.job("l", job_type="ledger", outcomes=(None, "lease_expired", "failed", "succeeded"))
    verdict = run.check()
    assert verdict.valid is True, verdict.problems
    assert verdict.redeliveries == 2 and verdict.max_executions == 4


def test_rows_may_be_tuples_and_timestamps_strings():
    run = Run()
    run.submit("l", job_type="ledger")
    run.job("l", job_type="ledger")
    jobs = [
        {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in j.items()}
        for j in run.jobs
    ]
    effects = [(e["job_id"], e["fence"], e["kind"]) for e in run.effects]
    attempts = [
        (a["job_id"], a["attempt"], a["fence"], a["worker"], a["started_at"], a["outcome"])
        for a in run.attempts
    ]
    verdict = check(run.ops, jobs, effects, attempts, quiet_at=60.0, run_started_at=T0.isoformat())
    assert verdict == run.check()


def test_jobs_of_other_runs_are_counted_not_judged():
    run = Run()
    run.submit("a")
    run.job("a")
    run.job("someone-else", "queued", finished_at=None, outcomes=())
    verdict = run.check()
    assert verdict.valid is True and verdict.unmatched_jobs == 1


# ---------------------------------------------------------------- unknown, and composition


def test_a_job_not_yet_due_at_quiet_is_unknown_not_lost():
    run = Run()
    run.submit("d")
    run.job("d", "scheduled", run_at=120.0, finished_at=None, outcomes=())
    verdict = run.check(quiet_at=60.0)
    assert verdict.valid == UNKNOWN and verdict.lost == 0
    assert kinds(verdict) == {"not_due"}
    # without the wall-clock origin the checker cannot tell, and calls it lost
    assert run.check(quiet_at=60.0, run_started_at=None).valid is False


def test_a_run_that_accepted_nothing_proves_nothing():
    run = Run()
    run.submit("gone", ("info",))
    assert run.check().valid == UNKNOWN


def test_invalid_outranks_unknown_outranks_valid():
    assert rank(True) < rank(UNKNOWN) < rank(False)
    assert merge_valid() is True
    assert merge_valid(True, True) is True
    assert merge_valid(True, UNKNOWN, True) == UNKNOWN
    assert merge_valid(UNKNOWN, False, True) is False
    assert merge_valid(False, UNKNOWN) is False
    with pytest.raises(ValueError):
        rank("maybe")  # type: ignore[arg-type]


def test_checkers_compose_by_name_and_keep_each_findings_kind():
    composed = compose(
        {
            "later": lambda _: [Finding("not_due", UNKNOWN, "later")],
            "clean": lambda _: Checked(measures={"count": 3}),
            "gone": lambda _: iter([Finding("lost", False, "gone")]),
        },
        None,
    )
    assert composed.valid is False
    assert [f.kind for f in composed.findings] == ["not_due", "lost"]
    assert [(r.name, r.valid) for r in composed] == [
        ("later", UNKNOWN),
        ("clean", True),
        ("gone", False),
    ]
    assert composed["clean"].measures == {"count": 3}
    assert compose({}, None).valid is True


def test_a_crashing_checker_is_unknown_never_a_silent_pass():
    def broken(_):
        raise KeyError("job_id")

    composed = compose({"fine": lambda _: (), "broken": broken}, None)
    assert composed.valid == UNKNOWN
    (finding,) = composed.findings
    assert finding.kind == "crashed" and finding.valid == UNKNOWN
    assert "the broken checker raised KeyError" in finding.message
    # a broken checker among the history checkers leaves the verdict unknown, not valid
    run = Run()
    run.submit("a")
    run.job("a")
    assert run.check().valid is True
    verdict = run.check(checkers={**HISTORY_CHECKERS, "effects": broken})
    assert verdict.valid == UNKNOWN and [f.kind for f in verdict.findings] == ["crashed"]
    assert {r.name: r.valid for r in verdict.results}["effects"] == UNKNOWN
    assert verdict.accepted == 1 and verdict.succeeded == 1  # the other checkers still ran


def test_a_verdict_with_unknown_and_invalid_findings_is_invalid():
    run = Run()
    run.submit("d")
    run.job("d", "scheduled", run_at=120.0, finished_at=None, outcomes=())
    run.submit("x", t=2.0)
    run.job("x", "running", finished_at=None, outcomes=(None,))
    verdict = run.check()
    assert kinds(verdict) == {"not_due", "lost"}
    assert verdict.valid is False


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0


# ---------------------------------------------------------------- judging against expectations


def _doubled_run() -> Verdict:
    run = Run()
    run.fault("sigstop", "worker-1", 2.0, 12.0)
    run.submit("l", job_type="ledger")
    run.job(
        "l", job_type="ledger", finished_at=14.0, outcomes=("succeeded", "succeeded"), effects=2
    )
    return run.check()


def test_the_unsafe_run_passes_only_if_it_shows_duplicates():
    doubled = _doubled_run()
    assert doubled.valid is False
    assert judge(doubled, Expectations(expect_doubled=True)).passed is True
    assert judge(doubled, Expectations()).passed is False

    run = Run()
    run.submit("l", job_type="ledger")
    run.job("l", job_type="ledger")
    clean = run.check()
    verdict = judge(clean, Expectations(expect_doubled=True))
    assert verdict.passed is False and "could not have failed" in verdict.problems[0]


def test_judge_bounds_lost_recovery_and_alerts():
    run = Run()
    run.fault("link_down", "postgres", 2.0, 10.0)
    run.submit("a")
    run.job("a", finished_at=40.0)
    run.submit("b", t=2.0)
    run.job("b", "queued", finished_at=None, outcomes=())
    verdict = run.check()
    assert verdict.recovery[0].seconds == pytest.approx(29.9)
    assert judge(verdict, Expectations(max_lost=1)).passed is True
    assert judge(verdict, Expectations()).passed is False
    assert judge(verdict, Expectations(max_lost=1, recovery_seconds=10)).passed is False
    assert judge(verdict, Expectations(max_lost=1, alerts=("X",))).passed == UNKNOWN
    fired = judge(
        verdict, Expectations(max_lost=1, alerts=("X",)), alerts_fired=["X"], alerts_delivered=["X"]
    )
    assert fired.passed is True
    missed = judge(verdict, Expectations(max_lost=1, alerts=("X",)), alerts_fired=[])
    assert missed.passed is False and missed.problems == ("alert X did not fire",)


def test_a_fault_with_no_job_finished_after_it_has_unmeasured_recovery():
    run = Run()
    run.submit("a")
    run.job("a", finished_at=3.0)
    run.fault("redis_flushall", "redis", 30.0, 30.0)
    verdict = run.check()
    assert verdict.recovery[0].seconds is None and verdict.valid is True
    assert judge(verdict, Expectations(recovery_seconds=5)).passed == UNKNOWN


# ---------------------------------------------------------------- pairs and fault windows


def test_pairs_and_fault_windows():
    run = Run()
    run.submit("a", ("info", "ok"))
    run.fault("latency", "redis", 5.0, 9.0)
    run.op(20.0, "nemesis", "invoke", "nemesis", nemesis_value("sigkill", "start", "relay"))
    paired = pairs(run.ops)
    assert [p.type for p in paired] == ["info", "ok", "info", "info", "info"]
    windows = fault_windows(run.ops)
    assert [(w.label, w.start, w.stop) for w in windows] == [
        ("latency redis", 5.1, 9.1),
        ("sigkill relay", 20.0, None),
    ]
