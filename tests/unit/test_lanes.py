"""Lanes without the stack: the declaration (which lane, what is refused), and each lane run
for real (threads, an asyncio loop, child processes) by :class:`Lanes` and by
:func:`run_here` (leasework.testing's way)."""

from __future__ import annotations

import os
import time
import uuid

import pytest
import trio

import leasework
from leasework.app import App
from leasework.context import EffectCall, JobContext
from leasework.errors import AppError
from leasework.lanes import Lane
from leasework.worker.execution import call_handler
from leasework.worker.lanes import LaneConfig, Lanes, run_here
from tests.unit import lane_handlers as h


def context() -> JobContext:
    return JobContext(uuid.uuid4(), "t", 1, 3, 7, "test-worker", payload={})


# ---------------------------------------------------------------- declaring


def test_a_plain_function_runs_in_a_thread_and_an_async_one_on_trio_by_default():
    app = App()

    @app.job()
    def plain(ctx): ...

    @app.job()
    async def coroutine(ctx): ...

    assert app.get("plain").lane is Lane.THREAD
    assert app.get("coroutine").lane is Lane.TRIO
    app.job("in_process", runs_in="process")(h.add)
    app.job("on_asyncio", runs_in="asyncio")(h.on_asyncio)
    assert app.get("in_process").lane is Lane.PROCESS
    assert app.get("on_asyncio").lane is Lane.ASYNCIO


@pytest.mark.parametrize(
    ("runs_in", "handler", "says"),
    [
        ("asyncio", h.add, "takes an async function"),
        ("trio", h.add, "takes an async function"),
        ("thread", h.on_asyncio, "takes a plain function"),
        ("process", h.on_asyncio, "takes a plain function"),
        ("process", lambda ctx: None, "a lambda does not pickle"),
        ("gpu", h.add, "runs_in is one of 'trio', 'thread', 'asyncio', 'process'"),
    ],
)
def test_a_handler_of_the_wrong_kind_for_its_lane_is_refused_with_why(runs_in, handler, says):
    with pytest.raises(AppError, match=says):
        App().job("t", runs_in=runs_in)(handler)


def test_a_nested_function_cannot_run_in_the_process_lane():
    def nested(ctx): ...

    with pytest.raises(AppError, match="defined inside a function"):
        App().job("t", runs_in="process")(nested)


def test_lane_hooks_are_checked_and_merged_by_include():
    app, other = App(), App()

    @other.on_lane_start("asyncio")
    async def open_pool(): ...

    with pytest.raises(AppError, match="takes an async function"):
        app.on_lane_start("asyncio")(lambda: None)
    app.include(other)
    assert app.lane_hooks[Lane.ASYNCIO]["start"] == [open_pool]


# ---------------------------------------------------------------- running, each lane


def typed(runs_in: str, handler) -> leasework.JobType:
    app = App()
    return app.job("t", runs_in=runs_in)(handler)


@pytest.mark.parametrize("runner", ["lanes", "here"])
async def test_each_lane_returns_the_value_and_the_effects_queued(runner):
    cases = [
        ("thread", h.add, {"a": 1, "b": 2}),
        ("process", h.add, {"a": 1, "b": 2}),
        ("asyncio", h.on_asyncio, {}),
    ]
    app = App()
    for runs_in, handler, _ in cases:
        app.job(f"t-{runs_in}", runs_in=runs_in)(handler)
    lanes = Lanes(app, LaneConfig(process=1))
    async with lanes.open():
        for runs_in, _, payload in cases:
            job_type = app.get(f"t-{runs_in}")
            ctx = context()
            run = lanes.run if runner == "lanes" else run_here
            value = await run(job_type, ctx, (ctx, payload))
            if runs_in == "asyncio":
                assert value == {"loop": "_UnixSelectorEventLoop"}
                continue
            assert value["sum"] == 3
            # the process lane's handler ran in a child, and its effect came back
            assert (value["pid"] != os.getpid()) is (runs_in == "process" and runner == "lanes")
            (effect,) = ctx.effects
            assert isinstance(effect, EffectCall) and effect(None) == 3


@pytest.mark.parametrize("runner", ["lanes", "here"])
async def test_a_child_failure_comes_back_as_type_message_and_whether_permanent(runner):
    app = App()
    refuses = app.job("refuses", runs_in="process")(h.refuses)
    oddly = app.job("oddly", runs_in="process")(h.fails_oddly)
    lambdas = app.job("lambdas", runs_in="process")(h.queues_a_lambda)
    lanes = Lanes(app, LaneConfig(process=1))
    run = lanes.run if runner == "lanes" else run_here
    async with lanes.open():
        ctx = context()
        ctx.payload = {"x": 1}
        refused = await call_handler(refuses, ctx, run)
        assert refused.permanent and refused.error == "Permanent: no: {'x': 1}"
        odd = await call_handler(oddly, context(), run)
        assert not odd.permanent and odd.error == "Unpicklable: 1/2"
        lam = await call_handler(lambdas, context(), run)
        assert lam.permanent and "queue a module-level function" in lam.error


