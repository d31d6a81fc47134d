"""Judging a run: its verdict held to the scenario's expectations, and the harness's own
checks of what it saw, each a checker composed by name into one :class:`Judgement`.

:data:`EXPECTATIONS` judge the verdict: lost and doubled jobs are held to ``max_lost`` and
``max_doubled`` (with ``expect_doubled``, the unsafe run, a run *without* duplicate effects
fails: the harness showed it cannot fail), a run's schedules' missing, doubled, lost (and, if
bounded, late) ticks to ``max_missing_ticks`` and the rest (``expect_doubled_ticks`` for the
unsafe scheduler's run), a unique load's violations together to ``max_unique_violations``
(``expect_doubled_keys`` for the unsafe, check-then-insert load), every other finding of the
history checkers counts as it is, and the recovery bound, the alerts that must fire and
their notifications (each expected alert that fired must also have reached the api's webhook
through Alertmanager, a finding of kind ``alert_not_delivered`` when it did not) are checked.

:data:`HARNESS` judge what the runner saw besides (so that no run passes vacuously or on a
stack someone else drove): a leasework process that crashed, interference, faults that did
not inject or heal or met no work, the API's "nothing was written" that had written, the
backlog drain bound, and evidence that the faults hit (redeliveries, unknown submits that
landed, messages produced twice, expected alerts not already firing at the start, unique
inserters that met on a key: duplicates answered, waiters that inserted after a rollback;
calls the shop's mail service refused as stale), and the product's own auditor held to the
checker (nothing found with the fence on, every doubled job found with it off).

Pure: the :class:`Evidence` is gathered by the runner.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chaos.auditor import DOUBLE_KINDS, TICK_KINDS
from chaos.checker import UNKNOWN, Checker, Composed, Finding, Result, Validity, compose
from chaos.unique_keys import VIOLATIONS as UNIQUE_VIOLATIONS

if TYPE_CHECKING:
    from chaos.auditor import AuditorView
    from chaos.limits import LimitView, RateView
    from chaos.messages import MessageView
    from chaos.nemesis import Injection
    from chaos.pauses import PauseView
    from chaos.scenario import Expectations
    from chaos.shop import ShopView
    from chaos.verdict import Verdict
    from chaos.workload import ClientView, Drain


@dataclass(frozen=True)
class Evidence:
    """What a run is judged on: the history checkers' verdict, the scenario's expectations,
    and what the harness saw besides. ``alerts_fired`` None: the alerts were not read;
    ``alerts_delivered`` (the alerts whose notification reached the api through
    Alertmanager) None: the notifications were not read; ``firing_at_start`` None: could not
    be read."""

    verdict: Verdict
    expect: Expectations
    alerts_fired: Collection[str] | None = None
    alerts_delivered: Collection[str] | None = None
    firing_at_start: Collection[str] | None = None
    view: ClientView | None = None
    drains: Sequence[Drain] = ()
    injections: Sequence[Injection] = ()
    messages: MessageView | None = None
    meddling: Sequence[str] = ()  # signs that something else drove the stack
    crashed: Sequence[str] = ()  # leasework processes that died with no fault killing them
    shop: ShopView | None = None  # the example shop's orders and emails, if the run used it
    auditor: AuditorView | None = None  # the relay's auditor on the run's jobs (None: unread)
    fencing: bool = True  # the workers' lease mode: fenced, or the unsafe plain TTL
    pauses: PauseView | None = None  # the queue_pause faults' windows (None: no pause)
    limits: LimitView | None = None  # the keyed jobs' effects in flight per key (None: none)
    rates: RateView | None = None  # the rated jobs' starts per key (None: none)


@dataclass(frozen=True)
class Judgement:
    """A run held to its expectations (and the harness's checks). ``passed`` is a validity
    too; ``problems`` the findings' messages; ``results`` each judge's, by name."""

    passed: Validity
    problems: tuple[str, ...]
    results: tuple[Result, ...] = ()

    @classmethod
    def of(cls, composed: Composed) -> Judgement:
        return cls(composed.valid, tuple(f.message for f in composed.findings), composed.results)

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for r in self.results for f in r.findings)

    def findings_of(self, names: Collection[str]) -> tuple[Finding, ...]:
        """The findings of the judges named ``names`` (e.g. :data:`HARNESS`)."""
        return tuple(f for r in self.results if r.name in names for f in r.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "problems": list(self.problems)}


def _label(fault: str, target: str | None) -> str:
    return f"{fault} {target}" if target else fault


def _too_slow(kind: str, text: str, bound: float) -> Finding:
    """A recovery measured past the scenario's ``recovery_seconds``: invalid."""
    return Finding(kind, False, f"{text}; bound {bound:g}s")


# ---------------------------------------------------------------- the expectations

# findings that expectations bound by count, instead of failing on sight
_COUNTED = frozenset(
    {"lost", "doubled", "tick_missing", "tick_doubled", "tick_lost"}
    | {f"unique_{name}" for name in UNIQUE_VIOLATIONS}
)
# what the unsafe unique load (check-then-insert) must show, and what comes with it
_UNSAFE_UNIQUE = ("doubled", "created_twice")


def history_findings(e: Evidence) -> Iterator[Finding]:
    """The history checkers' findings, except the ones bounded by count below."""
    return (f for f in e.verdict.findings if f.kind not in _COUNTED)


def lost_bound(e: Evidence) -> Iterator[Finding]:
    if e.expect.expect_lost:
        if e.verdict.lost == 0:
            yield Finding(
                "lost",
                False,
                "expected lost jobs (the recovery of lost records off) but saw none: this run "
                "could not have failed",
            )
        return
    if e.verdict.lost > e.expect.max_lost:
        yield Finding(
            "lost", False, f"{e.verdict.lost} job(s) lost; at most {e.expect.max_lost} allowed"
        )


def doubled_bound(e: Evidence) -> Iterator[Finding]:
    doubled = e.verdict.doubled
    if e.expect.expect_doubled:
        if doubled == 0:
            yield Finding(
                "doubled",
                False,
                "expected duplicate effects (fencing off) but saw none: this run could "
                "not have failed",
            )
    elif doubled > e.expect.max_doubled:
        yield Finding(
            "doubled",
            False,
            f"{doubled} job(s) took effect more than once; at most {e.expect.max_doubled} allowed",
        )


def ticks_bound(e: Evidence) -> Iterator[Finding]:
    """The run's schedules (:mod:`chaos.ticks`): missing, doubled and lost ticks held to
    their bounds (with ``expect_doubled_ticks``, the unsafe scheduler's run, a run without
    a doubled tick fails), late ticks to theirs when the scenario sets one."""
    ticks, x = e.verdict.ticks, e.expect
    if ticks is None:
        if x.expect_doubled_ticks:
            yield Finding(
                "tick_doubled",
                UNKNOWN,
                "expected doubled ticks (unsafe scheduler) but no tick was checked",
            )
        return
    bounds = [("missing", x.max_missing_ticks), ("lost", x.max_lost_ticks)]
    if not x.expect_doubled_ticks:
        bounds.append(("doubled", x.max_doubled_ticks))
    elif ticks.total("doubled") == 0:
        yield Finding(
            "tick_doubled",
            False,
            "expected doubled ticks (unsafe scheduler) but saw none: this run could not "
            "have failed",
        )
    if x.max_late_ticks is not None:
        bounds.append(("late", x.max_late_ticks))
    for name, bound in bounds:
        seen = ticks.total(name)
        if seen > bound:
            yield Finding(
                f"tick_{name}",
                False,
                f"{seen} tick(s) {name}; at most {bound} allowed"
                + (
                    f" (late: fired more than {ticks.late_seconds:g}s after their instant)"
                    if name == "late"
                    else ""
                ),
            )


def unique_bound(e: Evidence) -> Iterator[Finding]:
    """The run's unique keys (:mod:`chaos.unique_keys`): every violation together held to
    ``max_unique_violations``; with ``expect_doubled_keys`` (the unsafe, check-then-insert
    load) a run without a doubled key fails, and its doubled keys (and the answers that each
    created one) are what it shows, not violations."""
    unique, x = e.verdict.unique, e.expect
    if unique is None:
        if x.expect_doubled_keys:
            # as for ticks: nothing checked shows nothing, either way
            yield Finding("unique_doubled", UNKNOWN, "unique_doubled: no key was checked")
        return
    counted = UNIQUE_VIOLATIONS
    if x.expect_doubled_keys:
        counted = tuple(n for n in UNIQUE_VIOLATIONS if n not in _UNSAFE_UNIQUE)
        if unique.doubled == 0:
            yield Finding(
                "unique_doubled",
                False,
                "unique_doubled: expected doubled keys (check-then-insert without the index) "
                "but saw none: this run could not have failed",
            )
    seen = {name: unique.total(name) for name in counted if unique.total(name)}
    if sum(seen.values()) > x.max_unique_violations:
        text = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in seen.items())
        yield Finding(
            "unique",
            False,
            f"unique keys: {text}; at most {x.max_unique_violations} allowed",
        )


