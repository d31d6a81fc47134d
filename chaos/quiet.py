"""Waiting for the system to go quiet after the load: every job of the run terminal and no
worker running a job, seen twice in a row, or the scenario's patience spent. The tables are
read then."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import trio

from chaos.metrics import MetricsSampler
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
) -> Quiet:
    """Until every job of the run is terminal and no worker runs a job, seen twice in a
    row; or ``patience`` seconds."""
    started = trio.current_time()
    stable = 0
    pending: dict[str, int] = {}
    in_flight = 0.0
    while True:
        try:
            pending = await trio.to_thread.run_sync(pending_jobs, prefix)
        except psycopg.Error as exc:
            pending = {f"unreadable: {exc}"[:80]: 1}
        in_flight, _silent = await sampler.in_flight()
        stable = stable + 1 if not pending and in_flight == 0 else 0
        waited = trio.current_time() - started
        if stable >= 2:
            return Quiet(True, recorder_now(), round(waited, 3), {}, 0.0)
        if waited >= patience:
            return Quiet(False, recorder_now(), round(waited, 3), pending, in_flight)
        await trio.sleep(QUIET_POLL)
