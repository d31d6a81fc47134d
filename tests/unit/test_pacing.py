"""The adaptive batching rule (:class:`leasework.pacing.Pacer`) on a hand-driven clock, and
the completer's use of it on Trio's autojump clock: a lone item goes at once, a stream
becomes batches no closer than the window."""

from __future__ import annotations

import uuid

import pytest
import trio

from leasework.pacing import Pacer
from leasework.states import Status
from leasework.worker.completer import Completer, Finished


def test_an_idle_stage_goes_at_once():
    pacer = Pacer(0.025)
    assert pacer.delay(100.0) == 0.0  # nothing ever started
    pacer.started(100.0)
    assert pacer.delay(100.025) == 0.0
    assert pacer.delay(101.0) == 0.0


def test_a_busy_stage_waits_what_is_left_of_the_window():
    pacer = Pacer(0.025)
    pacer.started(100.0)
    assert pacer.delay(100.005) == pytest.approx(0.020)
    assert pacer.delay(100.0) == pytest.approx(0.025)
    assert pacer.delay(100.01) > 0


def test_a_batch_that_ran_longer_than_the_window_is_followed_at_once():
    pacer = Pacer(0.025)
    pacer.started(100.0)
    assert pacer.delay(100.040) == 0.0  # the last flush took 40 ms: Nagle, no timer


def test_batch_starts_are_never_closer_than_the_window():
    pacer = Pacer(0.02)
    starts = []
    now = 0.0
    for _ in range(50):  # an item every 3 ms, each batch starting when the pacer allows
        now += 0.003
        now += pacer.delay(now)
        pacer.started(now)
        starts.append(now)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= 0.02 - 1e-9


@pytest.mark.parametrize("window", [-0.1, float("nan")])
def test_a_window_must_be_seconds(window):
    with pytest.raises(ValueError, match="window"):
        Pacer(window)


class RecordingCompleter(Completer):
    """The real batching loop (:meth:`Completer.run`); each flush is recorded, takes 1 ms,
    and answers its waiters."""

    def __init__(self) -> None:
        super().__init__(None, None, dlq_topic="dlq", max_wait=0.015)  # type: ignore[arg-type]
        self.batches: list[tuple[float, int]] = []

    async def flush(self, batch):  # type: ignore[override]
        self.batches.append((trio.current_time(), len(batch)))
        await trio.sleep(0.001)
        for waiting in batch:
            waiting.finished = Finished(uuid.uuid4(), Status.SUCCEEDED)
            waiting.done.set()
        return []


async def batches_for(arrivals: list[float]) -> list[tuple[float, int]]:
    """The completer's batches (start, size) for outcomes handed in at ``arrivals`` (s)."""
    completer = RecordingCompleter()

    async def outcome_at(at: float) -> None:
        await trio.sleep(at)
        await completer.complete(object(), object())  # type: ignore[arg-type]

    async with trio.open_nursery() as nursery:
        await nursery.start(completer.run)
        async with trio.open_nursery() as outcomes:
            for at in arrivals:
                outcomes.start_soon(outcome_at, at)
        nursery.cancel_scope.cancel()
    return completer.batches


async def test_the_completer_writes_a_lone_outcome_at_once(autojump_clock):
    start = trio.current_time()
    [(written, size)] = await batches_for([1.0])
    assert size == 1
    assert written - start == pytest.approx(1.0)  # no 15 ms wait for company that never comes


async def test_the_completer_batches_a_stream_no_closer_than_its_window(autojump_clock):
    start = trio.current_time()
    arrivals = [1.0 + i * 0.001 for i in range(100)]  # 100 outcomes, one per millisecond
    batches = await batches_for(arrivals)
    assert sum(size for _, size in batches) == 100
    assert batches[0] == (pytest.approx(start + 1.0), 1)  # the first finds it idle
    gaps = [b[0] - a[0] for a, b in zip(batches, batches[1:], strict=False)]
    assert min(gaps) >= 0.015 - 1e-9
    assert len(batches) <= 1 + 100 * 0.001 / 0.015 + 1  # about one write per window
