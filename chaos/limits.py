"""A concurrency limit, seen from a chaos run: the demo's ``keyed`` type lets at most
:data:`LIMIT` of its jobs run at once per ``key``. Each committed effect of a keyed job says
when its handler began; the effect row's ``created_at`` is its finishing transaction's
start. From those spans, the most effects in flight at once for each key of the run. The
judge (:func:`chaos.judge.limits_held`) requires at most :data:`LIMIT`, and that some key
reached it (so a run whose keys never competed does not pass for one that held).

Only committed effects count: a worker frozen past its lease may still run its handler when
it wakes, but its fence is gone and its effect never commits, so it is not "in flight" in
any sense a user sees. With the fence off (the unsafe lease mode) such effects do commit.

:func:`read_limits` reads (blocking); :func:`most_in_flight` and :class:`LimitView` are pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC
from typing import Any

import psycopg
from psycopg.rows import dict_row

from chaos.tables import run_like
from devstack.layout import POSTGRES_DIRECT_DSN

LIMIT = 2  # leasework.demo's keyed: concurrency=2 per key


def most_in_flight(spans: list[tuple[float, float]]) -> int:
    """The most spans (begin, end) open at one instant; a span ending as another begins
    does not overlap it."""
    events = sorted([(end, -1) for _, end in spans] + [(begin, 1) for begin, _ in spans])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@dataclass(frozen=True)
class LimitView:
    """The most effects in flight at once per key of the run, and how many effects."""

    most: dict[str, int]
    effects: int

    @property
    def over(self) -> dict[str, int]:
        return {key: n for key, n in self.most.items() if n > LIMIT}

    @property
    def reached(self) -> bool:
        return any(n >= LIMIT for n in self.most.values())

    def cell(self) -> str:
        """The log's line."""
        peak = max(self.most.values(), default=0)
        return (
            f"{self.effects} keyed effect(s) over {len(self.most)} key(s); most in flight at "
            f"once for one key: {peak} (limit {LIMIT})"
            + (f"; OVER on {len(self.over)} key(s)" if self.over else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {"limit": LIMIT, "most_in_flight": self.most, "effects": self.effects}


def view_of(rows: list[dict[str, Any]]) -> LimitView:
    """The view from effect rows (``key``, ``began`` epoch seconds, ``ended`` datetime)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        ended = r["ended"]
        if ended.tzinfo is None:
            ended = ended.replace(tzinfo=UTC)
        spans.setdefault(r["key"], []).append((float(r["began"]), ended.timestamp()))
    return LimitView({k: most_in_flight(v) for k, v in spans.items()}, len(rows))


def read_limits(prefix: str) -> LimitView:
    """The run's keyed effects, as spans per key (blocking)."""
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT e.data->>'key' AS key, (e.data->>'began')::float8 AS began, "
            "e.created_at AS ended FROM effects e JOIN jobs j ON j.id = e.job_id "
            "WHERE j.idempotency_key LIKE %s AND e.kind = 'keyed'",
            (run_like(prefix),),
        ).fetchall()
    return view_of(rows)


RATE = 5  # leasework.demo's rated: 5/s per key, no burst
RATE_WINDOW = 1.0


def most_in_window(starts: list[float], window: float = RATE_WINDOW) -> int:
    """The most of ``starts`` (epoch seconds) within any ``window`` seconds (half-open)."""
    starts = sorted(starts)
    most, first = 0, 0
    for last, t in enumerate(starts):
        while starts[first] <= t - window:
            first += 1
        most = max(most, last - first + 1)
    return most


@dataclass(frozen=True)
class RateView:
    """The most rated handlers begun within any second per key of the run, and the rate
    each key kept over its busiest minute (starts in it over 60 s, keys with one only)."""

    most: dict[str, int]
    per_minute: dict[str, float]
    effects: int

    @property
    def allowed(self) -> int:
        # GCRA without burst: a window of W seconds holds at most W * rate + 1 starts
        return int(RATE * RATE_WINDOW) + 1

    @property
    def over(self) -> dict[str, int]:
        return {key: n for key, n in self.most.items() if n > self.allowed}

    @property
    def reached(self) -> bool:
        return any(n >= RATE * RATE_WINDOW for n in self.most.values())

    def cell(self) -> str:
        peak = max(self.most.values(), default=0)
        minute = ", ".join(f"{v:.2f}/s" for v in self.per_minute.values()) or "-"
        return (
            f"{self.effects} rated effect(s) over {len(self.most)} key(s); most begun in one "
            f"second for one key: {peak} (rate {RATE}/s, at most {self.allowed} in a window); "
            f"busiest minute per key: {minute}"
            + (f"; OVER on {len(self.over)} key(s)" if self.over else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {"rate": RATE, "most_in_a_second": self.most, "per_minute": self.per_minute}


def rate_view_of(rows: list[dict[str, Any]]) -> RateView:
    """The view from effect rows (``key``, ``began`` epoch seconds)."""
    starts: dict[str, list[float]] = {}
    for r in rows:
        starts.setdefault(r["key"], []).append(float(r["began"]))
    return RateView(
        {k: most_in_window(v) for k, v in starts.items()},
        {k: most_in_window(v, 60.0) / 60.0 for k, v in starts.items() if v[-1] - v[0] >= 60},
        len(rows),
    )


def read_rates(prefix: str) -> RateView:
    """The run's rated effects, as handler starts per key (blocking)."""
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT e.data->>'key' AS key, (e.data->>'began')::float8 AS began "
            "FROM effects e JOIN jobs j ON j.id = e.job_id "
            "WHERE j.idempotency_key LIKE %s AND e.kind = 'rated'",
            (run_like(prefix),),
        ).fetchall()
    return rate_view_of(rows)