def recovery_bound(e: Evidence) -> Iterator[Finding]:
    """A fault with no job finished after it is ``unknown`` against the bound."""
    bound = e.expect.recovery_seconds
    if bound is None:
        return
    for r in e.verdict.recovery:
        label = _label(r.fault, r.target)
        if r.seconds is None:
            yield Finding(
                "recovery",
                UNKNOWN,
                f"{label} (from t={r.started:.1f}s): no job finished after it was "
                "healed, recovery not measured",
            )
        elif r.seconds > bound:
            text = f"{label}: recovered {r.seconds:.1f}s after healing at t={r.stopped:.1f}s"
            yield _too_slow("recovery", text, bound)


def alerts_fired(e: Evidence) -> Iterator[Finding]:
    if not e.expect.alerts:
        return
    if e.alerts_fired is None:
        yield Finding("alerts", UNKNOWN, f"alerts {', '.join(e.expect.alerts)} were not checked")
        return
    fired = set(e.alerts_fired)
    for name in e.expect.alerts:
        if name not in fired:
            yield Finding("alerts", False, f"alert {name} did not fire")


def alerts_delivered(e: Evidence) -> Iterator[Finding]:
    """An expected alert that fired must have reached someone: its notification through
    Alertmanager in the api's ``alert_notifications``. One that did not fire is the
    ``alerts`` finding's, and alerts not read at all are ``alerts``' unknown."""
    if not e.expect.alerts or e.alerts_fired is None:
        return
    fired = [name for name in e.expect.alerts if name in e.alerts_fired]
    if not fired:
        return
    if e.alerts_delivered is None:
        yield Finding(
            "alert_not_delivered",
            UNKNOWN,
            f"alert_not_delivered: the notifications of {', '.join(fired)} were not read",
        )
        return
    for name in fired:
        if name not in e.alerts_delivered:
            yield Finding(
                "alert_not_delivered",
                False,
                f"alert_not_delivered: {name} fired in Prometheus but no notification of it "
                "reached the api's webhook through Alertmanager",
            )


