"""Small line charts as inline SVG, drawn on the server (pure): no script, no chart library.
A chart is the coordinates a template puts in ``<polyline points=...>``; the optional
threshold (the SLO's 5 s) is a horizontal line the axis always includes."""

from __future__ import annotations

from dataclasses import dataclass

WIDTH = 600
HEIGHT = 120
PAD = 4  # pixels kept free at the top and bottom


@dataclass(frozen=True)
class Chart:
    points: str  # "x,y x,y ..." for <polyline>; empty when there is no data
    y_max: float  # the value at the top edge
    threshold_y: float | None  # pixel row of the threshold line
    latest: float | None  # the last value (None: no data)
    width: int = WIDTH
    height: int = HEIGHT

    @property
    def empty(self) -> bool:
        return not self.points


def line_chart(
    series: list[tuple[float, float]],
    *,
    start: float,
    end: float,
    threshold: float | None = None,
    width: int = WIDTH,
    height: int = HEIGHT,
) -> Chart:
    """``series`` of (time, value) between ``start`` and ``end`` (unix seconds) scaled into
    the box (points outside the window are left out); values below zero are drawn at zero."""
    series = [(t, v) for t, v in series if start <= t <= end]
    top = max([v for _, v in series] + ([threshold] if threshold is not None else []) + [0.0])
    y_max = top * 1.1 if top > 0 else 1.0
    span = max(end - start, 1e-9)

    def y(value: float) -> float:
        return round(PAD + (height - 2 * PAD) * (1 - max(value, 0.0) / y_max), 1)

    coordinates = " ".join(f"{round((t - start) / span * width, 1)},{y(v)}" for t, v in series)
    return Chart(
        points=coordinates,
        y_max=y_max,
        threshold_y=y(threshold) if threshold is not None else None,
        latest=series[-1][1] if series else None,
        width=width,
        height=height,
    )
