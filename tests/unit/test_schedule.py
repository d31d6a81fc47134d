"""leasework.schedules: ticks across daylight-saving changes in two zones, the catch-up and
overlap policies, and clear refusals, all on a fake clock (instants passed in)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from leasework.schedules import (
    MAX_DROPPED_COUNTED,
    CatchUp,
    Cron,
    Overlap,
    Plan,
    Policy,
    ScheduleError,
    SkipReason,
    plan,
)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def ticks(cron: Cron, start: datetime, count: int) -> list[datetime]:
    out, at = [], start
    for _ in range(count):
        at = cron.after(at)
        out.append(at)
    return out


# --- daylight saving: New York (2026-03-08 02:00 EST -> 03:00 EDT; 2026-11-01 02:00 EDT ->
# 01:00 EST) and Berlin (2026-03-29 02:00 CET -> 03:00 CEST; 2026-10-25 03:00 CEST -> 02:00 CET)


def test_a_local_time_spring_forward_skips_ticks_once_at_the_first_valid_instant():
    new_york = Cron("30 2 * * *", "America/New_York")
    # 02:30 does not exist on 03-08: it ticks at 03:00 EDT (07:00Z), once; then 02:30 EDT
    assert ticks(new_york, utc(2026, 3, 7, 12), 3) == [
        utc(2026, 3, 8, 7, 0),
        utc(2026, 3, 9, 6, 30),
        utc(2026, 3, 10, 6, 30),
    ]
    berlin = Cron("30 2 * * *", "Europe/Berlin")
    assert ticks(berlin, utc(2026, 3, 28, 12), 2) == [
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 30, 0, 30),
    ]


def test_a_local_time_that_happens_twice_at_fall_back_ticks_once():
    new_york = Cron("30 1 * * *", "America/New_York")
    assert ticks(new_york, utc(2026, 10, 31, 12), 2) == [
        utc(2026, 11, 1, 5, 30),  # 01:30 EDT, the first of the two
        utc(2026, 11, 2, 6, 30),  # the next day, 01:30 EST
    ]
    berlin = Cron("30 2 * * *", "Europe/Berlin")
    assert ticks(berlin, utc(2026, 10, 24, 12), 2) == [
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]


def test_a_stepped_hour_ticks_by_the_wall_clock_each_instant_once():
    # */30 reads 01:00 and 01:30 twice on fall-back night; each of the four instants ticks
    every_half_hour = Cron("*/30 * * * *", "America/New_York")
    assert ticks(every_half_hour, utc(2026, 11, 1, 4, 10), 6) == [
        utc(2026, 11, 1, 4, 30),
        utc(2026, 11, 1, 5, 0),
        utc(2026, 11, 1, 5, 30),
        utc(2026, 11, 1, 6, 0),
        utc(2026, 11, 1, 6, 30),
        utc(2026, 11, 1, 7, 0),
    ]
    # and on spring-forward night the hour that does not exist has no ticks
    assert ticks(every_half_hour, utc(2026, 3, 8, 6, 10), 3) == [
        utc(2026, 3, 8, 6, 30),  # 01:30 EST
        utc(2026, 3, 8, 7, 0),  # 03:00 EDT
        utc(2026, 3, 8, 7, 30),
    ]


def test_looking_back_sees_the_same_ticks_as_looking_forward_across_both_changes():
    for zone in ("America/New_York", "Europe/Berlin"):
        for expression in ("30 1 * * *", "30 2 * * *", "*/20 * * * *", "0 2,3 * * *"):
            cron = Cron(expression, zone)
            for since in (utc(2026, 3, 6), utc(2026, 10, 23)):
                forward = [t for t in ticks(cron, since - timedelta(seconds=1), 300)]
                until = forward[-1]
                back, dropped = cron.latest(since, until, 1000)
                assert (back, dropped) == (forward, 0), (zone, expression)


def test_after_is_strictly_after_and_to_the_second():
    cron = Cron("*/10 * * * * *")  # every ten seconds, UTC
    assert cron.after(utc(2026, 1, 1, 0, 0, 10)) == utc(2026, 1, 1, 0, 0, 20)
    assert cron.after(datetime(2026, 1, 1, 0, 0, 9, 999_999, tzinfo=UTC)) == utc(
        2026, 1, 1, 0, 0, 10
    )
    with pytest.raises(ValueError, match="naive"):
        cron.after(datetime(2026, 1, 1))


def test_bad_expressions_and_zones_are_refused_saying_what_to_write():
    with pytest.raises(ScheduleError, match="not valid .*every five minutes"):
        Cron("61 * * * *")
    with pytest.raises(ScheduleError, match="unknown time zone 'Mars/Olympus'.*IANA"):
        Cron("* * * * *", "Mars/Olympus")
    with pytest.raises(ScheduleError, match="catch_up_limit"):
        Policy(catch_up_limit=0)


# --- the plan: catch-up and overlap, with a fake clock

EVERY_MINUTE = Cron("* * * * *")


def test_nothing_due_changes_nothing():
    assert plan(EVERY_MINUTE, Policy(), utc(2026, 1, 1, 0, 5), utc(2026, 1, 1, 0, 4, 30)) == Plan(
        (), (), 0, utc(2026, 1, 1, 0, 5)
    )


def test_a_tick_on_time_fires_and_the_next_fire_time_moves_past_now():
    result = plan(EVERY_MINUTE, Policy(), utc(2026, 1, 1, 0, 5), utc(2026, 1, 1, 0, 5, 2))
    assert result == Plan((utc(2026, 1, 1, 0, 5),), (), 0, utc(2026, 1, 1, 0, 6))


def test_catch_up_after_ten_minutes_down():
    down_since, now = utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 10, 30)
    missed = [utc(2026, 1, 1, 0, m) for m in range(0, 10)]  # 00:10 is 30 s late: on time
    on_time = utc(2026, 1, 1, 0, 10)

    skip = plan(EVERY_MINUTE, Policy(catch_up=CatchUp.SKIP), down_since, now)
    assert skip.fire == (on_time,)
    assert skip.skipped == tuple((t, SkipReason.CATCH_UP) for t in missed)

    latest = plan(EVERY_MINUTE, Policy(catch_up=CatchUp.LATEST), down_since, now)
    assert latest.fire == (on_time,)  # a tick on time anyway: the latest missed is not run too

    strict = Policy(catch_up=CatchUp.LATEST, grace=timedelta(seconds=10))  # 00:10 is missed too
    latest = plan(EVERY_MINUTE, strict, down_since, now)
    assert latest.fire == (on_time,)
    assert latest.skipped == tuple((t, SkipReason.CATCH_UP) for t in missed)

    every = plan(EVERY_MINUTE, Policy(catch_up=CatchUp.ALL, catch_up_limit=3), down_since, now)
    assert every.fire == (*missed[-3:], on_time)
    assert every.skipped == tuple((t, SkipReason.CATCH_UP) for t in missed[:-3])
    assert every.next_fire_at == utc(2026, 1, 1, 0, 11)


def test_overlap_skip_fires_only_when_nothing_is_unfinished():
    policy = Policy(overlap=Overlap.SKIP)
    due, now = utc(2026, 1, 1, 0, 5), utc(2026, 1, 1, 0, 5, 1)
    assert plan(EVERY_MINUTE, policy, due, now, unfinished=0).fire == (due,)
    busy = plan(EVERY_MINUTE, policy, due, now, unfinished=1)
    assert (busy.fire, busy.skipped) == ((), ((due, SkipReason.OVERLAP),))
    # several due at once (catch-up all) would overlap each other: only the latest fires
    burst = plan(
        EVERY_MINUTE,
        Policy(overlap=Overlap.SKIP, catch_up=CatchUp.ALL, catch_up_limit=5),
        utc(2026, 1, 1, 0, 0),
        now,
    )
    assert burst.fire == (due,)
    assert [r for _, r in burst.skipped].count(SkipReason.OVERLAP) == 5


def test_buffer_one_lets_one_run_wait_behind_the_unfinished_one():
    policy = Policy(overlap=Overlap.BUFFER_ONE)
    due, now = utc(2026, 1, 1, 0, 5), utc(2026, 1, 1, 0, 5, 1)
    assert plan(EVERY_MINUTE, policy, due, now, unfinished=1).fire == (due,)  # the buffered one
    full = plan(EVERY_MINUTE, policy, due, now, unfinished=2)  # running, and one waiting
    assert (full.fire, full.skipped) == ((), ((due, SkipReason.OVERLAP),))


def test_a_pass_looks_at_a_bounded_number_of_ticks_and_counts_the_rest():
    every_second = Cron("* * * * * *")
    policy = Policy(catch_up=CatchUp.SKIP, grace=timedelta(0))
    result = plan(every_second, policy, utc(2026, 1, 1), utc(2026, 1, 2), max_ticks=50)
    assert result.fire == (utc(2026, 1, 2),)
    assert len(result.skipped) == 49
    assert result.dropped == MAX_DROPPED_COUNTED
    assert result.next_fire_at == utc(2026, 1, 2, 0, 0, 1)


def test_a_definition_is_checked_when_made():
    from leasework.schedules import Definition

    with pytest.raises(ScheduleError, match="schedule name"):
        Definition(name="no spaces", type="noop", cron="* * * * *")
    with pytest.raises(ScheduleError, match="overlap is one of"):
        Definition(name="a", type="noop", cron="* * * * *", overlap="sometimes")
    with pytest.raises(ScheduleError, match="unknown time zone"):
        Definition(name="a", type="noop", cron="* * * * *", timezone="Mars/Olympus")
    with pytest.raises(ScheduleError, match="catch_up_limit"):
        Definition(name="a", type="noop", cron="* * * * *", catch_up_limit=0)
    d = Definition(name="a", type="noop", cron="*/5 * * * *", timezone="Europe/Berlin")
    at = datetime(2026, 3, 29, 0, 58, tzinfo=UTC)
    assert d.first_fire_at(at) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


def test_an_app_declares_schedules_on_its_job_types():
    import leasework
    from leasework.errors import AppError

    app = leasework.App()

    @app.job(schedule="*/5 * * * *")
    async def tidy(ctx) -> None: ...

    app.schedule("tidy-berlin", "0 3 * * *", job=tidy, timezone="Europe/Berlin", overlap="skip")
    assert [d.name for d in app.schedules] == ["tidy", "tidy-berlin"]
    assert app.schedules[1].overlap is Overlap.SKIP
    with pytest.raises(AppError, match="defined twice"):
        app.schedule("tidy", "* * * * *", job="tidy")
    with pytest.raises(AppError, match="not valid"):
        app.schedule("broken", "every day", job="tidy")
