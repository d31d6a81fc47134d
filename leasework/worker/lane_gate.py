"""How a lane's capacity and a queue's slots compose: the gate in front of the claim.

A queue's slots (:mod:`leasework.worker.slots`) bound what a worker holds of the queue; a
lane's capacity (:mod:`leasework.worker.lanes`) bounds what runs in it. Without this gate a
job waiting for a full lane would hold its queue slot while it waits, and a burst of one
lane's jobs (ten CPU-bound jobs for a process lane of two) would fill the queue's slots with
jobs that cannot run, starving the queue's other jobs.

So each lane but trio (which the slots alone bound) admits at most :func:`admission` of its
jobs past the claim stage in a worker, across its queues: its capacity running, and half a
queue's slots claimed and waiting for it. A message whose job's lane has admitted that many
is not claimed: it gives its queue slot back and waits here, unclaimed (no lease,
its job ``queued`` in Postgres, its offset not committed, so a crash redelivers it), in
arrival order, until a job of its lane leaves; then it takes a slot of its queue again and
is claimed (with the others let in at that moment, as one batch). Its queue's other jobs
meanwhile have every slot the lane's jobs do not hold: the jobs waiting for a lane hold at
most half of a queue's slots.

At most :data:`WAITING_ROOM` messages wait for a lane in a worker; past that, a message of
that lane keeps its slot while it waits, and the consumer reads ahead no further than the
slots let it (a backlog that deep belongs in a queue of its own: docs/architecture.md).
A job a wake-up starts passes by the gate (one at a time, into a quiet queue).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from leasework import metrics
from leasework.app import App
from leasework.lanes import Lane

# the lanes the gate admits to (the trio lane's jobs are bounded by the slots alone)
GATED_LANES = (Lane.THREAD, Lane.ASYNCIO, Lane.PROCESS)
# messages waiting unclaimed for their lane, per lane per worker: small records (a job id, a
# type, an offset) whose offsets hold back the commit; redelivered after a crash
WAITING_ROOM = 1000


def admission(capacity: int, slots: int) -> int:
    """How many of a lane's jobs a worker holds past the claim: its capacity running, and
    claimed and waiting for it at most half of a queue's ``slots`` (at least one). The other
    half is always the queue's other lanes' (measured: a tighter bound, twice the capacity,
    cost the thread lane a third of its throughput, its jobs let in a few at a time;
    docs/design-decisions.md, "How a lane's capacity and a queue's slots compose")."""
    return capacity + max(1, slots // 2)


@dataclass(eq=False)
class Waiter:
    """A message in its lane's line (:meth:`LaneGate.line_up`)."""

    message: object
    lane: Lane
    admitted: trio.Event = field(default_factory=trio.Event)


class LaneGate:
    """Admissions per lane, held from the claim until the job's slot is given back
    (:meth:`leave`, idempotent). ``lane_of`` names a job type's lane (None: not gated,
    such as a type this worker's app does not define, which the claim defers)."""

    def __init__(
        self,
        capacities: Mapping[Lane, int],
        lane_of: Callable[[str], Lane | None],
        slots: int,
    ) -> None:
        self._lane_of = lane_of
        self._free = {lane: admission(capacity, slots) for lane, capacity in capacities.items()}
        self._lines: dict[Lane, deque[Waiter]] = {lane: deque() for lane in capacities}
        # id(message) -> (message, lane): what each admitted message holds (the message is
        # kept so its id is not reused while it is admitted)
        self._held: dict[int, tuple[object, Lane]] = {}

    @classmethod
    def of_app(cls, app: App, capacity: Callable[[Lane], float], slots: int) -> LaneGate:
        """The gate of a worker running ``app``'s types, each lane's capacity by
        ``capacity``, each queue with ``slots`` (``worker_concurrency``)."""

        def lane_of(job_type: str) -> Lane | None:
            known = app.get(job_type)
            return None if known is None else known.lane

        return cls({lane: int(capacity(lane)) for lane in GATED_LANES}, lane_of, slots)

    def lane(self, job_type: str | None) -> Lane | None:
        """The gated lane a message's job runs in, or None if it is not gated."""
        if job_type is None:
            return None
        lane = self._lane_of(job_type)
        return lane if lane in self._free else None

    def try_enter(self, message: object, lane: Lane) -> bool:
        """Admit ``message`` now if its lane has room and nobody waits for it."""
        if self._free[lane] <= 0 or self._lines[lane]:
            return False
        self._free[lane] -= 1
        self._held[id(message)] = (message, lane)
        return True

    def holds(self, message: object) -> bool:
        """Whether ``message`` holds an admission."""
        return id(message) in self._held

    def room_to_wait(self, lane: Lane) -> bool:
        return len(self._lines[lane]) < WAITING_ROOM

    def line_up(self, message: object, lane: Lane) -> Waiter:
        """Put ``message`` at the end of ``lane``'s line (at once: the order is arrival's);
        :meth:`wait` for its turn."""
        waiter = Waiter(message, lane)
        self._lines[lane].append(waiter)
        metrics.lane_held_back.labels(lane.value).inc()
        return waiter

    async def wait(self, waiter: Waiter) -> None:
        """Until ``waiter`` is admitted; cancelled, it leaves the line (or, admitted just
        then, gives its room on)."""
        try:
            await waiter.admitted.wait()
        except BaseException:
            if waiter.admitted.is_set():
                self.leave(waiter.message)
            else:
                self._lines[waiter.lane].remove(waiter)
                metrics.lane_held_back.labels(waiter.lane.value).dec()
            raise

    def leave(self, message: object) -> None:
        """``message``'s job gave its slot back (finished, skipped or left): its lane's room
        goes to the first in line, if any. Nothing if it was not admitted."""
        held = self._held.pop(id(message), None)
        if held is None:
            return
        lane = held[1]
        line = self._lines[lane]
        if not line:
            self._free[lane] += 1
            return
        first = line.popleft()
        metrics.lane_held_back.labels(lane.value).dec()
        self._held[id(first.message)] = (first.message, lane)
        first.admitted.set()

    def waiting(self, lane: Lane) -> int:
        return len(self._lines[lane])

    def admitted(self, lane: Lane) -> int:
        return sum(1 for _, held in self._held.values() if held == lane)
