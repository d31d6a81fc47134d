"""What a fault of the registry is made of, and the targets it may name.

A :class:`Fault` is one fault as scenarios name it (``latency``, ``sigkill``): its family
(which groups faults in the report and gives them their colour), the params it takes, whether
it lasts until healed, how it checks and draws its target and params, which leasework
processes it hits (for the report), and its ``start`` and ``heal``. The nemesis
(:mod:`chaos.nemesis`) lends a fault its :class:`Hands` for those two.

A heal must be idempotent and derived from the injection alone, so that whatever was started
can always be undone, also after an error or Ctrl-C.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from devstack.layout import KAFKA_NODE_IDS, WORKER_PORTS
from devstack.layout import PROXIES as STACK_PROXIES

if TYPE_CHECKING:
    from chaos.nemesis import Injection
    from chaos.stack import StackCalls
    from chaos.toxiproxy import ToxiproxyClient
    from devstack import Stack

# ---------------------------------------------------------------- the stack's targets

# toxiproxy proxies (devstack/layout.py, toxiproxy/proxies.json): kafka-N carries the api's and
# the relay's Kafka traffic, kafka-N-worker-M worker-M's (each broker advertises the proxy of
# the listener a client came in through)
PROXIES: tuple[str, ...] = tuple(STACK_PROXIES)  # the order seeds the random mix's targets
# links with no shared proxy, offered only as one worker's private link (worker-N/mail):
# ``mail`` is the worker's calls to the example shop's mail service (send_receipt's third
# party); a latency toxic on it is a slow third party
PRIVATE_LINKS: tuple[str, ...] = ("mail",)
WORKERS: tuple[str, ...] = tuple(WORKER_PORTS)  # the local stack's workers
# the leasework processes; the order seeds the random mix's targets
PROCESSES: tuple[str, ...] = (*WORKERS, "relay", "api")
KAFKA_NODES: tuple[str, ...] = tuple(f"kafka-{n}" for n in KAFKA_NODE_IDS)
PROCESS_NAME = re.compile(r"^(worker|relay|api)(-[1-9][0-9]*)?$")
WORKER_NAME = re.compile(r"worker-[1-9][0-9]*")

START_TIMEOUT = 90.0  # seconds a heal waits for a process it starts to be ready


class NemesisError(RuntimeError):
    """A fault cannot be set up as asked (the message says why and what to do)."""


def split_target(target: str | None) -> tuple[str | None, str | None]:
    """``worker-1/redis`` -> (``worker-1``, ``redis``); ``redis`` -> (None, ``redis``)."""
    if target and "/" in target:
        process, proxy = target.split("/", 1)
        return process, proxy
    return None, target


def fault_workers(target: str | None) -> tuple[str, ...]:
    """The workers whose gauges a fault's ``wait_for`` reads: the worker its target names
    (``worker-1``, ``worker-1/postgres``, ``kafka-2-worker-1``), else every worker of the
    stack (a shared link, Redis, a broker, the relay or the api: the workers' state is what
    the fault meets)."""
    named = WORKER_NAME.findall(target or "")
    return (named[-1],) if named else WORKERS


# ---------------------------------------------------------------- waiting for busy workers

# gauges of a worker a fault may wait for (``wait_for``): short name -> metric name
WAIT_GAUGES: dict[str, str] = {
    # handlers running now
    "jobs_in_flight": "leasework_jobs_in_flight",
    # outcomes handed to the completer and not yet durable (waiting for, or in, a batch)
    "completer_waiting": "leasework_completer_waiting",
}


@dataclass(frozen=True)
class WaitFor:
    """A fault's precondition: it starts once ``gauge`` (a key of :data:`WAIT_GAUGES`),
    summed over the workers it hits (:func:`fault_workers`), is at least ``at_least``, or
    once ``patience`` seconds have passed (the injection records which, and what it saw)."""

    gauge: str
    at_least: float = 1.0
    patience: float = 15.0

    @property
    def metric(self) -> str:
        return WAIT_GAUGES[self.gauge]

    @property
    def label(self) -> str:
        return f"{self.gauge} >= {self.at_least:g}"


# ---------------------------------------------------------------- a fault


@dataclass(frozen=True)
class Param:
    """One entry of a fault's ``params`` in a scenario file: a number in [``low``, ``high``]
    (kept as an integer when whole, unless ``whole`` is False), or, with ``choices``, one of
    those strings. ``required``: the scenario must give it."""

    name: str
    low: float = 0.0
    high: float = math.inf
    required: bool = False
    whole: bool = True
    choices: tuple[str, ...] = ()


class Hands(Protocol):
    """What a fault's start and heal may use (the nemesis provides it)."""

    calls: StackCalls  # blocking Stack calls, in a worker thread, one at a time
    toxiproxy: ToxiproxyClient
    say: Callable[[str], None]  # a line for the run's log

    @property
    def stack(self) -> Stack: ...

    def proxy_for(self, target: str | None) -> str:
        """The Toxiproxy proxy a toxic's target names (a private link's own proxy)."""
        ...

    async def bank(self, injection: Injection) -> None:
        """Scrape the target just before a signal (its counters; a worker's gauges)."""
        ...

    async def restart(self, name: str) -> None:
        """Start a leasework process again with the run's environment, wait until ready."""
        ...


