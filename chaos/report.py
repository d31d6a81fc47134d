"""Reports of a chaos run: ``report.json`` for machines, ``report.md`` for people and
``timeline.svg``, throughput over time with the fault windows shaded (hand-written SVG).

Also one summary row per scenario, as a Markdown or plain-text table, for a run of many.
Rendering is pure (strings from data); only :func:`write_report` touches the disk.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal
from xml.sax.saxutils import escape, quoteattr

from chaos import nemeses
from chaos.checker import Validity
from chaos.history import SUBMIT, FaultWindow, Op, fault_windows
from chaos.judge import Judgement
from chaos.scenario import Scenario
from chaos.verdict import Verdict

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
TIMELINE_SVG = "timeline.svg"

_UNKNOWN_FAULT_COLOUR = "#7f7f7f"  # a fault the registry does not know (an older history)
_SUBMITTED_COLOUR = "#1f77b4"
_FINISHED_COLOUR = "#17becf"


def validity_text(valid: Validity) -> str:
    """``valid``, ``INVALID`` or ``unknown``."""
    return "valid" if valid is True else "INVALID" if valid is False else "unknown"


def passed_text(passed: Validity) -> str:
    """How a judgement against expectations reads: ``met``, ``NOT MET`` or ``unknown``."""
    return "met" if passed is True else "NOT MET" if passed is False else "unknown"


# ---------------------------------------------------------------- series


@dataclass(frozen=True)
class Throughput:
    """Jobs per bucket: ``submitted`` (first invocation of each key) and ``finished`` (jobs
    that reached a terminal state), bucket ``i`` covering [i*bucket, (i+1)*bucket)."""

    bucket: float
    submitted: tuple[int, ...]
    finished: tuple[int, ...]

    @property
    def horizon(self) -> float:
        return len(self.submitted) * self.bucket


def _horizon(verdict: Verdict, history: Sequence[Op], windows: Sequence[FaultWindow]) -> float:
    ends = [verdict.quiet_at, *verdict.finish_times, *(op.time for op in history)]
    ends += [w.stop if w.stop is not None else w.start for w in windows]
    return max([0.0, *ends])


def throughput(verdict: Verdict, history: Sequence[Op], *, bucket: float = 1.0) -> Throughput:
    windows = fault_windows(history)
    buckets = max(1, math.ceil(_horizon(verdict, history, windows) / bucket + 1e-9))
    submitted = [0] * buckets
    finished = [0] * buckets
    seen: set[str] = set()
    for op in history:
        key = op.value.get("key")
        if op.f == SUBMIT and op.is_invoke and isinstance(key, str) and key not in seen:
            seen.add(key)
            submitted[min(buckets - 1, max(0, int(op.time // bucket)))] += 1
    for t in verdict.finish_times:
        finished[min(buckets - 1, max(0, int(t // bucket)))] += 1
    return Throughput(bucket, tuple(submitted), tuple(finished))


# ---------------------------------------------------------------- SVG


def _colour(fault: str) -> str:
    known = nemeses.REGISTRY.get(fault)
    return known.colour if known is not None else _UNKNOWN_FAULT_COLOUR


def _nice_step(span: float, ticks: int) -> float:
    raw = span / max(1, ticks)
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def render_svg(
    verdict: Verdict,
    history: Sequence[Op],
    *,
    title: str = "",
    width: int = 900,
    height: int = 320,
    bucket: float = 1.0,
) -> str:
    """The throughput timeline: submitted and finished jobs per ``bucket`` seconds as two
    polylines, each fault window a shaded ``rect class="fault"`` labelled with its name."""
    windows = fault_windows(history)
    series = throughput(verdict, history, bucket=bucket)
    left, right, bottom, row_h = 56, 16, 40, 13
    plot_w = width - left - right
    plot_h = height - 30 - 2 * row_h - 6 - bottom  # room for two rows of fault labels
    horizon = max(series.horizon, bucket)
    peak = max([1, *series.submitted, *series.finished])
    y_step = _nice_step(peak, 5)
    y_max = math.ceil(peak / y_step) * y_step

    def x(t: float) -> float:
        return left + plot_w * min(max(t, 0.0), horizon) / horizon

    # fault labels go in rows above the plot, each in the first row where it fits
    rows: list[int] = []
    row_ends: list[float] = []
    label_xs: list[float] = []
    for w in windows:
        label_w = 6.2 * len(w.label)  # roughly, at 11 px
        label_x = max(0.0, min(x(w.start) + 2, width - 4 - label_w))
        row = next((i for i, end in enumerate(row_ends) if end < label_x), len(row_ends))
        if row == len(row_ends):
            row_ends.append(0.0)
        row_ends[row] = label_x + label_w + 8
        rows.append(row)
        label_xs.append(label_x)
    top = 30 + row_h * max(2, len(row_ends)) + 6
    height = top + plot_h + bottom

    def y(v: float) -> float:
        return top + plot_h * (1 - v / y_max)

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f"<title>{escape(title or 'chaos run timeline')}</title>",
        f'<rect class="background" x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    if title:
        out.append(
            f'<text class="title" x="{left}" y="18" font-size="14" font-weight="bold">'
            f"{escape(title)}</text>"
        )

    # fault windows: a shaded band over the plot, named above it
    out.append('<g class="faults">')
    for w, row, label_x in zip(windows, rows, label_xs, strict=True):
        x0 = x(w.start)
        x1 = x(w.stop if w.stop is not None else horizon)
        colour = _colour(w.fault)
        span = f"{_fmt(w.start)}s to " + (f"{_fmt(w.stop)}s" if w.stop is not None else "end")
        label_y = top - 6 - row_h * (len(row_ends) - 1 - row)
        out.append(
            f'<rect class="fault" data-fault={quoteattr(w.fault)} '
            f"data-target={quoteattr(w.target or '')} "
            f'x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 2.0):.1f}" height="{plot_h}" '
            f'fill="{colour}" fill-opacity="0.18" stroke="{colour}" stroke-opacity="0.5">'
            f"<title>{escape(w.label)}: {span}</title></rect>"
            f'<line x1="{x0:.1f}" y1="{label_y + 3}" x2="{x0:.1f}" y2="{top}" '
            f'stroke="{colour}" stroke-opacity="0.5"/>'
            f'<text class="fault-label" x="{label_x:.1f}" y="{label_y}" fill="{colour}">'
            f"{escape(w.label)}</text>"
        )
    out.append("</g>")

    # axes, grid and ticks
    out.append('<g class="axes" stroke="#444444">')
    out.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}"/>')
    out.append("</g>")
    out.append('<g class="ticks" fill="#444444">')
    t_step = _nice_step(horizon, 10)
    t = 0.0
    while t <= horizon + 1e-9:
        out.append(
            f'<line x1="{x(t):.1f}" y1="{top + plot_h}" x2="{x(t):.1f}" y2="{top + plot_h + 4}" '
            'stroke="#444444"/>'
            f'<text x="{x(t):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{_fmt(t)}</text>'
        )
        t += t_step
    v = 0.0
    while v <= y_max + 1e-9:
        out.append(
            f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + plot_w}" y2="{y(v):.1f}" '
            'stroke="#dddddd"/>'
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{_fmt(v)}</text>'
        )
        v += y_step
    out.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 6}" text-anchor="middle">'
        "seconds since the run started</text>"
        f'<text x="14" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.0f})">jobs per {_fmt(bucket)} s</text>'
    )
    out.append("</g>")

    # the two series
    for name, colour, values in (
        ("submitted", _SUBMITTED_COLOUR, series.submitted),
        ("finished", _FINISHED_COLOUR, series.finished),
    ):
        points = " ".join(
            f"{x((i + 0.5) * bucket):.1f},{y(count):.1f}" for i, count in enumerate(values)
        )
        out.append(
            f'<polyline class="{name}" points="{points}" fill="none" stroke="{colour}" '
            'stroke-width="1.5"/>'
        )

    # legend
    out.append(f'<g class="legend" transform="translate({left + plot_w - 280},14)">')
    for i, (name, colour) in enumerate(
        (("submitted", _SUBMITTED_COLOUR), ("finished", _FINISHED_COLOUR))
    ):
        out.append(
            f'<line x1="{i * 140}" y1="0" x2="{i * 140 + 18}" y2="0" stroke="{colour}" '
            f'stroke-width="2"/><text x="{i * 140 + 24}" y="4">{name} per {_fmt(bucket)} s</text>'
        )
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- Markdown


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value else "0"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(
    verdict: Verdict,
    scenario: Scenario,
    history: Sequence[Op],
    *,
    judgement: Judgement | None = None,
    svg_name: str = TIMELINE_SVG,
    list_limit: int = 50,
) -> str:
    lines = [f"# Chaos run: {scenario.name}", ""]
    if scenario.description:
        lines += [scenario.description, ""]
    head = f"**Checker: {validity_text(verdict.valid)}**"
    if judgement is not None:
        head += f" · **Expectations: {passed_text(judgement.passed)}**"
    fencing = "on" if scenario.fencing else f"OFF ({scenario.lease_mode})"
    lines += [head, "", f"Fencing {fencing}; source `{scenario.source}`.", ""]

    lines += ["## Verdict", ""]
    lines += _table(
        ["measure", "value"],
        [
            ("submitted (distinct keys)", verdict.submitted),
            ("accepted", verdict.accepted),
            ("… acknowledged (2xx)", verdict.acknowledged),
            ("… unknown, landed", verdict.unknown_landed),
            ("unknown, never landed", verdict.unknown_not_landed),
            ("rejected (4xx)", verdict.rejected),
            ("succeeded", verdict.succeeded),
            ("dead", verdict.dead),
            ("cancelled", verdict.cancelled),
            ("**lost**", verdict.lost),
            ("**doubled** (more than one effect)", verdict.doubled),
            ("stray effects", verdict.stray_effects),
            ("executions (total)", verdict.total_executions),
            ("executions per job (max)", verdict.max_executions),
            ("redeliveries", verdict.redeliveries),
            ("fence rejections", verdict.fence_rejections),
            ("scheduling delay p50 (s)", verdict.scheduling_delay_p50),
            ("scheduling delay p99 (s)", verdict.scheduling_delay_p99),
            ("quiet at (s)", verdict.quiet_at),
            ("jobs not from this history", verdict.unmatched_jobs),
        ],
    )
    lines.append("")

    problems = list(verdict.problems)
    if judgement is not None:
        problems += [p for p in judgement.problems if p not in problems]
    lines += ["## Problems", ""]
    shown = problems[:list_limit]
    lines += [f"- {p}" for p in shown] if shown else ["None."]
    if len(problems) > len(shown):
        lines.append(f"- … and {len(problems) - len(shown)} more (see {REPORT_JSON})")
    lines.append("")

    lines += ["## Fault timeline", ""]
    if verdict.recovery:
        lines += _table(
            ["#", "fault", "target", "start (s)", "healed (s)", "recovery (s)"],
            [
                (i + 1, r.fault, r.target, r.started, r.stopped, r.seconds)
                for i, r in enumerate(verdict.recovery)
            ],
        )
    else:
        lines.append("No faults were injected.")
    lines.append("")

    lines += ["## Figures", "", f"![throughput and fault windows]({svg_name})", ""]
    lines += ["### Executions per job", ""]
    lines += _table(["executions", "jobs"], sorted(verdict.executions.items()))
    lines.append("")

    for heading, issues in (
        ("Lost jobs", verdict.lost_jobs),
        ("Doubled jobs", verdict.doubled_jobs),
    ):
        if issues:
            lines += [f"## {heading}", ""]
            lines += _table(
                ["job", "key", "why"],
                [(j.job_id, j.key, j.reason) for j in issues[:list_limit]],
            )
            if len(issues) > list_limit:
                lines.append(f"\n… and {len(issues) - list_limit} more (see {REPORT_JSON})")
            lines.append("")

    w = scenario.workload
    mix = ", ".join(f"{k} {v:g}" for k, v in w.mix.weights() if v)
    e = scenario.expect
    lines += ["## Scenario", ""]
    lines += _table(
        ["setting", "value"],
        [
            ("rate (submits/s)", w.rate),
            ("duration (s)", w.duration),
            ("mix", mix),
            ("ledger sleep (s)", w.ledger_seconds),
            ("fail: times / max attempts", f"{w.fail_times} / {w.fail_max_attempts}"),
            ("history operations", len(history)),
            ("expect: max lost / max doubled", f"{e.max_lost} / {e.max_doubled}"),
            ("expect: duplicate effects", "yes" if e.expect_doubled else "no"),
            ("expect: recovery bound (s)", e.recovery_seconds),
            ("expect: alerts", ", ".join(e.alerts) or None),
        ],
    )
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- summary rows


@dataclass(frozen=True)
class SummaryRow:
    scenario: str
    faults: str
    accepted: int
    lost: int
    doubled: int
    executions: str
    recovery: str
    result: str


def summary_row(
    scenario: Scenario, verdict: Verdict, judgement: Judgement | None = None
) -> SummaryRow:
    accepted = max(verdict.accepted, 1)
    executions = (
        f"{verdict.total_executions} ({verdict.total_executions / accepted:.2f}/job, "
        f"max {verdict.max_executions})"
    )
    worst = verdict.max_recovery
    unmeasured = sum(1 for r in verdict.recovery if r.seconds is None)
    recovery = "–" if worst is None else f"max {worst:.1f}s"
    if unmeasured:
        recovery += f" ({unmeasured} unmeasured)"
    result = (
        f"expectations {passed_text(judgement.passed)}"
        if judgement is not None
        else f"checker {validity_text(verdict.valid)}"
    )
    return SummaryRow(
        scenario=scenario.name,
        faults=", ".join(scenario.fault_names) or "none",
        accepted=verdict.accepted,
        lost=verdict.lost,
        doubled=verdict.doubled,
        executions=executions,
        recovery=recovery,
        result=result,
    )


def summary_row_from_report(directory: str | os.PathLike[str]) -> SummaryRow:
    """The summary row stored in a report directory's ``report.json``."""
    data = json.loads((Path(directory) / REPORT_JSON).read_text(encoding="utf-8"))
    return SummaryRow(**data["summary"])


