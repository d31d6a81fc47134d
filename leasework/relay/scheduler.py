"""The scheduler: recurring schedules' due ticks become jobs, in the relay's room.

Each pass locks the schedules due on this relay's clock (``FOR UPDATE SKIP LOCKED``: any
number of relays run it side by side, and none is a leader that matters), plans each with
:func:`leasework.schedules.plan` (catch-up and overlap policies), records every tick it
handles in ``schedule_ticks`` (unique on schedule and nominal instant) with a job for each
fired one, and moves the schedule's next fire time on by compare-and-set, all in one
transaction (:func:`leasework.store.schedules.schedules_fire_due`). A fired tick's job runs
at the tick's nominal instant: a relay whose clock is fast inserts it early as ``scheduled``,
and the promoter, on the database's clock, queues it on time.

Between passes it sleeps until the earliest next fire time, never longer than
``max_idle`` (so a schedule created or resumed meanwhile is seen within it) and never
shorter than ``min_idle``.

``unsafe`` (``LEASEWORK_UNSAFE_SCHEDULER``, which :mod:`leasework.config` refuses without
``LEASEWORK_I_ACCEPT_DOUBLE_TICKS=yes``) runs the pass without its guards
(:func:`leasework.store.schedules.schedules_fire_due_unsafe`), so that the chaos harness can
show a doubled tick; the choice is made here and nowhere else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
import trio

from leasework import metrics
from leasework.config import Settings
from leasework.db import Database
from leasework.relay.service import Backoff, Pass, run_passes
from leasework.schedules import Plan, plan
from leasework.store.schedules import (
    Handled,
    Raced,
    StoredSchedule,
    schedules_fire_due,
    schedules_fire_due_unsafe,
)

log = logging.getLogger("leasework.relay.scheduler")

Clock = Callable[[], datetime]


def system_clock(offset: float = 0.0) -> Clock:
    """The wall clock in UTC, ``offset`` seconds off (the chaos harness's skewed relay)."""

    def now() -> datetime:
        return datetime.fromtimestamp(time.time() + offset, UTC)

    return now


@dataclass(frozen=True)
class SchedulerConfig:
    topic: str
    # schedules handled per transaction
    batch: int = 50
    # the longest sleep between passes: how soon a new or resumed schedule is seen
    max_idle: float = 1.0
    min_idle: float = 0.02
    backoff: Backoff = Backoff.from_interval(0.5)
    clock: Clock = field(default_factory=system_clock)
    # UNSAFE: the pass without its row lock, compare-and-set and tick guard (chaos only)
    unsafe: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> SchedulerConfig:
        return cls(
            topic=settings.topic_ready,
            clock=system_clock(settings.fake_clock_offset),
            unsafe=settings.unsafe_scheduler,
        )


def decide(now: datetime) -> Callable[[StoredSchedule, int], Plan]:
    def for_schedule(schedule: StoredSchedule, unfinished: int) -> Plan:
        assert schedule.next_fire_at is not None  # the pass selects due schedules only
        d = schedule.definition
        return plan(d.calendar, d.policy, schedule.next_fire_at, now, unfinished)

    return for_schedule


@dataclass(frozen=True)
class Fired(Pass):
    handled: tuple[Handled, ...]
    batch: int

    @property
    def more_waiting(self) -> bool:
        return len(self.handled) >= self.batch


def count(handled: Handled) -> None:
    for tick in handled.fired:
        metrics.schedule_ticks_fired.labels(handled.name, tick.source).inc()
    for tick in handled.skipped:
        metrics.schedule_ticks_skipped.labels(handled.name, str(tick.reason)).inc()
    if handled.late:
        metrics.schedule_ticks_late.labels(handled.name).inc(handled.late)


class Scheduler:
    def __init__(self, db: Database, config: SchedulerConfig) -> None:
        self.db = db
        self.config = config
        self._next_due: datetime | None = None

    async def run_once(self) -> Fired:
        now = self.config.clock()
        handled, self._next_due = await self.db.run(self._pass, now)
        for h in handled:
            count(h)
        return Fired(tuple(handled), self.config.batch)

    def _pass(
        self, conn: psycopg.Connection, now: datetime
    ) -> tuple[list[Handled], datetime | None]:
        fire = schedules_fire_due_unsafe if self.config.unsafe else schedules_fire_due
        handled = fire(conn, now, self.config.batch, self.config.topic, decide(now))
        row = conn.execute(
            "SELECT min(next_fire_at) AS due FROM schedules WHERE NOT paused"
        ).fetchone()
        return handled, row["due"]

    def idle_seconds(self) -> float:
        """How long to sleep before the next pass: until the earliest next fire time, within
        ``[min_idle, max_idle]``."""
        c = self.config
        if self._next_due is None:
            return c.max_idle
        wait = (self._next_due - c.clock()).total_seconds()
        return min(c.max_idle, max(c.min_idle, wait))

    async def _idle(self) -> None:
        await trio.sleep(self.idle_seconds())

    async def run(self) -> None:
        if self.config.unsafe:
            log.warning(
                "UNSAFE scheduler: no row lock, no compare-and-set, a job for every tick "
                "planned; two relays WILL fire a tick twice (chaos demonstration only)"
            )
        await run_passes(
            "scheduler",
            self.run_once,
            interval=self.config.max_idle,
            backoff=self.config.backoff,
            idle=self._idle,
            expected=(psycopg.Error, Raced),
        )
