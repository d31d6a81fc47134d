"""A stop's two moments: the signal, which ends a role's waits, and the shutdown's deadline,
which ends what :meth:`Stopping.finishing` let run on (and abandons the thread it waited on).
On trio's clock, with a thread held on an event where a blocking call would be."""

from __future__ import annotations

import math
import threading

import trio
import trio.testing

from leasework.service import Stopping


async def test_a_finishing_block_outlives_the_stops_cancel_until_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stopping = Stopping()
    ended: list[float] = []
    finished: list[bool] = []

    async def pass_in_flight() -> None:
        with stopping.finishing() as scope:
            await trio.sleep(100)  # a publish Kafka does not answer
        finished.append(not scope.cancelled_caught)
        ended.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pass_in_flight)
        await trio.sleep(1)
        stopping.set("SIGTERM", trio.current_time() + 5)
        nursery.cancel_scope.cancel()  # the relay cancels its services at the stop
    assert stopping.reason == "SIGTERM"
    assert ended == [6.0]  # not at the cancel (1), not when the sleep ends (100)
    assert finished == [False]


async def test_a_finishing_block_ends_by_itself_when_the_stop_has_time_for_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stopping = Stopping()
    finished: list[bool] = []

    async def short_pass() -> None:
        with stopping.finishing() as scope:
            await trio.sleep(2)
        finished.append(not scope.cancelled_caught)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(short_pass)
        await trio.sleep(1)
        stopping.set("SIGTERM", trio.current_time() + 20)
        nursery.cancel_scope.cancel()
    assert finished == [True]
    assert trio.current_time() == 2.0  # when its own work ended


async def test_without_a_stop_a_finishing_block_has_no_deadline() -> None:
    stopping = Stopping()
    with stopping.finishing() as scope:
        assert scope.deadline == math.inf
        await trio.lowlevel.checkpoint()
    assert not scope.cancelled_caught


async def test_a_block_entered_after_the_deadline_is_cancelled_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stopping = Stopping()
    stopping.set("SIGINT", trio.current_time() - 1)
    with stopping.finishing() as scope:
        await trio.sleep(10)
    assert scope.cancelled_caught
    assert trio.current_time() == 0.0


async def test_a_second_signal_cuts_a_finishing_block_short(
    autojump_clock: trio.testing.MockClock,
) -> None:
    stopping = Stopping()
    ended: list[float] = []

    async def pass_in_flight() -> None:
        with stopping.finishing():
            await trio.sleep(100)
        ended.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pass_in_flight)
        await trio.sleep(1)
        stopping.set("SIGTERM", trio.current_time() + 20)
        await trio.sleep(2)
        stopping.cut_short()
    assert ended == [3.0]


async def test_the_deadline_abandons_the_thread_a_finishing_block_waits_on() -> None:
    """The thread is not waited for: it is still blocked when the block has ended."""
    stopping = Stopping()
    release = threading.Event()
    try:
        with trio.fail_after(10), stopping.finishing() as scope:
            stopping.set("SIGTERM", trio.current_time() + 0.2)
            await trio.to_thread.run_sync(release.wait, abandon_on_cancel=True)
        assert scope.cancelled_caught
        assert not release.is_set()
    finally:
        release.set()