SUMMARY_HEADERS = (
    "scenario",
    "faults",
    "accepted",
    "lost",
    "doubled",
    "executions",
    "recovery",
    "result",
)


def summary_table(
    rows: Sequence[SummaryRow], *, fmt: Literal["markdown", "plain"] = "markdown"
) -> str:
    """One row per scenario, as a Markdown table or as aligned plain text."""
    cells = [[str(getattr(row, h)) for h in SUMMARY_HEADERS] for row in rows]
    if fmt == "markdown":
        return "\n".join(_table(SUMMARY_HEADERS, cells)) + "\n"
    if fmt != "plain":
        raise ValueError(f"fmt must be 'markdown' or 'plain', got {fmt!r}")
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(SUMMARY_HEADERS)]
    numeric = {"accepted", "lost", "doubled"}

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if h in numeric else v.ljust(w)
            for v, w, h in zip(values, widths, SUMMARY_HEADERS, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(SUMMARY_HEADERS), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- writing


@dataclass(frozen=True)
class ReportFiles:
    json: Path
    markdown: Path
    svg: Path


def report_data(
    verdict: Verdict,
    scenario: Scenario,
    history: Sequence[Op],
    *,
    judgement: Judgement | None = None,
) -> dict[str, Any]:
    """What ``report.json`` holds."""
    series = throughput(verdict, history)
    return {
        "scenario": scenario.to_dict(),
        "verdict": verdict.to_dict(),
        "judgement": judgement.to_dict() if judgement is not None else None,
        "fault_windows": [asdict(w) for w in fault_windows(history)],
        "throughput": {
            "bucket_seconds": series.bucket,
            "submitted": list(series.submitted),
            "finished": list(series.finished),
        },
        "history_ops": len(history),
        "summary": asdict(summary_row(scenario, verdict, judgement)),
    }


def write_report(
    directory: str | os.PathLike[str],
    verdict: Verdict,
    scenario: Scenario,
    history: Sequence[Op],
    *,
    judgement: Judgement | None = None,
) -> ReportFiles:
    """Write ``report.json``, ``report.md`` and ``timeline.svg`` into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out / REPORT_JSON, out / REPORT_MD, out / TIMELINE_SVG)
    data = report_data(verdict, scenario, history, judgement=judgement)
    files.json.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    files.markdown.write_text(
        render_markdown(verdict, scenario, history, judgement=judgement), encoding="utf-8"
    )
    files.svg.write_text(
        render_svg(verdict, history, title=f"{scenario.name}: submitted and finished jobs"),
        encoding="utf-8",
    )
    return files
