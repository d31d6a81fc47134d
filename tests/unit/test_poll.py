"""The shared wait-until loop (chaos.poll): it returns the last value and whether the
condition held, probes at least once, and checks its deadline only between probes."""

from __future__ import annotations

import trio

from chaos.poll import apoll, poll


class Clock:
    """A fake clock that the fake sleep moves forward."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_poll_stops_once_the_condition_holds():
    clock, values = Clock(), iter([0, 1, 2, 3])
    polled = poll(
        lambda: next(values),
        lambda v: v >= 2,
        patience=10,
        interval=0.5,
        clock=clock,
        sleep=clock.sleep,
    )
    assert (polled.value, polled.met, polled.waited) == (2, True, 1.0)
    assert clock.sleeps == [0.5, 0.5]


def test_poll_gives_up_after_its_patience_with_the_last_value():
    clock, calls = Clock(), []

    def probe() -> str:
        calls.append(clock.now)
        return ""

    polled = poll(probe, patience=1.0, interval=0.4, clock=clock, sleep=clock.sleep)
    assert polled.met is False and polled.value == ""
    assert calls == [0.0, 0.4, 0.8, 1.2000000000000002]  # the last look is past the deadline
    # no patience at all: one look
    assert poll(lambda: 0, patience=0, interval=1, clock=clock, sleep=clock.sleep).met is False


async def test_apoll_on_the_trio_clock(autojump_clock):
    seen = []

    async def probe() -> int:
        seen.append(trio.current_time())
        return len(seen)

    polled = await apoll(probe, lambda n: n == 3, patience=60, interval=2.0)
    assert polled.met and polled.value == 3 and polled.waited == 4.0
    late = await apoll(probe, lambda n: n > 100, patience=5, interval=2.0)
    assert not late.met and late.value == 7 and late.waited == 6.0
