"""The runner's pure side: choosing scenarios by name, its exit status, and the scenario
files themselves (they load, and cover what the issues asked of them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.checker import UNKNOWN
from chaos.judge import Judgement
from chaos.links import link_targets
from chaos.loader import load_scenarios, loads_scenario
from chaos.record import RecoveryRow, RunRecord
from chaos.report import recovery_text
from chaos.runner import RunResult, exit_code, select
from chaos.verdict import check

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def test_exit_code_and_recovery_text():
    scenario = loads_scenario('name = "s"\n[workload]\nrate = 1\nduration = 10\n')

    verdict = check([], [], [], [], quiet_at=0.0)

    def result(passed, error=None):
        record = RunRecord(scenario, (), verdict, Judgement(passed, ()))
        return RunResult(scenario, Path("."), 1.0, record, error=error)

    assert exit_code([result(True), result(True)]) == 0
    assert exit_code([result(True), result(UNKNOWN)]) == 2
    assert exit_code([result(UNKNOWN), result(False)]) == 1
    assert exit_code([result(True), result(True, error="boom")]) == 3
    rows = [
        RecoveryRow("sigkill", "worker-1", 10.0, 0.5, 12.0, 40),
        RecoveryRow("latency", "postgres", 30.0, 1.5, None, None),
    ]
    assert recovery_text(rows) == "first ≤1.5s, drained ≤12.0s (1 undrained)"
    assert recovery_text([]) == "–"


# ---------------------------------------------------------------- the scenario files


def test_the_scenarios_load_and_cover_the_issue():
    scenarios = {s.name: s for s in load_scenarios(SCENARIOS)}
    for letter in "abcdefghij":
        assert any(name.startswith(f"{letter}-") for name in scenarios), letter
    fast = ["a-worker-sigkill", "b-worker-sigstop", "f-redis-wipe", "h-api-reset"]
    assert set(fast) <= set(scenarios)
    for name, s in scenarios.items():
        link_targets(s.faults)  # no impossible private link
        assert s.expect.max_lost == 0
        if name.startswith("j-"):
            assert s.workload.duration >= 180 and len(s.faults) >= 10
        elif name.startswith("o-"):  # the schedules' long run: a relay down over a minute
            assert s.workload.duration >= 120 and len(s.faults) >= 10
        elif name.endswith("-alerts"):  # they outlast the alerts' `for:` windows
            assert 60 <= s.workload.duration <= 240, name
        else:
            assert 30 <= s.workload.duration <= 60, name
        assert all(f.stop <= s.workload.duration for f in s.faults), name
    unsafe = scenarios["b-unsafe"]
    assert not unsafe.fencing and unsafe.expect.expect_doubled
    assert unsafe.faults == scenarios["b-worker-sigstop"].faults
    assert scenarios["h-api-reset"].expect.min_unknown_landed >= 1
    # i: one worker's Kafka link, the other worker's and the relay's stay clean
    assert {f.target for f in scenarios["i-kafka-reset-peer"].faults} == {
        "kafka-1-worker-1",
        "kafka-2-worker-1",
        "kafka-3-worker-1",
    }
    # the throughput issue's targets: a kill in the middle of a completer batch, a Postgres
    # reset during a batched finish (on the workers' own links: the api and relay go on)
    kills = [f for f in scenarios["m-worker-kill-mid-batch"].faults if f.fault == "sigkill"]
    assert len(kills) >= 3 and {f.target for f in kills} == {"worker-1", "worker-2"}
    assert all(f.wait_for and f.wait_for.gauge == "completer_waiting" for f in kills)
    assert scenarios["m-worker-kill-mid-batch"].expect.min_redeliveries >= 1
    resets = [f for f in scenarios["n-postgres-reset-mid-finish"].faults if f.fault == "reset_peer"]
    assert len(resets) >= 3
    assert {f.target for f in resets} == {"worker-1/postgres", "worker-2/postgres"}
    assert all(f.wait_for and f.wait_for.gauge == "completer_waiting" for f in resets)
    for name in ("m-worker-kill-mid-batch", "n-postgres-reset-mid-finish"):
        w = scenarios[name].workload
        assert w.ledger_seconds == 0 and w.rate >= 100 and w.mix.ledger > 0, name
    # the issue's alert checks: relay killed, workers' Kafka link cut, a run of dead jobs
    expected_alerts = {a for s in scenarios.values() for a in s.expect.alerts}
    assert {
        "LeaseworkRelayStalled",
        "LeaseworkOutboxBacklog",
        "LeaseworkConsumerLag",
        "LeaseworkDeadLetters",
    } <= expected_alerts


def test_the_schedule_scenarios_cover_issue_20():
    """Relays killed at random while per-second schedules tick, two or three relays at once,
    one 60 s fast, a relay frozen longer than a tick, Postgres restarted; a fast one for CI;
    an unsafe one that must show doubled ticks."""
    scenarios = {s.name: s for s in load_scenarios(SCENARIOS)}
    main, fast, unsafe = (
        scenarios["o-schedule-relays-chaos"],
        scenarios["p-schedule-relays-fast"],
        scenarios["q-schedule-unsafe"],
    )
    for s in (main, fast, unsafe):
        every_second = s.schedules[0]
        assert every_second.cron == "* * * * * *" and every_second.type == "ledger"
        assert (every_second.overlap, every_second.catch_up) == ("allow", "all")
        assert s.expect.max_missing_ticks == s.expect.max_lost_ticks == 0
    assert {r.name: r.clock_offset for r in main.relays} == {"relay-2": 0, "relay-3": 60}
    assert [s.overlap for s in main.schedules] == ["allow", "skip"]
    kinds = {(f.fault, f.target) for f in main.faults}
    assert {("sigkill", "relay"), ("sigkill", "relay-2"), ("sigkill", "relay-3")} <= kinds
    assert ("sigstop", "relay") in kinds and ("postgres_restart", "postgres") in kinds
    assert any(f.fault == "sigstop" and f.duration > 1 for f in main.faults)
    # the relay-3 outage outlasts its minute's lead: the on-time relays take over
    (outage,) = [f for f in main.faults if (f.fault, f.target) == ("sigkill", "relay-3")]
    assert outage.duration > 60
    assert main.workload.quiet_timeout > 60 + 60  # its ticks a minute ahead must still run
    assert main.expect.max_doubled_ticks == 0 and not main.expect.expect_doubled_ticks
    # fast: two relays, a kill and a freeze longer than a tick, within a minute of load
    assert fast.extra_relays == ("relay-2",) and fast.workload.duration <= 60
    assert {f.fault for f in fast.faults} == {"sigkill", "sigstop"}
    assert any(f.fault == "sigstop" and f.duration > 1 for f in fast.faults)
    assert fast.expect.max_doubled_ticks == 0
    assert "p-schedule-relays-fast" in (SCENARIOS.parent / ".ci" / "run").read_text()
    # unsafe: every relay's scheduler without its guards, and the doubled ticks expected
    assert {r.name for r in unsafe.relays} == {"relay", "relay-2", "relay-3"}
    assert all(r.unsafe_scheduler for r in unsafe.relays)
    assert unsafe.expect.expect_doubled_ticks
    assert not any(r.unsafe_scheduler for s in (main, fast) for r in s.relays)


def test_select_by_name_or_unique_prefix():
    scenarios = load_scenarios(SCENARIOS)
    assert [s.name for s in select(scenarios, ["a", "h-api-reset"])] == [
        "a-worker-sigkill",
        "h-api-reset",
    ]
    assert len(select(scenarios, [])) == len(scenarios)
    with pytest.raises(ValueError, match="matches several"):
        select(scenarios, ["b"])
    with pytest.raises(ValueError, match="matches none"):
        select(scenarios, ["zzz"])
