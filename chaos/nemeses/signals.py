"""Signals to a leasework process (the api, the relay, a worker): ``sigstop`` freezes every
process of the service (healed with SIGCONT), ``sigkill`` kills it and ``restart`` stops it
gracefully (SIGTERM, its drain); both are healed by starting it again, with the run's
environment, and waiting until it is ready.

Just before its signal the nemesis scrapes the target (:meth:`Hands.bank`): its counters,
which a kill would lose, and a worker's gauges. A worker is hit mid-job: unless the scenario
says what to wait for, the fault waits (up to :data:`MID_JOB_PATIENCE`) until the worker
runs at least one job.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from chaos.nemeses.base import PROCESS_NAME, PROCESSES, WORKERS, Fault, Hands, WaitFor

if TYPE_CHECKING:
    from chaos.nemesis import Injection

RANK = 2

MID_JOB_PATIENCE = 15.0
MID_JOB_WAIT = WaitFor("jobs_in_flight", 1.0, MID_JOB_PATIENCE)


@dataclass(frozen=True)
class ProcessFault(Fault):
    family: ClassVar[str] = "process"
    colour: ClassVar[str] = "#d62728"

    def target_problem(self, target: str | None) -> str | None:
        if target and PROCESS_NAME.match(target):
            return None
        return f"{target!r} is not a leasework process; expected one of {', '.join(PROCESSES)}"

    def random_target(
        self, rng: random.Random, processes: Sequence[str], proxies: Sequence[str]
    ) -> str:
        return rng.choice(list(processes))

    def affected(self, target: str | None) -> str:
        return f"{target} only"

    def default_wait(self, target: str | None) -> WaitFor | None:
        return MID_JOB_WAIT if target in WORKERS else None

    async def start(self, hands: Hands, injection: Injection) -> None:
        assert injection.target is not None
        await hands.bank(injection)  # what a signal would lose, just before it
        await self.signal(hands, injection.target)

    async def signal(self, hands: Hands, target: str) -> None:
        raise NotImplementedError

    async def heal(self, hands: Hands, injection: Injection) -> None:
        """The process was stopped: start it again with the run's environment."""
        assert injection.target is not None
        await hands.restart(injection.target)


@dataclass(frozen=True)
class Sigstop(ProcessFault):
    async def signal(self, hands: Hands, target: str) -> None:
        await hands.calls(hands.stack.pause, target)

    async def heal(self, hands: Hands, injection: Injection) -> None:
        if await hands.calls(hands.stack.is_running, injection.target):
            await hands.calls(hands.stack.resume, injection.target)


@dataclass(frozen=True)
class Sigkill(ProcessFault):
    async def signal(self, hands: Hands, target: str) -> None:
        await hands.calls(hands.stack.kill, target, signal.SIGKILL)


@dataclass(frozen=True)
class Restart(ProcessFault):
    async def signal(self, hands: Hands, target: str) -> None:
        await hands.calls(hands.stack.stop, target)


FAULTS: tuple[Fault, ...] = (
    Sigstop("sigstop"),
    Sigkill("sigkill", instant=True, restarts_target=True),
    Restart("restart", instant=True, restarts_target=True),
)