EXPECTATIONS: Mapping[str, Checker[Evidence]] = {
    "history": history_findings,
    "lost": lost_bound,
    "doubled": doubled_bound,
    "ticks": ticks_bound,
    "unique": unique_bound,
    "recovery": recovery_bound,
    "alerts": alerts_fired,
    "alerts_delivered": alerts_delivered,
}


# ---------------------------------------------------------------- the harness's own checks


def crashes(e: Evidence) -> Iterator[Finding]:
    for what in e.crashed:
        yield Finding("crash", False, f"crash: {what}")


def interference(e: Evidence) -> Iterator[Finding]:
    for what in e.meddling:
        yield Finding(
            "interference",
            UNKNOWN,
            f"interference: {what}; something else drove the shared stack during the "
            "run, so it does not show what the scenario claims",
        )


def faults_as_planned(e: Evidence) -> Iterator[Finding]:
    """Every fault injected, healed, and (when it waited for busy workers) hitting work."""
    for injection in e.injections:
        spec = injection.spec
        if injection.start_error:
            yield Finding(
                "nemesis",
                UNKNOWN,
                f"nemesis: {spec.label} at t={spec.at:g}s was not injected as planned "
                f"({injection.start_error}); the run does not show what it claims",
            )
        if injection.started and not injection.healed:
            yield Finding(
                "nemesis",
                UNKNOWN,
                f"nemesis: {spec.label} could not be healed ({injection.stop_error})",
            )
        if spec.wait_for is not None and injection.wait_met is False:
            peak = injection.peak
            yield Finding(
                "evidence",
                UNKNOWN,
                f"evidence: {spec.label} at t={spec.at:g}s waited "
                f"{spec.wait_for.patience:g}s for {spec.wait_for.label} and saw "
                f"{'nothing readable' if peak is None else f'at most {peak:g}'}: it hit "
                "without the work it is meant to hit",
            )


