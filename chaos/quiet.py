"""Waiting for the system to go quiet after the load: every job of the run terminal and no
worker running a job, seen twice in a row, or the scenario's patience spent. The tables are
read then."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import trio

from chaos.metrics import MetricsSampler
from chaos.poll import apoll
from chaos.tables import pending_jobs

QUIET_POLL = 1.0


@dataclass
class Quiet:
    reached: bool
    at: float  # history time
    waited: float
    pending: dict[str, int]
    in_flight: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


async def wait_quiet(
    recorder_now: Callable[[], float],
    prefix: str,
    sampler: MetricsSampler,
    patience: float,
    schedules: Sequence[str] = (),
) -> Quiet:
    """Until every job of the run (the workload's, and those its ``schedules`` inserted)
    is terminal and no worker runs a job, seen twice in a row; or ``patience`` seconds."""

    async def look() -> tuple[dict[str, int], float]:
        """The run's jobs not terminal yet, by status, and the jobs the workers run."""
        try:
            pending = await trio.to_thread.run_sync(pending_jobs, prefix, schedules)
        except psycopg.Error as exc:
            pending = {f"unreadable: {exc}"[:80]: 1}
        in_flight, _silent = await sampler.in_flight()
        return pending, in_flight

    quiet_in_a_row = 0

    def twice_quiet(seen: tuple[dict[str, int], float]) -> bool:
        nonlocal quiet_in_a_row
        pending, in_flight = seen
        quiet_in_a_row = quiet_in_a_row + 1 if not pending and in_flight == 0 else 0
        return quiet_in_a_row >= 2

    polled = await apoll(look, twice_quiet, patience=patience, interval=QUIET_POLL)
    waited = round(polled.waited, 3)
    if polled.met:
        return Quiet(True, recorder_now(), waited, {}, 0.0)
    pending, in_flight = polled.value
    return Quiet(False, recorder_now(), waited, pending, in_flight)
