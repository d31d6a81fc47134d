"""The leasework processes' counters and gauges during a run, scraped from their /metrics.

:class:`MetricsSampler` scrapes every process each second into a :class:`CounterTracker`,
whose totals survive restarts; the nemesis asks it how busy the workers are before a fault
(:func:`worker_gauges`) and banks a process's counters just before it kills it; the runner
asks it whether any job is still in flight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from chaos.nemeses.base import PROCESSES, WAIT_GAUGES
from devstack.layout import APPS, HOST, WORKER_PORTS

# every leasework process's ops port (its /metrics)
OPS_PORTS: dict[str, int] = {name: APPS[name][1] for name in PROCESSES}


def worker_gauges(values: Mapping[str, float]) -> dict[str, float]:
    """The :data:`~chaos.nemeses.base.WAIT_GAUGES` of one scrape, by short name."""
    return {name: values[metric] for name, metric in WAIT_GAUGES.items() if metric in values}


def parse_metrics(text: str) -> dict[str, float]:
    """Sum of every sample by sample name (labels summed away)."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    return sums


class CounterTracker:
    """Counters of processes that may restart during a run (a restart resets them to 0).

    Each observation is keyed by the process and its ``process_start_time_seconds``: one
    incarnation. The run's total is, over all incarnations, the last value seen minus the
    first value seen for an incarnation that was already running when the run started (a
    later one started from zero). Increments between an incarnation's last scrape and its
    death are missed: the totals are lower bounds (the nemesis scrapes just before it kills
    or stops a process to keep that gap small).
    """

    def __init__(self, run_started_epoch: float) -> None:
        self.run_started_epoch = run_started_epoch
        self._first: dict[tuple[str, float], dict[str, float]] = {}
        self._last: dict[tuple[str, float], dict[str, float]] = {}

    def observe(self, process: str, started: float, values: Mapping[str, float]) -> None:
        key = (process, started)
        if key not in self._first:
            self._first[key] = dict(values) if started < self.run_started_epoch else {}
        self._last[key] = dict(values)

    def incarnations(self, process: str) -> int:
        return sum(1 for p, _ in self._last if p == process)

    def per_process(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for key, last in self._last.items():
            first = self._first.get(key, {})
            totals = out.setdefault(key[0], {})
            for name, value in last.items():
                totals[name] = totals.get(name, 0.0) + max(0.0, value - first.get(name, 0.0))
        return out

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for values in self.per_process().values():
            for name, value in values.items():
                out[name] = out.get(name, 0.0) + value
        return out


COUNTERS: tuple[str, ...] = (
    "leasework_fence_rejections_total",
    "leasework_lease_loss_cancellations_total",
    "leasework_fence_reseeds_total",
    "leasework_messages_skipped_total",
    "leasework_lease_conflicts_total",
    "leasework_lease_expirations_total",
    "leasework_relay_published_total",
    "leasework_relay_publish_failures_total",
    "leasework_retries_total",
)


class MetricsSampler:
    """Scrapes the leasework processes' /metrics every ``interval`` into a tracker."""

    def __init__(
        self,
        tracker: CounterTracker,
        ports: Mapping[str, int] = OPS_PORTS,
        names: Sequence[str] = COUNTERS,
        *,
        timeout: float = 1.0,
    ) -> None:
        self.tracker = tracker
        self.ports = dict(ports)
        self.names = tuple(names)
        self.http = httpx.AsyncClient(timeout=timeout)
        self.failures: dict[str, int] = {}

    async def aclose(self) -> None:
        await self.http.aclose()

    async def scrape(self, process: str) -> dict[str, float] | None:
        try:
            response = await self.http.get(f"http://{HOST}:{self.ports[process]}/metrics")
            response.raise_for_status()
            return parse_metrics(response.text)
        except (httpx.HTTPError, ValueError):
            self.failures[process] = self.failures.get(process, 0) + 1
            return None

    async def sample(self, process: str) -> dict[str, float] | None:
        """Scrape one process now and record its counters; None if it did not answer."""
        if process not in self.ports:
            return None
        values = await self.scrape(process)
        if values is None or "process_start_time_seconds" not in values:
            return values
        self.tracker.observe(
            process,
            values["process_start_time_seconds"],
            {n: values.get(n, 0.0) for n in self.names},
        )
        return values

    async def sample_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for process in self.ports:
                nursery.start_soon(self.sample, process)

    async def run(self, interval: float = 1.0) -> None:
        while True:
            await self.sample_all()
            await trio.sleep(interval)

    async def in_flight(self) -> tuple[float, list[str]]:
        """Jobs running on the workers now, and the workers that did not answer."""
        total, silent = 0.0, []
        for worker in WORKER_PORTS:
            values = await self.scrape(worker)
            if values is None:
                silent.append(worker)
            else:
                total += values.get("leasework_jobs_in_flight", 0.0)
        return total, silent
