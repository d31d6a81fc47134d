"""Worker timing on Trio's MockClock (pytest-trio's ``autojump_clock``): no sleeping, and
every deadline exact. The heartbeat moves a handler's deadline on a renewal and cancels
exactly the handler whose lease was lost; a handler no heartbeat renews is cancelled at its
lease deadline, except in the plain-TTL demonstration mode; the drain cancels what still
runs when the graceful time is up. Redis and
Postgres are stand-ins that answer as the real ones would (these are timing tests; the real
services are driven in tests/integration/test_services.py)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import trio
import trio.lowlevel

from leasework.config import UNSAFE_LEASE_MODE, Settings
from leasework.demo import app as demo_app
from leasework.job import Job
from leasework.lease import Claim
from leasework.states import Status
from leasework.worker.claim import Started
from leasework.worker.completer import UnsafeCompleter
from leasework.worker.heartbeat import CancelReason, Heartbeat, RunningJob, lease_deadline
from leasework.worker.process import Worker

TTL = 9.0


class Leases:
    """Renewals answer from ``lost``: the jobs whose lease someone else took."""

    def __init__(self) -> None:
        self.lost: set[uuid.UUID] = set()
        self.calls = 0

    async def renew_many(self, claims, ttl):
        self.calls += 1
        return [c.job_id not in self.lost for c in claims]


class Db:
    """``jobs_heartbeat_many``'s answer: every job still ours, no cancel requested."""

    def __init__(self) -> None:
        self.cancel: set[uuid.UUID] = set()

    async def run(self, fn, leases, ttl):
        return {job_id: job_id in self.cancel for job_id, _fence in leases}


def claim() -> Claim:
    return Claim(uuid.uuid4(), "w", 1)


async def test_a_renewal_moves_the_deadline_and_a_lost_lease_cancels_only_its_handler(
    autojump_clock,
):
    leases, db = Leases(), Db()
    start = trio.current_time()
    kept = RunningJob(claim(), trio.CancelScope(deadline=lease_deadline(start, TTL)))
    lost = RunningJob(claim(), trio.CancelScope(deadline=lease_deadline(start, TTL)))
    beat = Heartbeat(db, leases, lambda: [kept, lost], ttl=TTL)
    ended: dict[str, float] = {}

    async def handler(name: str, running: RunningJob) -> None:
        with running.scope:
            await trio.sleep(100)
        ended[name] = trio.current_time() - start

    async with trio.open_nursery() as nursery:
        nursery.start_soon(handler, "kept", kept)
        nursery.start_soon(handler, "lost", lost)
        nursery.start_soon(beat.run)
        await trio.sleep(TTL / 3 - 0.5)
        leases.lost.add(lost.job_id)  # someone takes lost's lease before the first tick
        await trio.sleep(1.0)  # the first tick (at TTL/3) has happened
        assert lost.scope.cancel_called and lost.reason == CancelReason.LEASE
        assert not kept.scope.cancel_called
        assert kept.scope.deadline == lease_deadline(start + TTL / 3, TTL)  # moved forward
        await trio.sleep(50)
        assert "kept" not in ended  # every tick keeps moving it
        nursery.cancel_scope.cancel()
    assert ended["lost"] == TTL / 3
    assert leases.calls >= 5  # one renewal call per tick for all leases


async def test_a_cancel_request_seen_by_the_heartbeat_cancels_the_handler(autojump_clock):
    leases, db = Leases(), Db()
    running = RunningJob(claim(), trio.CancelScope(deadline=trio.current_time() + 100))
    db.cancel.add(running.job_id)
    beat = Heartbeat(db, leases, lambda: [running], ttl=TTL)
    await beat.run_once()
    assert running.reason == CancelReason.REQUEST and running.scope.cancel_called


def settings() -> Settings:
    return Settings(role="worker", process_name="w", app="leasework.demo:app", lease_ttl=TTL)


