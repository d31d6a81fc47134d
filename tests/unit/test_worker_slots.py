"""The worker's concurrency bound (Trio's MockClock: no sleeping)."""

from __future__ import annotations

import trio

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


async def test_a_lent_slot_is_beyond_the_capacity_and_only_a_waiting_poll_is_quiet(
    autojump_clock,
):
    slots = Slots(2)
    assert slots.quiet()  # nothing held
    slots.polling = await slots.take(500)  # the consumer's poll waits with both
    assert slots.quiet()
    slots.lend()  # a woken job, while the poll still holds both
    assert slots.held == 3 and not slots.quiet()
    slots.polling = 0
    slots.release(2)  # the poll came back empty
    assert not slots.quiet()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slots.idle)
            await trio.sleep(1)
            slots.give_back_lent()  # the woken job ended: idle
    assert slots.held == 0 and slots.lent == 0 and slots.quiet()
