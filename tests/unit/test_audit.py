"""The auditor's invariants on hand-written rows: each kind found on a job seeded to break it,
and the histories a fenced system makes (a reaped attempt, a retry, an operator's retry of a
dead job, a cancel while a retry waits) found clean; and each fact judged by what held when it
happened (a cap or a rate changed while jobs ran, a schedule deleted and created again, a
unique policy changed between two jobs of a key), a seeded real violation still found."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leasework.audit import (
    AttemptRow,
    AuditReport,
    FinishedJob,
    KeyJob,
    Kind,
    LimitSpan,
    RateRule,
    RateStart,
    TickJob,
    cap_limits,
    check_finished,
    check_limits,
    check_rates,
    check_ticks,
    check_unique_keys,
    overdue_lease,
    queue_capped,
    running_at_start,
    running_at_starts,
    started_within,
    started_within_each,
    stuck_queued,
)
from leasework.audit.commands import parse_moment
from leasework.states import Status

NOW = datetime(2026, 12, 4, 8, 0, tzinfo=UTC)


def job(status: Status = Status.SUCCEEDED, fence: int = 2, attempt: int = 2, budget: int = 5):
    return FinishedJob(uuid.uuid4(), status, fence, attempt, budget, NOW)


def attempt(j: FinishedJob, n: int, fence: int, outcome: str | None, effects: bool = False):
    return AttemptRow(j.id, n, fence, outcome, effects)


def kinds(found) -> list[str]:
    return sorted(str(v.kind) for v in found)


def test_a_job_whose_effects_committed_twice_is_found_with_both_fences():
    j = job()
    rows = [attempt(j, 1, 1, "succeeded", True), attempt(j, 2, 2, "succeeded", True)]
    found = check_finished([j], rows)
    assert kinds(found) == ["effects_twice", "succeeded_twice"]
    (twice,) = [v for v in found if v.kind == Kind.EFFECTS_TWICE]
    assert twice.job_id == j.id and "fences 1, 2" in twice.detail


def test_the_unsafe_history_a_stale_finish_after_the_new_one_breaks_three_invariants():
    # the plain-TTL worker wakes, puts the job back under its old fence and succeeds again
    j = job(fence=1)
    rows = [attempt(j, 1, 1, "succeeded", True), attempt(j, 2, 2, "succeeded", True)]
    assert kinds(check_finished([j], rows)) == [
        "effects_twice",
        "stale_outcome",
        "succeeded_twice",
    ]


def test_effects_of_an_attempt_that_did_not_succeed_are_found():
    j = job(Status.DEAD, fence=2)
    rows = [attempt(j, 1, 1, "failed", True), attempt(j, 2, 2, "dead")]
    (found,) = check_finished([j], rows)
    assert found.kind == Kind.EFFECTS_WITHOUT_SUCCESS and "failed (fence 1)" in found.detail


def test_a_success_whose_current_attempt_says_otherwise_is_stale():
    j = job(fence=2)
    rows = [attempt(j, 1, 1, "succeeded", True), attempt(j, 2, 2, "lease_expired")]
    assert "stale_outcome" in kinds(check_finished([j], rows))


def test_more_attempts_than_the_budget_are_found():
    j = job(Status.DEAD, fence=3, attempt=3, budget=2)
    rows = [attempt(j, n, n, "failed" if n < 3 else "dead") for n in (1, 2, 3)]
    (found,) = check_finished([j], rows)
    assert found.kind == Kind.OVER_BUDGET and found.detail == "3 attempts, max_attempts 2"


@pytest.mark.parametrize(
    "history",
    [
        # a worker lost its lease; the reaper closed it, the next attempt succeeded
        (Status.SUCCEEDED, 2, [(1, "lease_expired", False), (2, "succeeded", True)]),
        # retried after failures, then dead: the reaper closed the last one lease_expired
        (Status.DEAD, 3, [(1, "failed", False), (2, "failed", False), (3, "lease_expired", False)]),
        # an operator retried a dead job (max_attempts raised) and it succeeded
        (Status.SUCCEEDED, 2, [(1, "dead", False), (2, "succeeded", True)]),
        # cancelled while its retry waited
        (Status.CANCELLED, 1, [(1, "failed", False)]),
        # succeeded without effects; cancelled before it ever ran
        (Status.SUCCEEDED, 1, [(1, "succeeded", False)]),
        (Status.CANCELLED, 0, []),
    ],
)
def test_what_a_fenced_system_does_is_clean(history):
    status, fence, rows = history
    j = job(status, fence=fence, attempt=len(rows))
    assert (
        check_finished([j], [attempt(j, n + 1, f, o, e) for n, (f, o, e) in enumerate(rows)]) == []
    )


def test_the_report_counts_by_kind_and_lists_each_violation():
    j = job(fence=1)
    rows = [attempt(j, 1, 1, "succeeded", True), attempt(j, 2, 2, "succeeded", True)]
    waiting = [overdue_lease(uuid.uuid4(), 125.0, "worker-1"), stuck_queued(uuid.uuid4(), 1000)]
    report = AuditReport(
        1, NOW - timedelta(hours=1), None, tuple(check_finished([j], rows) + waiting)
    )
    counts = report.by_kind()
    assert counts["effects_twice"] == 1 and counts["overdue_lease"] == 1
    assert counts["over_budget"] == 0 and list(counts) == [str(k) for k in Kind]
    text = report.text()
    assert f"- effects_twice: job {j.id}: 2 attempts committed effects" in text
    assert "running 125s past its lease (held by worker-1)" in text
    assert text.endswith("result: INVALID, 5 violation(s)")
    assert {v.job_id for v in report.violations if v.kind == Kind.EFFECTS_TWICE} == {j.id}
    clean = AuditReport(10, None, None, ())
    assert clean.valid and clean.text().endswith("result: VALID, nothing found")


def test_a_window_is_given_as_a_time_or_an_age():
    assert parse_moment("2h", NOW) == NOW - timedelta(hours=2)
    assert parse_moment("90s", NOW) == NOW - timedelta(seconds=90)
    assert parse_moment("2026-12-04T07:00:00Z", NOW) == NOW - timedelta(hours=1)
    assert parse_moment("2026-12-04T07:00:00", NOW).tzinfo is not None
    with pytest.raises(ValueError, match="neither an RFC 3339 time"):
        parse_moment("yesterday", NOW)


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    from leasework import cli

    code = cli.main(["audit", *argv])
    return code, capsys.readouterr().err


def test_the_cli_refuses_a_bad_window_clearly(capsys):
    code, err = run_cli(capsys, "--since", "yesterday")
    assert code == 2 and "neither an RFC 3339 time" in err
    code, err = run_cli(capsys, "--since", "1h", "--until", "2h")
    assert code == 2 and "--until is before --since" in err


def test_the_cli_says_when_the_database_cannot_be_reached(capsys, monkeypatch):
    # a loopback port nothing listens on: refused at once
    monkeypatch.setenv("LEASEWORK_POSTGRES_DSN", "postgresql://x:y@127.0.0.1:1/none")
    code, err = run_cli(capsys, "--since", "1h")
    assert code == 1 and "cannot reach the database" in err and "LEASEWORK_POSTGRES_DSN" in err


# ---------------------------------------------------------------- ticks and unique keys

TICK = NOW - timedelta(minutes=5)


def ticked(schedule: str = "nightly", tick: datetime = TICK) -> FinishedJob:
    return FinishedJob(
        uuid.uuid4(), Status.SUCCEEDED, 1, 1, 5, NOW, schedule=schedule, tick_at=tick
    )


def test_a_tick_with_two_jobs_names_both_and_a_tick_with_one_is_clean():
    first, single = ticked(), ticked(tick=TICK + timedelta(seconds=1))
    second = uuid.uuid4()  # still running: only the finished one brought the tick up
    rows = [
        TickJob(first.id, "nightly", TICK),
        TickJob(second, "nightly", TICK),
        TickJob(single.id, "nightly", single.tick_at),
        TickJob(uuid.uuid4(), "other", TICK),  # another schedule's job of the same instant
    ]
    found = check_ticks([first, single], rows)
    assert {v.job_id for v in found} == {first.id, second}
    assert {v.kind for v in found} == {Kind.TICK_TWICE}
    assert all("has 2 jobs" in v.detail and "nightly" in v.detail for v in found)
    # both jobs of the tick finished in one batch: each named once
    other = FinishedJob(second, Status.SUCCEEDED, 1, 1, 5, NOW, schedule="nightly", tick_at=TICK)
    assert len(check_ticks([first, other], rows)) == 2


KEY = b"k" * 32


def keyed() -> FinishedJob:
    return FinishedJob(uuid.uuid4(), Status.SUCCEEDED, 1, 1, 5, NOW, unique_key=KEY)


def ran(j: FinishedJob, *spans: tuple[int, int | None], holds: bool = False) -> KeyJob:
    """``j`` as its key sees it: attempts from minute a to minute b (None: running)."""

    def at_minute(m: int | None) -> datetime | None:
        return None if m is None else NOW - timedelta(minutes=60 - m)

    attempts = tuple((at_minute(a), at_minute(b)) for a, b in spans)
    return KeyJob(j.id, KEY, attempts, at_minute(spans[-1][1]), holds)  # type: ignore[arg-type]


def test_two_jobs_of_a_key_running_at_once_are_both_found():
    first, second = keyed(), keyed()
    found = check_unique_keys([second], [ran(first, (10, 20)), ran(second, (15, 25))])
    assert {(v.kind, v.job_id) for v in found} == {
        (Kind.UNIQUE_TWICE, first.id),
        (Kind.UNIQUE_TWICE, second.id),
    }
    assert str(first.id) in next(v.detail for v in found if v.job_id == second.id)
    # one still running when the other ran
    running = KeyJob(uuid.uuid4(), KEY, ((NOW - timedelta(minutes=50), None),))
    assert len(check_unique_keys([second], [running, ran(second, (15, 25))])) == 2


def test_a_job_running_after_a_holder_finished_in_a_state_its_key_holds_in_is_found():
    holder, later = keyed(), keyed()
    rows = [ran(holder, (10, 20), holds=True), ran(later, (30, 40))]
    assert kinds(check_unique_keys([later], rows)) == ["unique_twice", "unique_twice"]


def test_jobs_of_a_key_one_after_the_other_are_clean_retries_included():
    first, second = keyed(), keyed()
    # first ran and died (freeing the key), second ran, then an operator retried first
    rows = [ran(first, (5, 10), (30, 35)), ran(second, (15, 20))]
    assert check_unique_keys([first, second], rows) == []
    # a job with no key, or whose key row is missing, is skipped
    plain = FinishedJob(uuid.uuid4(), Status.SUCCEEDED, 1, 1, 5, NOW)
    assert check_unique_keys([plain, keyed()], rows) == []


def test_an_operators_retry_raises_the_budget_the_attempts_are_held_to():
    # max_attempts 3, dead after three; a retry made it 3 + 3 (attempt + attempt_budget)
    retried = job(Status.SUCCEEDED, fence=5, attempt=5, budget=6)
    outcomes = ["failed", "failed", "dead", "failed", "succeeded"]
    rows = [attempt(retried, n, n, o) for n, o in enumerate(outcomes, start=1)]
    assert check_finished([retried], rows) == []
    # more attempts than even the retry granted
    over = job(Status.DEAD, fence=7, attempt=7, budget=6)
    rows = [attempt(over, n, n, "failed" if n < 7 else "dead") for n in range(1, 8)]
    assert kinds(check_finished([over], rows)) == ["over_budget"]


def test_a_schedule_deleted_and_created_again_is_another_schedule_its_ticks_its_own():
    """The api changes a schedule by deleting it and creating it again; a backfill of the new
    one rightly fires the instants the old one fired. Jobs created on either side of a
    deletion of the name are not one tick's; two of one side still are."""
    old, new = ticked(), ticked()
    deleted = NOW - timedelta(minutes=3)
    rows = [
        TickJob(old.id, "nightly", TICK, created_at=TICK),
        TickJob(new.id, "nightly", TICK, created_at=NOW - timedelta(minutes=1)),
    ]
    assert check_ticks([old, new], rows, {"nightly": [deleted]}) == []
    assert len(check_ticks([old, new], rows)) == 2  # with no deletion recorded: one schedule's
    # the new schedule fired the tick twice itself: those two are found, the old job is not
    twice = TickJob(uuid.uuid4(), "nightly", TICK, created_at=NOW)
    found = check_ticks([new], [*rows, twice], {"nightly": [deleted]})
    assert {v.job_id for v in found} == {new.id, twice.id}
    # a deletion of another schedule's name changes nothing
    assert len(check_ticks([old, new], rows, {"weekly": [deleted]})) == 2


