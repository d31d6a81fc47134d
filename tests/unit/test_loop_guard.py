"""The loop guard (leasework/worker/loop_guard.py) on a real Trio loop and a real thread, with
stand-ins for Redis and Postgres: a loop blocked past the lease's deadline costs no running
handler its lease (and without the guard it does), a lease lost meanwhile is cancelled once
the loop runs, and the bounds end the worker."""

from __future__ import annotations

import functools
import logging
import time
import uuid

import trio

from leasework.app import App
from leasework.health import measure_event_loop_lag
from leasework.lease import Claim
from leasework.worker.heartbeat import CancelReason, RunningJob, lease_deadline
from leasework.worker.loop_guard import (
    EXIT_STATUS,
    SILENCE_WITHOUT_JOB,
    LoopGuard,
    trio_handlers,
)

TTL = 1.0
BLOCK = 2.0  # seconds the loop is blocked: twice the TTL


class Store:
    def __init__(self, lost: set[uuid.UUID]) -> None:
        self.lost = lost
        self.renewals = 0

    def renew_many(self, claims, ttl):
        self.renewals += 1
        return [c.job_id not in self.lost for c in claims]


class Leases:
    def __init__(self, lost: set[uuid.UUID] = frozenset()) -> None:  # type: ignore[assignment]
        self.store = Store(set(lost))


class Db:
    def run_blocking(self, fn, pairs, ttl):
        return {job_id: False for job_id, _ in pairs}


def running_job() -> RunningJob:
    claim = Claim(uuid.uuid4(), "test-worker", 1)
    return RunningJob(claim, trio.CancelScope(deadline=lease_deadline(trio.current_time(), TTL)))


def guard_of(jobs: list[RunningJob], leases: Leases, ended: list[int]) -> LoopGuard:
    return LoopGuard(
        Db(),  # type: ignore[arg-type]
        leases,  # type: ignore[arg-type]
        lambda: list(jobs),
        ttl=TTL,
        loop_bound=lambda: 30.0,
        overdue_threads=lambda now: [],
        end_process=ended.append,
    )


async def block_the_loop_beside(jobs: list[RunningJob], guard: LoopGuard | None) -> list[bool]:
    """Block the loop for BLOCK s while each of ``jobs`` waits in its scope; whether each
    was cancelled, looked at 0.3 s after the loop runs again."""
    cancelled: list[bool] = []

    async def handler(job: RunningJob, until: float) -> None:
        with job.scope:
            await trio.sleep_until(until)
        cancelled.append(job.scope.cancelled_caught)

    if guard is not None:
        trio.lowlevel.add_instrument(guard)
        thread = guard.start()
    try:
        async with trio.open_nursery() as nursery:
            if guard is not None:
                nursery.start_soon(guard.beat)
            until = trio.current_time() + BLOCK + 0.3
            for job in jobs:
                nursery.start_soon(handler, job, until)
            await trio.sleep(0.05)
            time.sleep(BLOCK)  # noqa: ASYNC251 (what a trio-lane handler that never yields does)
            await trio.sleep_until(until + 0.05)
            nursery.cancel_scope.cancel()
    finally:
        if guard is not None:
            guard.stop()
            trio.lowlevel.remove_instrument(guard)
            thread.join()
    return cancelled


async def test_without_the_guard_a_blocked_loop_costs_every_handler_its_lease():
    jobs = [running_job() for _ in range(3)]
    assert await block_the_loop_beside(jobs, None) == [True, True, True]


async def test_the_guard_renews_while_the_loop_is_blocked_and_no_handler_is_cancelled():
    jobs = [running_job() for _ in range(3)]
    leases, ended = Leases(), []
    guard = guard_of(jobs, leases, ended)
    assert await block_the_loop_beside(jobs, guard) == [False, False, False]
    assert leases.store.renewals >= 3  # every third of the TTL while blocked
    assert all(job.reason is None for job in jobs) and ended == []


async def test_a_lease_lost_while_the_loop_was_blocked_is_cancelled_as_it_runs_again():
    kept, lost = running_job(), running_job()
    leases, ended = Leases({lost.job_id}), []
    guard = guard_of([kept, lost], leases, ended)
    assert sorted(await block_the_loop_beside([kept, lost], guard)) == [False, True]
    assert lost.reason == CancelReason.LEASE and kept.reason is None


def test_the_guard_ends_the_worker_past_the_loops_bound_or_a_threads():
    ended: list[int] = []
    guard = LoopGuard(
        Db(),  # type: ignore[arg-type]
        Leases(),  # type: ignore[arg-type]
        lambda: [],
        ttl=TTL,
        loop_bound=lambda: 5.0,
        overdue_threads=lambda now: [],
        end_process=ended.append,
    )
    now = time.monotonic()
    guard.pulse = now - 4.0
    guard.look(now)
    assert ended == []  # silent 4 s, the longest timeout on the loop is 5 s
    guard.pulse = now - 6.0
    guard.look(now, slept=6.0)
    assert ended == []  # the guard slept as long: the process was frozen, not its loop
    guard.pulse = now - 6.0
    guard.look(now)
    assert ended == [EXIT_STATUS]

    ended.clear()
    idle = LoopGuard(
        Db(),  # type: ignore[arg-type]
        Leases(),  # type: ignore[arg-type]
        lambda: [],
        ttl=TTL,
        loop_bound=lambda: None,
        overdue_threads=lambda now: ["send_invoice 42 (95s, timeout 60s)"],
        end_process=ended.append,
    )
    idle.pulse = now
    idle.look(now)
    assert ended == [EXIT_STATUS]  # a thread far past its timeout
    assert SILENCE_WITHOUT_JOB == 60.0


async def test_the_loop_lag_warning_names_the_job_type_that_blocked_the_loop(caplog):
    app = App("blame")

    @app.job("resize_image")
    async def resize_image(ctx, payload) -> None:
        time.sleep(1.0)  # noqa: ASYNC251 (a trio-lane handler that never yields)

    @app.job("quiet_neighbour")
    async def quiet_neighbour(ctx, payload) -> None:
        await trio.lowlevel.checkpoint()

    guard = LoopGuard(
        Db(),  # type: ignore[arg-type]
        Leases(),  # type: ignore[arg-type]
        lambda: [],
        ttl=10.0,
        loop_bound=lambda: 30.0,
        overdue_threads=lambda now: [],
        handlers=trio_handlers(app),
    )
    assert sorted(guard.handlers.values()) == ["quiet_neighbour", "resize_image"]
    thread = guard.start()
    try:
        with caplog.at_level(logging.WARNING, logger="leasework.health"):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(guard.beat)
                nursery.start_soon(
                    functools.partial(measure_event_loop_lag, blame=guard.blocked_by)
                )
                await trio.sleep(0.3)
                await app.get("resize_image").handler(None, {})
                await trio.sleep(0.3)
                nursery.cancel_scope.cancel()
    finally:
        guard.stop()
        thread.join()
    (warning,) = [r for r in caplog.records if "event loop blocked" in r.getMessage()]
    assert warning.job_type == "resize_image"
    assert "(job type resize_image)" in warning.getMessage()
    assert guard.blocked_by() is None  # read once; nothing runs on the loop now