async def test_a_blocking_thread_lane_handler_leaves_the_trio_loop_free():
    app = App()
    sleeps = app.job("sleeps")(h.sleeps)
    lanes = Lanes(app, LaneConfig(thread=2))
    ticks = 0

    async def tick():
        nonlocal ticks
        while True:
            await trio.sleep(0.01)
            ticks += 1

    async with lanes.open(), trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        ctx = context()
        assert await lanes.run(sleeps, ctx, (ctx, {"seconds": 0.5})) == "slept"
        nursery.cancel_scope.cancel()
    assert ticks > 20  # a blocked loop would have ticked once


async def test_a_cancelled_thread_handler_is_told_and_keeps_its_place_until_it_returns():
    app = App()
    sleeps = app.job("sleeps")(h.sleeps)
    lanes = Lanes(app, LaneConfig(thread=1))
    ctx = context()
    async with lanes.open():
        with trio.move_on_after(0.1):
            await lanes.run(sleeps, ctx, (ctx, {"seconds": 0.6}))
        assert ctx.cancelled
        assert lanes.limiters[Lane.THREAD].borrowed_tokens == 1  # the thread still runs
        began = trio.current_time()
        other = context()
        await lanes.run(sleeps, other, (other, {"seconds": 0.0}))
        assert trio.current_time() - began > 0.3  # it waited for the abandoned one


async def test_a_cancelled_process_handler_is_killed():
    app = App()
    spins = app.job("spins", runs_in="process")(h.spins)
    pid_of = app.job("pid", runs_in="process")(h.my_pid)
    lanes = Lanes(app, LaneConfig(process=1))
    async with lanes.open():
        ctx = context()
        first = await lanes.run(pid_of, ctx, (ctx,))
        began = time.monotonic()
        with trio.move_on_after(0.5):
            await lanes.run(spins, ctx, (ctx, {"seconds": 30}))
        assert time.monotonic() - began < 5
        second = await lanes.run(pid_of, ctx, (ctx,))
    assert first != second  # the spinning child was killed; a new one took its place


async def test_a_process_child_is_recycled_after_its_jobs():
    app = App()
    pid_of = app.job("pid", runs_in="process")(h.my_pid)
    lanes = Lanes(app, LaneConfig(process=1, max_jobs_per_child=2))
    async with lanes.open():
        ctx = context()
        pids = [await lanes.run(pid_of, ctx, (ctx,)) for _ in range(4)]
    assert pids[0] == pids[1] != pids[2] == pids[3]


async def test_a_cancelled_asyncio_handler_is_cancelled_on_its_loop():
    app = App()
    slow = app.job("slow", runs_in="asyncio")(h.on_asyncio)
    lanes = Lanes(app, LaneConfig())
    async with lanes.open():
        ctx = context()
        with trio.move_on_after(0.1) as scope:
            await lanes.run(slow, ctx, (ctx, {"seconds": 30}))
        assert scope.cancelled_caught and ctx.cancelled
        ctx = context()
        assert await lanes.run(slow, ctx, (ctx, {})) == {"loop": "_UnixSelectorEventLoop"}


# ---------------------------------------------------------------- a handler's own retry


@pytest.mark.parametrize("runs_in", ["thread", "process"])
async def test_a_handler_asks_for_its_own_retry_in_every_lane(runs_in):
    from datetime import timedelta

    from leasework.job import Job
    from leasework.outcomes import RetryDefaults
    from leasework.states import Status
    from leasework.worker.outcome import outcome_of

    app = App()
    job_type = app.job("t", runs_in=runs_in)(h.retries_in_a_minute)
    handled = await call_handler(job_type, context(), run_here)
    assert handled.retry_after == 60.0
    assert handled.error == "the handler asked to be retried in 60s: the bank is closed"
    job = Job.__new__(Job)  # only what outcome_of reads
    for field, value in {
        "attempt": 1,
        "max_attempts": 3,
        "retry_base": 1.0,
        "retry_cap": 2.0,
        "timeout_seconds": 30,
    }.items():
        object.__setattr__(job, field, value)
    outcome = outcome_of(job, handled, RetryDefaults(1, 2), timed_out=False, cancelled_by=None)
    assert (outcome.status, outcome.retry_in) == (Status.FAILED, 60.0)  # not the 2 s backoff
    object.__setattr__(job, "attempt", 3)
    last = outcome_of(job, handled, RetryDefaults(1, 2), timed_out=False, cancelled_by=None)
    assert last.status == Status.DEAD  # the attempt counted
    with pytest.raises(ValueError, match="0 to 2.592e"):
        leasework.Retry(after=-1)
    assert leasework.Retry(after=timedelta(minutes=2)).after == 120.0


@pytest.mark.parametrize("runner", ["lanes", "here"])
async def test_a_handler_declared_with_the_decorator_runs_in_a_child(runner):
    job_type = h.app.get("decorated")
    assert isinstance(h.decorated, leasework.JobType)  # the module's name is the type now
    lanes = Lanes(h.app, LaneConfig(process=1))
    run = lanes.run if runner == "lanes" else run_here
    async with lanes.open():
        ctx = context()
        pid = await run(job_type, ctx, (ctx, {}))
    assert (pid != os.getpid()) is (runner == "lanes")
