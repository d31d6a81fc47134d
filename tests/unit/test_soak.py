"""The soak's pure pieces: judging the samples (RSS windows across restarts, flatness, the
p99 delay outside fault windows, the exit code), the fault schedule, the rate, the /proc
parsers and the report."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chaos.checker import UNKNOWN
from chaos.history import FaultWindow
from tools.soak import goals as g
from tools.soak import plan, plot, sampler
from tools.soak.report import SoakRun, render_markdown, result_table

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SOAK = g.Windows.of(1800.0)  # 30 minutes: windows of 10


def series(values, *, pid=100, start=-30.0, every=60.0, **fixed):
    """Readings every ``every`` seconds from ``start``: rss_kib from ``values`` (a list, or
    a function of t), the other fields fixed."""
    out = []
    for i, value in enumerate(values):
        t = start + i * every
        fields = {"rss_kib": value, "fds": 40, "pg_links": 2, **fixed}
        out.append(g.Reading(t, pid, **fields))
    return out


def steady(n=33, rss=100_000, **kw):
    return series([rss] * n, **kw)


# --------------------------------------------------------------- windows and lives


def test_windows_are_ten_minutes_or_a_third_of_a_shorter_soak():
    assert SOAK.first == (0.0, 600.0) and SOAK.last == (1200.0, 1800.0)
    short = g.Windows.of(180.0)
    assert short.window == 60.0 and short.last == (120.0, 180.0)


def test_a_restart_or_an_absence_ends_a_life():
    readings = [
        g.Reading(0, 1),
        g.Reading(60, 1),
        g.Reading(120, None),
        g.Reading(180, 1),  # the same number after a gap: another life
        g.Reading(240, 2),
    ]
    lives = g.lives(readings)
    assert [(life.pid, life.start, life.end) for life in lives] == [
        (1, 0, 60),
        (1, 180, 180),
        (2, 240, 240),
    ]
    assert [life.started_in_run for life in lives] == [False, True, True]


# --------------------------------------------------------------- RSS


def test_steady_rss_meets_the_goal_over_the_whole_soak():
    p = g.process_goals("api", steady(), SOAK)
    assert p.span.basis == "whole soak"
    assert p.rss.ok is True and p.rss.ratio == 1.0
    assert p.valid is True


@pytest.mark.parametrize(
    ("last", "ok", "why"),
    [
        (110_000, True, ""),  # exactly 10 %: within
        (115_000, False, "grew 15.0%"),
        (88_000, False, "shrank 12.0%"),
    ],
)
def test_rss_must_stay_within_ten_percent_either_way(last, ok, why):
    values = [100_000] * 11 + [100_000 + (last - 100_000) * i // 11 for i in range(11)]
    values += [last] * 11
    p = g.process_goals("worker-1", series(values), SOAK)
    assert p.span.basis == "whole soak"
    assert p.rss.first == 100_000 and p.rss.last == last
    assert p.rss.ok is ok and p.rss.why == why


def test_a_window_is_judged_by_its_median_not_by_one_spike():
    values = [100_000] * 33
    values[25] = 400_000  # one sample during a fault
    assert g.process_goals("relay", series(values), SOAK).rss.ok is True


def test_a_restarted_process_is_judged_over_its_longest_life_after_warm_up():
    # pid 1 for the first five minutes, then pid 2: small at its start, flat after a minute
    first_life = series([100_000] * 6, pid=1, start=-30.0)
    second = series([60_000] + [120_000] * 26, pid=2, start=330.0)
    p = g.process_goals("worker-2", first_life + second, SOAK)
    assert p.span.pid == 2 and p.span.lives == 2
    assert p.span.basis.startswith("longest life: pid 2")
    assert p.span.first[0] == pytest.approx(390.0)  # its start plus the warm-up
    assert p.rss.ok is True  # its warm-up's 60 MB does not count


def test_a_leak_within_the_longest_life_is_still_caught():
    first_life = series([100_000] * 6, pid=1)
    leaking = series([100_000 + 4_000 * i for i in range(27)], pid=2, start=330.0)
    p = g.process_goals("worker-2", first_life + leaking, SOAK)
    assert p.span.pid == 2
    assert p.rss.ok is False and "grew" in p.rss.why


def test_a_process_restarted_every_few_minutes_is_not_judged():
    readings = []
    for n in range(10):  # a new pid every three minutes
        readings += series([100_000] * 3, pid=10 + n, start=n * 180.0)
    p = g.process_goals("api", readings, SOAK)
    assert not p.span.judged and p.span.basis.startswith("not judged: 10 lives")
    assert p.rss.ok == UNKNOWN and p.valid == UNKNOWN


def test_a_life_restarted_just_before_the_soak_is_judged_after_its_warm_up():
    readings = [g.Reading(-40.0, 1, rss_kib=90_000)] + series([50_000] + [100_000] * 32, pid=2)
    p = g.process_goals("relay", readings, SOAK)
    assert p.span.basis.startswith("longest life: pid 2") and p.span.first[0] == 30.0
    assert p.rss.ok is True


# --------------------------------------------------------------- descriptors, connections


@pytest.mark.parametrize(
    ("first", "last", "ok"),
    [
        (20, 22, True),  # within the slack of 3
        (200, 215, True),  # within 10 %
        (100, 60, True),  # a drop is no leak
        (20, 40, False),
        (200, 240, False),
    ],
)
def test_descriptors_must_not_grow(first, last, ok):
    readings = series([100_000] * 11, fds=first) + series([100_000] * 22, start=630.0, fds=last)
    p = g.process_goals("kafka-1", readings, SOAK)
    assert p.fds.ok is ok
    if not ok:
        assert p.fds.why == f"grew from {first:g} to {last:g}"


def test_a_connection_leak_is_caught_and_only_talkers_get_a_connection_goal():
    leaking = series([100_000] * 11, pg_links=2) + series([100_000] * 22, start=630.0, pg_links=6)
    silent = steady(pg_links=0)
    judged = g.judge(
        [g.process_goals("api", leaking, SOAK), g.process_goals("redis", silent, SOAK)],
        g.server_connections([(t, 12) for t in range(0, 1800, 60)], SOAK),
        g.delay_goal([g.Delay(10.0, 0.01, False)]),
        g.Checked(True, 0, 0, True),
    )
    names = [goal.name for goal in judged.goals]
    assert "pg connections api" in names and "pg connections redis" not in names
    assert [goal.name for goal in judged.missed] == ["pg connections api"]
    assert g.exit_code(judged) == 1


def test_the_servers_connections_are_judged_over_the_whole_soak():
    flat = [(float(t), 12) for t in range(0, 1801, 60)]
    assert g.server_connections(flat, SOAK).ok is True
    growing = [(float(t), 12 + t // 100) for t in range(0, 1801, 60)]
    assert g.server_connections(growing, SOAK).ok is False
    assert g.server_connections([], SOAK).ok == UNKNOWN


# --------------------------------------------------------------- scheduling delay


def job(due: float, delay: float) -> dict:
    run_at = T0 + timedelta(seconds=due)
    return {
        "id": f"j{due}",
        "type": "noop",
        "status": "succeeded",
        "run_at": run_at,
        "started_at": run_at + timedelta(seconds=delay),
    }


def test_jobs_due_in_a_fault_window_or_its_settle_time_are_set_aside():
    windows = [FaultWindow("sigkill", "worker-1", 100.0, 110.0), FaultWindow("x", None, 500, None)]
    jobs = [
        job(50.0, 0.01),
        job(99.5, 20.0),  # within the lead before the fault
        job(105.0, 30.0),
        job(135.0, 5.0),  # in the settle time
        job(145.0, 0.02),
        job(600.0, 9.0),  # a window never healed holds to the end
        {**job(70.0, 0.0), "started_at": None},  # never started: no delay
    ]
    delays = g.job_delays(jobs, windows, T0, settle=30.0)
    assert [(d.due, d.in_fault) for d in delays] == [
        (50.0, False),
        (99.5, True),
        (105.0, True),
        (135.0, True),
        (145.0, False),
        (600.0, True),
    ]
    goal = g.delay_goal(delays, settle=30.0)
    assert goal.ok is True and goal.outside == 2 and goal.jobs == 6
    assert goal.p99_outside == pytest.approx(0.02) and goal.p99_all == pytest.approx(30.0)


def test_the_delay_goal_misses_on_a_slow_tail_outside_faults():
    delays = [g.Delay(float(i), 0.05, False) for i in range(97)]
    delays += [g.Delay(200.0 + i, 1.5, False) for i in range(3)]  # 3 % over a second
    goal = g.delay_goal(delays)
    assert goal.ok is False and goal.why == "p99 1.500s is not under 1s"
    assert g.delay_goal([g.Delay(1.0, 0.1, True)]).ok == UNKNOWN


def test_delay_buckets_split_by_due_time():
    delays = [g.Delay(5.0, 0.1, False), g.Delay(6.0, 4.0, True), g.Delay(70.0, 0.2, False)]
    buckets = g.delay_buckets(delays, 120.0, count=2)
    assert [(b.start, b.p99_all, b.p99_outside) for b in buckets] == [
        (0.0, 4.0, 0.1),
        (60.0, 0.2, 0.2),
    ]


# --------------------------------------------------------------- the verdict


def _judged(checked: g.Checked, rss=None):
    return g.judge(
        [g.process_goals("api", rss or steady(), SOAK)],
        g.server_connections([(float(t), 5) for t in range(0, 1801, 60)], SOAK),
        g.delay_goal([g.Delay(1.0, 0.1, False)]),
        checked,
    )


def test_every_goal_met_exits_zero():
    judged = _judged(g.Checked(True, 0, 0, True))
    assert judged.valid is True and g.exit_code(judged) == 0


@pytest.mark.parametrize(
    "checked",
    [g.Checked(False, 0, 0, False), g.Checked(True, 1, 0, False), g.Checked(True, 0, 2, True)],
)
def test_a_lost_or_doubled_job_or_an_invalid_verdict_fails(checked):
    judged = _judged(checked)
    assert "checker" in [goal.name for goal in judged.missed]
    assert g.exit_code(judged) == 1


def test_an_unjudged_process_makes_the_soak_unknown_not_passed():
    restarted = []
    for n in range(10):
        restarted += series([100_000] * 3, pid=10 + n, start=n * 180.0)
    judged = _judged(g.Checked(True, 0, 0, True), rss=restarted)
    assert not judged.missed and judged.unknown
    assert g.exit_code(judged) == 2


# --------------------------------------------------------------- the plan


def test_the_schedule_has_a_fault_in_every_minute_and_is_a_function_of_its_seed():
    schedule = plan.soak_schedule(3, 30)
    assert schedule == plan.soak_schedule(3, 30) != plan.soak_schedule(4, 30)
    for minute in range(30):
        starts = [f.at for f in schedule if minute * 60 <= f.at < (minute + 1) * 60]
        assert starts and minute * 60 + 5 <= min(starts) <= minute * 60 + 25
    assert all(f.duration <= plan.MAX_DURATION for f in schedule)


def test_overlapping_faults_hit_other_targets_and_never_two_brokers():
    schedule = plan.soak_schedule(5, 200, overlap=1.0)
    assert plan.overlapping(schedule) >= 150
    by_minute: dict[int, list] = {}
    for f in schedule:
        by_minute.setdefault(int(f.at // 60), []).append(f)
    for faults in by_minute.values():
        if len(faults) == 2:
            first, second = faults
            assert first.at <= second.at <= first.at + max(first.duration, 2.0)
            assert first.target != second.target
            assert not (first.kind == second.kind == "kafka")
    assert plan.overlapping(plan.soak_schedule(5, 60, overlap=0.0)) == 0
    assert len(plan.soak_schedule(5, 60, overlap=0.0)) == 60


def test_the_scenario_mixes_fenced_effects_and_expects_nothing_lost_or_doubled():
    scenario = plan.soak_scenario(30, 80.0, 16)
    assert scenario.workload.duration == 1800 and scenario.workload.rate == 80
    assert scenario.workload.mix.ledger > 0 and scenario.workload.mix.receipt > 0
    assert scenario.expect.max_lost == 0 and scenario.expect.max_doubled == 0
    assert scenario.fencing and scenario.uses_shop
    with pytest.raises(ValueError):
        plan.soak_scenario(0, 80.0, 16)


def _bench(directory: Path, name: str, rows: dict[str, float]) -> None:
    (directory / name).mkdir(parents=True)
    data = {"rows": [{"name": n, "e2e_per_s": v} for n, v in rows.items()]}
    (directory / name / "bench.json").write_text(json.dumps(data))


def test_the_rate_is_half_the_latest_bench_single_submit_row(tmp_path):
    assert plan.bench_rate(tmp_path) is None
    fallback = plan.choose_rate(None, tmp_path)
    assert fallback.per_second == plan.FALLBACK_RATE and "no bench report" in fallback.source
    _bench(tmp_path, "20260101T000000Z", {"floor": 3000.0, "single": 400.0})
    _bench(tmp_path, "20260102T000000Z", {"single": 500.0, "proxied-single": 300.0})
    rate = plan.bench_rate(tmp_path)
    assert rate is not None and rate.per_second == 150.0
    assert "proxied-single" in rate.source and "20260102T000000Z" in rate.source
    assert plan.choose_rate(42.0, tmp_path) == plan.Rate(42.0, "--rate")


# --------------------------------------------------------------- /proc


TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  inode
   0: 0100007F:3C28 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1
   1: 0100007F:D431 0100007F:3C28 01 00000000:00000000 00:00000000 00000000     0        0 222 1
   2: 0100007F:D432 0100007F:3C29 01 00000000:00000000 00:00000000 00000000     0        0 333 1
   3: 0100007F:D433 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 444 1
   4: 0100007F:D434 0100007F:3C28 06 00000000:00000000 00:00000000 00000000     0        0 555 1
"""


