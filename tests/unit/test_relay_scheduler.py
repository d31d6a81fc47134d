"""The scheduler's fire pass on a fake connection: a tick another transaction already
recorded gets no second job from the guarded pass, and does from the unsafe one (the chaos
harness's broken scheduler); the unsafe pass reads without a row lock and writes the next
fire time without compare-and-set; only ``LEASEWORK_UNSAFE_SCHEDULER`` (confirmed) picks it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from leasework import config
from leasework.relay import scheduler as scheduler_module
from leasework.relay.scheduler import Scheduler, SchedulerConfig, decide
from leasework.states import Status
from leasework.store import schedules as store
from leasework.store.schedules import Raced
from leasework.store.submit import Inserted

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NAME = "every-second"


def schedule_row(next_fire_at: datetime) -> dict[str, Any]:
    return {
        "name": NAME,
        "type": "ledger",
        "payload": {},
        "cron": "* * * * * *",
        "timezone": "UTC",
        "overlap": "allow",
        "catch_up": "all",
        "catch_up_limit": 100,
        "grace_seconds": 60,
        "paused": False,
        "next_fire_at": next_fire_at,
        "source": "api",
        "declared_by": "test",
        "created_at": T0,
        "updated_at": T0,
    }


class Result:
    def __init__(self, rows: list[dict[str, Any]] | None = None, rowcount: int = 0) -> None:
        self.rows = rows or []
        self.rowcount = rowcount

    def fetchall(self) -> list[dict[str, Any]]:
        return self.rows

    def fetchone(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None


class FakeConn:
    """The statements of one pass, answered as Postgres would when another transaction
    has already recorded the ticks in ``recorded_elsewhere`` (and, with ``moved``, moved
    the schedule's next fire time on)."""

    def __init__(self, row: dict[str, Any], recorded_elsewhere: set[datetime], moved=False):
        self.row = row
        self.recorded_elsewhere = recorded_elsewhere
        self.moved = moved
        self.statements: list[tuple[str, Any]] = []

    def execute(self, sql: str, params: Any = ()) -> Result:
        text = " ".join(sql.split())
        self.statements.append((text, params))
        if text.startswith("SELECT name, type"):
            return Result([self.row])
        if text.startswith("INSERT INTO schedule_ticks"):
            wanted = [datetime.fromisoformat(r["nominal_at"]) for r in params[1].obj]
            return Result([{"nominal_at": t} for t in wanted if t not in self.recorded_elsewhere])
        if text.startswith("UPDATE schedules"):
            return Result(rowcount=0 if self.moved and "AND next_fire_at" in text else 1)
        if text.startswith("SELECT min(next_fire_at)"):
            return Result([{"due": None}])
        return Result()

    def sql(self, prefix: str) -> list[str]:
        return [text for text, _ in self.statements if text.startswith(prefix)]


@pytest.fixture
def inserted(monkeypatch) -> list[dict[str, Any]]:
    """The job requests the pass hands to ``jobs_insert`` (every door's insert)."""
    requests: list[dict[str, Any]] = []

    def jobs_insert(conn: Any, rows: list[dict[str, Any]], topic: str) -> list[Inserted]:
        requests.extend(rows)
        return [new_job(n, row) for n, row in enumerate(rows, 1)]

    monkeypatch.setattr(store, "jobs_insert", jobs_insert)
    return requests


def new_job(ord: int, row: dict[str, Any]) -> Inserted:
    """What the insert answers for a request that wrote its job (no duplicate)."""
    run_at = datetime.fromisoformat(row["run_at"])
    return Inserted(ord, uuid.UUID(row["id"]), Status.QUEUED, run_at, run_at, 5, 300, False, False)


def fire(fire_due, conn: FakeConn, now: datetime):
    return fire_due(conn, now, 50, "jobs.ready", decide(now))


def test_the_guarded_pass_gives_a_tick_recorded_elsewhere_no_job(inserted):
    now = T0 + timedelta(seconds=1, milliseconds=5)
    conn = FakeConn(schedule_row(T0), recorded_elsewhere={T0})
    (handled,) = fire(store.schedules_fire_due, conn, now)
    # T0 was recorded by another transaction: only T0+1 s is this pass's, with one job
    assert [t.nominal_at for t in handled.fired] == [T0 + timedelta(seconds=1)]
    assert [r["run_at"] for r in inserted] == [(T0 + timedelta(seconds=1)).isoformat()]
    (select,) = conn.sql("SELECT name, type")
    assert "FOR UPDATE SKIP LOCKED" in select
    (update,) = conn.sql("UPDATE schedules")
    assert update.endswith("WHERE name = %s AND next_fire_at = %s")


def test_the_guarded_pass_raises_when_the_next_fire_time_moved(inserted):
    conn = FakeConn(schedule_row(T0), recorded_elsewhere=set(), moved=True)
    with pytest.raises(Raced, match=NAME):
        fire(store.schedules_fire_due, conn, T0 + timedelta(milliseconds=5))


def test_the_unsafe_pass_fires_a_tick_recorded_elsewhere_again(inserted):
    now = T0 + timedelta(seconds=1, milliseconds=5)
    conn = FakeConn(schedule_row(T0), recorded_elsewhere={T0}, moved=True)
    (handled,) = fire(store.schedules_fire_due_unsafe, conn, now)
    both = [T0, T0 + timedelta(seconds=1)]
    assert [t.nominal_at for t in handled.fired] == both
    assert [r["run_at"] for r in inserted] == [t.isoformat() for t in both]
    (select,) = conn.sql("SELECT name, type")
    assert "FOR UPDATE" not in select
    (update,) = conn.sql("UPDATE schedules")  # written whatever it holds now: no Raced
    assert update.endswith("WHERE name = %s")


def settings(**environ: str) -> config.Settings:
    return config.load("relay", environ)


def test_only_the_confirmed_switch_makes_the_scheduler_unsafe(monkeypatch):
    assert SchedulerConfig.from_settings(settings()).unsafe is False
    confirmed = settings(LEASEWORK_UNSAFE_SCHEDULER="1", LEASEWORK_I_ACCEPT_DOUBLE_TICKS="yes")
    assert SchedulerConfig.from_settings(confirmed).unsafe is True
    called: list[str] = []
    monkeypatch.setattr(
        scheduler_module, "schedules_fire_due", lambda *a: called.append("guarded") or []
    )
    monkeypatch.setattr(
        scheduler_module, "schedules_fire_due_unsafe", lambda *a: called.append("unsafe") or []
    )
    conn = FakeConn(schedule_row(T0), set())
    for chosen in (settings(), confirmed):
        cfg = SchedulerConfig.from_settings(chosen)
        Scheduler(db=None, config=cfg)._pass(conn, T0)  # type: ignore[arg-type]
    assert called == ["guarded", "unsafe"]