def make_job(job_type: str, payload: dict) -> Job:
    """Attempt 1 of 3 of a job just stamped ``running`` under fence 1, timeout 3600 s."""
    now = datetime.now(UTC)
    return Job(
        id=uuid.uuid4(), type=job_type, payload=payload, status=Status.RUNNING, run_at=now,
        attempt=1, max_attempts=3, timeout_seconds=3600, fence=1, lease_owner="w",
        lease_expires_at=None, idempotency_key=None, ordering_key=None, last_error=None,
        cancel_requested=False, created_at=now, updated_at=now, started_at=now,
        finished_at=None, result=None, retry_base=None, retry_cap=None, deferrals=0,
        attempt_budget=3,
    )  # fmt: skip


def started(job_type: str, payload: dict) -> Started:
    job = make_job(job_type, payload)
    return Started(job, Claim(job.id, "w", 1), trio.current_time())


async def test_a_started_job_of_a_type_the_app_does_not_define_fails_its_attempt():
    worker = Worker(settings(), db=None, app=demo_app)  # type: ignore[arg-type]
    completion = await worker.executor.execute(started("type-no-app-defines", {}))
    assert completion.outcome.status == Status.FAILED  # attempt 1 of 3: retried
    assert "does not define type 'type-no-app-defines'" in completion.outcome.error
    assert completion.effects == ()


async def test_a_handler_no_heartbeat_renews_is_cancelled_at_its_lease_deadline(autojump_clock):
    worker = Worker(settings(), db=None, app=demo_app)  # type: ignore[arg-type]
    begin = trio.current_time()
    completion = await worker.executor.execute(started("sleep", {"seconds": 600}))
    assert trio.current_time() - begin == TTL * 0.8  # claim time + TTL x (1 - margin)
    assert completion.outcome.status == Status.FAILED
    assert completion.outcome.error.startswith("lease lost")


async def test_the_drain_waits_its_graceful_time_then_cancels_what_still_runs(autojump_clock):
    worker = Worker(settings(), db=None, app=demo_app)  # type: ignore[arg-type]
    outcomes = []

    async def job(seconds: float) -> None:
        completion = await worker.executor.execute(started("sleep", {"seconds": seconds}))
        outcomes.append((seconds, completion.outcome))
        worker.slots_of["default"].release()  # the job's message is settled

    begin = trio.current_time()
    with trio.fail_after(10):  # a hang is a failure
        async with trio.open_nursery() as nursery:
            assert await worker.slots_of["default"].take(2) == 2  # two messages, a slot each
            nursery.start_soon(job, 1.0)  # finishes within the graceful time
            nursery.start_soon(job, 5.0)  # still running when it is up
            await trio.lowlevel.checkpoint()
            await worker.drain(graceful=3.0)
    assert trio.current_time() - begin == 3.0
    by_length = dict(outcomes)
    assert by_length[1.0].status == Status.SUCCEEDED
    shut = by_length[5.0]
    assert shut.status == Status.FAILED and shut.retry_in == 0.0  # retried at once
    assert shut.error == "worker shut down before the handler finished"


async def test_the_plain_ttl_mode_neither_cuts_a_handler_at_its_deadline_nor_fences(
    autojump_clock,
):
    unsafe = dataclasses.replace(settings(), lease_mode=UNSAFE_LEASE_MODE)
    worker = Worker(unsafe, db=None, app=demo_app)  # type: ignore[arg-type]
    begin = trio.current_time()
    completion = await worker.executor.execute(started("sleep", {"seconds": 600}))
    assert trio.current_time() - begin == 600  # far past its lease deadline (TTL x 0.8)
    assert completion.outcome.status == Status.SUCCEEDED
    assert isinstance(worker.completer, UnsafeCompleter)
    assert not worker.heartbeat.notices_loss
    fenced = Worker(settings(), db=None, app=demo_app)  # type: ignore[arg-type]
    assert not isinstance(fenced.completer, UnsafeCompleter) and fenced.heartbeat.notices_loss
