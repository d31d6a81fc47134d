"""The run's timeline, ``timeline.svg``: submitted and finished jobs per second over the run,
with each fault window shaded in its fault's colour (from the registry) and named above the
plot. Hand-written SVG; pure (a string from data).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from chaos import nemeses
from chaos.history import SUBMIT, FaultWindow, Op, fault_windows
from chaos.verdict import Verdict

_UNKNOWN_FAULT_COLOUR = "#7f7f7f"  # a fault the registry does not know (an older history)
_SUBMITTED_COLOUR = "#1f77b4"
_FINISHED_COLOUR = "#17becf"


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


def nice_step(span: float, ticks: int) -> float:
    """A round axis step (1, 2 or 5 times a power of ten) for about ``ticks`` ticks."""
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
    y_step = nice_step(peak, 5)
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
    t_step = nice_step(horizon, 10)
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
