"""``soak.svg``: the soak over time, in four panels on one time axis, every fault window
shaded in its fault's colour (the registry's, as in the chaos timeline): each process's RSS
as a percentage of its first sample (a line per life: a restart starts a new one), its open
descriptors, the Postgres connections (the server's count and each process's own), and the
p99 scheduling delay of the jobs due in each bucket, of all and of those outside the fault
windows, against the 1 s goal. Hand-written SVG; pure (a string from data).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from chaos import nemeses
from chaos.history import FaultWindow
from chaos.timeline import nice_step
from tools.soak.goals import DELAY_GOAL, RSS_TOLERANCE, Bucket, Reading, lives

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#ad494a",
    "#637939",
    "#843c39",
    "#5254a3",
    "#6b6ecf",
)
SERVER_COLOUR = "#000000"
ALL_DELAY_COLOUR = "#999999"
OUTSIDE_DELAY_COLOUR = "#1f77b4"
GOAL_COLOUR = "#d62728"
DELAY_CAP = 10.0  # seconds; a bucket's p99 above it is drawn at it


@dataclass(frozen=True)
class Line:
    """One series: its label and colour, and its segments (a gap between them)."""

    label: str
    colour: str
    segments: tuple[tuple[tuple[float, float], ...], ...]
    width: float = 1.3


@dataclass(frozen=True)
class Panel:
    title: str
    lines: tuple[Line, ...]
    references: tuple[tuple[float, str], ...] = ()  # y values drawn dashed, with a label
    y_floor: float | None = None
    y_cap: float | None = None


def _steps(low: float, high: float, step: float) -> list[float]:
    """``low``, ``low + step``, ... up to ``high`` (an axis's ticks)."""
    return [low + i * step for i in range(int((high - low) / step + 1e-9) + 1)]


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _segments(readings: Sequence[Reading], value) -> tuple[tuple[tuple[float, float], ...], ...]:
    out = []
    for life in lives(readings):
        points = tuple((r.t, v) for r in life.readings if (v := value(r)) is not None)
        if points:
            out.append(points)
    return tuple(out)


def process_panels(readings: Mapping[str, Sequence[Reading]]) -> tuple[Panel, Panel]:
    """The RSS (percent of the first sample) and descriptor panels, a line per process."""
    rss_lines, fd_lines = [], []
    for i, (name, series) in enumerate(sorted(readings.items())):
        colour = PALETTE[i % len(PALETTE)]
        first = next((r.rss_kib for r in sorted(series, key=lambda r: r.t) if r.rss_kib), None)
        if first:
            rss = _segments(
                series,
                lambda r, first=first: None if r.rss_kib is None else 100 * r.rss_kib / first,
            )
            rss_lines.append(Line(f"{name} ({first / 1024:.0f} MiB)", colour, rss))
        fd_lines.append(Line(name, colour, _segments(series, lambda r: r.fds)))
    band = RSS_TOLERANCE * 100
    rss_panel = Panel(
        "RSS, % of the process's first sample (a new line after each restart)",
        tuple(rss_lines),
        ((100 - band, f"-{band:g}%"), (100 + band, f"+{band:g}%")),
    )
    return rss_panel, Panel("open file descriptors", tuple(fd_lines), y_floor=0.0)


def connections_panel(
    readings: Mapping[str, Sequence[Reading]], server: Sequence[tuple[float, int]]
) -> Panel:
    lines = [Line("pg_stat_activity", SERVER_COLOUR, (tuple(server),), width=2.0)]
    for i, (name, series) in enumerate(sorted(readings.items())):
        if any(r.pg_links for r in series):
            colour = PALETTE[i % len(PALETTE)]
            lines.append(Line(name, colour, _segments(series, lambda r: r.pg_links)))
    return Panel("Postgres connections (the server's count; each process's own)", tuple(lines))


def delay_panel(buckets: Sequence[Bucket]) -> Panel:
    def series(get) -> tuple[tuple[tuple[float, float], ...], ...]:
        points = []
        segments = []
        for b in buckets:
            value = get(b)
            if value is None:
                if points:
                    segments.append(tuple(points))
                points = []
                continue
            points.append((b.start + b.width / 2, min(value, DELAY_CAP)))
        if points:
            segments.append(tuple(points))
        return tuple(segments)

    return Panel(
        f"scheduling delay, p99 of the jobs due in each bucket (s; capped at {DELAY_CAP:g})",
        (
            Line("all jobs", ALL_DELAY_COLOUR, series(lambda b: b.p99_all)),
            Line("outside faults", OUTSIDE_DELAY_COLOUR, series(lambda b: b.p99_outside), 2.0),
        ),
        ((DELAY_GOAL, f"goal {DELAY_GOAL:g}s"),),
        y_floor=0.0,
        y_cap=DELAY_CAP,
    )


def _y_range(panel: Panel) -> tuple[float, float, float]:
    values = [v for line in panel.lines for seg in line.segments for _, v in seg]
    values += [v for v, _ in panel.references]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    if panel.y_floor is not None:
        low = min(low, panel.y_floor)
    if panel.y_cap is not None:
        high = min(high, panel.y_cap)
    if high - low < 1e-9:
        low, high = low - 1, high + 1
    step = nice_step(high - low, 4)
    return math.floor(low / step) * step, math.ceil(high / step) * step, step


def render_svg(
    panels: Sequence[Panel],
    windows: Sequence[FaultWindow],
    horizon: float,
    *,
    title: str = "",
    width: int = 960,
    panel_height: int = 170,
) -> str:
    """The panels stacked on one time axis (minutes), fault windows shaded in each."""
    left, right, gap, legend_h = 56, 220, 34, 12
    plot_w = width - left - right
    horizon = max(horizon, 1.0)
    top0 = 40
    height = top0 + len(panels) * (panel_height + gap) + 30

    def x(t: float) -> float:
        return left + plot_w * min(max(t, 0.0), horizon) / horizon

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f"<title>{escape(title or 'soak')}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    if title:
        out.append(
            f'<text class="title" x="{left}" y="20" font-size="14" font-weight="bold">'
            f"{escape(title)}</text>"
        )
    t_step = nice_step(horizon / 60, 10) * 60  # ticks on whole minutes where they fit
    for n, panel in enumerate(panels):
        top = top0 + n * (panel_height + gap) + 14
        low, high, step = _y_range(panel)

        def y(v: float, low: float = low, high: float = high, top: int = top) -> float:
            return top + panel_height * (1 - (min(max(v, low), high) - low) / (high - low))

        out.append(f'<g class="panel" data-panel="{n}">')
        out.append(
            f'<text x="{left}" y="{top - 4}" font-weight="bold">{escape(panel.title)}</text>'
        )
        for w in windows:
            x0, x1 = x(w.start), x(w.stop if w.stop is not None else horizon)
            known = nemeses.REGISTRY.get(w.fault)
            colour = known.colour if known is not None else "#7f7f7f"
            out.append(
                f'<rect class="fault" data-fault={quoteattr(w.fault)} x="{x0:.1f}" y="{top}" '
                f'width="{max(x1 - x0, 1.5):.1f}" height="{panel_height}" fill="{colour}" '
                f'fill-opacity="0.16"><title>{escape(w.label)}</title></rect>'
            )
        out += [
            f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + plot_w}" y2="{y(v):.1f}" '
            f'stroke="#e4e4e4"/><text x="{left - 5}" y="{y(v) + 4:.1f}" '
            f'text-anchor="end" fill="#444444">{_fmt(v)}</text>'
            for v in _steps(low, high, step)
        ]
        for value, label in panel.references:
            if low <= value <= high:
                out.append(
                    f'<line class="reference" x1="{left}" y1="{y(value):.1f}" '
                    f'x2="{left + plot_w}" y2="{y(value):.1f}" stroke="{GOAL_COLOUR}" '
                    f'stroke-dasharray="5 3"/><text x="{left + plot_w - 2}" '
                    f'y="{y(value) - 3:.1f}" text-anchor="end" fill="{GOAL_COLOUR}">'
                    f"{escape(label)}</text>"
                )
        out.append(
            f'<rect x="{left}" y="{top}" width="{plot_w}" height="{panel_height}" '
            'fill="none" stroke="#444444"/>'
        )
        for line in panel.lines:
            for seg in line.segments:
                if len(seg) == 1:  # a life of one sample
                    (t, v), *_ = seg
                    out.append(
                        f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2" fill="{line.colour}">'
                        f"<title>{escape(line.label)}</title></circle>"
                    )
                    continue
                points = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in seg)
                out.append(
                    f'<polyline class="series" points="{points}" fill="none" '
                    f'stroke="{line.colour}" stroke-width="{line.width}">'
                    f"<title>{escape(line.label)}</title></polyline>"
                )
        for i, line in enumerate(panel.lines[: panel_height // legend_h]):
            ly = top + 8 + i * legend_h
            lx = left + plot_w + 10
            out.append(
                f'<line x1="{lx}" y1="{ly}" x2="{lx + 16}" y2="{ly}" stroke="{line.colour}" '
                f'stroke-width="2"/><text x="{lx + 20}" y="{ly + 4}">{escape(line.label)}</text>'
            )
        bottom = top + panel_height
        out += [
            f'<line x1="{x(t):.1f}" y1="{bottom}" x2="{x(t):.1f}" y2="{bottom + 4}" '
            f'stroke="#444444"/><text x="{x(t):.1f}" y="{bottom + 15}" '
            f'text-anchor="middle" fill="#444444">{_fmt(t / 60)}</text>'
            for t in _steps(0.0, horizon, t_step)
        ]
        out.append("</g>")
    out.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 8}" text-anchor="middle">'
        "minutes since the soak started (shaded: fault windows)</text>"
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"
