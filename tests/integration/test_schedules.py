"""Recurring schedules on the real stack: the relay's scheduler fires each tick of a
per-second schedule once, with its job; extra schedulers racing it add no second job to any
tick; missed ticks follow the catch-up policy; a paused schedule fires nothing; trigger and
backfill insert the ticks they say and no others."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import trio

from chaos.promql import scrape
from leasework.db import Database
from leasework.relay.scheduler import Scheduler, SchedulerConfig
from leasework.schedules import CatchUp, Definition
from leasework.store import schedules as sched
from tests.integration.conftest import DIRECT_DSN, wait_for


def now() -> datetime:
    return datetime.now(UTC)


def create(db, **fields) -> Definition:
    definition = Definition(name=f"t-{uuid.uuid4().hex[:10]}", type="noop", **fields)
    assert sched.schedule_create(db, definition, "test", now()) is not None
    return definition


def ticks(db, name: str) -> list[dict]:
    return db.execute(
        """SELECT t.nominal_at, t.outcome, t.reason, t.source, t.job_id, j.schedule,
                  j.tick_at, j.status
           FROM schedule_ticks t LEFT JOIN jobs j ON j.id = t.job_id
           WHERE t.schedule = %s ORDER BY t.nominal_at""",
        (name,),
    ).fetchall()


def jobs_per_tick(db, name: str) -> dict[datetime, int]:
    rows = db.execute(
        "SELECT tick_at, count(*) AS n FROM jobs WHERE schedule = %s GROUP BY tick_at", (name,)
    ).fetchall()
    return {r["tick_at"]: r["n"] for r in rows}


def test_every_second_fires_each_tick_once_with_its_job(db):
    definition = create(db, cron="* * * * * *")
    wait_for(lambda: len(ticks(db, definition.name)) >= 4, 20, "four ticks")
    sched.schedule_set_paused(db, definition.name, True, None)
    recorded = ticks(db, definition.name)
    instants = [r["nominal_at"] for r in recorded]
    # whole seconds, one apart: no tick missed, none twice
    assert all(t.microsecond == 0 for t in instants)
    gaps = [(b - a).total_seconds() for a, b in zip(instants, instants[1:], strict=False)]
    assert gaps == [1.0] * (len(instants) - 1)
    for row in recorded:
        assert row["outcome"] == "fired" and row["source"] == "cron"
        assert row["schedule"] == definition.name and row["tick_at"] == row["nominal_at"]
    assert set(jobs_per_tick(db, definition.name).values()) == {1}
    for row in recorded:
        wait_for(
            lambda row=row: (
                db.execute("SELECT status FROM jobs WHERE id = %s", (row["job_id"],)).fetchone()[
                    "status"
                ]
                == "succeeded"
            ),
            60,
            "the tick's job to succeed",
        )
    # paused: nothing more is recorded
    count = len(ticks(db, definition.name))
    time.sleep(2.5)
    assert len(ticks(db, definition.name)) == count
    sched.schedule_delete(db, definition.name)


async def race(schedulers: int, seconds: float) -> None:
    """``schedulers`` schedulers of this process beside the relay's, each on its own pool,
    closed after (a pool left to the garbage collector may be collected in one of its own
    threads, which then cannot join itself: a clean-clone CI run failed so)."""
    databases = [Database(DIRECT_DSN, max_size=2) for _ in range(schedulers)]
    try:
        async with trio.open_nursery() as nursery:
            for database in databases:
                await database.open()
                scheduler = Scheduler(
                    database, SchedulerConfig(topic="jobs.ready", max_idle=0.05, min_idle=0.001)
                )
                nursery.start_soon(scheduler.run)
            await trio.sleep(seconds)
            nursery.cancel_scope.cancel()
    finally:
        for database in databases:
            await database.close()


def test_schedulers_racing_for_the_same_ticks_fire_each_once(db):
    definitions = [create(db, cron="* * * * * *") for _ in range(3)]
    trio.run(race, 3, 5.0)
    for definition in definitions:
        sched.schedule_set_paused(db, definition.name, True, None)
        per_tick = jobs_per_tick(db, definition.name)
        assert len(per_tick) >= 4, per_tick
        assert set(per_tick.values()) == {1}, per_tick
        assert len(ticks(db, definition.name)) == len(per_tick)
        sched.schedule_delete(db, definition.name)


def test_missed_ticks_follow_the_catch_up_policy(db):
    """Ten minutes of a per-minute schedule missed (its next fire time set back): catch-up
    ``all`` up to 3 fires the latest three late and records the rest as skipped."""
    definition = create(db, cron="* * * * *", catch_up=CatchUp.ALL, catch_up_limit=3)
    minute = now().replace(second=0, microsecond=0)
    db.execute(
        "UPDATE schedules SET next_fire_at = %s WHERE name = %s",
        (minute - timedelta(minutes=10), definition.name),
    )
    wait_for(lambda: len(ticks(db, definition.name)) >= 10, 20, "the missed ticks recorded")
    sched.schedule_set_paused(db, definition.name, True, None)
    recorded = ticks(db, definition.name)
    late = [r for r in recorded if now() - r["nominal_at"] > timedelta(seconds=60)]
    fired = [r for r in late if r["outcome"] == "fired"]
    skipped = [r for r in late if r["outcome"] == "skipped"]
    assert len(fired) == 3 and all(r["source"] == "catch_up" for r in fired)
    assert fired == late[-3:]
    assert skipped and all(r["reason"] == "catch_up" for r in skipped)
    sched.schedule_delete(db, definition.name)


def test_trigger_and_backfill_fire_only_what_never_fired(db):
    definition = create(db, cron="0 0 * * *")  # midnight: never due during the test
    job_id, at = sched.schedule_trigger(db, definition.name, "jobs.ready")
    assert [r["job_id"] for r in ticks(db, definition.name)] == [job_id]
    days = [
        now().replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=d)
        for d in (3, 2, 1)
    ]
    first = sched.schedule_backfill(db, definition, days[:2], "jobs.ready")
    assert len(first.fired) == 2 and first.already == 0
    again = sched.schedule_backfill(db, definition, days, "jobs.ready")
    assert [t.nominal_at for t in again.fired] == [days[2]] and again.already == 2
    assert set(jobs_per_tick(db, definition.name).values()) == {1}
    assert len(jobs_per_tick(db, definition.name)) == 4
    assert sched.schedule_trigger(db, "no-such-schedule", "jobs.ready") is None
    sched.schedule_delete(db, definition.name)


def test_reconcile_updates_declarations_and_keeps_the_operators_pause(db):
    name = f"t-{uuid.uuid4().hex[:10]}"
    hourly = Definition(name=name, type="noop", cron="0 * * * *")
    assert name not in sched.schedules_reconcile(db, [hourly], "app-1", now())
    first = sched.schedule_get(db, name)
    assert first.source == "app" and first.next_fire_at > now()
    sched.schedule_set_paused(db, name, True, None)
    # a new payload keeps the calendar's place; the pause is the operator's, and stays
    repaid = Definition(name=name, type="noop", cron="0 * * * *", payload={"v": 2})
    sched.schedules_reconcile(db, [repaid], "app-2", now())
    second = sched.schedule_get(db, name)
    assert second.definition.payload == {"v": 2} and second.paused
    assert second.next_fire_at == first.next_fire_at and second.declared_by == "app-2"
    # a new calendar starts from its own first tick
    daily = Definition(name=name, type="noop", cron="30 2 * * *", timezone="Europe/Berlin")
    sched.schedules_reconcile(db, [daily], "app-3", now())
    third = sched.schedule_get(db, name)
    assert third.next_fire_at == daily.first_fire_at(now())
    # an app that no longer declares it is told so; the schedule is left alone
    assert name in sched.schedules_reconcile(db, [], "app-4", now())
    assert sched.schedule_get(db, name) is not None
    assert sched.schedule_delete(db, name) and sched.schedule_get(db, name) is None


def test_ticks_no_relay_handled_in_their_grace_are_counted_late_for_the_alert(stack, db):
    """With the relay frozen past a tick's grace, the ticks it finds when it resumes fire by
    catch-up and are counted in leasework_schedule_ticks_late_total{schedule}, a series that
    also exports its creation time: the two inputs of LeaseworkScheduleTicksMissed (whose
    logic promtool tests)."""
    definition = create(db, cron="* * * * * *", grace_seconds=1, catch_up=CatchUp.ALL)
    try:
        wait_for(lambda: len(ticks(db, definition.name)) >= 1, 20, "a first tick")
        stack.pause("relay")
        try:
            time.sleep(4)  # ticks come due and pass their 1 s grace with no scheduler
        finally:
            stack.resume("relay")
        late = f'leasework_schedule_ticks_late_total{{schedule="{definition.name}"}}'
        created = f'leasework_schedule_ticks_late_created{{schedule="{definition.name}"}}'

        def counted() -> dict[str, float]:
            return {k: v for k, v in scrape(9102).items() if k in (late, created)}

        wait_for(lambda: counted().get(late, 0) >= 2, 20, "late ticks counted")
        assert counted()[created] > time.time() - 60  # created just now: news to the alert
        sources = {r["source"] for r in ticks(db, definition.name)}
        assert "catch_up" in sources, sources
    finally:
        sched.schedule_delete(db, definition.name)
