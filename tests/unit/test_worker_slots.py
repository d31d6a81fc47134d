"""The worker's concurrency bound (Trio's MockClock: no sleeping)."""

from __future__ import annotations

import trio
import trio.testing

from leasework.worker.slots import Slots


async def test_take_waits_for_one_free_slot_then_takes_every_free_one_up_to_its_limit(
    autojump_clock,
):
    slots = Slots(5)
    assert await slots.take(3) == 3
    assert await slots.take(500) == 2  # what was left
    assert slots.held == 5
    taken: list[int] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _take_into(slots, taken))
        await trio.sleep(1)
        assert taken == []  # none free: it waits
        slots.release(2)
    assert taken == [2] and slots.held == 5


async def _take_into(slots: Slots, taken: list[int]) -> None:
    taken.append(await slots.take(500))


async def test_idle_returns_once_every_slot_is_back(autojump_clock):
    slots = Slots(4)
    await slots.idle()  # none held: at once
    await slots.take(3)
    slots.release(0)  # nothing given back: still held
    with trio.fail_after(10):  # a hang is a failure
        async with trio.open_nursery() as nursery:

            async def give_back_later() -> None:
                await trio.sleep(1)
                slots.release(2)
                await trio.sleep(1)
                slots.release()

            nursery.start_soon(give_back_later)
            begin = trio.current_time()
            await slots.idle()
            assert trio.current_time() - begin == 2  # not at the first release
    assert slots.held == 0 and await slots.take(500) == 4


async def test_a_lent_slot_is_beyond_the_capacity_and_quiet_is_nothing_in_flight(
    autojump_clock,
):
    slots = Slots(2)
    assert slots.quiet()  # nothing held
    slots.lend()  # a woken job
    assert slots.held == 1 and not slots.quiet()
    assert await slots.take(500) == 2  # the capacity is still all there
    assert slots.held == 3
    slots.release(2)
    assert not slots.quiet()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slots.idle)
            await trio.sleep(1)
            slots.give_back_lent()  # the woken job ended: idle
    assert slots.held == 0 and slots.lent == 0 and slots.quiet()


async def _take_as(slots: Slots, band: int, at_most: int, served: list[tuple[int, int]]) -> None:
    served.append((band, await slots.take(at_most, band)))


async def test_a_freed_slot_goes_to_the_highest_band_waiting_whoever_came_first(autojump_clock):
    slots = Slots(2)
    await slots.take(2)
    served: list[tuple[int, int]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_take_as, slots, 3, 5, served)
        await trio.sleep(0.1)
        nursery.start_soon(_take_as, slots, 1, 5, served)
        await trio.sleep(0.1)
        nursery.start_soon(_take_as, slots, 0, 5, served)
        await trio.sleep(0.1)
        assert slots.available() == 0
        for _ in range(3):
            slots.release()
            await trio.testing.wait_all_tasks_blocked()
    assert served == [(0, 1), (1, 1), (3, 1)]


async def test_a_waiting_band_rises_a_level_per_aging_period_so_it_is_not_starved(
    autojump_clock,
):
    slots = Slots(1, aging=1.0)
    await slots.take(1)
    served: list[tuple[int, int]] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_take_as, slots, 2, 1, served)  # waits from t=0
        await trio.sleep(1.5)  # risen to band 1
        nursery.start_soon(_take_as, slots, 1, 1, served)  # band 1, but since t=1.5
        await trio.sleep(0.1)
        slots.release()  # equal bands now: the longer waiting goes first
        await trio.testing.wait_all_tasks_blocked()
        assert served == [(2, 1)]
        await trio.sleep(0.1)
        nursery.start_soon(_take_as, slots, 0, 1, served)
        await trio.sleep(0.1)
        slots.release(1)
        await trio.testing.wait_all_tasks_blocked()
        assert served == [(2, 1), (0, 1)]  # the band 1 waiter has not yet risen to 0
        slots.release(1)
    assert served == [(2, 1), (0, 1), (1, 1)]


async def test_a_cancelled_wait_takes_nothing(autojump_clock):
    slots = Slots(1)
    await slots.take(1)
    with trio.move_on_after(1):
        await slots.take(1, 2)
    slots.release()
    assert slots.held == 0 and slots.available() == 1