def api_contract(e: Evidence) -> Iterator[Finding]:
    replayed = e.view.failed_then_replayed if e.view is not None else ()
    if replayed:
        keys = ", ".join(replayed[:5])
        yield Finding(
            "api_contract",
            False,
            f"api_contract: {len(replayed)} submit(s) were answered 503 "
            f"'nothing was written' yet had created their job (a retry got it back as a "
            f"replay): {keys}",
        )


def drain_bound(e: Evidence) -> Iterator[Finding]:
    bound = e.expect.recovery_seconds
    if bound is None:
        return
    for drain in e.drains:
        label = _label(drain.fault, drain.target)
        if drain.seconds is not None and drain.seconds > bound:
            text = (
                f"drain: the backlog of {label} (healed at t={drain.stopped:.1f}s) "
                f"took {drain.seconds:.1f}s to finish"
            )
            yield _too_slow("drain", text, bound)


def redeliveries(e: Evidence) -> Iterator[Finding]:
    if e.verdict.redeliveries < e.expect.min_redeliveries:
        yield Finding(
            "evidence",
            UNKNOWN,
            f"evidence: {e.verdict.redeliveries} redelivered job(s), at least "
            f"{e.expect.min_redeliveries} expected: the faults did not hit running jobs, so "
            "the run shows nothing about them",
        )


def unknown_landed(e: Evidence) -> Iterator[Finding]:
    wanted = e.expect.min_unknown_landed
    seen = e.view.unknown_landed if e.view is not None else None
    if wanted and (seen is None or seen < wanted):
        yield Finding(
            "evidence",
            UNKNOWN,
            f"evidence: {'unknown' if seen is None else seen} submit(s) with an unknown "
            f"outcome landed, at least {wanted} expected: the fault did "
            "not produce the ambiguity it is meant to",
        )


def alerts_not_firing_at_start(e: Evidence) -> Iterator[Finding]:
    for name in e.expect.alerts:
        if e.firing_at_start is None or name in e.firing_at_start:
            why = "could not be read" if e.firing_at_start is None else "was already firing"
            yield Finding(
                "alerts",
                UNKNOWN,
                f"alerts: {name}: the set of alerts firing when the run started {why}; "
                "this run cannot show that its faults tripped it",
            )


def _too_little(seen: int | None, wanted: int, what: str, why: str) -> Iterator[Finding]:
    """An evidence finding (unknown) when ``seen`` (None: could not be read) is below
    ``wanted``; nothing when ``wanted`` is 0."""
    if wanted and (seen is None or seen < wanted):
        yield Finding(
            "evidence",
            UNKNOWN,
            f"evidence: {'unknown' if seen is None else seen} {what}, at least {wanted} "
            f"expected: {why}",
        )


