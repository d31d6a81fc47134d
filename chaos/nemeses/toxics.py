"""Toxiproxy's faults on a link: a toxic added to the link's proxy (and removed to heal), or
the proxy disabled (``link_down``: connections refused, open ones closed; enabled to heal).

The target is a shared proxy of the stack, whose traffic several leasework processes share
(``postgres`` every process's, ``redis`` the workers', ``kafka-N`` the relay's,
``kafka-N-worker-M`` worker-M's), or one process's own link (``worker-1/redis``,
``api/postgres``): a proxy of its own, added for the run (:mod:`chaos.links`), with the
process restarted pointing at it. A single process's Kafka link is not offered: a broker
advertises the proxy of the listener a client came in through, and a client follows the
advertised address after bootstrap. ``worker-N/mail`` is a link with no shared proxy: the
worker's calls to the example shop's mail service.

Params are Toxiproxy's attributes, in its names and units, plus ``stream`` (``upstream``,
``downstream``, the default, or ``both``: one toxic each) and ``toxicity`` (0 to 1).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from chaos.nemeses.base import (
    PRIVATE_LINKS,
    PROCESS_NAME,
    PROXIES,
    Fault,
    Hands,
    NemesisError,
    Param,
    split_target,
)

if TYPE_CHECKING:
    from chaos.nemesis import Injection

RANK = 1  # the first faults of the vocabulary (the default random mix draws in this order)

STREAMS = ("upstream", "downstream", "both")
# what every toxic takes besides its attributes
COMMON_PARAMS = (
    Param("stream", choices=STREAMS),
    Param("toxicity", high=1.0, whole=False),
)


def toxic_bodies(fault: str, params: Mapping[str, Any], stem: str) -> list[dict[str, Any]]:
    """Toxiproxy toxic definitions for a toxic fault (one per stream; ``both`` is two).
    ``stem`` is the injection's unique stem."""
    attributes = dict(params)
    stream = attributes.pop("stream", "downstream")
    toxicity = float(attributes.pop("toxicity", 1.0))
    streams = ("upstream", "downstream") if stream == "both" else (stream,)
    return [
        {
            "name": f"{stem}-{s}",
            "type": fault,
            "stream": s,
            "toxicity": toxicity,
            "attributes": dict(attributes),
        }
        for s in streams
    ]


def _no_params(rng: random.Random) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class LinkFault(Fault):
    """A fault on a link: a shared proxy or one process's own."""

    family: ClassVar[str] = "toxic"
    colour: ClassVar[str] = "#ff7f0e"

    def target_problem(self, target: str | None) -> str | None:
        if target in PROXIES:
            return None
        process, proxy = split_target(target)
        if process is not None:
            if PROCESS_NAME.match(process) and proxy in PROXIES:
                return None
            if proxy in PRIVATE_LINKS and re.fullmatch(r"worker-[1-9][0-9]*", process):
                return None
        return (
            f"{target!r} is not a toxiproxy proxy; expected one of {', '.join(PROXIES)}, "
            "or PROCESS/PROXY for one process's link (e.g. 'worker-1/postgres'), or "
            f"worker-N/LINK for one worker's link to {', '.join(PRIVATE_LINKS)} "
            "(the example shop's mail service)"
        )

    def random_target(
        self, rng: random.Random, processes: Sequence[str], proxies: Sequence[str]
    ) -> str:
        return rng.choice(list(proxies))

    def link(self, target: str | None) -> tuple[str, str] | None:
        process, proxy = split_target(target)
        if process is None or proxy is None:
            return None
        if proxy.startswith("kafka"):
            raise NemesisError(
                f"{target}: a single process's Kafka link is not offered (a broker "
                "advertises the proxy of the listener a client came in through, so a "
                "client would leave a private proxy after bootstrap); target kafka-N for "
                "the relay's links or kafka-N-worker-M for one worker's"
            )
        return process, proxy

    def affected(self, target: str | None) -> str:
        process, proxy = split_target(target)
        if process is not None:
            return f"{process} only: its own {proxy} proxy, added for this run"
        if target == "postgres":
            return (
                "api, relay, worker-1, worker-2: the shared proxy carries every leasework "
                "process's Postgres traffic (the harness reads Postgres directly)"
            )
        if target == "redis":
            return "worker-1, worker-2: the shared proxy; only workers use Redis"
        if target and (match := re.fullmatch(r"(kafka-\d+)-(worker-\d+)", target)):
            broker, worker = match.groups()
            return (
                f"{worker} only (fetches, group coordinator, offset commits) whenever it "
                f"talks to {broker}: its own proxy; the other worker's and the relay's links "
                "and replication between brokers are untouched"
            )
        if target and target.startswith("kafka-"):
            return (
                f"relay (the producer; the api does not use Kafka) whenever it talks to "
                f"{target}; the workers use {target}-worker-N, replication between brokers "
                "is direct"
            )
        return str(target)


