"""A fault an operator makes: ``queue_pause`` pauses a queue (``default`` unless the scenario
names another) for the fault's duration and resumes it at the heal, as ``leasework queues
pause`` and ``resume`` do (audited as actor ``chaos``). It is not a failure of a part but the
state a pause puts every worker in at once, while other faults (a SIGKILL) land: the judge
then holds the run to "no job of the queue started while it was paused"
(:func:`chaos.judge.pauses_held`, from :mod:`chaos.pauses`), beside every job once. Not in the
default random mix, so the seeded schedules of existing scenarios stay as they were.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import psycopg
import trio

from devstack.layout import POSTGRES_DIRECT_DSN
from leasework.operations import Actor
from leasework.queues import DEFAULT, name_error
from leasework.queues.operations import set_paused

if TYPE_CHECKING:
    from chaos.nemeses.base import Hands
    from chaos.nemesis import Injection

from chaos.nemeses.base import Fault

RANK = 6

ACTOR = Actor("chaos", "chaos")  # the audit log's actor of the harness's pauses


def toggle(queue: str, paused: bool) -> None:
    """Pause or resume ``queue`` on the stack (blocking)."""
    with psycopg.connect(POSTGRES_DIRECT_DSN, connect_timeout=10) as conn, conn.transaction():
        if set_paused(conn, queue, paused, ACTOR).queue is None:
            raise RuntimeError(f"no queue {queue!r} on the stack")


@dataclass(frozen=True)
class QueuePause(Fault):
    family: ClassVar[str] = "queue"
    colour: ClassVar[str] = "#17becf"

    def target_problem(self, target: str | None) -> str | None:
        if target is None or name_error(target) is None:
            return None
        return f"{target!r}: {self.name} names a queue (e.g. default, emails): {name_error(target)}"

    def random_target(
        self, rng: random.Random, processes: Sequence[str], proxies: Sequence[str]
    ) -> str:
        return DEFAULT

    def affected(self, target: str | None) -> str:
        return f"every worker's queue {target or DEFAULT}: paused, then resumed at the heal"

    async def start(self, hands: Hands, injection: Injection) -> None:
        await trio.to_thread.run_sync(toggle, injection.target or DEFAULT, True)

    async def heal(self, hands: Hands, injection: Injection) -> None:
        await trio.to_thread.run_sync(toggle, injection.target or DEFAULT, False)


FAULTS: tuple[Fault, ...] = (QueuePause("queue_pause", default_target=DEFAULT, random_mix=False),)
