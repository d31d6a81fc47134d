"""The loop every relay service runs, written once: :func:`run_passes`.

A service does its work in passes (``run_once()``), each returning a :class:`Pass`, a small
record of what it did. The loop runs the next pass at once while the last one says more is
waiting (it filled its batch), waits the service's interval when it is idle (or until the
service's own wake-up, the outbox relay's NOTIFY), and after a pass that failed waits a
backoff that doubles with each failure in a row up to a cap and starts over after the first
pass that succeeds. A failed pass never ends the loop: a database error (or another error
the service expects, Kafka's for the outbox relay) is weather, logged as a warning; anything
else is a bug, logged with its traceback. Every failure is logged here, nowhere else.
``Cancelled`` is never caught.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import psycopg
import trio

log = logging.getLogger("leasework.relay.service")

MAX_BACKOFF = 5.0  # seconds: the longest a quick service waits after failures in a row


@dataclass(frozen=True)
class Backoff:
    """How long a service waits after a failed pass: ``first`` seconds after the first
    failure in a row, twice the last wait after each further one, never more than ``cap``."""

    first: float
    cap: float

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.cap:
            raise ValueError(f"a backoff needs 0 < first <= cap, got {self.first}, {self.cap}")

    @classmethod
    def from_interval(cls, interval: float, cap: float = MAX_BACKOFF) -> Backoff:
        """A failed pass first waits what an idle one waits (``interval``), then doubles up to
        ``cap`` (or the interval itself, when that is longer)."""
        return cls(interval, max(interval, cap))

    def after(self, previous: float) -> float:
        """The wait after one more failure, ``previous`` the wait after the last one (zero
        when the pass before it succeeded)."""
        return min(self.cap, max(self.first, previous * 2))


@dataclass(frozen=True)
class Setback:
    """A pass that ran without raising but could not do its work (Kafka did not acknowledge
    the outbox rows): logged as a warning with ``details`` and the backoff, and waited out as
    a failure is."""

    message: str
    details: Mapping[str, object] = field(default_factory=dict)


class Pass:
    """The base of what a service's ``run_once()`` returns: its own counts, plus what the loop
    asks of it. Nothing is waiting and nothing went wrong, unless a record says otherwise."""

    @property
    def more_waiting(self) -> bool:
        """The pass filled its batch: the next one runs at once, without waiting."""
        return False

    @property
    def setback(self) -> Setback | None:
        """Why the pass, though it raised nothing, did not get its work done."""
        return None


class Service(Protocol):
    """What the relay process starts: a maintenance service with its own loop."""

    async def run_once(self) -> Pass: ...

    async def run(self) -> None: ...


async def run_passes(
    name: str,
    run_once: Callable[[], Awaitable[Pass]],
    *,
    interval: float,
    backoff: Backoff,
    idle: Callable[[], Awaitable[object]] | None = None,
    expected: tuple[type[Exception], ...] = (psycopg.Error,),
) -> None:
    """Run ``run_once`` for ever: again at once while it says more is waiting, after
    ``interval`` seconds (or ``idle()``, when given) when it does not, after ``backoff`` when
    it raised or had a setback. ``name`` is the service's in the log; ``expected`` are the
    errors that are weather, not bugs."""
    waited = 0.0  # the last backoff; zero once a pass succeeded
    while True:
        try:
            done = await run_once()
        except Exception as exc:  # a failed pass keeps its rows for the next; the loop lives on
            waited = backoff.after(waited)
            pass_failed(name, exc, expected)
            await trio.sleep(waited)
            continue
        if (setback := done.setback) is not None:
            waited = backoff.after(waited)
            log.warning(setback.message, extra={**setback.details, "backoff": waited})
            await trio.sleep(waited)
            continue
        waited = 0.0
        if done.more_waiting:
            await trio.lowlevel.checkpoint()  # at once, but a cancel still gets through
        elif idle is not None:
            await idle()
        else:
            await trio.sleep(interval)


def pass_failed(name: str, exc: Exception, expected: tuple[type[Exception], ...]) -> None:
    """Log a failed pass of service ``name``, which tries again after its backoff. An
    ``expected`` error is weather; anything else is a bug, logged with its traceback."""
    if isinstance(exc, expected):
        log.warning(f"{name} pass failed", extra={"error": str(exc)[:300]})
    else:
        log.exception(f"{name} pass failed unexpectedly (a bug); retrying")