def test_each_job_of_a_key_holds_it_in_the_states_its_own_insert_recorded():
    """The type's policy changed between two jobs of a key: the first's did not hold in
    succeeded, the second's does. The first, finished, no longer held the key when the
    second ran: clean. Held by the first's new states, it would have been a double."""
    first, second = keyed(), keyed()
    as_recorded = [ran(first, (10, 20), holds=False), ran(second, (30, 40), holds=True)]
    assert check_unique_keys([first, second], as_recorded) == []
    as_if_now = [ran(first, (10, 20), holds=True), ran(second, (30, 40), holds=True)]
    assert len(check_unique_keys([first, second], as_if_now)) == 2


def limited(key: str = "keyed/a") -> FinishedJob:
    return FinishedJob(uuid.uuid4(), Status.SUCCEEDED, 1, 1, 5, NOW, limit_key=key)


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def span(
    j: FinishedJob, start: float, end: float | None, applied: int | None | str = "unrecorded"
) -> LimitSpan:
    """An attempt of ``j`` from ``start`` to ``end`` seconds (None: running), its stamp
    having applied the limit ``applied`` (None: none in force), or having recorded nothing."""
    if applied == "unrecorded":
        return LimitSpan(j.id, j.limit_key or "", at(start), None if end is None else at(end))
    assert not isinstance(applied, str)
    return LimitSpan(
        j.id, j.limit_key or "", at(start), None if end is None else at(end), True, applied
    )


