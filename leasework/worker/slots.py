"""The worker's concurrency bound: a slot per message, held from the moment the consumer asks
Kafka for it until the message is settled (its offset marked finished, or left for
redelivery). Every job in flight, whether claiming, running or waiting for its fenced write,
holds one, so at most ``worker_concurrency`` of them are in flight; the drain waits until
none is held.

One more may be lent (:meth:`Slots.lend`) to a job a Postgres wake-up starts
(:mod:`leasework.worker.wakeup`), and only while the queue is quiet: nothing in flight, the
consumer's poll waiting with every free slot. At most ``worker_concurrency + 1`` jobs are then
in flight, as the next lend waits for quiet again.
"""

from __future__ import annotations

import trio


class Slots:
    def __init__(self, capacity: int) -> None:
        self._free = trio.Semaphore(capacity)
        self.held = 0
        self.polling = 0  # of those held, the ones a consumer's poll holds while it waits
        self.lent = 0
        self._idle = trio.Event()
        self._idle.set()

    async def take(self, at_most: int) -> int:
        """Wait for one free slot, then take every free one, up to ``at_most``."""
        await self._free.acquire()
        taken = 1
        while taken < at_most:
            try:
                self._free.acquire_nowait()
            except trio.WouldBlock:
                break
            taken += 1
        if self.held == 0:
            self._idle = trio.Event()
        self.held += taken
        return taken

    def release(self, count: int = 1) -> None:
        """Give back ``count`` slots: messages settled, or asked for and not received."""
        if count <= 0:
            return
        for _ in range(count):
            self._free.release()
        self.held -= count
        if self.held == 0:
            self._idle.set()

    def quiet(self) -> bool:
        """Nothing in flight: every slot held, if any, is a waiting poll's."""
        return self.held == self.polling

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
