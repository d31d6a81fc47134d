"""The bench's pure pieces: percentiles, /proc parsing and CPU accounting, the paced plan,
pgbench's summary, the Markdown report and the SVG plot."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tools.bench import doors as bench_doors
from tools.bench import main as bench
from tools.bench import pgbench as bench_pgbench
from tools.bench import proc as procfs
from tools.bench import queues, report

# --- percentiles, buckets -------------------------------------------------------------------


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert report.percentile(values, 50) == 50
    assert report.percentile(values, 99) == 99
    assert report.percentile(values, 100) == 100
    assert report.percentile(values, 0) == 1
    assert report.percentile([3.0, 1.0, 2.0], 50) == 2
    assert report.percentile([7.0], 99) == 7
    assert report.percentile([], 50) is None


def test_delay_summary_is_in_milliseconds():
    summary = report.delay_summary([0.001] * 98 + [0.5, 2.0])
    assert summary["jobs"] == 100
    assert summary["p50_ms"] == pytest.approx(1.0)
    assert summary["p99_ms"] == pytest.approx(500.0)
    assert summary["max_ms"] == pytest.approx(2000.0)
    assert report.delay_summary([])["p99_ms"] is None


def test_buckets_count_per_half_second_from_start():
    assert report.buckets([100.1, 100.2, 100.6, 101.9], 100.0, 0.5) == [2, 1, 0, 1]
    assert report.buckets([99.0], 100.0, 0.5) == [1]  # before start: first bucket
    assert report.buckets([], 100.0) == []


def test_ratio():
    assert report.ratio(500.0, 2000.0) == 0.25
    assert report.ratio(500.0, None) is None
    assert report.ratio(None, 2000.0) is None


# --- /proc ------------------------------------------------------------------------------------

STAT = (
    "4989 (postgres) S 1 4989 4989 0 -1 4194560 12345 678 0 0 "
    "1500 700 30 20 20 0 1 0 12345 200000000 8000 18446744073709551615"
)


def test_parse_stat_fields():
    s = procfs.parse_stat(STAT)
    assert (s.pid, s.ppid, s.utime, s.stime, s.cutime, s.cstime) == (4989, 1, 1500, 700, 30, 20)
    assert s.ticks == 2250


def test_parse_stat_survives_parentheses_and_spaces_in_comm():
    text = STAT.replace("(postgres)", "(we (ird) name))")
    s = procfs.parse_stat(text)
    assert (s.pid, s.ppid, s.utime) == (4989, 1, 1500)


def test_parse_vmhwm():
    status = "Name:\tjava\nVmPeak:\t 900000 kB\nVmHWM:\t  517272 kB\nVmRSS:\t 500000 kB\n"
    assert procfs.parse_vmhwm_kib(status) == 517272
    assert procfs.parse_vmhwm_kib("Name:\tkthreadd\nState:\tS\n") is None


def test_parse_machine_ticks_and_busy_fraction():
    start = procfs.parse_machine_ticks("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n")
    assert start == (150, 1000)
    end = procfs.parse_machine_ticks("cpu  200 0 100 850 50 0 0 0 0 0\n")
    assert procfs.busy_fraction(start, end) == pytest.approx(150 / 200)
    assert procfs.busy_fraction(start, start) is None


def test_accounted_share_of_machine_busy_time():
    ticks = {"api": 30, "postgres": 50, "gone": None}
    assert procfs.accounted(ticks, (1000, 5000), (1100, 5200)) == pytest.approx(0.8)
    assert procfs.accounted(ticks, (1000, 5000), (1000, 5200)) is None


def _stat(pid, ppid, utime, stime=0, cutime=0, cstime=0):
    return procfs.Stat(pid, ppid, utime, stime, cutime, cstime)


def test_descendants_stop_at_other_roots():
    parents = {10: 1, 11: 10, 12: 11, 20: 10, 21: 20, 30: 1}
    assert procfs.descendants(10, parents) == [10, 11, 12, 20, 21]
    # 20 is another tree's root (a leasework process the bench spawned): not the bench's
    assert procfs.descendants(10, parents, stop={20, 30}) == [10, 11, 12]
    assert procfs.descendants(20, parents, stop={10, 20}) == [20, 21]


def test_tree_ticks_sums_members_and_reaped_children():
    stats = {
        1: _stat(1, 0, 5),
        100: _stat(100, 1, 10, 5, cutime=40, cstime=10),  # postmaster, reaped backends
        101: _stat(101, 100, 7, 3),  # a live backend
        102: _stat(102, 100, 1, 1),
        200: _stat(200, 1, 99),  # another process
    }
    assert procfs.tree_ticks(100, stats) == 65 + 10 + 2
    assert procfs.tree_ticks(999, stats) is None


def test_a_child_reaped_inside_the_window_is_counted_once():
    before = {100: _stat(100, 1, 10), 101: _stat(101, 100, 30)}
    # the child used 20 more ticks, exited, and its 50 moved into the parent's cutime
    after = {100: _stat(100, 1, 12, cutime=50)}
    start = procfs.tree_ticks(100, before)
    end = procfs.tree_ticks(100, after)
    assert end - start == 2 + 20


def test_cpu_ms_per_job():
    tck = procfs.CLK_TCK
    start = {"api": 0, "postgres": 100, "gone": 5, "new": None}
    end = {"api": tck, "postgres": 100 + 2 * tck, "gone": None, "new": 7}
    out = procfs.cpu_ms_per_job(start, end, jobs=1000)
    assert out["api"] == pytest.approx(1.0)  # 1 s of CPU over 1000 jobs
    assert out["postgres"] == pytest.approx(2.0)
    assert out["gone"] is None and out["new"] is None
    assert out["total"] == pytest.approx(3.0)


def test_cpu_of_a_restarted_process_is_not_a_negative_number():
    out = procfs.cpu_ms_per_job({"api": 500}, {"api": 3}, jobs=10)
    assert out["api"] is None
    assert out["total"] == 0


def test_peak_rss_max_and_sum_per_tree():
    members = {"postgres": [100, 101, 102], "redis": [300], "shop": []}
    peaks = {100: 40 * 1024, 101: 20 * 1024, 300: 12 * 1024}  # 102 exited meanwhile
    out = procfs.peak_rss_mib(members, peaks)
    assert out["postgres"] == {"max": 40.0, "sum": 60.0, "processes": 2}
    assert out["redis"]["max"] == 12.0
    assert out["shop"] == {"max": None, "sum": None, "processes": 0}


# --- doors, pgbench -----------------------------------------------------------------------------


def test_chunks_and_paced_plan():
    assert bench_doors.chunks(250, 100) == [range(0, 100), range(100, 200), range(200, 250)]
    assert bench_doors.chunks(3, 1) == [range(0, 1), range(1, 2), range(2, 3)]
    jobs, interval = bench_doors.paced_plan(rate=60.0, seconds=15.0, chunk=100)
    assert (jobs, interval) == (900, pytest.approx(100 / 60))
    assert bench_doors.paced_plan(rate=10.0, seconds=1.0, chunk=100)[0] == 100  # at least one
    assert bench_doors.paced_plan(rate=800.0, seconds=15.0, chunk=1) == (12000, 1 / 800)
    with pytest.raises(ValueError):
        bench_doors.paced_plan(rate=0.0, seconds=15.0, chunk=1)


PGBENCH_OUT = """pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: /tmp/x/insert.sql
scaling factor: 1
query mode: prepared
number of clients: 16
number of threads: 2
maximum number of tries: 1
duration: 12 s
number of transactions actually processed: 43200
number of failed transactions: 0 (0.000%)
latency average = 4.446 ms
initial connection time = 21.331 ms
tps = 3598.714220 (without initial connection time)
"""


def test_parse_pgbench_output():
    assert bench_pgbench.parse_output(PGBENCH_OUT) == {
        "tps": pytest.approx(3598.714220),
        "latency_ms": pytest.approx(4.446),
        "failed": 0,
    }
    assert bench_pgbench.parse_output("garbage")["tps"] is None


def test_pgbench_script_inserts_one_tagged_noop():
    script = bench_pgbench.SCRIPT.format(tag="bench-1234-pgbench")
    assert "leasework_jobs_insert(jsonb_build_array(" in script
    assert "gen_random_uuid()::text" in script and "'noop'" in script
    assert "'bench-1234-pgbench'" in script


# --- command line, ratios -----------------------------------------------------------------------


def test_app_env_is_taken_as_leasework_names_only():
    cfg = bench.parse_args(
        ["--app-env", "LEASEWORK_RDKAFKA_COMPRESSION_TYPE=lz4", "--app-env", "LEASEWORK_X=a=b"]
    )
    assert cfg.app_env == {"LEASEWORK_RDKAFKA_COMPRESSION_TYPE": "lz4", "LEASEWORK_X": "a=b"}
    assert bench.parse_args([]).app_env == {}
    for bad in ("PATH=/tmp", "LEASEWORK_NO_VALUE"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--app-env", bad])


def test_the_report_names_the_app_env():
    summary = report.aggregate([])
    summary["app_env"] = {"LEASEWORK_RDKAFKA_COMPRESSION_TYPE": "lz4"}
    assert "`LEASEWORK_RDKAFKA_COMPRESSION_TYPE=lz4`" in report.render_summary(summary)


def test_parse_args_defaults_and_validation():
    cfg = bench.parse_args([])
    assert cfg.rows == [
        "floor",
        "lone",
        "single",
        "single-client",
        "batch",
        "unaudited-batch",
        "enqueue",
        "floor-order",
        "enqueue-one",
        "proxied-batch",
    ]
    assert cfg.door("enqueue-one") == bench_doors.Door("enqueue-one", 1, 16)
    assert cfg.door("unaudited-batch") == cfg.door("batch")  # the same door, auditor off
    assert (cfg.repeat, cfg.fresh) == (1, False)
    assert bench.parse_args(["--repeat", "3", "--fresh"]).repeat == 3
    assert (cfg.jobs, cfg.floor_jobs, cfg.single_concurrency, cfg.batch_size) == (
        8000,
        8000,
        16,
        100,
    )
    assert cfg.door("proxied-batch") == bench_doors.Door("batch", 100, 4)
    assert cfg.door("single") == bench_doors.Door("single", 1, 16)
    assert cfg.door("single-client") == bench_doors.Door("single", 1, 16, bench_doors.SHIPPED)
    assert bench.parse_args(["--rows", "floor,enqueue", "--jobs", "300"]).rows == [
        "floor",
        "enqueue",
    ]
    with pytest.raises(SystemExit):
        bench.parse_args(["--rows", "floor,nonsense"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--paced-fraction", "0"])


def _row(name, e2e, **extra):
    return {
        "name": name,
        "door": f"{name} door",
        "links": "direct",
        "jobs": 2000,
        "submit_per_s": 150.0,
        "e2e_per_s": e2e,
        "cpu_ms_per_job": {"api": 1.5, "postgres": 2.0, "client": 0.5, "total": 4.0},
        "machine_busy": 0.97,
        "accounted_of_busy": 0.934,
        "rss_mib": {"api": {"max": 83.0, "sum": 83.0, "processes": 1}},
        "throughput_buckets": [10, 60, 62, 30],
        "paced": {"achieved_per_s": 62.0, "delay": {"p50_ms": 12.25, "p99_ms": 250.0}},
        "speed": {"median": 15.25, "min": 14.0, "max": 30.0, "n": 9},
        **extra,
    }


def _result(rows, **extra):
    result = {
        "started_utc": "2026-12-01 09:00:00 UTC",
        "git_head": "abc123",
        "nproc": 2,
        "rows": rows,
        "idle": {"seconds": 5.0, "cpu_ms_per_s": {"api": 1.0, "total": 30.0}},
        "pgbench": {
            "clients": 16,
            "threads": 2,
            "seconds": 12,
            "protocol": "prepared",
            "tps": 3598.7,
            "latency_ms": 4.45,
        },
        "method": ["one invocation"],
        "errors": [],
        **extra,
    }
    bench.finish(result)
    return result


def test_finish_puts_every_row_against_the_floor():
    result = _result([_row("floor", 1800.0), _row("single", 126.0)])
    assert result["floor_e2e_per_s"] == 1800.0
    assert [r["vs_floor"] for r in result["rows"]] == [1.0, pytest.approx(0.07)]
    no_floor = _result([_row("single", 126.0)])
    assert no_floor["rows"][0]["vs_floor"] is None


def test_enqueue_one_is_also_put_against_its_peer_with_the_callers_row():
    result = _result(
        [_row("floor", 1000.0), _row("floor-order", 800.0), _row("enqueue-one", 600.0)]
    )
    ratios = {r["name"]: (r["vs_floor"], r.get("vs_floor_order")) for r in result["rows"]}
    assert ratios == {
        "floor": (1.0, None),
        "floor-order": (0.8, None),
        "enqueue-one": (0.6, pytest.approx(0.75)),
    }
    md = report.render_markdown(result)
    assert "`enqueue-one` against `floor-order`: **0.75x**." in md
    assert "the goals read the floor" in md
    # without the peer row there is no such line, and enqueue-one's ratio to it is unknown
    alone = _result([_row("floor", 1000.0), _row("enqueue-one", 600.0)])
    assert alone["rows"][1]["vs_floor_order"] is None
    assert "against `floor-order`" not in report.render_markdown(alone)


def test_the_floor_order_row_is_a_row_of_its_own():
    assert bench.parse_args(["--rows", "floor,floor-order,enqueue-one"]).rows == [
        "floor",
        "floor-order",
        "enqueue-one",
    ]


def test_markdown_has_the_table_the_breakdown_rss_and_pgbench():
    md = report.render_markdown(_result([_row("floor", 1800.0), _row("single", 126.0)]))
    assert (
        "| single | single door | direct | 2000 | 150 | 126 | 0.07x | 62 | 12.2 | 250.0 | 4.00 "
        "| 97% | 15.2 |" in md
    )
    assert "| floor | floor door | direct | 2000 | 150 | 1,800 | 1.00x |" in md
    assert "## CPU milliseconds per job, per process" in md
    assert "| row | api | postgres | client | total | of it idle | of machine busy |" in md
    # the idle stack's 30 ms a second over 126 jobs a second
    assert "| single | 1.50 | 2.00 | 0.50 | 4.00 | 0.24 | 93% |" in md
    assert "| floor | 1.50 | 2.00 | 0.50 | 4.00 | 0.02 | 93% |" in md
    assert "| idle, ms per s (5 s) | 1.0 | – | – | 30.0 |" in md
    assert "| row | api |" in md and "| floor | 83 |" in md
    assert "**3,599 tps**" in md
    assert "![jobs finished per 0.5 s](throughput.svg)" in md
    assert "- one invocation" in md


def test_markdown_splits_the_paced_delay_only_when_it_was_asked_for():
    stages = {
        "insert_to_start": {"p50_ms": 20.0, "p90_ms": 40.0, "p99_ms": 80.0, "max_ms": 95.0},
        "insert_to_publish": {"p50_ms": 12.0, "p90_ms": 25.0, "p99_ms": 31.5, "max_ms": 40.0},
        "publish_to_start": {"p50_ms": 8.0, "p90_ms": 15.0, "p99_ms": 60.0, "max_ms": 70.0},
        "started_before_publish": 3,
    }
    staged = _row("single", 126.0)
    staged["paced"]["stages"] = stages
    md = report.render_markdown(_result([_row("floor", 1800.0), staged]))
    assert "## Where the paced delay goes" in md
    assert "| single | insert to publish (relay) | 12.0 | 25.0 | 31.5 | 40.0 |" in md
    assert "| single | publish to start (Kafka, claim) | 8.0 | 15.0 | 60.0 | 70.0 |" in md
    assert "| floor |" not in md.split("## Where the paced delay goes")[1].split("##")[0]
    plain = report.render_markdown(_result([_row("floor", 1800.0), _row("single", 126.0)]))
    assert "Where the paced delay goes" not in plain


def test_markdown_shows_an_audit_pass_at_each_size():
    result = _result([_row("floor", 1800.0)])
    sizes = [(100_000, [150.0, 160.0, 170.0], 1.0), (1_000_000, [150.0, 168.0, 190.0], 1.05)]
    result["audit"] = {
        "batch": 5000,
        "passes": 3,
        "sizes": [
            {"jobs": n, "pass_ms": ms, "median_ms": ms[1], "vs_smallest": ratio}
            for n, ms, ratio in sizes
        ],
    }
    md = report.render_markdown(result)
    assert "## One auditor pass as the table grows" in md
    assert "| 100,000 | 160.0 | 150.0 | 170.0 | 1.00x |" in md
    assert "| 1,000,000 | 168.0 | 150.0 | 190.0 | 1.05x |" in md
    assert "limited jobs" not in md
    assert "auditor pass" not in report.render_markdown(_result([_row("floor", 1800.0)]))
    result["audit"]["limited"] = [
        {
            "type": "keyed",
            "backlog": 0,
            "pass_ms": [700.0, 780.0, 800.0],
            "median_ms": 780.0,
            "violations": 0,
        },
        {
            "type": "rated",
            "backlog": 400_000,
            "pass_ms": [1200.0, 1400.0, 1700.0],
            "median_ms": 1400.0,
            "violations": 0,
        },
    ]
    md = report.render_markdown(result)
    assert "| `keyed` | 0 | 780.0 | 700.0 | 800.0 | 0 |" in md
    assert "| `rated` | 400,000 | 1400.0 | 1200.0 | 1700.0 | 0 |" in md


def test_markdown_shows_errors_and_missing_figures():
    row = _row("single", 126.0, paced=None, machine_busy=None)
    result = _result([row], errors=["single: not all succeeded"])
    result["pgbench"] = {"tps": None, "error": "pgbench not found"}
    md = report.render_markdown(result)
    assert "**error:** single: not all succeeded" in md
    assert "| single | single door | direct | 2000 | 150 | 126 | – | – | – | – | 4.00 | – |" in md
    assert "not measured: pgbench not found" in md


def test_svg_is_well_formed_with_one_line_per_row():
    svg = report.render_svg({"floor": [900, 950, 10], "single": [60, 62, 63, 61], "empty": []})
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    lines = [p for p in root.iter(f"{ns}polyline") if p.get("class") == "row"]
    assert len(lines) == 2
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert {"floor", "single", "empty", "seconds"} <= set(texts)
    # the floor's 950 jobs per 0.5 s is 1,900 jobs/s: the y axis reaches it
    assert max(float(t) for t in texts if t and t.replace(".", "").isdigit()) >= 1900


def test_svg_escapes_names():
    svg = report.render_svg({"a<b & c": [1]})
    assert "a&lt;b &amp; c" in svg
    ET.fromstring(svg)


def test_nice_step():
    assert report.nice_step(1900, 5) == 500
    assert report.nice_step(16, 8) == 2
    assert report.nice_step(0.0, 5) == 1


def test_repeated_runs_report_the_median_and_the_spread():
    def run(rate: float, api_ms: float, start_ms: float, busy: float) -> dict:
        return {
            "started_utc": "t",
            "git_head": "abc",
            "config": {"fresh": True},
            "machine_busy_before": busy,
            "jobs_table_before": {"live_rows": int(rate) * 100, "mb": 12},
            "idle": {"seconds": 5.0, "cpu_ms_per_s": {"total": 240.0}},
            "rows": [
                {
                    "name": "single",
                    "e2e_per_s": rate,
                    "vs_floor": rate / 1000,
                    "cpu_ms_per_job": {
                        "total": 2 * api_ms,
                        "api": api_ms,
                        "kafka-1": 0.1,
                        "kafka-2": 0.1,
                        "kafka-3": 0.2,
                    },
                    "paced": {"delay": {"p50_ms": 5.0, "p99_ms": 20.0}},
                    "speed": {"median": rate / 40},
                }
            ],
            "lone": {
                "insert_to_start": {"p50_ms": start_ms, "p99_ms": 3 * start_ms},
                "insert_to_finish": {"p50_ms": 2 * start_ms},
            },
            "pgbench": {"tps": 2000.0},
            "errors": [],
        }

    summary = report.aggregate(
        [run(500, 1.0, 9.0, 0.02), run(700, 3.0, 12.0, 0.05), run(600, 2.0, 50.0, 0.01)]
    )
    single = summary["rows"]["single"]
    assert single["e2e jobs/s"] == {"median": 600, "min": 500, "max": 700, "n": 3}
    assert single["api CPU ms/job"]["median"] == 2.0
    assert single["brokers CPU ms/job"]["median"] == pytest.approx(0.4)
    assert single["probe ms"] == {"median": 15.0, "min": 12.5, "max": 17.5, "n": 3}
    # CPU 2, 6, 4 ms a job over probes of 12.5, 17.5, 15 ms
    assert single["CPU per job in probe units"]["median"] == pytest.approx(0.2667, abs=1e-4)
    assert single["CPU per job in probe units"]["min"] == pytest.approx(0.16)
    assert report.per_probe(2.0, None) is None and report.per_probe(None, 10.0) is None
    # the idle stack's 240 ms a second over each run's rate
    assert single["of it idle"]["median"] == pytest.approx(0.4)
    assert single["of it idle"]["max"] == pytest.approx(0.48)
    assert summary["lone"]["insert to start p50 ms"]["median"] == 12.0
    assert summary["lone"]["insert to start p50 ms"]["max"] == 50.0
    text = report.render_summary(summary)
    assert "600 (500–700)" in text and "0.60x (0.50–0.70)" in text
    assert "| of it idle |" in text and "0.40 (0.34–0.48)" in text
    assert "| probe ms |" in text and "15.0 (12.5–17.5)" in text
    assert "0.267 (0.160–0.343)" in text
    assert "the whole stack restarted before each run" in text
    assert "2%, 5%, 1%" in text
    assert (
        "jobs table before each run: 50,000 rows, 12 MB; 70,000 rows, 12 MB; 60,000 rows, 12 MB."
        in text
    )
    assert report.spread([None, 2.0]) == {"median": 2.0, "min": 2.0, "max": 2.0, "n": 1}
    assert report.spread([1.0, 2.0, 3.0, 4.0])["median"] == 2.5
    assert "against `floor-order`" not in text  # no run had the peer row


def test_repeated_runs_report_enqueue_one_against_its_peer():
    def run(peer: float) -> dict:
        return {
            "started_utc": "t",
            "git_head": "abc",
            "config": {"fresh": True},
            "rows": [{"name": "enqueue-one", "e2e_per_s": 500.0, "vs_floor_order": peer}],
            "errors": [],
        }

    summary = report.aggregate([run(0.7), run(0.9), run(0.8)])
    assert summary["enqueue_one_vs_floor_order"]["median"] == 0.8
    text = report.render_summary(summary)
    assert "`enqueue-one` against `floor-order`: 0.80x (0.70–0.90)." in text
    # runs without the lone row have no lone section (not a table of dashes)
    assert "## A lone job" not in text


def test_isolation_shows_each_flood_being_published_and_published_and_judges_the_latter():
    delays = {"p50_ms": 5.0, "p99_ms": 60.0, "max_ms": 61.0}
    result = {
        "isolation": {
            "flood": 20000,
            "paced": 100,
            "unflooded": delays,
            "goal_p99_ms": 160.0,
            "floods": [
                {
                    "job_seconds": 5.0,
                    "waiting_after": 19000,
                    "publishing": {"p50_ms": 9.0, "p99_ms": 400.0, "max_ms": 410.0},
                    "p50_ms": 6.0,
                    "p99_ms": 90.0,
                    "max_ms": 95.0,
                },
                # a report written before floods were measured twice
                {"job_seconds": 1.0, "waiting_after": 18000, **delays},
            ],
        }
    }
    text = "\n".join(report.queues_lines(result))
    assert "| `emails` flooded with 5 s jobs, being published | 9.0 ms | 400.0 ms |" in text
    assert "| `emails` flooded with 5 s jobs, published | 6.0 ms | 90.0 ms |" in text
    assert "| `emails` flooded with 1 s jobs | 5.0 ms | 60.0 ms |" in text
    assert "160.0 ms: met." in text
    assert "baseline stalled" not in text
    result["isolation"]["floods"][0]["p99_ms"] = 170.0
    assert "160.0 ms: **not met**." in "\n".join(report.queues_lines(result))
    # one job of the baseline stalled (1 s against a 6 ms p50): the goal it sets is said to be
    result["isolation"]["unflooded"] = {"p50_ms": 6.0, "p99_ms": 1085.4, "max_ms": 1085.4}
    stalled = "\n".join(report.queues_lines(result))
    assert "**The unflooded baseline stalled:** its slowest job waited 1085.4 ms" in stalled


def test_a_baseline_stalls_when_its_slowest_job_is_far_beyond_its_spread():
    assert not report.baseline_stalled({"p50_ms": 5.0, "max_ms": 61.0})
    assert not report.baseline_stalled({"p50_ms": 20.0, "max_ms": 150.0})
    assert report.baseline_stalled({"p50_ms": 6.2, "max_ms": 189.7})
    assert report.baseline_stalled({"p50_ms": 5.6, "max_ms": 1546.5})


def test_priorities_show_the_backlog_being_published_and_published_and_judge_the_latter():
    prio = {
        "paced": 100,
        "flood": 20000,
        "flood_started": 9000,
        "flood_waiting_after": 8000,
        "flood_job_seconds": 0.5,
        "goal_p99_ms": 1000.0,
        "publishing": {
            "p50_ms": 120.0,
            "p99_ms": 1100.0,
            "max_ms": 1110.0,
            "flood_waiting_after": 15000,
        },
        "p50_ms": 8.0,
        "p99_ms": 40.0,
        "max_ms": 41.0,
    }
    text = "\n".join(report.queues_lines({"priorities": prio}))
    assert (
        "| priority 0, backlog being published | 120.0 ms | 1100.0 ms | 1110.0 ms | 15000 |" in text
    )
    assert "| priority 0 behind the backlog, published | 8.0 ms | 40.0 ms |" in text
    assert "under 1000 ms: met |" in text
    del prio["publishing"]
    prio["p99_ms"] = 1200.0
    text = "\n".join(report.queues_lines({"priorities": prio}))
    assert "being published" not in text and "under 1000 ms: **not met** |" in text


def test_the_lone_section_gives_each_figure_and_stage_in_one_table():
    d = {"p50_ms": 6.5, "p90_ms": 9.0, "p99_ms": 13.8, "max_ms": 13.8}
    lone = {
        "jobs": 40,
        "door": "POST /jobs, one at a time",
        "insert_to_start": d,
        "insert_to_finish": {**d, "p50_ms": 11.5},
        "insert_to_publish": {**d, "p50_ms": 5.6},
        "publish_to_start": {},
        "started_before_publish": 12,
    }
    text = "\n".join(report.lone_section(lone))
    assert "|  | p50 ms | p90 ms | p99 ms | max ms |" in text
    assert "| insert to start | 6.5 | 9.0 | 13.8 | 13.8 |" in text
    assert "| insert to finish | 11.5 | 9.0 | 13.8 | 13.8 |" in text
    assert "| insert to publish (relay) | 5.6 |" in text
    assert "publish to start" not in text  # no stage row without its figures
    assert "12 of them started before their message was published" in text


def test_the_slowest_job_of_each_measurement_is_split_at_its_publish():
    """A job the relay was late for, one Kafka was late for, one a worker claimed on its
    Postgres wake-up, one whose message the tap missed; a measurement without the split
    (an older report) says nothing."""
    split = queues.slowest_stages
    lines = report.slowest_lines(
        [
            ("relay", {"slowest": split(10.0, 11.2, 11.25)}),
            ("kafka", {"slowest": split(10.0, 10.005, 10.9)}),
            ("woken", {"slowest": split(10.0, 10.02, 10.006)}),
            ("unseen", {"slowest": split(10.0, None, 10.3)}),
            ("older", {"p99_ms": 12.0}),
        ]
    )
    assert lines[2:-1] == [
        "- relay: 1250.0 ms; 1200.0 ms insert to publish (the relay), 50.0 ms publish to "
        "start (Kafka, the claim)",
        "- kafka: 900.0 ms; 5.0 ms insert to publish (the relay), 895.0 ms publish to start "
        "(Kafka, the claim)",
        "- woken: 6.0 ms; claimed on its Postgres wake-up 6.0 ms after its insert, before its "
        "message was published (20.0 ms)",
        "- unseen: 300.0 ms; its message was not seen",
    ]
    assert report.slowest_lines([("older", {"p99_ms": 12.0})]) == []


def test_every_late_paced_job_is_split_slowest_first():
    """Jobs later than LATE each get their split, slowest first (one published late, one
    whose message the tap did not see); the slowest is split even when it was on time."""
    from tools.bench.tap import Published

    rows = [
        {"id": "a", "due": 10.0, "started": 10.02},
        {"id": "b", "due": 11.0, "started": 12.1},
        {"id": "c", "due": 12.0, "started": 12.3},
        {"id": "d", "due": 13.0, "started": 13.1 + 0.001},
    ]
    seen = {"a": Published(0, 10.01), "b": Published(3, 12.05), "d": Published(1, 13.002)}
    stages = queues.late_stages(rows, seen)
    assert stages["slowest"] == queues.slowest_stages(11.0, 12.05, 12.1)
    assert [s["delay_ms"] for s in stages["late"]] == [1100.0, 300.0, 101.0]
    assert stages["late"][1]["to_publish_ms"] is None  # c: not seen
    on_time = queues.late_stages(rows[:1], seen)
    assert on_time["late"] == [] and on_time["slowest"]["delay_ms"] == 20.0


def test_the_late_jobs_follow_the_slowest_and_are_capped():
    split = queues.slowest_stages
    late = [split(10.0, 10.001, 10.0 + 0.5 - i / 100) for i in range(8)]
    lines = report.slowest_lines([("unflooded", {"slowest": late[0], "late": late})])
    assert lines[2].startswith("- unflooded: 500.0 ms;")
    assert lines[3] == (
        "  - then 490.0 ms; 1.0 ms insert to publish (the relay), 489.0 ms publish to start "
        "(Kafka, the claim)"
    )
    assert len(lines) == 2 + 1 + report.LATE_SHOWN + 1 + 1
    assert lines[-2] == f"  - and {7 - report.LATE_SHOWN} more over 100 ms"
    assert report.LATE_MS == queues.LATE * 1000


def test_the_report_says_how_big_the_jobs_table_was_before_the_run():
    result = _result([_row("floor", 1800.0), _row("single", 126.0)])
    assert "jobs table –" in report.render_markdown(result)  # a run from before it was read
    result["jobs_table_before"] = {"live_rows": 261509, "mb": 289}
    assert "jobs table 261,509 rows, 289 MB" in report.render_markdown(result)
