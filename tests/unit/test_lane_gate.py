"""How a lane's capacity and a queue's slots compose (leasework/worker/lane_gate.py): a full
lane's jobs wait unclaimed without a queue slot, in arrival order, so the queue's other jobs
still run; at the worker's stop they are left for redelivery holding nothing."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

import trio

from leasework.lanes import Lane
from leasework.service import Stopping
from leasework.worker.claim import ClaimResult, ClaimStage, Started
from leasework.worker.consumer import Consumed
from leasework.worker.lane_gate import WAITING_ROOM, LaneGate, admission
from leasework.worker.offsets import Offsets
from leasework.worker.slots import Slots
from tests.unit.test_worker_claim import Claimer, start

LANE_OF = {"cpu": Lane.PROCESS, "blocking": Lane.THREAD, "quick": Lane.TRIO}


def gate(process: int = 1, thread: int = 1, slots: int = 2) -> LaneGate:
    capacities = {Lane.THREAD: thread, Lane.ASYNCIO: 1, Lane.PROCESS: process}
    return LaneGate(capacities, LANE_OF.get, slots)


def test_a_lane_admits_its_capacity_running_and_half_a_queues_slots_waiting():
    assert admission(2, 64) == 34 and admission(16, 64) == 48 and admission(2, 1) == 3
    g = gate(process=1)
    first, second, third = (Consumed(0, n, uuid.uuid4(), "cpu") for n in range(3))
    assert g.try_enter(first, Lane.PROCESS) and g.try_enter(second, Lane.PROCESS)
    assert not g.try_enter(third, Lane.PROCESS)
    assert g.try_enter(Consumed(0, 9, uuid.uuid4(), "blocking"), Lane.THREAD)  # its own room
    g.leave(first)
    g.leave(first)  # twice: nothing more
    assert g.admitted(Lane.PROCESS) == 1
    assert g.try_enter(third, Lane.PROCESS)
    g.leave(Consumed(0, 7, None))  # never admitted: nothing
    assert g.admitted(Lane.PROCESS) == 2


def test_only_a_known_type_of_a_gated_lane_is_gated():
    g = gate()
    assert g.lane("cpu") is Lane.PROCESS and g.lane("blocking") is Lane.THREAD
    assert g.lane("quick") is None  # the trio lane: the slots alone bound it
    assert g.lane("unknown") is None and g.lane(None) is None  # deferred by the claim


async def test_waiters_are_let_in_in_arrival_order_and_none_jumps_the_line():
    g = gate(process=1)
    holders = [Consumed(0, n, uuid.uuid4(), "cpu") for n in range(2)]
    for m in holders:
        assert g.try_enter(m, Lane.PROCESS)
    waiters = [Consumed(1, n, uuid.uuid4(), "cpu") for n in range(3)]
    let_in: list[int] = []

    async def wait(m: Consumed) -> None:
        await g.wait(g.line_up(m, Lane.PROCESS))
        let_in.append(m.offset)

    async with trio.open_nursery() as nursery:
        for m in waiters:
            nursery.start_soon(wait, m)
            await trio.testing.wait_all_tasks_blocked()
        assert g.waiting(Lane.PROCESS) == 3 and g.room_to_wait(Lane.PROCESS)
        g.leave(holders[0])
        await trio.testing.wait_all_tasks_blocked()
        assert not g.try_enter(Consumed(2, 0, uuid.uuid4(), "cpu"), Lane.PROCESS)  # no jump
        g.leave(holders[1])
        await trio.testing.wait_all_tasks_blocked()
        assert let_in == [0, 1]
        g.leave(waiters[0])
    assert let_in == [0, 1, 2] and g.waiting(Lane.PROCESS) == 0
    assert WAITING_ROOM >= 100


@dataclass
class GatedStage:
    """A claim stage of a queue of 4 slots behind a gate whose process lane has 1 runner
    (2 admitted: ``slots=2`` for the admission), every claim started."""

    messages: list[Consumed]
    stopping: Stopping = field(default_factory=Stopping)

    def __post_init__(self) -> None:
        self.slots = Slots(4)
        self.offsets = Offsets(None, "jobs.ready")  # type: ignore[arg-type]
        self.claimer = Claimer(lambda ids: ClaimResult(started=[start(i) for i in ids]))
        self.started_in, self.started_out = trio.open_memory_channel[
            tuple[Consumed | None, Started]
        ](math.inf)
        self.batches_in, self.batches_out = trio.open_memory_channel[list[Consumed]](math.inf)
        self.gate = gate(process=1)
        self.stage = ClaimStage(
            self.claimer,  # type: ignore[arg-type]
            self.offsets,
            self.slots,
            self.stopping,
            self.started_in,
            ttl=10.0,
            gate=self.gate,
        )
        for m in self.messages:
            self.offsets.tracker.start(m.partition, m.offset)


async def test_a_full_lane_gives_its_waiting_jobs_slots_back_to_the_queues_other_jobs():
    # 4 CPU-bound jobs arrive, then a quick one; without the gate the quick one would wait
    # for a slot behind 2 jobs that cannot run
    cpu = [Consumed(0, n, uuid.uuid4(), "cpu") for n in range(4)]
    quick = Consumed(0, 4, uuid.uuid4(), "quick")
    t = GatedStage([*cpu, quick])
    slots, g, claimer = t.slots, t.gate, t.claimer
    async with trio.open_nursery() as nursery:
        nursery.start_soon(t.stage.run, t.batches_out)
        assert await slots.take(4) == 4
        t.batches_in.send_nowait(cpu)
        await trio.testing.wait_all_tasks_blocked()
        assert claimer.calls == [[cpu[0].job_id, cpu[1].job_id]]
        assert slots.held == 2 and g.waiting(Lane.PROCESS) == 2  # theirs given back

        assert await slots.take(1) == 1  # the quick job gets a slot at once
        t.batches_in.send_nowait([quick])
        await trio.testing.wait_all_tasks_blocked()
        assert claimer.calls[-1] == [quick.job_id]

        # the first CPU job ends: the next waiting one takes a slot again and is claimed
        slots.release()
        g.leave(cpu[0])
        await trio.sleep(0.05)  # (those let in are gathered a moment, then claimed together)
        assert claimer.calls[-1] == [cpu[2].job_id]
        assert slots.held == 3 and g.waiting(Lane.PROCESS) == 1
        handed_on = [t.started_out.receive_nowait()[0] for _ in range(4)]
        assert handed_on == [cpu[0], cpu[1], quick, cpu[2]]
        nursery.cancel_scope.cancel()


async def test_at_the_stop_a_job_waiting_for_its_lane_is_left_for_redelivery_holding_nothing():
    cpu = [Consumed(0, n, uuid.uuid4(), "cpu") for n in range(3)]
    t = GatedStage(cpu)
    slots, g, claimer, offsets = t.slots, t.gate, t.claimer, t.offsets
    async with trio.open_nursery() as nursery:
        nursery.start_soon(t.stage.run, t.batches_out)
        assert await slots.take(3) == 3
        t.batches_in.send_nowait(cpu)
        await trio.testing.wait_all_tasks_blocked()
        assert g.waiting(Lane.PROCESS) == 1
        t.stopping.set("test")
        await trio.testing.wait_all_tasks_blocked()
        assert g.waiting(Lane.PROCESS) == 0 and g.admitted(Lane.PROCESS) == 2
        assert slots.held == 2  # the two started jobs' only
        assert len(claimer.calls) == 1  # the waiting one was never claimed
        offsets.finish(0, 0)
        offsets.finish(0, 1)  # the two started jobs end; the third's offset is not finished
        assert offsets.tracker.positions() == {0: 2}
        t.batches_in.close()
    assert [m for m, _ in [x async for x in t.started_out]] == cpu[:2]
