"""The worker's concurrency bound for one queue: a slot per message, held from the moment the
message is handed to the claim stage until it is settled (its offset marked finished, or left
for redelivery). Every job in flight, whether claiming, running or waiting for its fenced
write, holds one, so at most ``worker_concurrency`` of a queue's jobs are in flight; the
drain waits until none is held.

The queue's priority bands (:mod:`leasework.queues.priorities`) share its slots. A band's consumer
takes slots for the messages it has received (:meth:`Slots.take`); when none is free it
waits, and a freed slot goes to the waiting band of the highest priority, a band rising one
level per :data:`~leasework.queues.priorities.AGING` seconds it has waited, so that under a flood of
high-priority jobs a low band is still served (in arrival order once it has risen to the
top). No slot is held while a consumer waits for Kafka: an idle band never keeps another's
slots.

One more may be lent (:meth:`Slots.lend`) to a job a Postgres wake-up starts
(:mod:`leasework.worker.wakeup`), and only while the queue is quiet: nothing in flight. At
most ``worker_concurrency + 1`` jobs are then in flight, as the next lend waits for quiet
again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from leasework.queues.priorities import AGING, HIGHEST


@dataclass
class _Waiter:
    band: int
    since: float
    at_most: int
    granted: trio.Event = field(default_factory=trio.Event)
    taken: int = 0

    def rank(self, now: float, aging: float) -> tuple[int, float]:
        """Who is served first: the highest band after aging, then the longest waiting."""
        risen = int((now - self.since) / aging) if aging > 0 else 0
        return (max(HIGHEST, self.band - risen), self.since)


class Slots:
    def __init__(self, capacity: int, aging: float = AGING) -> None:
        self.capacity = capacity
        self.aging = aging
        self.free = capacity
        self.held = 0
        self.lent = 0
        self._waiting: list[_Waiter] = []
        self._idle = trio.Event()
        self._idle.set()

    def available(self) -> int:
        """Slots free now and promised to nobody waiting."""
        return 0 if self._waiting else self.free

    async def take(self, at_most: int, band: int = HIGHEST) -> int:
        """Take free slots, up to ``at_most``; when none is free, wait for one (served by
        band, highest first, with aging; see the module's text). Returns how many, >= 1."""
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._waiting and self.free > 0:
            taken = self._grant(at_most)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return taken
        waiter = _Waiter(band, trio.current_time(), at_most)
        self._waiting.append(waiter)
        try:
            await waiter.granted.wait()
        except BaseException:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif waiter.taken:  # granted as it was cancelled: give them on
                self.release(waiter.taken)
            raise
        return waiter.taken

    def _grant(self, at_most: int) -> int:
        taken = min(self.free, at_most)
        self.free -= taken
        if self.held == 0 and taken:
            self._idle = trio.Event()
        self.held += taken
        return taken

    def release(self, count: int = 1) -> None:
        """Give back ``count`` slots: messages settled, or taken and not used."""
        if count <= 0:
            return
        self.free += count
        self.held -= count
        if self.held == 0:
            self._idle.set()
        self._serve()

    def _serve(self) -> None:
        """Hand free slots to the waiting bands, the first in :meth:`_Waiter.rank` first."""
        if not self._waiting:
            return
        now = trio.current_time()
        while self.free > 0 and self._waiting:
            first = min(self._waiting, key=lambda w: w.rank(now, self.aging))
            self._waiting.remove(first)
            first.taken = self._grant(first.at_most)
            first.granted.set()

    def quiet(self) -> bool:
        """Nothing in flight."""
        return self.held == 0

    def lend(self) -> None:
        """A slot beyond the capacity, for a job a wake-up starts while :meth:`quiet`; give it
        back with :meth:`give_back_lent`."""
        if self.held == 0:
            self._idle = trio.Event()
        self.held += 1
        self.lent += 1

    def give_back_lent(self) -> None:
        self.lent -= 1
        self.held -= 1
        if self.held == 0:
            self._idle.set()

    async def idle(self) -> None:
        """Return once no slot is held (at once if none is)."""
        await self._idle.wait()
