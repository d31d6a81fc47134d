"""Faults of Redis itself (only the workers use it: leases and the fence counter).

``redis_restart`` SIGKILLs it and starts it again to heal (with the AOF, up to 1 s of writes
may be lost, so the fence counter may go back: the Postgres guard's job). ``redis_flushall``
wipes it (leases and fence counter gone): a one-off, nothing to undo.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from chaos.nemeses.base import START_TIMEOUT, Fault, Hands

if TYPE_CHECKING:
    from chaos.nemesis import Injection

RANK = 4

REDIS = "redis"  # the stack's name of the service, and these faults' only target


@dataclass(frozen=True)
class RedisFault(Fault):
    family: ClassVar[str] = "redis"
    colour: ClassVar[str] = "#2ca02c"

    def target_problem(self, target: str | None) -> str | None:
        if target in (None, REDIS):
            return None
        return f"{target!r}: {self.name} acts on Redis itself; leave target out or write 'redis'"

    def random_target(
        self, rng: random.Random, processes: Sequence[str], proxies: Sequence[str]
    ) -> str:
        return REDIS

    def affected(self, target: str | None) -> str:
        if target != REDIS:
            return str(target)
        return "worker-1, worker-2 (only workers use Redis: leases and the fence counter)"


@dataclass(frozen=True)
class RedisRestart(RedisFault):
    async def start(self, hands: Hands, injection: Injection) -> None:
        await hands.calls(hands.stack.kill, REDIS, signal.SIGKILL)

    async def heal(self, hands: Hands, injection: Injection) -> None:
        await hands.calls(hands.stack.start, REDIS, timeout=START_TIMEOUT)


@dataclass(frozen=True)
class RedisFlushall(RedisFault):
    async def start(self, hands: Hands, injection: Injection) -> None:
        await hands.calls(hands.stack.redis_flushall)

    async def heal(self, hands: Hands, injection: Injection) -> None:
        return  # nothing to undo


FAULTS: tuple[Fault, ...] = (
    RedisRestart("redis_restart", instant=True, default_target=REDIS),
    RedisFlushall("redis_flushall", lasts=False, instant=True, default_target=REDIS),
)
