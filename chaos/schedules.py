"""The run's schedules: created at its start, each under a name of the run's own, ticking
while the load and the faults run; paused once the tick due when the load ended has been
handled; read once the system is quiet; deleted at the end, whatever happened.

Blocking calls (the runner makes them in a thread), straight to Postgres on its direct port
(never a proxy: toxics never fool the harness), through the store's own functions
(``schedule_create``, ``schedule_get``, ``schedule_set_paused``, ``schedule_delete``). The
rows read are what :mod:`chaos.ticks` checks; they go into ``tables.json`` under
``schedules`` (each schedule's window), ``schedule_ticks``, ``schedule_jobs`` and
``schedule_effects``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from chaos.scenario import ScheduleSpec
from chaos.ticks import ScheduleWindow
from devstack.layout import POSTGRES_DIRECT_DSN
from leasework.schedules import Definition
from leasework.store.schedules import (
    schedule_create,
    schedule_delete,
    schedule_get,
    schedule_set_paused,
)

T = TypeVar("T")

# how long the harness waits for the tick due when the load ended to be handled, and how
# long it retries its own statements while Postgres is unreachable (a fault just healed)
SETTLE_PATIENCE = 30.0
POLL = 0.25
CREATED_BY = "chaos"


def _connect() -> psycopg.Connection[dict[str, Any]]:
    return psycopg.connect(POSTGRES_DIRECT_DSN, row_factory=dict_row, connect_timeout=5)


def _retrying(fn: Callable[[psycopg.Connection[Any]], T], patience: float) -> T:
    """``fn`` in a transaction of its own, tried again while Postgres cannot be reached
    (for up to ``patience`` seconds; then the last error is raised)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            with _connect() as conn:
                return fn(conn)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL)


@dataclass
class RunSchedule:
    """One schedule of the run: its definition, its first tick and its creation time (the
    database's), and, once paused, the tick due when the load ended and whether it had been
    handled by then."""

    definition: Definition
    first: datetime
    created_at: datetime
    due_by: datetime | None = None
    settled: bool | None = None

    @property
    def name(self) -> str:
        return self.definition.name


class RunSchedules:
    """The schedules of one run (none for a scenario without ``[[schedules]]``)."""

    def __init__(self, specs: Sequence[ScheduleSpec], prefix: str) -> None:
        self.specs = tuple(specs)
        self.prefix = prefix
        self.made: list[RunSchedule] = []

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.made)

    def create(self, now: datetime | None = None) -> list[str]:
        """Create every schedule (``<prefix>-s1``, ...): each starts at its first tick
        after ``now``. Returns a line per schedule for the run's log."""
        now = now or datetime.now(UTC)
        definitions = [
            spec.definition(f"{self.prefix}-s{i}") for i, spec in enumerate(self.specs, 1)
        ]

        def make(conn: psycopg.Connection[Any]) -> list[RunSchedule]:
            made = []
            for d in definitions:
                stored = schedule_create(conn, d, CREATED_BY, now)
                if stored is None or stored.next_fire_at is None:
                    raise RuntimeError(f"schedule {d.name} exists already, or never ticks")
                made.append(RunSchedule(d, stored.next_fire_at, stored.created_at))
            return made

        self.made = _retrying(make, SETTLE_PATIENCE)
        return [
            f"schedule {s.name}: {s.definition.cron} ({s.definition.type}), overlap "
            f"{s.definition.overlap}, catch-up {s.definition.catch_up}, first tick "
            f"{s.first.isoformat()}"
            for s in self.made
        ]

    def settle_and_pause(self, ended_at: datetime, patience: float = SETTLE_PATIENCE) -> list[str]:
        """Wait (up to ``patience`` seconds) until each schedule's tick due at ``ended_at``
        has been handled (its next fire time is past it), then pause them all: no tick is
        fired after that, and every tick up to the one due must have its row. Returns lines
        for the run's log."""
        for s in self.made:
            due, _ = s.definition.calendar.latest(s.first, ended_at, 1)
            s.due_by = due[-1] if due else None
        waiting = {s.name: s.due_by for s in self.made if s.due_by is not None}
        started = time.monotonic()
        deadline = started + patience
        while waiting and time.monotonic() < deadline:
            try:
                with _connect() as conn:
                    for name, due_by in list(waiting.items()):
                        stored = schedule_get(conn, name)
                        moved = stored.next_fire_at if stored is not None else None
                        if moved is None or moved > due_by:
                            del waiting[name]
            except psycopg.OperationalError:
                pass  # Postgres not back yet: the patience covers it
            if waiting:
                time.sleep(POLL)
        for s in self.made:
            s.settled = s.name not in waiting

        def pause(conn: psycopg.Connection[Any]) -> None:
            for s in self.made:
                schedule_set_paused(conn, s.name, True, None)

        _retrying(pause, patience)
        lines = [
            f"schedule {s.name}: tick due at the end {_iso(s.due_by)} "
            + ("handled" if s.settled else f"NOT handled within {patience:g}s")
            + "; paused"
            for s in self.made
        ]
        return lines

    def read(self) -> dict[str, list[dict[str, Any]]]:
        """The schedules' windows and rows, for the tick checker (and ``tables.json``);
        nothing for a run without schedules."""
        if not self.made:
            return {}
        names = list(self.names)
        # every job of the run's schedules was created after them (the database's clock)
        since = min(s.created_at for s in self.made) - timedelta(minutes=5)

        def read(conn: psycopg.Connection[Any]) -> dict[str, list[dict[str, Any]]]:
            windows = []
            for s in self.made:
                stored = schedule_get(conn, s.name)
                window = ScheduleWindow(
                    s.definition,
                    s.first,
                    s.due_by,
                    stored.next_fire_at if stored is not None else None,
                )
                windows.append({**window.to_dict(), "settled": s.settled})
            ticks = conn.execute(
                "SELECT schedule, nominal_at, outcome, reason, job_id::text AS job_id, source, "
                "recorded_at FROM schedule_ticks WHERE schedule = ANY(%s) "
                "ORDER BY schedule, nominal_at",
                (names,),
            ).fetchall()
            jobs = conn.execute(
                "SELECT id::text AS id, schedule, tick_at, type, status, run_at, started_at, "
                "finished_at, created_at FROM jobs WHERE schedule = ANY(%s) AND created_at >= %s "
                "ORDER BY schedule, tick_at, created_at",
                (names, since),
            ).fetchall()
            effects = conn.execute(
                "SELECT e.job_id::text AS job_id, e.fence, e.kind FROM effects e "
                "JOIN jobs j ON j.id = e.job_id WHERE j.schedule = ANY(%s) "
                "AND j.created_at >= %s ORDER BY e.id",
                (names, since),
            ).fetchall()
            return {
                "schedules": windows,
                "schedule_ticks": ticks,
                "schedule_jobs": jobs,
                "schedule_effects": effects,
            }

        return _retrying(read, SETTLE_PATIENCE)

    def delete(self) -> None:
        """Delete the run's schedules and their tick rows (their jobs stay)."""

        def delete(conn: psycopg.Connection[Any]) -> None:
            for s in self.made:
                schedule_delete(conn, s.name)

        if self.made:
            _retrying(delete, SETTLE_PATIENCE)


def _iso(moment: datetime | None) -> str:
    return moment.isoformat() if moment is not None else "(none)"
