"""The bench's figures and reports: percentiles, throughput buckets, the Markdown tables,
the throughput-over-time SVG (hand-written), all pure functions of the result dict that
``tools.bench`` also writes as ``bench.json``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from chaos.timeline import nice_step
from tools.bench.lanes import aggregate as aggregate_lanes
from tools.bench.lanes import blocking_markdown, lanes_markdown
from tools.bench.lanes import summary_markdown as lanes_summary_markdown

# process columns, in the order the tables show them
PROCESSES = (
    "api",
    "relay",
    "worker-1",
    "worker-2",
    "postgres",
    "redis",
    "kafka-1",
    "kafka-2",
    "kafka-3",
    "toxiproxy",
    "prometheus",
    "shop",
    "client",
)
METHOD = [
    "one invocation on the live stack; rows run one after another, nothing else runs meanwhile",
    "e2e jobs/s = jobs / (first submit to the last job's finished_at), from the direct DSN",
    "submit/s = jobs / (first submit to the last submit answered)",
    "leasework rows `single`, `batch`, `enqueue`: api, relay and workers restarted with "
    "LEASEWORK_POSTGRES_DSN, LEASEWORK_REDIS_ADDR, LEASEWORK_KAFKA_BROKERS pointing straight "
    "at Postgres (15433), Redis (16380) and the brokers' BROKER listeners; `proxied-*` rows "
    "with the stack's normal links through Toxiproxy (no toxics)",
    "before the leasework rows, batches of 48 jobs until one finishes within 5 s on both "
    "workers (the consumer group has settled)",
    "floor: bench_floor_jobs, one autocommit INSERT per job, workers loop over a claim "
    "transaction (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1; UPDATE running; COMMIT) and a done "
    "transaction; an empty queue is polled every 5 ms",
    "scheduling delay = started_at - run_at, measured only over jobs paced open loop at "
    "`paced_fraction` of the row's e2e rate for `paced_seconds` (batch doors: one chunk per "
    "interval, so a chunk's jobs share one run_at)",
    "CPU and peak RSS cover the throughput window only (not the paced phase)",
    "machine busy = non-idle, non-iowait share of all CPUs from /proc/stat over the window",
    "probe ms = the machine's speed over the throughput window: CPU ms of a fixed unit of "
    "pure-Python work, timed once a second by a process of the bench's own (tools.bench.speed), "
    "median; lower is faster. This VM's CPUs take about 9 to 32 ms for it from one minute to "
    "the next, and a saturated row's CPU ms per job moves with it",
    "the bench's jobs are deleted by tag afterwards (VACUUM ANALYZE jobs, outbox after each "
    "row); the floor table is truncated",
]
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = math.ceil(q / 100 * len(ordered))
    return ordered[min(len(ordered), max(1, rank)) - 1]


def delay_summary(delays: Sequence[float]) -> dict[str, float | int | None]:
    """p50/p90/p99/max of scheduling delays, in milliseconds."""

    def ms(v: float | None) -> float | None:
        return None if v is None else v * 1000.0

    return {
        "jobs": len(delays),
        "p50_ms": ms(percentile(delays, 50)),
        "p90_ms": ms(percentile(delays, 90)),
        "p99_ms": ms(percentile(delays, 99)),
        "max_ms": ms(max(delays) if delays else None),
    }


def buckets(times: Sequence[float], start: float, width: float = 0.5) -> list[int]:
    """Counts of ``times`` per ``width``-second bucket from ``start`` (earlier times go into
    the first bucket)."""
    if not times:
        return []
    counts = [0] * (int(max(0.0, max(times) - start) // width) + 1)
    for t in times:
        counts[int(max(0.0, t - start) // width)] += 1
    return counts


def ratio(value: float | None, floor: float | None) -> float | None:
    if value is None or not floor:
        return None
    return value / floor


# --- markdown -------------------------------------------------------------------------------
def fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:,.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(headers) - 1)
    marks = {"l": ":---", "r": "---:"}
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(marks[a] for a in align) + "|",
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


def main_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    headers = [
        "row",
        "door",
        "links",
        "jobs",
        "submit/s",
        "e2e jobs/s",
        "vs floor",
        "paced at jobs/s",
        "delay p50 ms",
        "p99 ms",
        "CPU ms/job",
        "machine busy",
        "probe ms",
    ]
    body = []
    for r in rows:
        d = r.get("paced") or {}
        delay = d.get("delay") or {}
        busy = r.get("machine_busy")
        body.append(
            [
                r["name"],
                r["door"],
                r["links"],
                fmt(r["jobs"]),
                fmt(r.get("submit_per_s")),
                fmt(r.get("e2e_per_s")),
                "–" if r.get("vs_floor") is None else f"{r['vs_floor']:.2f}x",
                fmt(d.get("achieved_per_s")),
                fmt(delay.get("p50_ms"), 1),
                fmt(delay.get("p99_ms"), 1),
                fmt((r.get("cpu_ms_per_job") or {}).get("total"), 2),
                _percent(busy),
                fmt(probe_ms(r), 1),
            ]
        )
    return table(headers, body)


def probe_ms(row: Mapping[str, Any]) -> float | None:
    """The machine's speed over the row's throughput window: the CPU ms the bench's probe
    took for its fixed unit of work, median (``tools.bench.speed``; lower is faster)."""
    return (row.get("speed") or {}).get("median")


PEER_NOTE = (
    "`floor-order` is the floor fed the web-app pattern (the caller's own row and its job in "
    "one transaction, as `enqueue-one` does); the goals read the floor."
)


def enqueue_one_vs_peer(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """``enqueue-one``'s ratio to ``floor-order``, its peer on the same footing (None when
    either row is missing)."""
    return next((r.get("vs_floor_order") for r in rows if r["name"] == "enqueue-one"), None)


def peer_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    peer = enqueue_one_vs_peer(rows)
    if peer is None:
        return []
    return [f"`enqueue-one` against `floor-order`: **{peer:.2f}x**. {PEER_NOTE}", ""]


def _present(rows: Sequence[Mapping[str, Any]], key: str) -> list[str]:
    seen = {p for r in rows for p, v in (r.get(key) or {}).items() if v is not None}
    return [p for p in PROCESSES if p in seen]


def idle_share(row: Mapping[str, Any], idle: Mapping[str, Any] | None) -> float | None:
    """The idle stack's own CPU (ms a second) spread over the row's jobs at its rate: about
    how much of the row's CPU per job the stack would have spent doing nothing (its pollers,
    heartbeats, scrapes and the brokers' own traffic go on under load)."""
    per_s = ((idle or {}).get("cpu_ms_per_s") or {}).get("total")
    rate = row.get("e2e_per_s")
    if per_s is None or not rate:
        return None
    return per_s / rate