@dataclass(frozen=True)
class Fault:
    """One fault. A family subclasses this once and sets the class variables; each fault of
    the family is an instance (or a further subclass, when its start and heal differ).

    ``lasts``: the fault holds until its heal (False: a one-off with nothing to undo; its
    duration defaults to 0 and the random mix gives it none). ``instant``: a duration of 0 is
    allowed (a kill, whose heal is the restart). ``default_target``: the target when a
    scenario gives none. ``restarts_target``: the heal starts the target process again, so
    its pid changes (the runner does not take that for interference). ``random_mix``: the
    default random mix may draw it (a fault added later says False, so the seeded schedules
    of existing scenarios do not change)."""

    name: str
    params: tuple[Param, ...] = ()
    lasts: bool = True
    instant: bool = False
    default_target: str | None = None
    restarts_target: bool = False
    random_mix: bool = True

    family: ClassVar[str] = ""  # groups faults: "toxic", "process", "kafka", "redis", "postgres"
    colour: ClassVar[str] = "#7f7f7f"  # the family's colour in the report's timeline

    # -------------------------------------------------------- scenario side (pure)

    def target_problem(self, target: str | None) -> str | None:
        """Why ``target`` does not fit this fault, or None when it does."""
        raise NotImplementedError

    def random_target(
        self, rng: random.Random, processes: Sequence[str], proxies: Sequence[str]
    ) -> str:
        """A target for the random mix (drawn from ``rng`` exactly as before: the seeded
        schedules of existing scenarios depend on it)."""
        raise NotImplementedError

    def random_params(self, rng: random.Random) -> dict[str, Any]:
        """Params for the random mix; none by default (and no draw from ``rng``)."""
        return {}

    def affected(self, target: str | None) -> str:
        """Which leasework processes the fault hits, in words (for the report)."""
        return str(target)

    def link(self, target: str | None) -> tuple[str, str] | None:
        """The (process, proxy) pair that needs a private proxy for this run, if any."""
        return None

    def default_wait(self, target: str | None) -> WaitFor | None:
        """What the fault waits for before it starts when its scenario says nothing."""
        return None

    # -------------------------------------------------------- the run

    async def resolve(self, hands: Hands, target: str | None) -> str | None:
        """The target as it is when the fault starts (``coordinator`` -> ``kafka-3``)."""
        return target

    async def start(self, hands: Hands, injection: Injection) -> None:
        raise NotImplementedError

    async def heal(self, hands: Hands, injection: Injection) -> None:
        raise NotImplementedError
