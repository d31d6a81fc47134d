"""The harness's side of issue 20 without a stack: scenario files with relays and schedules
(and the mistakes they refuse), the relays' environment (which leasework's own config must
accept), the extra relays started and stopped by name, the run's schedules made, settled,
paused, read and deleted against a fake store, and the ticks in the report."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chaos import schedules as run_schedules
from chaos.links import extra_relay_envs, process_envs
from chaos.loader import ScenarioError, loads_scenario
from chaos.record import RunRecord
from chaos.report import part_summary_table, tick_summary_rows, write_report
from chaos.runner import summary_of_directory
from chaos.scenario import RelaySpec
from chaos.schedules import RunSchedules
from chaos.stack import UNSAFE_ENV, app_pids, start_extra_relay, stop_extra_relays
from chaos.ticks import TickObservation
from chaos.verdict import check
from leasework import config

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
BASE = 'name = "s"\n[workload]\nrate = 1\nduration = 30\n'
RELAYS = '[[relays]]\nname = "relay-2"\n[[relays]]\nname = "relay-3"\nclock_offset = 60\n'
SCHEDULE = '[[schedules]]\ncron = "* * * * * *"\n'


def test_a_scenario_with_relays_and_schedules_loads():
    text = (
        BASE
        + RELAYS
        + SCHEDULE
        + '[[schedules]]\ncron = "*/2 * * * * *"\ntype = "ledger"\nseconds = 2.5\n'
        'overlap = "skip"\ncatch_up = "latest"\ncatch_up_limit = 1\ntimezone = "Europe/Berlin"\n'
        '[[faults]]\nat = 5\nduration = 2\nfault = "sigkill"\ntarget = "relay-3"\n'
        '[random_faults]\nseed = 3\nfaults = ["sigkill"]\nprocesses = ["relay", "relay-2"]\n'
        "min_duration = 1\nmax_duration = 2\nmin_gap = 1\nmax_gap = 2\n"
        "[expect]\nmax_missing_ticks = 0\nlate_tick_seconds = 2\nmax_late_ticks = 4\n"
    )
    s = loads_scenario(text)
    assert s.extra_relays == ("relay-2", "relay-3")
    assert s.relays[1] == RelaySpec("relay-3", clock_offset=60.0)
    assert [x.overlap for x in s.schedules] == ["allow", "skip"]
    assert (s.schedules[0].catch_up, s.schedules[0].catch_up_limit) == ("all", 1000)
    definition = s.schedules[1].definition("run-s2")
    assert definition.payload == {"seconds": 2.5} and definition.timezone == "Europe/Berlin"
    assert s.schedules[0].definition("run-s1").payload == {"seconds": 0.0}
    drawn = {f.target for f in s.faults if f.at != 5}
    assert drawn and drawn <= {"relay", "relay-2"}  # the random kills hit the relays named
    assert (s.expect.late_tick_seconds, s.expect.max_late_ticks) == (2.0, 4)
    assert s.to_dict()["relays"][1]["clock_offset"] == 60.0


@pytest.mark.parametrize(
    "text, field, words",
    [
        (BASE + '[[relays]]\nname = "relay-4"\n', "relays[0].name", "not a relay"),
        (BASE + '[[relays]]\nname = "relay-2"\n' * 2, "relays[1].name", "twice"),
        (
            BASE + '[[relays]]\nname = "relay-2"\nclock_offset = 4000\n',
            "relays[0].clock_offset",
            "3600",
        ),
        (BASE + '[[relays]]\nname = "relay-2"\nfast = true\n', "relays[0].fast", "unknown field"),
        (
            BASE + '[[faults]]\nat = 1\nduration = 1\nfault = "sigstop"\ntarget = "relay-2"\n',
            "faults[0].target",
            '[[relays]] with name = "relay-2"',
        ),
        (
            BASE + '[[relays]]\nname = "relay-2"\n[[faults]]\nat = 1\nduration = 1\n'
            'fault = "latency"\ntarget = "relay-2/postgres"\nparams = { latency = 5 }\n',
            "faults[0].target",
            "no private links",
        ),
        (
            BASE + '[random_faults]\nseed = 1\nfaults = ["sigkill"]\nprocesses = ["relay-3"]\n',
            "random_faults.processes",
            "relay-3 runs only",
        ),
        (
            BASE + '[random_faults]\nseed = 1\nprocesses = ["postgres"]\n',
            "random_faults.processes",
            "not a leasework process",
        ),
        (BASE + '[[schedules]]\ncron = "61 * * * *"\n', "schedules[0]", "not valid"),
        (
            BASE + '[[schedules]]\ncron = "* * * * *"\ntype = "sleep"\n',
            "schedules[0].type",
            "ledger",
        ),
        (
            BASE + '[[schedules]]\ncron = "* * * * *"\noverlap = "never"\n',
            "schedules[0]",
            "overlap",
        ),
        (BASE + "[[schedules]]\n", "schedules[0].cron", "required"),
        ('schedules = "hourly"\n' + BASE, "schedules", "array of tables"),
        (
            BASE + SCHEDULE + "[expect]\nexpect_doubled_ticks = true\n",
            "expect.expect_doubled_ticks",
            "unsafe_scheduler",
        ),
    ],
)
def test_bad_relays_and_schedules_name_the_field(text, field, words):
    with pytest.raises(ScenarioError) as info:
        loads_scenario(text, source="bad.toml")
    assert info.value.field == field, str(info.value)
    assert words in str(info.value)


def test_the_relays_environment_is_what_leasework_s_config_accepts():
    fast, unsafe = RelaySpec("relay-3", clock_offset=60), RelaySpec("relay", unsafe_scheduler=True)
    assert RelaySpec("relay-2").env() == {}
    relay3 = config.load("relay", fast.env())
    assert relay3.fake_clock_offset == 60.0 and not relay3.unsafe_scheduler
    assert config.load("relay", unsafe.env()).unsafe_scheduler is True
    relays = (RelaySpec("relay-2"), fast, unsafe)
    # the stack's relay is restarted with its options, like the workers in the unsafe mode
    assert process_envs([], fencing=False, unsafe_env=UNSAFE_ENV, relays=relays) == {
        "worker-1": UNSAFE_ENV,
        "worker-2": UNSAFE_ENV,
        "relay": unsafe.env(),
    }
    assert process_envs([], fencing=True, unsafe_env=UNSAFE_ENV, relays=relays[:2]) == {}
    # the others are started for the run
    assert extra_relay_envs(relays) == {"relay-2": {}, "relay-3": fast.env()}


class FakeStack:
    def __init__(self, running: set[str]) -> None:
        self.running = set(running)
        self.calls: list[tuple[Any, ...]] = []

    def names(self, kind=None):
        names = {"app": ["api", "relay", "worker-1", "worker-2"], "extra": ["relay-2", "relay-3"]}
        return names[kind]

    def pid(self, name):
        return 100 + len(name) if name in self.running else None

    def stop_many(self, names, timeout=None):
        self.calls.append(("stop_many", tuple(names)))
        self.running -= set(names)

    def start(self, name, extra_env=None, wait=True, timeout=None):
        self.calls.append(("start", name, extra_env))
        self.running.add(name)


def test_extra_relays_start_with_their_environment_and_stop_by_name():
    stack = FakeStack({"api", "relay", "relay-3"})
    assert stop_extra_relays(stack) == ["relay-3"]  # type: ignore[arg-type]
    assert stop_extra_relays(stack) == []  # type: ignore[arg-type]
    start_extra_relay(stack, "relay-2", {})  # type: ignore[arg-type]
    start_extra_relay(stack, "relay-3", {"LEASEWORK_FAKE_CLOCK_OFFSET": "60"})  # type: ignore[arg-type]
    assert stack.calls == [
        ("stop_many", ("relay-3",)),
        ("start", "relay-2", None),
        ("start", "relay-3", {"LEASEWORK_FAKE_CLOCK_OFFSET": "60"}),
    ]
    pids = app_pids(stack, ("relay-2", "relay-3"))  # type: ignore[arg-type]
    assert set(pids) == {"api", "relay", "worker-1", "worker-2", "relay-2", "relay-3"}
    assert pids["worker-1"] is None and pids["relay-2"] is not None


# ---------------------------------------------------------------- the run's schedules


@dataclass
class Stored:
    next_fire_at: datetime | None
    created_at: datetime = T0


class FakeStore:
    """The store functions and a connection, in memory: schedules whose next fire time a
    test moves by hand, the pauses and deletes the harness asks for, canned rows."""

    def __init__(self) -> None:
        self.schedules: dict[str, Stored] = {}
        self.paused: list[str] = []
        self.deleted: list[str] = []
        self.queries: list[tuple[str, Any]] = []
        self.moves: list[datetime] = []  # next fire times handed out on each read

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(run_schedules, "_connect", lambda: self)
        monkeypatch.setattr(run_schedules, "schedule_create", self.create)
        monkeypatch.setattr(run_schedules, "schedule_get", self.get)
        monkeypatch.setattr(
            run_schedules, "schedule_set_paused", lambda c, n, p, nf: self.paused.append(n)
        )
        monkeypatch.setattr(run_schedules, "schedule_delete", lambda c, n: self.deleted.append(n))
        monkeypatch.setattr(run_schedules, "POLL", 0.001)

    def __enter__(self) -> FakeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def create(self, conn, definition, created_by, now):
        assert created_by == "chaos"
        self.schedules[definition.name] = Stored(definition.first_fire_at(now))
        return self.schedules[definition.name]

    def get(self, conn, name):
        stored = self.schedules[name]
        if self.moves:
            stored.next_fire_at = self.moves.pop(0)
        return stored

    def execute(self, sql, params):
        self.queries.append((sql, params))

        class Rows:
            def fetchall(self):
                return [{"sql": sql}]

        return Rows()


def test_the_run_s_schedules_are_made_settled_paused_read_and_deleted(monkeypatch):
    store = FakeStore()
    store.install(monkeypatch)
    scenario = loads_scenario(BASE + SCHEDULE + SCHEDULE.replace("* * * * * *", "*/5 * * * * *"))
    run = RunSchedules(scenario.schedules, "chaos-s-x")
    lines = run.create(now=T0 + timedelta(milliseconds=300))
    assert run.names == ("chaos-s-x-s1", "chaos-s-x-s2")
    assert [s.first for s in run.made] == [T0 + timedelta(seconds=1), T0 + timedelta(seconds=5)]
    assert "first tick 2026-03-01T12:00:01+00:00" in lines[0]
    # the load ended at 12:00:09.5: ticks due 9 s and 5 s; the schedulers handle them late
    ended = T0 + timedelta(seconds=9, milliseconds=500)
    store.moves = [
        T0 + timedelta(seconds=8),
        T0 + timedelta(seconds=10),
        T0 + timedelta(seconds=10),
    ]
    lines = run.settle_and_pause(ended, patience=5)
    assert [s.due_by for s in run.made] == [T0 + timedelta(seconds=9), T0 + timedelta(seconds=5)]
    assert [s.settled for s in run.made] == [True, True] and not store.moves
    assert store.paused == ["chaos-s-x-s1", "chaos-s-x-s2"]
    assert all("handled; paused" in line for line in lines)
    tables = run.read()
    windows = tables["schedules"]
    assert [w["definition"]["name"] for w in windows] == list(run.names)
    assert windows[0]["next_fire_at"] == (T0 + timedelta(seconds=10)).isoformat()
    assert windows[0]["settled"] is True
    assert set(tables) == {"schedules", "schedule_ticks", "schedule_jobs", "schedule_effects"}
    assert all(params[0] == list(run.names) for _, params in store.queries)
    observed = TickObservation.from_tables(
        tables | {"schedule_ticks": [], "schedule_jobs": [], "schedule_effects": []}
    )
    assert observed is not None and observed.windows[0].due_by == T0 + timedelta(seconds=9)
    run.delete()
    assert store.deleted == list(run.names)


def test_a_schedule_whose_due_tick_is_never_handled_is_paused_anyway_and_said(monkeypatch):
    store = FakeStore()
    store.install(monkeypatch)
    run = RunSchedules(loads_scenario(BASE + SCHEDULE).schedules, "p")
    run.create(now=T0)
    (line,) = run.settle_and_pause(T0 + timedelta(seconds=30), patience=0.05)
    assert run.made[0].settled is False and "NOT handled within 0.05s" in line
    assert store.paused == ["p-s1"]
    assert RunSchedules((), "p").read() == {} and TickObservation.from_tables({}) is None


# ---------------------------------------------------------------- the report


def test_the_ticks_are_in_the_report_and_the_summary(tmp_path: Path):
    scenario = loads_scenario(BASE + SCHEDULE)
    definition = scenario.schedules[0].definition("run-s1")
    window = {
        "definition": {**definition.__dict__, "overlap": "allow", "catch_up": "all"},
        "first": T0.isoformat(),
        "due_by": (T0 + timedelta(seconds=2)).isoformat(),
        "next_fire_at": (T0 + timedelta(seconds=3)).isoformat(),
    }
    rows = [
        {
            "schedule": "run-s1",
            "nominal_at": T0 + timedelta(seconds=i),
            "outcome": "fired",
            "job_id": f"j{i}",
            "recorded_at": T0 + timedelta(seconds=i + 0.1),
        }
        for i in range(3)
    ]
    jobs = [
        {
            "id": f"j{i}",
            "schedule": "run-s1",
            "tick_at": T0 + timedelta(seconds=i),
            "type": "ledger",
            "status": "succeeded",
        }
        for i in (0, 1, 2, 2)  # tick 2 twice
    ]
    effects = [{"job_id": f"j{i}", "kind": "ledger"} for i in (0, 1, 2, 2)]
    ticks = TickObservation.of([window], rows, jobs, effects)
    verdict = check([], [], [], [], quiet_at=10.0, run_started_at=T0, ticks=ticks)
    write_report(tmp_path / scenario.name, RunRecord(scenario, (), verdict))
    md = (tmp_path / scenario.name / "report.md").read_text()
    assert "## Schedule ticks" in md
    policy = "* * * * * * (UTC), overlap allow, catch-up all up to 1000"
    assert f"| run-s1: {policy} | 12:00:00 to 12:00:02 | 3 | 3 | 0 | 0 | 1 |" in md
    assert (
        "| schedule 1 | * * * * * * (UTC), ledger 0s, overlap allow, catch-up all up to 1000 |"
        in md
    )
    report = json.loads((tmp_path / scenario.name / "report.json").read_text())
    assert report["verdict"]["ticks"]["totals"]["doubled"] == 1
    (row,) = tick_summary_rows(tmp_path)
    assert (row.scenario, row.expected, row.fired, row.doubled) == ("s", 3, 3, 1)
    assert part_summary_table([row]).splitlines()[0].startswith("| scenario | expected | fired |")
    assert "Schedule ticks:" in summary_of_directory(tmp_path, fmt="markdown")