def duplicate_messages(e: Evidence) -> Iterator[Finding]:
    return _too_little(
        e.messages.duplicate_messages if e.messages is not None else None,
        e.expect.min_duplicate_messages,
        "message(s) produced twice",
        "no kill landed between producing and marking published",
    )


def unique_contention(e: Evidence) -> Iterator[Finding]:
    """Evidence that the unique load's inserters really met: committed answers of duplicate
    and keys a waiter created after the holder rolled back."""
    unique, x = e.verdict.unique, e.expect
    for name, wanted, what in (
        ("duplicates", x.min_unique_duplicates, "committed answer(s) of duplicate"),
        ("handoffs", x.min_unique_handoffs, "key(s) created by a waiter after a rollback"),
    ):
        seen = None if unique is None else getattr(unique, name)
        if wanted and (seen is None or seen < wanted):
            yield Finding(
                "evidence",
                UNKNOWN,
                f"evidence: {'unknown' if seen is None else seen} {what}, at least {wanted} "
                "expected: the inserters did not contend, so the run shows nothing about it",
            )


def mail_refusals(e: Evidence) -> Iterator[Finding]:
    """Evidence that a stale attempt reached the shop's mail service and was refused."""
    return _too_little(
        e.shop.mail_refusals if e.shop is not None else None,
        e.expect.min_mail_refusals,
        "call(s) refused as stale by the mail service",
        "no stale attempt's call arrived after a newer attempt's, so the run shows nothing "
        "about the fence downstream",
    )


# the effects a job takes outside leasework's tables (the shop's mail service's emails): their
# doubles are the downstream fence's to stop and the checker's to see, not the auditor's
NOT_LEASEWORKS = frozenset({"email"})


def auditor_agrees(e: Evidence) -> Iterator[Finding]:
    """The product's auditor held to the checker: it finds every job the checker found
    taking a fenced effect (or success) twice (with the fence off) and every job of a tick
    the tick checker found doubled; with the fence on, it finds nothing else among the run's
    jobs. (A shop email sent twice is not its to see: the mail service is not leasework's;
    the checker's email doubles are left out. Nor is a unique key the run's inserters
    doubled without asking for one, as s-unique-unsafe's do: no key, nothing to audit.)"""
    seen = e.auditor
    if seen is None:
        return
    if not seen.reached:
        yield Finding(
            "auditor",
            UNKNOWN,
            f"auditor: its watermark did not pass the run's last finished job within "
            f"{seen.waited:.0f}s, so what it found is not the whole run",
        )
        return
    doubled = (
        set()
        if e.fencing
        else {j.job_id for j in e.verdict.doubled_jobs if set(j.effects) - NOT_LEASEWORKS}
    )
    ticks = set(e.verdict.ticks.doubled_jobs) if e.verdict.ticks is not None else set()
    for what, wanted, kinds in (
        ("job(s) the checker found doubled", doubled, DOUBLE_KINDS),
        ("job(s) of the ticks the tick checker found doubled", ticks, TICK_KINDS),
    ):
        missed = sorted(wanted - seen.jobs(kinds))
        if missed:  # (none doubled at all is doubled_bound's to judge)
            yield Finding(
                "auditor",
                False,
                f"auditor: missed {len(missed)} of the {len(wanted)} {what} "
                f"({', '.join(missed[:5])}{' ...' if len(missed) > 5 else ''})",
            )
    if not e.fencing:
        return
    unexplained = [
        v for v in seen.violations if not (v["kind"] in TICK_KINDS and v["job_id"] in ticks)
    ]
    if unexplained:
        shown = "; ".join(f"{v['kind']} {v['job_id']}: {v['detail']}" for v in unexplained[:3])
        yield Finding(
            "auditor",
            False,
            f"auditor: found {len(unexplained)} violation(s) among the run's jobs with the "
            f"fence on that the checkers did not ({shown}"
            f"{' ...' if len(unexplained) > 3 else ''})",
        )


