"""A fault of Postgres itself, every leasework process's source of truth.

``postgres_restart`` stops the stack's Postgres (its fast shutdown: every connection of every
process is cut, open transactions roll back, and a COMMIT whose answer was on its way is
durable or not without its client knowing) and keeps it down for the fault's duration; the
heal starts it again and waits until it accepts connections. Meanwhile the api answers 503,
the relays and the workers retry. Not in the default random mix (:data:`chaos.nemeses.
RANDOM_MIX`), so the seeded schedules of existing scenarios stay as they were.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from chaos.nemeses.base import START_TIMEOUT, Fault, Hands

if TYPE_CHECKING:
    from chaos.nemesis import Injection

RANK = 5

POSTGRES = "postgres"  # the stack's name of the service, and this fault's only target


@dataclass(frozen=True)
class PostgresRestart(Fault):
    family: ClassVar[str] = "postgres"
    colour: ClassVar[str] = "#8c564b"

    def target_problem(self, target: str | None) -> str | None:
        if target in (None, POSTGRES):
            return None
        return (
            f"{target!r}: {self.name} acts on Postgres itself; leave target out or write 'postgres'"
        )

    def random_target(
        self, rng: random.Random, processes: Sequence[str], proxies: Sequence[str]
    ) -> str:
        return POSTGRES

    def affected(self, target: str | None) -> str:
        if target != POSTGRES:
            return str(target)
        return (
            "every leasework process: the api refuses submits (503), the relays and the "
            "workers retry until it is back"
        )

    async def start(self, hands: Hands, injection: Injection) -> None:
        await hands.calls(hands.stack.stop, POSTGRES)

    async def heal(self, hands: Hands, injection: Injection) -> None:
        await hands.calls(hands.stack.start, POSTGRES, timeout=START_TIMEOUT)


FAULTS: tuple[Fault, ...] = (
    PostgresRestart("postgres_restart", instant=True, default_target=POSTGRES, random_mix=False),
)
