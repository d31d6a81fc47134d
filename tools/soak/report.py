"""The soak's report: ``report.json`` for machines, ``report.md`` for people (its closing
table is the one the issue asks for) and ``soak.svg`` (:mod:`tools.soak.plot`). Rendering
is pure; only :func:`write_report` touches the disk."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.checker import Validity
from chaos.history import FaultWindow
from chaos.report import _cell, _table, validity_text
from chaos.tables import jsonable
from tools.soak import plot
from tools.soak.goals import (
    CONN_SLACK,
    FD_SLACK,
    FLAT_TOLERANCE,
    LEAD,
    RSS_TOLERANCE,
    WARMUP,
    Bucket,
    Compared,
    Reading,
    SoakGoals,
    Windows,
)
from tools.soak.plan import Rate
from tools.soak.sampler import Sample

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
SOAK_SVG = "soak.svg"


@dataclass(frozen=True)
class SoakRun:
    """Everything the report is written from."""

    minutes: int
    rate: Rate
    seed: int
    interval: float
    overlap: float
    scenario: Mapping[str, Any]  # the scenario's to_dict()
    chaos_report: Path  # the chaos run's own report directory
    windows: Windows
    goals: SoakGoals
    readings: Mapping[str, Sequence[Reading]]
    server: Sequence[tuple[float, int]]
    samples: Sequence[Sample]
    fault_windows: Sequence[FaultWindow]
    buckets: Sequence[Bucket]
    verdict: Mapping[str, Any]  # the chaos verdict's to_dict()
    client_late: float | None  # the client's worst lag behind its schedule (s)


def _mib(kib: float | None) -> float | None:
    return None if kib is None else round(kib / 1024, 1)


def _ratio(c: Compared) -> float | None:
    return None if c.ratio is None else round(c.ratio, 3)


def _mark(ok: Validity) -> str:
    return "" if ok is True else " **(missed)**" if ok is False else " (unknown)"


def result_table(run: SoakRun) -> str:
    """The closing table: per process first vs last window RSS and their ratio, descriptors
    and Postgres connections first/last; the server's connections, the p99 delay outside
    faults and the checker's verdict."""
    goals = run.goals
    headers = (
        "process",
        "judged over",
        "RSS first (MiB)",
        "RSS last (MiB)",
        "ratio",
        "fds first",
        "fds last",
        "pg conns first",
        "pg conns last",
    )
    rows = []
    for p in goals.processes:
        rows.append(
            (
                p.name,
                p.span.basis,
                _mib(p.rss.first),
                f"{_cell(_mib(p.rss.last))}{_mark(p.rss.ok)}",
                _ratio(p.rss),
                p.fds.first,
                f"{_cell(p.fds.last)}{_mark(p.fds.ok)}",
                p.pg_links.first,
                f"{_cell(p.pg_links.last)}{_mark(p.pg_links.ok if p.pg_links.first else True)}",
            )
        )
    conn = goals.connections
    rows.append(
        (
            "**Postgres server** (pg_stat_activity)",
            "whole soak",
            "",
            "",
            "",
            "",
            "",
            conn.first,
            f"{_cell(conn.last)}{_mark(conn.ok)}",
        )
    )
    lines = _table(headers, rows)
    d, c = goals.delay, goals.checked
    p99 = "–" if d.p99_outside is None else f"{d.p99_outside:.3f} s"
    share = "–" if d.share_outside is None else f"{100 * d.share_outside:.0f}%"
    lines += [
        "",
        *_table(
            ("goal", "value", "result"),
            [
                (
                    "p99 scheduling delay outside faults (< 1 s)",
                    f"{p99} ({d.outside} of {d.jobs} jobs, {share}; settle {d.settle:g} s)",
                    _verdict_word(d.ok),
                ),
                (
                    "p99 scheduling delay, all jobs / inside faults",
                    f"{_seconds(d.p99_all)} / {_seconds(d.p99_inside)}",
                    "(shown)",
                ),
                (
                    "checker verdict (lost, doubled)",
                    f"{validity_text(c.valid)} ({c.lost} lost, {c.doubled} doubled)",
                    _verdict_word(c.valid if not (c.lost or c.doubled) else False),
                ),
                ("the scenario's expectations", "", _verdict_word(c.expectations)),
            ],
        ),
    ]
    return "\n".join(lines) + "\n"


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f} s"


def _verdict_word(ok: Validity) -> str:
    return "met" if ok is True else "**MISSED**" if ok is False else "unknown"


