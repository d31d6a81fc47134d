"""Readiness: each dependency a process needs is probed in the background; ``/readyz`` reads
the latest results, so a request never waits on a dead server."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from leasework import metrics

log = logging.getLogger("leasework.health")

Probe = Callable[[], Awaitable[None]]  # returns when healthy, raises when not


@dataclass
class Health:
    interval: float = 1.0
    timeout: float = 3.0
    probes: dict[str, Probe] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    checked: set[str] = field(default_factory=set)
    # a process may declare itself not ready (draining, or a loop that cannot make progress)
    conditions: dict[str, str] = field(default_factory=dict)
    # failed start-up checks an override let this process start past ({"check", "found"}):
    # it is ready, but runs against an unsafe setup (leasework.preflight)
    overridden: list[dict[str, str]] = field(default_factory=list)
    # who blocked the event loop, for the loop-lag warning (a worker's loop guard says)
    blame: Callable[[], str | None] | None = None

    def add(self, name: str, probe: Probe) -> None:
        self.probes[name] = probe

    def ready(self) -> tuple[bool, dict[str, str]]:
        pending = {n: "not checked yet" for n in self.probes if n not in self.checked}
        problems = {**pending, **self.problems, **self.conditions}
        return not problems, problems

    def readiness(self, process_name: str, *, detail: bool) -> tuple[dict[str, Any], int]:
        """The body and status of ``/readyz``. Without ``detail`` it names the unavailable
        dependencies but not their errors (for a port that may face a network), and the
        overridden start-up checks but not what they found. An override never makes a
        process unready."""
        ok, problems = self.ready()
        body: dict[str, Any] = {"status": "ready" if ok else "not ready", "process": process_name}
        if problems:
            body["unavailable"] = problems if detail else {name: "unavailable" for name in problems}
        if self.overridden:
            body["overridden"] = (
                [dict(o) for o in self.overridden]
                if detail
                else [{"check": o["check"]} for o in self.overridden]
            )
        return body, (200 if ok else 503)

    async def check_once(self) -> None:
        async def one(name: str, probe: Probe) -> None:
            error: str | None = None
            with trio.move_on_after(self.timeout) as scope:
                try:
                    await probe()
                except Exception as exc:  # any failure of a probe means "not ready"
                    error = f"{type(exc).__name__}: {exc}".strip()[:300]
            if scope.cancelled_caught:
                error = f"no answer within {self.timeout:g}s"
            was = self.problems.get(name)
            if error is None:
                self.problems.pop(name, None)
                if was is not None:
                    log.info("dependency reachable again", extra={"dependency": name})
            else:
                self.problems[name] = error
                if was is None:
                    log.warning(
                        "dependency unreachable", extra={"dependency": name, "error": error}
                    )
            self.checked.add(name)
            metrics.dependency_up.labels(name).set(0 if error else 1)

        async with trio.open_nursery() as nursery:
            for name, probe in self.probes.items():
                nursery.start_soon(one, name, probe)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self.check_once()
            task_status.started()
            while True:
                await trio.sleep(self.interval)
                await self.check_once()
        finally:
            # a probe that keeps a connection (leasework.pgprobe) closes it with the process
            for probe in self.probes.values():
                close = getattr(probe, "close", None)
                if close is not None:
                    close()


# seconds a short sleep may wake late before it is logged: a loop blocked that long holds
# every task of the process (the relay's passes, a worker's claims, the api's requests)
BLOCKED_LOOP = 0.5


async def measure_event_loop_lag(
    period: float = 0.1,
    warn_after: float = BLOCKED_LOOP,
    blame: Callable[[], str | None] | None = None,
) -> None:
    """Observe how late a short sleep wakes: a blocked event loop shows up here, and a lag
    over ``warn_after`` seconds is logged as a warning as well, naming what ``blame()`` says
    blocked it (a worker's loop guard names the job type)."""
    while True:
        before = trio.current_time()
        await trio.sleep(period)
        lag = max(0.0, trio.current_time() - before - period)
        metrics.event_loop_lag.observe(lag)
        if lag > warn_after:
            culprit = blame() if blame is not None else None
            message = "event loop blocked: a task ran without yielding"
            if culprit is not None:
                message += f" (job type {culprit})"
            log.warning(
                message,
                extra={"blocked_seconds": round(lag, 3), "job_type": culprit},
            )