def cpu_table(rows: Sequence[Mapping[str, Any]], idle: Mapping[str, Any] | None) -> list[str]:
    procs = _present(
        [*rows, {"cpu_ms_per_job": (idle or {}).get("cpu_ms_per_s")}], "cpu_ms_per_job"
    )
    headers = ["row", *procs, "total", "of it idle", "of machine busy"]
    body = [
        [
            r["name"],
            *(fmt(r["cpu_ms_per_job"].get(p), 2) for p in procs),
            fmt(r["cpu_ms_per_job"].get("total"), 2),
            fmt(idle_share(r, idle), 2),
            _percent(r.get("accounted_of_busy")),
        ]
        for r in rows
    ]
    if idle and idle.get("cpu_ms_per_s"):
        per_s = idle["cpu_ms_per_s"]
        body.append(
            [
                f"idle, ms per s ({idle['seconds']:.0f} s)",
                *(fmt(per_s.get(p), 1) for p in procs),
                fmt(per_s.get("total"), 1),
                "",
                _percent(idle.get("accounted_of_busy")),
            ]
        )
    return table(headers, body)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.0f}%"


def jobs_table_text(table: Mapping[str, int] | None) -> str:
    """``jobs``' size before a run, as the report says it (– for runs before it was read)."""
    if not table:
        return "–"
    return f"{table['live_rows']:,} rows, {table['mb']:,} MB"