def pauses_held(e: Evidence) -> Iterator[Finding]:
    """A queue_pause held: no attempt of the run's jobs of the paused queue started inside
    its window, the queue was resumed, and the pause held something back (a job created
    before the resume that first started after it), so a pause that did nothing is not
    taken for one that held."""
    for w in () if e.pauses is None else e.pauses.windows:
        if w.started_inside:
            yield Finding(
                "pauses",
                False,
                f"pause: {len(w.started_inside)} job(s) of queue {w.queue} started while it "
                f"was paused, e.g. {', '.join(w.started_inside[:3])}",
            )
        if w.resumed_at is None:
            yield Finding("pauses", False, f"pause: queue {w.queue} was never resumed")
        elif w.held_back == 0:
            yield Finding(
                "pauses",
                UNKNOWN,
                f"pause: queue {w.queue}'s pause held back none of the run's jobs, so it "
                "shows nothing (submit to the queue while it is paused)",
            )


def _per_key(
    kind: str, view: LimitView | RateView | None, over: str, idle: str
) -> Iterator[Finding]:
    """A per-key bound (a concurrency or rate limit) held by every key of the run, and
    reached by one (else the run shows nothing)."""
    if view is None:
        return
    if view.over:
        shown = ", ".join(f"{k}: {n}" for k, n in sorted(view.over.items())[:3])
        yield Finding(kind, False, f"{kind}: {len(view.over)} key(s) {over} ({shown})")
    elif not view.reached:
        yield Finding(kind, UNKNOWN, f"{kind}: {idle}")


def limits_held(e: Evidence) -> Iterator[Finding]:
    """The keyed jobs' concurrency limit held: no key had more than its limit of committed
    effects in flight at once, and some key reached it (else the run shows nothing)."""
    return _per_key(
        "limits",
        e.limits,
        "had more effects in flight at once than their limit",
        "no key reached its limit, so the run shows nothing (more keyed jobs per key, or "
        "longer handlers)",
    )


def rates_held(e: Evidence) -> Iterator[Finding]:
    """The rated jobs' rate limit held: no key had more handlers begin within a second than
    the rate allows (GCRA without burst: rate + 1), and some key reached the rate."""
    allowed = e.rates.allowed if e.rates is not None else 0
    return _per_key(
        "rates",
        e.rates,
        f"began more jobs within one second than {allowed}",
        "no key reached its rate, so the run shows nothing (submit a key's jobs faster "
        "than its rate)",
    )


HARNESS: Mapping[str, Checker[Evidence]] = {
    "crash": crashes,
    "interference": interference,
    "faults": faults_as_planned,
    "api_contract": api_contract,
    "drain": drain_bound,
    "redeliveries": redeliveries,
    "unknown_landed": unknown_landed,
    "alerts_at_start": alerts_not_firing_at_start,
    "duplicate_messages": duplicate_messages,
    "unique_contention": unique_contention,
    "mail_refusals": mail_refusals,
    "auditor": auditor_agrees,
    "pauses": pauses_held,
    "limits": limits_held,
    "rates": rates_held,
}


def judge(
    verdict: Verdict,
    expect: Expectations,
    *,
    alerts_fired: Collection[str] | None = None,
    alerts_delivered: Collection[str] | None = None,
) -> Judgement:
    """Did the run meet its scenario's expectations (:data:`EXPECTATIONS` only)?"""
    evidence = Evidence(verdict, expect, alerts_fired, alerts_delivered)
    return Judgement.of(compose(EXPECTATIONS, evidence))


def harness_findings(evidence: Evidence) -> tuple[Finding, ...]:
    """The harness's own findings on a run (:data:`HARNESS` alone)."""
    return compose(HARNESS, evidence).findings


def judge_run(evidence: Evidence) -> Judgement:
    """A run held to its expectations and to the harness's checks, in that order."""
    return Judgement.of(compose({**EXPECTATIONS, **HARNESS}, evidence))