def test_an_attempt_that_started_while_its_limit_was_full_is_over_limit():
    a, b, c = limited(), limited(), limited()
    spans = [span(a, 0, 10), span(b, 2, 8), span(c, 5, 12)]  # three at once from 5 to 8
    found = check_limits([a, b, c], spans, {"keyed": 2})
    assert [v.job_id for v in found] == [c.id]  # the start that made three, not the two before
    assert found[0].detail == (
        "started while 3 attempts of its limit keyed/a ran (itself included); the limit as "
        "set now is 2"
    )
    assert check_limits([c], spans, {"keyed": 3}) == []
    assert check_limits([a], [span(a, 0, 10), span(b, 10, 12), span(c, 10, 13)], {"keyed": 2}) == []


# spans on a coarse grid (ties between starts and finishes are the edge cases), some still
# running, some finishing where or before they started
SPANS = st.lists(
    st.tuples(st.integers(0, 12), st.one_of(st.none(), st.integers(0, 14))), max_size=24
)


@given(SPANS)
def test_the_sweep_counts_what_the_definition_does(bounds):
    job = limited()
    spans = [span(job, start, end) for start, end in bounds]
    assert running_at_starts(spans) == [running_at_start(s, spans) for s in spans]


@given(
    st.lists(st.integers(0, 40), max_size=30),
    st.sampled_from([0.5, 1.0, 2.5]),
)
def test_the_window_sweep_counts_what_the_definition_does(quarters, per):
    starts = [NOW + timedelta(seconds=q / 4) for q in quarters]  # ties and window edges
    assert started_within_each(starts, per) == [started_within(t, starts, per) for t in starts]