@dataclass(frozen=True)
class Toxic(LinkFault):
    """A Toxiproxy toxic of type ``name``; ``draw`` gives the random mix's attributes."""

    draw: Callable[[random.Random], dict[str, Any]] = _no_params

    def random_params(self, rng: random.Random) -> dict[str, Any]:
        return self.draw(rng)

    async def start(self, hands: Hands, injection: Injection) -> None:
        proxy = hands.proxy_for(injection.target)
        for body in toxic_bodies(self.name, injection.spec.params, injection.stem):
            await hands.toxiproxy.add_toxic(proxy, body)

    async def heal(self, hands: Hands, injection: Injection) -> None:
        proxy = hands.proxy_for(injection.target)
        for body in toxic_bodies(self.name, injection.spec.params, injection.stem):
            await hands.toxiproxy.remove_toxic(proxy, body["name"])


@dataclass(frozen=True)
class LinkDown(LinkFault):
    """The proxy disabled: connections refused, open ones closed."""

    async def start(self, hands: Hands, injection: Injection) -> None:
        await hands.toxiproxy.set_enabled(hands.proxy_for(injection.target), False)

    async def heal(self, hands: Hands, injection: Injection) -> None:
        await hands.toxiproxy.set_enabled(hands.proxy_for(injection.target), True)


def _latency(rng: random.Random) -> dict[str, Any]:
    latency = rng.choice([100, 250, 500, 1000, 2000])
    return {"latency": latency, "jitter": latency // 4}


def _slicer(rng: random.Random) -> dict[str, Any]:
    size = rng.choice([1, 8, 64])
    return {"average_size": size, "size_variation": size // 2, "delay": rng.choice([10, 1000])}


FAULTS: tuple[Fault, ...] = (
    Toxic(
        "latency",  # ms
        (Param("latency", 0, 600_000, True), Param("jitter", 0, 600_000), *COMMON_PARAMS),
        draw=_latency,
    ),
    Toxic(
        "timeout",  # ms; 0 holds data until the toxic goes
        (Param("timeout", 0, 3_600_000), *COMMON_PARAMS),
        draw=lambda rng: {"timeout": rng.choice([0, 500, 2000])},
    ),
    Toxic(
        "reset_peer",  # ms before the reset
        (Param("timeout", 0, 3_600_000), *COMMON_PARAMS),
        draw=lambda rng: {"timeout": rng.choice([0, 100, 1000])},
    ),
    Toxic(
        "bandwidth",  # KB/s
        (Param("rate", 0, 10_000_000, True), *COMMON_PARAMS),
        draw=lambda rng: {"rate": rng.choice([1, 8, 64])},
    ),
    Toxic(
        "slicer",
        (
            Param("average_size", 1, 1_000_000, True),  # bytes
            Param("size_variation", 0, 1_000_000),  # bytes
            Param("delay", 0, 60_000_000),  # microseconds between slices
            *COMMON_PARAMS,
        ),
        draw=_slicer,
    ),
    Toxic(
        "limit_data",  # close after this many bytes
        (Param("bytes", 0, 1 << 40, True), *COMMON_PARAMS),
        draw=lambda rng: {"bytes": rng.choice([64, 1024, 65536])},
    ),
    LinkDown("link_down", COMMON_PARAMS),
)