def rss_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    procs = [
        p for p in PROCESSES if any((r.get("rss_mib") or {}).get(p, {}).get("max") for r in rows)
    ]
    headers = ["row", *procs]
    body = []
    for r in rows:
        rss = r.get("rss_mib") or {}
        body.append([r["name"], *(fmt((rss.get(p) or {}).get("max"), 0) for p in procs)])
    return table(headers, body)


DELAY_HEADERS = ["p50 ms", "p90 ms", "p99 ms", "max ms"]


def delay_cells(summary: Mapping[str, Any] | None) -> list[str]:
    """A :func:`delay_summary`'s p50, p90, p99 and max, as table cells."""
    d = summary or {}
    return [fmt(d.get(k), 1) for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms")]


def lone_section(lone: Mapping[str, Any] | None) -> list[str]:
    if not lone:
        return []
    start, finish = lone["insert_to_start"], lone["insert_to_finish"]
    stages = [
        (name, lone[key])
        for name, key in (
            ("insert to publish (relay)", "insert_to_publish"),
            ("publish to start (Kafka, claim; jobs Kafka delivered)", "publish_to_start"),
        )
        if lone.get(key)
    ]
    return [
        "## A lone job on an idle stack",
        "",
        f"{lone['jobs']} noop jobs through `POST /jobs`, each submitted once the one before had "
        f"finished and the pipeline had been idle for a while ({lone['door']}); from the job's "
        "`created_at` (the submitting transaction) to its `started_at` and `finished_at`; "
        "publish is its `jobs.ready` message's timestamp (set by the relay's producer, "
        "millisecond resolution). "
        f"{lone.get('started_before_publish', 0)} of them started before their message was "
        "published: a worker claimed them on their Postgres wake-up:",
        "",
        *table(
            ["", *DELAY_HEADERS],
            [
                [name, *delay_cells(d)]
                for name, d in (
                    ("insert to start", start),
                    ("insert to finish", finish),
                    *stages,
                )
            ],
        ),
        "",
    ]


def paced_stages_section(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where each row's paced delay goes (``--paced-stages``), when it was asked for."""
    staged = [(r["name"], (r.get("paced") or {}).get("stages")) for r in rows]
    staged = [(name, s) for name, s in staged if s]
    if not staged:
        return []
    stages = (
        ("insert to start", "insert_to_start"),
        ("insert to publish (relay)", "insert_to_publish"),
        ("publish to start (Kafka, claim)", "publish_to_start"),
    )
    body = [[name, label, *delay_cells(s.get(key))] for name, s in staged for label, key in stages]
    return [
        "## Where the paced delay goes",
        "",
        "`--paced-stages`: every paced job's `jobs.ready` message read by a consumer in the "
        "bench during the paced phase (its cost is in these delays, not in the CPU figures, "
        "which cover the throughput window), its timestamp (set by the relay's producer, "
        "millisecond resolution) splitting `created_at` to `started_at` in two. Jobs a worker "
        "claimed on their Postgres wake-up before the publish count only in the first line.",
        "",
        *table(["row", "stage", *DELAY_HEADERS], body),
        "",
    ]


def render_markdown(result: Mapping[str, Any], svg_name: str = "throughput.svg") -> str:
    rows = result["rows"]
    floor = result.get("floor_e2e_per_s")
    lines = [
        f"# just bench, {result['started_utc']}",
        "",
        f"git {result['git_head']} on {result['nproc']} CPUs; "
        f"floor {fmt(floor)} jobs/s end to end; machine busy before the run "
        f"{_percent(result.get('machine_busy_before'))} (stack idle, 5 s); jobs table "
        f"{jobs_table_text(result.get('jobs_table_before'))}"
        + (
            "; the whole stack restarted before the run."
            if (result.get("config") or {}).get("fresh")
            else "."
        ),
        "",
        *(
            [f"Apps started with {_env_text(env)}.", ""]
            if (env := (result.get("config") or {}).get("app_env"))
            else []
        ),
        *(f"**error:** {e}" for e in result.get("errors", [])),
        *([""] if result.get("errors") else []),
        *main_table(rows),
        "",
        *peer_lines(rows),
        *paced_stages_section(rows),
        *lone_section(result.get("lone")),
        "## CPU milliseconds per job, per process",
        "",
        "Over each row's throughput window (first submit to last job finished), from "
        "`/proc/PID/stat` utime+stime (+ reaped children) of each process tree; `postgres` is "
        "the postmaster and all its children, `client` is this bench process with its floor "
        "workers. Idle background (last line, ms of CPU per second) is inside every row; "
        "`of it idle` spreads it over the row's jobs at the row's rate (its share of `total`, "
        "about: the stack's pollers, heartbeats and scrapes go on under load). "
        "`of machine busy`: the share of all non-idle CPU time (`/proc/stat`) in the window "
        "that these processes account for.",
        "",
        *cpu_table(rows, result.get("idle")),
        "",
        "## Peak RSS per process, MiB",
        "",
        "VmHWM after `echo 5 > /proc/PID/clear_refs` at the row's start; for `postgres` the "
        "largest of its processes (their sum counts shared buffers once per backend, see "
        "bench.json).",
        "",
        *rss_table(rows),
        "",
    ]
    pg = result.get("pgbench")
    if pg:
        if pg.get("tps") is not None:
            lines += [
                "## Postgres commit ceiling (pgbench)",
                "",
                f"`pgbench -c {pg['clients']} -j {pg['threads']} -T {pg['seconds']} -M "
                f"{pg['protocol']}` on the direct port, one `leasework_jobs_insert` of a due "
                f"noop job per transaction (a jobs row, an outbox row, and the wake-up NOTIFY "
                f"while an idle worker holds its gate), relay stopped: **{fmt(pg['tps'])} tps**, "
                f"latency average {fmt(pg.get('latency_ms'), 2)} ms.",
                "",
            ]
        else:
            lines += [
                "## Postgres commit ceiling (pgbench)",
                "",
                f"not measured: {pg.get('error')}",
                "",
            ]
    limits = result.get("limits")
    if limits:
        off = limits["rate_off_by"] * 100
        lines += [
            "## Concurrency and rate limits under a backlog (issue 22)",
            "",
            "Sampled from Postgres every 50 ms while the demo's workers ran the backlog "
            "(`tools/bench/limits.py`):",
            "",
            "| limit | jobs | seconds | observed | limit |",
            "|:---|---:|---:|---:|---:|",
            f"| running at once per key (`keyed`, 8 keys) | {limits['key_jobs']} | "
            f"{limits['key_seconds']} | {limits['key_max_running']} | {limits['key_limit']} |",
            f"| running at once in a queue (`emails`, capped) | {limits['queue_jobs']} | "
            f"{limits['queue_seconds']} | {limits['queue_max_running']} | "
            f"{limits['queue_cap']} |",
            f"| starts per second over the busiest minute (`rated`, one key) | "
            f"{limits['rated_jobs']} | {limits['rated_seconds']} | "
            f"{limits['rate_busiest_minute']:.2f} ({off:+.1f}%) | {limits['rate']:g} |",
            f"| most starts within one second (`rated`) | | | "
            f"{limits['rate_most_in_a_second']} | {int(limits['rate']) + 1} |",
            "",
        ]
    lines += queues_lines(result)
    if result.get("lanes"):
        lines += [*lanes_markdown(result["lanes"]), ""]
    if result.get("blocking"):
        lines += [*blocking_markdown(result["blocking"]), ""]
    audit = result.get("audit")
    if audit:
        lines += [
            "## One auditor pass as the table grows",
            "",
            f"The relay's `audit_pass` over {audit['batch']:,} finished jobs from its "
            f"watermark, {audit['passes']} passes at each size, in a scratch schema filled "
            "with finished jobs (one attempt each):",
            "",
            "| jobs in the table | pass ms, median | min | max | vs the smallest |",
            "|---:|---:|---:|---:|---:|",
            *(
                f"| {s['jobs']:,} | {s['median_ms']:.1f} | {min(s['pass_ms']):.1f} | "
                f"{max(s['pass_ms']):.1f} | {s['vs_smallest']:.2f}x |"
                for s in audit["sizes"]
            ),
            "",
        ]
        if audit.get("limited"):
            lines += [
                f"Passes over {audit['batch']:,} limited jobs each: a queue capped at 4 "
                "(its cap one limit for all of them), the type `keyed` (a concurrency key "
                "each) or `rated` (a rate key each), four attempts at once, beside a backlog "
                "of the queue's jobs waiting:",
                "",
                "| type | backlog waiting | pass ms, median | min | max | violations found |",
                "|:---|---:|---:|---:|---:|---:|",
                *(
                    f"| `{s['type']}` | {s['backlog']:,} | {s['median_ms']:.1f} | "
                    f"{min(s['pass_ms']):.1f} | {max(s['pass_ms']):.1f} | {s['violations']} |"
                    for s in audit["limited"]
                ),
                "",
            ]
    lines += [
        "## Throughput over time",
        "",
        f"![jobs finished per 0.5 s]({svg_name})",
        "",
        "## How it was measured",
        "",
        *(f"- {line}" for line in result.get("method", [])),
        "",
    ]
    return "\n".join(lines)


# --- repeated runs ---------------------------------------------------------------------------
KAFKA = ("kafka-1", "kafka-2", "kafka-3")


def row_figures(
    row: Mapping[str, Any], idle: Mapping[str, Any] | None = None
) -> dict[str, float | None]:
    """The figures of one row that a repeated bench summarises (``idle``: its run's idle
    measurement, for the idle stack's share of the row's CPU)."""
    cpu = row.get("cpu_ms_per_job") or {}
    delay = (row.get("paced") or {}).get("delay") or {}
    kafka = [cpu.get(k) for k in KAFKA]
    return {
        "e2e jobs/s": row.get("e2e_per_s"),
        "vs floor": row.get("vs_floor"),
        "CPU ms/job": cpu.get("total"),
        "of it idle": idle_share(row, idle),
        "api CPU ms/job": cpu.get("api"),
        "brokers CPU ms/job": None if None in kafka else sum(kafka),  # type: ignore[arg-type]
        "paced p50 ms": delay.get("p50_ms"),
        "paced p99 ms": delay.get("p99_ms"),
        "probe ms": probe_ms(row),
        "CPU per job in probe units": per_probe(cpu.get("total"), probe_ms(row)),
    }


def per_probe(cpu_ms: float | None, probe: float | None) -> float | None:
    """A row's CPU ms per job over its probe ms: the job's CPU in units of the probe's fixed
    work, which moves far less between the machine's fast and slow minutes than milliseconds
    do (docs/design-decisions.md, "A row's CPU per job moves with the machine's speed")."""
    if cpu_ms is None or not probe:
        return None
    return cpu_ms / probe


def lone_figures(lone: Mapping[str, Any] | None) -> dict[str, float | None]:
    start = (lone or {}).get("insert_to_start") or {}
    finish = (lone or {}).get("insert_to_finish") or {}
    publish = (lone or {}).get("insert_to_publish") or {}
    return {
        "insert to start p50 ms": start.get("p50_ms"),
        "insert to start p99 ms": start.get("p99_ms"),
        "insert to finish p50 ms": finish.get("p50_ms"),
        "insert to publish p50 ms": publish.get("p50_ms"),
        "jobs started before their publish": (lone or {}).get("started_before_publish"),
    }


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    """Median, lowest and highest of the values measured (None where a run had none)."""
    got = sorted(v for v in values if v is not None)
    if not got:
        return {"median": None, "min": None, "max": None, "n": 0}
    mid = len(got) // 2
    median = got[mid] if len(got) % 2 else (got[mid - 1] + got[mid]) / 2
    return {"median": median, "min": got[0], "max": got[-1], "n": len(got)}


def aggregate(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median and spread, over repeated runs, of every row's figures, the lone job's
    latencies, pgbench's tps and how busy the machine was before each run."""
    names = [r["name"] for r in results[0]["rows"]] if results else []
    rows = {}
    for name in names:
        per_run = [
            row_figures(next((r for r in res["rows"] if r["name"] == name), {}), res.get("idle"))
            for res in results
        ]
        rows[name] = {key: spread([f[key] for f in per_run]) for key in per_run[0]}
    lone = [lone_figures(res.get("lone")) for res in results]
    return {
        "runs": len(results),
        "started_utc": [res["started_utc"] for res in results],
        "git_head": results[0]["git_head"] if results else None,
        "fresh": bool(results and results[0]["config"].get("fresh")),
        "machine_busy_before": [res.get("machine_busy_before") for res in results],
        "jobs_table_before": [res.get("jobs_table_before") for res in results],
        "app_env": results[0]["config"].get("app_env") if results else {},
        "rows": rows,
        "lone": {key: spread([f[key] for f in lone]) for key in lone[0]} if lone else {},
        "enqueue_one_vs_floor_order": spread([enqueue_one_vs_peer(res["rows"]) for res in results]),
        "pgbench_tps": spread([(res.get("pgbench") or {}).get("tps") for res in results]),
        "errors": [e for res in results for e in res.get("errors", [])],
        **aggregate_lanes(list(results)),
    }


def _spread_cell(s: Mapping[str, Any], digits: int, suffix: str = "") -> str:
    if s.get("median") is None:
        return "–"
    return f"{fmt(s['median'], digits)}{suffix} ({fmt(s['min'], digits)}–{fmt(s['max'], digits)})"


def _env_text(env: Mapping[str, str]) -> str:
    return ", ".join(f"`{k}={v}`" for k, v in env.items())


def render_summary(summary: Mapping[str, Any]) -> str:
    """summary.md: each figure as median (lowest–highest) over the runs."""
    busy = ", ".join(_percent(b) for b in summary["machine_busy_before"])
    fresh = "the whole stack restarted before each run" if summary["fresh"] else "one stack"
    digits = {
        "vs floor": 2,
        "CPU ms/job": 2,
        "of it idle": 2,
        "api CPU ms/job": 2,
        "brokers CPU ms/job": 2,
        "CPU per job in probe units": 3,
    }
    first = next(iter(summary["rows"].values()), {})
    headers = ["row", *first]
    body = [
        [
            name,
            *(
                _spread_cell(
                    s, digits.get(key, 1 if "ms" in key else 0), "x" if key == "vs floor" else ""
                )
                for key, s in figures.items()
            ),
        ]
        for name, figures in summary["rows"].items()
    ]
    lines = [
        f"# just bench, {summary['runs']} runs ({fresh})",
        "",
        f"git {summary['git_head']}; runs started {', '.join(summary['started_utc'])}; machine "
        f"busy before each run (stack idle, 5 s): {busy}; jobs table before each run: "
        + "; ".join(jobs_table_text(t) for t in summary.get("jobs_table_before", []))
        + ".",
        "",
        *(
            [f"Apps started with {_env_text(summary['app_env'])}.", ""]
            if summary.get("app_env")
            else []
        ),
        "Each figure: median (lowest–highest) over the runs.",
        "",
        *(f"**error:** {e}" for e in summary.get("errors", [])),
        *(table(headers, body) if body else []),
        "",
    ]
    peer = summary.get("enqueue_one_vs_floor_order") or {}
    if peer.get("median") is not None:
        lines += [
            f"`enqueue-one` against `floor-order`: {_spread_cell(peer, 2, 'x')}. {PEER_NOTE}",
            "",
        ]
    if any(s.get("median") is not None for s in (summary.get("lone") or {}).values()):
        lines += [
            "## A lone job on an idle stack",
            "",
            *table(
                ["figure", "median (lowest–highest)"],
                [[key, _spread_cell(s, 1)] for key, s in summary["lone"].items()],
            ),
            "",
        ]
    if summary["pgbench_tps"].get("median") is not None:
        lines += [f"pgbench: {_spread_cell(summary['pgbench_tps'], 0)} tps.", ""]
    lines += lanes_summary_markdown(dict(summary))
    return "\n".join(lines)


# --- svg --------------------------------------------------------------------------------------
def render_svg(
    series: Mapping[str, Sequence[int]],
    *,
    width_s: float = 0.5,
    title: str = "jobs finished per second (0.5 s buckets), from each row's first submit",
    width: int = 900,
    height: int = 360,
) -> str:
    """One polyline per row: jobs finished per second in ``width_s`` buckets against seconds
    since the row's first submit."""
    left, right, top, bottom = 64, 170, 30, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    rates = {name: [c / width_s for c in counts] for name, counts in series.items()}
    horizon = max([width_s, *(len(c) * width_s for c in rates.values())])
    peak = max([1.0, *(v for c in rates.values() for v in c)])
    y_step = nice_step(peak, 5)
    y_max = math.ceil(peak / y_step) * y_step
    x_step = nice_step(horizon, 8)

    def x(t: float) -> float:
        return left + plot_w * t / horizon

    def y(v: float) -> float:
        return top + plot_h * (1 - v / y_max)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">{escape(title)}</text>',
    ]
    tick = 0.0
    while tick <= y_max + 1e-9:
        out.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            'stroke="#ddd"/>'
        )
        out.append(f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick:g}</text>')
        tick += y_step
    tick = 0.0
    while tick <= horizon + 1e-9:
        out.append(
            f'<text x="{x(tick):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{tick:g}</text>'
        )
        tick += x_step
    out.append(
        f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">seconds</text>'
    )
    out.append(
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#888"/>'
    )
    for i, (name, values) in enumerate(rates.items()):
        colour = COLOURS[i % len(COLOURS)]
        points = " ".join(f"{x((j + 0.5) * width_s):.1f},{y(v):.1f}" for j, v in enumerate(values))
        if points:
            out.append(
                f'<polyline class="row" fill="none" stroke="{colour}" stroke-width="1.5" '
                f'points="{points}"/>'
            )
        ly = top + 14 + 16 * i
        out.append(
            f'<line x1="{left + plot_w + 12}" x2="{left + plot_w + 32}" y1="{ly - 4}" '
            f'y2="{ly - 4}" stroke="{colour}" stroke-width="2"/>'
        )
        out.append(f'<text x="{left + plot_w + 36}" y="{ly}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _flood_lines(flood: dict[str, Any]) -> list[str]:
    """An isolation flood's rows: while published (when measured), then published."""
    lines = []
    what = f"`emails` flooded with {flood['job_seconds']:g} s jobs"
    if (p := flood.get("publishing")) is not None:
        lines.append(
            f"| {what}, being published | {p['p50_ms']} ms | {p['p99_ms']} ms | "
            f"{p['max_ms']} ms | |"
        )
    lines.append(
        f"| {what}{', published' if p is not None else ''} | {flood['p50_ms']} ms | "
        f"{flood['p99_ms']} ms | {flood['max_ms']} ms | {flood['waiting_after']} |"
    )
    return lines


def queues_lines(result: dict[str, Any]) -> list[str]:
    """The priorities and isolation rows (``tools/bench/queues.py``), when measured."""
    lines: list[str] = []
    prio, iso = result.get("priorities"), result.get("isolation")
    if prio:
        verdict = "met" if prio["p99_ms"] < prio["goal_p99_ms"] else "**not met**"
        p = prio.get("publishing")
        lines += [
            "## Priorities behind a backlog (issue 22)",
            "",
            f"{prio['paced']} `noop` jobs of priority 0, 10 a second, while {prio['flood']} "
            f"`sleep` jobs ({prio.get('flood_job_seconds', 0.2):g} s) of priority 3 waited in "
            f"the same queue ({prio['flood_started']} of them had started, "
            f"{prio['flood_waiting_after']} still waited when the last paced job ran)"
            + (
                ", first while the relay still published the backlog, then with all of it "
                "published:"
                if p
                else ":"
            ),
            "",
            "| scheduling delay | p50 | p99 | max | backlog still waiting | goal (p99) |",
            "|:---|---:|---:|---:|---:|---:|",
            *(
                [
                    f"| priority 0, backlog being published | {p['p50_ms']} ms | "
                    f"{p['p99_ms']} ms | {p['max_ms']} ms | {p['flood_waiting_after']} | |"
                ]
                if p
                else []
            ),
            f"| priority 0 behind the backlog{', published' if p else ''} | {prio['p50_ms']} ms "
            f"| {prio['p99_ms']} ms | {prio['max_ms']} ms | {prio['flood_waiting_after']} | "
            f"under {prio['goal_p99_ms']:g} ms: {verdict} |",
            "",
            *slowest_lines([("backlog being published", p or {}), ("backlog published", prio)]),
        ]
    if iso:
        a, floods = iso["unflooded"], iso["floods"]
        slow = floods[0]
        verdict = "met" if slow["p99_ms"] < iso["goal_p99_ms"] else "**not met**"
        lines += [
            "## Isolation of queues (issue 22)",
            "",
            f"{iso['paced']} `noop` jobs in `default`, 10 a second, alone and then while "
            f"`emails` held {iso['flood']} `sleep` jobs (each flood cancelled after). Each "
            "flood is measured twice: while the relay still publishes it (a burst of "
            f"{iso['flood']} messages on two cores), then with all of it published, `emails` "
            "holding its backlog and running its slots full:",
            "",
            "| scheduling delay in `default` | p50 | p99 | max | `emails` jobs still waiting |",
            "|:---|---:|---:|---:|---:|",
            f"| unflooded | {a['p50_ms']} ms | {a['p99_ms']} ms | {a['max_ms']} ms | |",
            *[line for f in floods for line in _flood_lines(f)],
            "",
            f"Goal: with slow jobs ({slow['job_seconds']:g} s), flooded (published) p99 under "
            f"the unflooded p99 plus 100 ms, {iso['goal_p99_ms']} ms: {verdict}.",
            "",
            *slowest_lines(
                [("unflooded", a)]
                + [
                    (f"{f['job_seconds']:g} s jobs, {phase}", m)
                    for f in floods
                    for phase, m in (
                        ("being published", f.get("publishing") or {}),
                        ("published", f),
                    )
                ]
            ),
            *(
                [
                    f"**The unflooded baseline stalled:** its slowest job waited {a['max_ms']} "
                    f"ms against a p50 of {a['p50_ms']} ms, so the goal above is set by that "
                    "stall, not by the queue at rest. Read the flooded p99 against a run whose "
                    "baseline did not stall.",
                    "",
                ]
                if baseline_stalled(a)
                else []
            ),
        ]
    return lines


def slowest_lines(measurements: list[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """Where the slowest job of each measurement spent its delay, split at its message's
    timestamp (``tools.bench.queues.slowest_stages``), then every other job later than
    ``tools.bench.queues.LATE`` (runs before they were recorded have none); nothing for
    measurements without a split."""
    lines = []
    for label, measured in measurements:
        if not (s := measured.get("slowest")):
            continue
        lines.append(f"- {label}: {s['delay_ms']} ms; {_split(s)}")
        others = measured.get("late", [])[1:]
        for late in others[:LATE_SHOWN]:
            lines.append(f"  - then {late['delay_ms']} ms; {_split(late)}")
        if len(others) > LATE_SHOWN:
            lines.append(f"  - and {len(others) - LATE_SHOWN} more over {LATE_MS:g} ms")
    if not lines:
        return []
    return [
        "The slowest job of each measurement, and each other one over "
        f"{LATE_MS:g} ms, its delay split at its `jobs.ready` message's "
        "timestamp (set by the relay's producer):",
        "",
        *lines,
        "",
    ]


LATE_MS = 100.0  # tools.bench.queues.LATE, in milliseconds
LATE_SHOWN = 5  # late jobs listed after the slowest, at most


def _split(s: Mapping[str, Any]) -> str:
    if s["to_publish_ms"] is None:
        return "its message was not seen"
    if s["after_publish_ms"] < 0:
        return (
            f"claimed on its Postgres wake-up {s['delay_ms']} ms after its insert, "
            f"before its message was published ({s['to_publish_ms']} ms)"
        )
    return (
        f"{s['to_publish_ms']} ms insert to publish (the relay), "
        f"{s['after_publish_ms']} ms publish to start (Kafka, the claim)"
    )


def baseline_stalled(delays: Mapping[str, float]) -> bool:
    """Whether a baseline's slowest job is a stall rather than its spread: over 100 ms and
    over ten times its p50 (a queue at rest starts its jobs in a few ms)."""
    return delays["max_ms"] > max(100.0, 10 * delays["p50_ms"])