def test_of_a_queue_caps_thousands_of_jobs_those_that_started_one_too_many_are_found():
    """One limit for 5,000 jobs (a capped queue's pass), four at once all along (each
    finishing as the fifth after it starts), and one more attempt from 100 s to 100.5 s:
    the starts it made five are over the cap, its own tie at 100 s and the one at 100.25 s."""
    jobs = [limited("@capped") for _ in range(5000)]
    spans = [span(j, i * 0.25, i * 0.25 + 1.0) for i, j in enumerate(jobs)]
    extra = limited("@capped")
    spans.append(span(extra, 100.0, 100.5))
    found = check_limits([*jobs, extra], spans, {"@capped": 4})
    assert {f.job_id for f in found} == {jobs[400].id, jobs[401].id, extra.id}
    assert all("started while 5 attempts" in f.detail for f in found)


def test_a_reaped_attempts_slot_counts_until_it_was_taken_back_and_other_keys_do_not():
    a, b, other = limited(), limited(), limited("keyed/b")
    running = [span(a, 0, None), span(b, 1, 3), span(other, 1, 3)]
    assert kinds(check_limits([b], running, {"keyed": 1})) == ["over_limit"]
    assert check_limits([other], running, {"keyed": 1}) == []
    assert check_limits([b], running, {}) == []  # no longer limited: nothing to hold it to