def test_postgres_sockets_are_the_established_ones_to_its_ports():
    # 0x3C28 is 15400, 0x3C29 15401, 0x1F90 8080; a LISTEN (0A) or TIME_WAIT (06) socket is no link
    assert sampler.peer_inodes(TCP, [0x3C28, 0x3C29]) == {"222", "333"}
    assert sampler.peer_inodes(TCP, [8080]) == {"444"}
    assert sampler.socket_inode("socket:[222]") == "222"
    assert sampler.socket_inode("/var/log/x.log") is None


def test_status_fields_in_kib():
    text = "Name:\tpython\nState:\tS (sleeping)\nVmRSS:\t  109436 kB\nRssAnon:\t 82484 kB\n"
    assert sampler.status_kib(text) == {"VmRSS": 109436, "RssAnon": 82484}


def _fake_process(proc: Path, pid: int, rss: int, anon: int, fds: list[str]) -> None:
    (proc / str(pid) / "fd").mkdir(parents=True)
    state = "S (sleeping)"
    (proc / str(pid) / "status").write_text(
        f"Name:\tx\nState:\t{state}\nVmRSS:\t{rss} kB\nRssAnon:\t{anon} kB\n"
    )
    for n, target in enumerate(fds):
        os.symlink(target, proc / str(pid) / "fd" / str(n))