def render_markdown(run: SoakRun) -> str:
    goals = run.goals
    valid = goals.valid
    result = "every goal met" if valid is True else "MISSED" if valid is False else "unknown"
    faults = run.scenario.get("faults", [])
    lines = [f"# Soak: {run.minutes} minute(s)", "", f"**Result: {result}**", ""]
    for goal in goals.missed:
        lines.append(f"- missed: {goal.name}: {goal.detail}")
    for goal in goals.unknown:
        lines.append(f"- unknown: {goal.name}: {goal.detail}")
    if goals.missed or goals.unknown:
        lines.append("")
    lines += [
        f"Rate {run.rate.per_second:g} submits/s ({run.rate.source}); seed {run.seed}; "
        f"{len(faults)} faults planned (overlap chance {run.overlap:g}), "
        f"{len(run.fault_windows)} injected; a sample every {run.interval:g} s "
        f"({len(run.samples)} samples); windows of {run.windows.window / 60:.1f} min "
        f"(first and last of {run.windows.duration / 60:.0f}). The client's worst lag "
        f"behind its schedule: {_seconds(run.client_late)}.",
        "",
        f"The chaos run's own report (verdict, faults, recovery, timeline): "
        f"[{run.chaos_report.name}/report.md]({run.chaos_report.name}/report.md).",
        "",
        f"![RSS, descriptors, connections and delay over time]({SOAK_SVG})",
        "",
        "## How it is judged",
        "",
        f"- RSS (VmRSS of the process the pidfile names): the median of the samples in the "
        f"last window within {RSS_TOLERANCE:.0%} of the first window's. A process a fault "
        f"restarted is judged over one life: the whole soak when one life, begun before "
        f"it, spans both windows, else its longest life less {WARMUP:g} s of warm-up, "
        f"windows a third of it at most (the column *judged over*); with fewer than three "
        f"samples a window it is not judged.",
        f"- Descriptors and each process's Postgres connections (its sockets to Postgres) "
        f"over the same span: flat when the last window's median is at most "
        f"{FLAT_TOLERANCE:.0%} (or {FD_SLACK:g} descriptors, {CONN_SLACK:g} connections) "
        f"above the first's. The server's count (`pg_stat_activity`, client backends, "
        f"without the sampler's own) over the whole soak; it includes anyone else's "
        f"connections.",
        f"- Scheduling delay: `started_at - run_at` of every job of the run that started; "
        f"outside faults, the jobs due outside every fault window, a window running from "
        f"{LEAD:g} s before the fault took effect to {run.goals.delay.settle:g} s after "
        f"its heal.",
        "- The checker: the chaos run's verdict and expectations (0 lost, 0 doubled).",
        "",
        "## Result",
        "",
        result_table(run),
    ]
    return "\n".join(lines)


def report_data(run: SoakRun) -> dict[str, Any]:
    goals = run.goals
    return {
        "minutes": run.minutes,
        "rate": dataclasses.asdict(run.rate),
        "seed": run.seed,
        "sample_interval": run.interval,
        "overlap": run.overlap,
        "windows": dataclasses.asdict(run.windows),
        "chaos_report": str(run.chaos_report),
        "result": goals.valid,
        "goals": [dataclasses.asdict(g) for g in goals.goals],
        "processes": [
            {
                "name": p.name,
                "basis": p.span.basis,
                "lives": p.span.lives,
                "pid": p.span.pid,
                "first_window": p.span.first,
                "last_window": p.span.last,
                "rss_mib": [_mib(p.rss.first), _mib(p.rss.last)],
                "rss_ratio": _ratio(p.rss),
                "fds": [p.fds.first, p.fds.last],
                "pg_links": [p.pg_links.first, p.pg_links.last],
                "tree_anon_mib": [_mib(p.tree_anon[0]), _mib(p.tree_anon[1])],
                "ok": p.valid,
            }
            for p in goals.processes
        ],
        "server_connections": dataclasses.asdict(goals.connections),
        "delay": dataclasses.asdict(goals.delay),
        "checked": dataclasses.asdict(goals.checked),
        "verdict": dict(run.verdict),
        "fault_windows": [dataclasses.asdict(w) for w in run.fault_windows],
        "delay_buckets": [dataclasses.asdict(b) for b in run.buckets],
        "readings": {
            name: [dataclasses.asdict(r) for r in series] for name, series in run.readings.items()
        },
        "server": [list(p) for p in run.server],
        "samples": [
            {"epoch": s.epoch, "server": s.server, "errors": list(s.errors)} for s in run.samples
        ],
        "scenario": dict(run.scenario),
    }


def render_plot(run: SoakRun) -> str:
    rss, fds = plot.process_panels(run.readings)
    panels = [rss, fds, plot.connections_panel(run.readings, run.server)]
    panels.append(plot.delay_panel(run.buckets))
    horizon = max([run.windows.duration, *(r.t for s in run.readings.values() for r in s)])
    return plot.render_svg(
        panels,
        run.fault_windows,
        horizon,
        title=f"soak: {run.minutes} min at {run.rate.per_second:g}/s",
    )


def write_report(directory: Path, run: SoakRun) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    data = report_data(run)
    (directory / REPORT_JSON).write_text(
        json.dumps(data, indent=2, default=jsonable) + "\n", encoding="utf-8"
    )
    (directory / REPORT_MD).write_text(render_markdown(run), encoding="utf-8")
    (directory / SOAK_SVG).write_text(render_plot(run), encoding="utf-8")