def test_a_queues_cap_is_checked_as_the_limit_of_its_name():
    caps = {"emails": 1}
    a, b, elsewhere = (
        FinishedJob(uuid.uuid4(), Status.SUCCEEDED, 1, 1, 5, NOW, queue=q)
        for q in ("emails", "emails", "default")
    )
    rows = [attempt_of(j, False) for j in (a, b, elsewhere)]  # (before migration 0025)
    capped = queue_capped([a, b, elsewhere], caps, rows)
    assert [(j.id, j.limit_key) for j in capped] == [(a.id, "@emails"), (b.id, "@emails")]
    spans = [span(capped[0], 0, 10), span(capped[1], 5, 12)]
    found = check_limits(capped, spans, cap_limits(caps))
    assert [v.job_id for v in found] == [b.id] and "limit @emails" in found[0].detail
    assert check_limits(capped, spans, cap_limits({"emails": 2})) == []


def emails() -> FinishedJob:
    return FinishedJob(uuid.uuid4(), Status.SUCCEEDED, 1, 1, 5, NOW, limit_key="@emails")


def test_a_cap_lowered_while_jobs_ran_holds_each_start_to_the_cap_its_claim_applied():
    """Four started under a cap of 4; the cap went down to 2 at 5 s; the stamp then held
    the next ones until fewer than two ran (at 12 s and 13 s). As set now (2), the first
    four's third and fourth starts would be over; as each stamp applied it, none is."""
    before = [emails() for _ in range(4)]
    after = [emails() for _ in range(2)]
    spans = [span(j, n, 10 + n, applied=4) for n, j in enumerate(before)]
    spans += [span(after[0], 12, 20, applied=2), span(after[1], 13, 20, applied=2)]
    assert check_limits([*before, *after], spans, {"@emails": 2}) == []
    # the same attempts recorded nothing (opened before migration 0025): judged as set now
    unrecorded = [replace(s, recorded=False, limit=None) for s in spans]
    found = check_limits([*before, *after], unrecorded, {"@emails": 2})
    assert {v.job_id for v in found} == {before[2].id, before[3].id}
    assert "the limit as set now is 2" in found[0].detail


def test_a_real_violation_under_a_lowered_cap_is_still_found():
    """After the cap went down to 2, a stamp started a job while two ran (its claim applied
    2 and should have held it): found, by the cap its claim applied."""
    before = [emails() for _ in range(4)]
    late = emails()
    spans = [span(j, n, 10 + n, applied=4) for n, j in enumerate(before)]
    spans.append(span(late, 11, 20, applied=2))  # 1 (9-11 gone)... 2, 3 still run: 3 at once
    found = check_limits([*before, late], spans, {"@emails": 2})
    assert [v.job_id for v in found] == [late.id]
    assert found[0].detail == (
        "started while 3 attempts of its limit @emails ran (itself included); the limit its "
        "claim applied is 2"
    )
    # and under a cap set now higher: still held to the cap in force when it started
    assert [v.job_id for v in check_limits([late], spans, {"@emails": 10})] == [late.id]


def test_a_cap_set_while_jobs_ran_does_not_judge_the_jobs_that_started_uncapped():
    """Five started with no cap; then a cap of 2. The five are not held to it (no cap was
    in force at their starts), but they count against the starts after it."""
    uncapped = [emails() for _ in range(5)]
    spans = [span(j, n, 30, applied=None) for n, j in enumerate(uncapped)]
    assert check_limits(uncapped, spans, {"@emails": 2}) == []
    late = emails()
    found = check_limits([late], [*spans, span(late, 10, 20, applied=2)], {"@emails": 2})
    assert [v.job_id for v in found] == [late.id]  # 6 at once, its claim applied 2


def attempt_of(j: FinishedJob, recorded: bool, queue_limit: int | None = None) -> AttemptRow:
    return AttemptRow(j.id, 1, 1, "succeeded", False, recorded, queue_limit=queue_limit)


def test_the_jobs_held_to_a_queues_cap_are_those_stamped_under_one_or_before_records():
    now_capped, uncapped_then, capped_then, before = (
        FinishedJob(uuid.uuid4(), Status.SUCCEEDED, 1, 1, 5, NOW, queue=q)
        for q in ("emails", "emails", "default", "emails")
    )
    rows = [
        attempt_of(now_capped, True, 2),
        attempt_of(uncapped_then, True, None),  # the cap was set after it started
        attempt_of(capped_then, True, 3),  # the cap was lifted since
        attempt_of(before, False),  # opened before migration 0025: the cap as set now
    ]
    jobs = [now_capped, uncapped_then, capped_then, before]
    assert [j.id for j in queue_capped(jobs, {"emails": 2}, rows)] == [
        now_capped.id,
        capped_then.id,
        before.id,
    ]