def test_a_process_reading_counts_its_descriptors_postgres_sockets_and_tree(tmp_path):
    _fake_process(tmp_path, 10, 5000, 3000, ["/dev/null", "socket:[222]", "socket:[9]"])
    _fake_process(tmp_path, 11, 700, 600, [])  # its child
    reading = sampler.read_process(10, 1.0, {"222"}, {10: 1, 11: 10}, [10], tmp_path)
    assert reading == g.Reading(
        1.0, 10, rss_kib=5000, fds=3, pg_links=1, tree=2, tree_anon_kib=3600
    )
    assert sampler.read_process(99, 1.0, set(), {}, [], tmp_path) == g.Reading(1.0, None)
    assert sampler.read_process(None, 1.0, set(), {}, [], tmp_path).pid is None


# --------------------------------------------------------------- the report


def _run(tmp_path: Path) -> SoakRun:
    readings = {
        "api": series([100_000] * 11, pid=1) + series([150_000] * 22, pid=1, start=630.0),
        "worker-1": series([90_000] * 6, pid=2) + series([95_000] * 27, pid=3, start=330.0),
    }
    windows = [FaultWindow("sigkill", "worker-1", 300.0, 330.0)]
    server = [(float(t), 12) for t in range(0, 1801, 60)]
    delays = [g.Delay(float(t), 0.05, 300 <= t <= 360) for t in range(0, 1800, 2)]
    judged = g.judge(
        [g.process_goals(n, r, SOAK) for n, r in readings.items()],
        g.server_connections(server, SOAK),
        g.delay_goal(delays),
        g.Checked(True, 0, 0, True),
    )
    return SoakRun(
        minutes=30,
        rate=plan.Rate(100.0, "--rate"),
        seed=16,
        interval=60.0,
        overlap=0.25,
        scenario={"faults": [{}]},
        chaos_report=tmp_path / "soak-30m",
        windows=SOAK,
        goals=judged,
        readings=readings,
        server=server,
        samples=[],
        fault_windows=windows,
        buckets=g.delay_buckets(delays, 1800.0),
        verdict={},
        client_late=0.5,
    )


def test_the_table_names_each_process_and_marks_what_missed(tmp_path):
    run = _run(tmp_path)
    table = result_table(run)
    api = next(line for line in table.splitlines() if line.startswith("| api "))
    assert "146.5 **(missed)**" in api and "| 1.5 |" in api
    assert "longest life: pid 3" in table
    assert "0 lost, 0 doubled" in table
    text = render_markdown(run)
    assert "**Result: MISSED**" in text and "missed: RSS MiB api: grew 50.0%" in text


def test_the_plot_is_svg_with_fault_windows_and_a_line_per_life(tmp_path):
    run = _run(tmp_path)
    rss, fds = plot.process_panels(run.readings)
    svg = plot.render_svg([rss, fds, plot.delay_panel(run.buckets)], run.fault_windows, 1800.0)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f".//{ns}rect[@class='fault']")) == 3  # in each panel
    worker = [line for line in rss.lines if line.label.startswith("worker-1")]
    assert len(worker) == 1 and len(worker[0].segments) == 2  # two lives
    assert len(root.findall(f".//{ns}line[@class='reference']")) >= 3
