"""The soak as a chaos scenario, generated in code (pure but for :func:`bench_rate`, which
reads the latest bench report).

- The rate: ``--rate``, else half the single-submit rate of the latest ``just bench``
  report under ``reports/bench/`` (its ``proxied-single`` row if it has one, the soak's
  links being the stack's own through Toxiproxy, else ``single``), else
  :data:`FALLBACK_RATE`. Where it came from is kept and printed in the report.
- The workload: the chaos client's mix at that rate for the whole soak: noops, delayed
  noops, jobs that fail twice before they succeed, ``ledger`` jobs (one effect through the
  fence) and orders through the example shop (``send_receipt``, its receipt recorded through
  the fence).
- The faults (:func:`soak_schedule`): one of the random mix in every minute (drawn by
  :func:`chaos.generator.draw_fault`), starting 5-25 s into the minute; with probability
  ``overlap`` a second one starts while the first still holds, on another target (and never
  a second broker while one is down: two of three brokers down is below the topics' min ISR).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from chaos import nemeses
from chaos.generator import draw_fault
from chaos.scenario import Expectations, FaultSpec, Mix, Scenario, WorkloadSpec

FALLBACK_RATE = 100.0  # submits/s when no bench report says better
BENCH_ROWS = ("proxied-single", "single")  # the bench rows a soak's rate may halve, preferred first
PERIOD = 60.0  # one fault (or two) per this many seconds
OFFSET = (5.0, 25.0)  # a minute's first fault starts this far into it
MIN_DURATION, MAX_DURATION = 3.0, 15.0  # of a fault that lasts
OVERLAP = 0.25  # chance that a minute's fault gets a second one overlapping it
OVERLAP_TRIES = 5  # draws for a second fault compatible with the first

MIX = Mix(noop=4, delayed=2, fail=1, ledger=3, receipt=1)


@dataclass(frozen=True)
class Rate:
    """Submits per second and where the number came from, in words."""

    per_second: float
    source: str


def bench_rate(reports: Path, rows: Sequence[str] = BENCH_ROWS) -> Rate | None:
    """Half the end-to-end rate of the latest bench report's single-submit row, or None
    when no report has one. Reports are ``reports/bench/<UTC time>/bench.json``; the latest
    is the last by name (the names are UTC times)."""
    for path in sorted(reports.glob("*/bench.json"), reverse=True):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        by_name = {r.get("name"): r for r in data.get("rows", []) if isinstance(r, dict)}
        for name in rows:
            measured = (by_name.get(name) or {}).get("e2e_per_s")
            if isinstance(measured, int | float) and measured > 0:
                return Rate(
                    round(measured / 2, 1),
                    f"half of {measured:.1f} jobs/s, the {name} row of {path}",
                )
    return None


def choose_rate(given: float | None, reports: Path) -> Rate:
    if given is not None:
        return Rate(given, "--rate")
    found = bench_rate(reports)
    if found is not None:
        return found
    return Rate(FALLBACK_RATE, f"no bench report under {reports}: the fallback {FALLBACK_RATE:g}/s")


def _compatible(first: FaultSpec, second: FaultSpec) -> bool:
    """Two faults may overlap: other targets, and not two brokers down at once."""
    if first.target == second.target:
        return False
    return not (first.kind == "kafka" and second.kind == "kafka")


def soak_schedule(
    seed: int,
    minutes: int,
    *,
    faults: Sequence[str] = nemeses.RANDOM_MIX,
    period: float = PERIOD,
    overlap: float = OVERLAP,
    min_duration: float = MIN_DURATION,
    max_duration: float = MAX_DURATION,
) -> tuple[FaultSpec, ...]:
    """A fault in every ``period`` of ``minutes`` periods, sometimes two overlapping; the
    same arguments always give the same schedule. Times are rounded to 0.1 s."""
    if not 0.0 <= overlap <= 1.0:
        raise ValueError(f"overlap must be a probability, got {overlap}")
    rng = random.Random(seed)
    schedule: list[FaultSpec] = []
    for minute in range(minutes):
        at = round(minute * period + rng.uniform(*OFFSET), 1)
        first = draw_fault(rng, at, faults, min_duration, max_duration)
        schedule.append(first)
        if rng.random() >= overlap:
            continue
        # while the first holds (an instant fault holds until its heal, a restart: seconds)
        second_at = round(at + rng.uniform(0.0, max(first.duration, 2.0)), 1)
        for _ in range(OVERLAP_TRIES):
            second = draw_fault(rng, second_at, faults, min_duration, max_duration)
            if _compatible(first, second):
                schedule.append(second)
                break
    return tuple(sorted(schedule, key=lambda f: f.at))


def overlapping(schedule: Sequence[FaultSpec]) -> int:
    """How many faults of a schedule start while an earlier one is planned to hold."""
    count, holds_until = 0, -math.inf
    for spec in sorted(schedule, key=lambda f: f.at):
        if spec.at <= holds_until:
            count += 1
        holds_until = max(holds_until, spec.stop)
    return count


def soak_scenario(minutes: int, rate: float, seed: int, *, overlap: float = OVERLAP) -> Scenario:
    """The soak as one chaos scenario: load for ``minutes`` minutes at ``rate`` submits/s,
    a fault per minute, no lost and no doubled job expected."""
    if minutes < 1 or rate <= 0:
        raise ValueError("a soak needs at least a minute and a positive rate")
    schedule = soak_schedule(seed, minutes, overlap=overlap)
    workload = WorkloadSpec(
        rate=rate,
        duration=minutes * PERIOD,
        mix=MIX,
        ledger_seconds=0.5,
        delay_seconds=5.0,
        fail_times=2,
        fail_max_attempts=10,
        max_attempts=10,
        timeout_seconds=30,
        # a client submits one key at a time: enough of them to keep the rate through a
        # second of latency, and to catch up after a stalled api
        clients=max(16, math.ceil(rate)),
        submit_timeout=3.0,
        quiet_timeout=300.0,
    )
    return Scenario(
        name=f"soak-{minutes}m",
        description=(
            f"The soak: {rate:g} submits/s of mixed jobs (fenced ledger effects, shop "
            f"receipts, retries, delayed jobs) for {minutes} minute(s), a fault of the random "
            f"mix every minute ({len(schedule)} faults, {overlapping(schedule)} overlapping "
            f"another), seed {seed}."
        ),
        workload=workload,
        faults=schedule,
        expect=Expectations(max_lost=0, max_doubled=0),
        source="tools/soak/plan.py",
    )