def rated(n: int = 7) -> list[FinishedJob]:
    return [FinishedJob(uuid.uuid4(), Status.SUCCEEDED, 1, 1, 5, NOW) for _ in range(n)]


def test_a_job_that_started_with_its_rate_exceeded_is_over_limit():
    rule = {"rated": RateRule(count=5, per=1.0, burst=1)}  # at most 6 starts in any second
    jobs = rated()
    steady = [RateStart(j.id, "rated/a", at(n * 0.2)) for n, j in enumerate(jobs)]
    assert check_rates(jobs, steady, rule) == []  # 0, .2, ... 1.2: 5 per second (6 at most)
    bunched = [RateStart(j.id, "rated/a", at(n * 0.1)) for n, j in enumerate(jobs)]
    found = check_rates(jobs, bunched, rule)
    assert [v.job_id for v in found] == [jobs[6].id]  # the seventh start in a second
    assert "7 starts of its rate limit rated/a within 1s; its rate allows 6" in found[0].detail
    two_keys = [
        RateStart(j.id, "rated/a" if n % 2 else "rated/b", at(n * 0.1)) for n, j in enumerate(jobs)
    ]
    assert check_rates(jobs, two_keys, rule) == []  # another key's starts do not count
    assert check_rates(jobs, bunched, {"rated": RateRule(5, 1.0, burst=2)}) == []


def test_of_a_type_wide_rates_thousands_of_starts_those_that_made_one_too_many_are_found():
    """A rate with no key is one key for every job of its type: 5,000 starts at the rate's
    pace (5 a second: 5 in any second, 6 allowed) and two more at 500.05 s and 500.1 s. The
    starts with 7 in the second up to them are over: 500.1 s's, and the pace's from 500.2 s
    to 501.0 s (the second up to 501.2 s no longer holds the two)."""
    rule = {"rated": RateRule(count=5, per=1.0, burst=1)}
    jobs = rated(5002)
    starts = [RateStart(j.id, "rated", at(n * 0.2)) for n, j in enumerate(jobs[:5000])]
    starts += [RateStart(jobs[5000].id, "rated", at(500.05))]
    starts += [RateStart(jobs[5001].id, "rated", at(500.1))]
    found = check_rates(jobs, starts, rule)
    assert {v.job_id for v in found} == {j.id for j in jobs[2501:2506]} | {jobs[5001].id}
    assert all("7 starts" in v.detail for v in found)


def test_a_rate_lowered_while_jobs_started_holds_each_start_to_the_rate_its_claim_applied():
    """Ten starts in a second under 10/s (11 allowed), then the rate went down to 2/s (3
    allowed): the limiter started the next ones at the new pace from where the old one was,
    so the second before each new start still holds old starts. Each is held to its own
    rate, counting the starts made under it."""
    fast, slow = RateRule(10, 1.0, 1), RateRule(2, 1.0, 1)
    jobs = rated(14)
    starts = [RateStart(j.id, "rated/a", at(n * 0.1), True, fast) for n, j in enumerate(jobs[:10])]
    starts += [
        RateStart(j.id, "rated/a", at(1.0 + n * 0.5), True, slow) for n, j in enumerate(jobs[10:])
    ]
    now = {"rated": slow}
    assert check_rates(jobs, starts, now) == []
    # recorded nothing (before migration 0025): all held to the rate as registered now
    unrecorded = [replace(s, recorded=False, rule=None) for s in starts]
    assert len(check_rates(jobs, unrecorded, now)) > 0
    # a real violation under the new rate: three more at 2.6-2.8 s, four in its second
    late = rated(3)
    bunched = [
        RateStart(j.id, "rated/a", at(2.6 + n * 0.1), True, slow) for n, j in enumerate(late)
    ]
    found = check_rates([*jobs, *late], [*starts, *bunched], now)
    assert {v.job_id for v in found} == {late[1].id, late[2].id}
    assert "its rate allows 3 (2 per 1s, burst 1)" in found[0].detail
