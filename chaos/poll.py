"""Polling until a condition holds or time runs out: the one wait-until loop of the harness,
the bench and the fencing demo.

:func:`poll` (blocking) and :func:`apoll` (Trio) call a probe, then every ``interval``
seconds again, until its value satisfies ``until`` or ``patience`` seconds have passed; the
deadline is checked between probes, so the probe runs at least once and is never cut short.
Both return the last value seen and whether the condition held: the caller decides whether
running out of time is an error.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


@dataclass(frozen=True)
class Polled(Generic[T]):
    value: T  # the probe's last value
    met: bool  # whether ``until`` held for it (False: time ran out first)
    waited: float  # seconds from the first probe to the last


def poll(
    probe: Callable[[], T],
    until: Callable[[T], object] = bool,
    *,
    patience: float,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> Polled[T]:
    """Call ``probe`` until ``until(value)`` is true (by default: until the value itself
    is) or ``patience`` seconds have passed, sleeping ``interval`` between calls."""
    started = clock()
    while True:
        value = probe()
        if until(value):
            return Polled(value, True, clock() - started)
        if clock() - started >= patience:
            return Polled(value, False, clock() - started)
        sleep(interval)


async def apoll(
    probe: Callable[[], Awaitable[T]],
    until: Callable[[T], object] = bool,
    *,
    patience: float,
    interval: float,
) -> Polled[T]:
    """:func:`poll` for an async probe, on the Trio clock."""
    started = trio.current_time()
    while True:
        value = await probe()
        if until(value):
            return Polled(value, True, trio.current_time() - started)
        if trio.current_time() - started >= patience:
            return Polled(value, False, trio.current_time() - started)
        await trio.sleep(interval)
