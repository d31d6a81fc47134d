"""The worker's stages wired together (``Worker.pipeline``) on stand-ins for Kafka, the
claimer and the completer, with the demo app's real handlers: each message passes through
once; its offset is marked finished only once its outcome is written; a stop drains the
running jobs (cancelled after the graceful time, their outcomes still written); a bug while
handling one job leaves its message unfinished and the worker running."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid

import trio
from prometheus_client import REGISTRY

from leasework.demo import app as demo_app
from leasework.lease import Claim
from leasework.outcomes import Completion
from leasework.service import Stopping
from leasework.states import Status
from leasework.worker.claim import IDLE_BEFORE_WAKE, ClaimResult, ClaimStage, Skip, Started
from leasework.worker.completer import Finished
from leasework.worker.feed import Feed
from leasework.worker.offsets import Offsets
from leasework.worker.process import Worker
from leasework.worker.slots import Slots
from tests.unit.test_worker_consumer import Message
from tests.unit.test_worker_timing import make_job, settings


class Kafka:
    """Hands out ``script`` to poll() and consume(), then nothing (after a real millisecond,
    so that an idle poll loop does not spin)."""

    def __init__(self, script: list[Message]) -> None:
        self.script = list(script)

    def poll(self, timeout: float):
        if not self.script:
            time.sleep(0.001)
            return None
        return self.script.pop(0)

    def consume(self, count: int, timeout: float) -> list[Message]:
        taken, self.script = self.script[:count], self.script[count:]
        return taken


def value(job_id: uuid.UUID | None) -> bytes:
    return b"{" if job_id is None else json.dumps({"job_id": str(job_id)}).encode()


class Claimer:
    """Starts the jobs in ``jobs`` (id -> (type, payload)), skips every other."""

    def __init__(self, jobs: dict[uuid.UUID, tuple[str, dict]]) -> None:
        self.jobs = jobs
        self.calls: list[list[uuid.UUID]] = []

    async def claim(self, job_ids: list[uuid.UUID], types=None) -> ClaimResult:
        self.calls.append(list(job_ids))
        result = ClaimResult()
        for job_id in job_ids:
            if job_id in self.jobs:
                job = dataclasses.replace(make_job(*self.jobs[job_id]), id=job_id)
                result.started.append(Started(job, Claim(job_id, "w", 1), trio.current_time()))
            else:
                result.skipped[job_id] = Skip.NOT_QUEUED
        return result

    async def claim_woken(self, job_ids: list[uuid.UUID]) -> ClaimResult:
        self.woken = [*getattr(self, "woken", []), *job_ids]
        return await self.claim(job_ids)


class Completer:
    """Writes each completion once ``gate`` is set; raises for the jobs in ``broken``."""

    def __init__(self) -> None:
        self.gate = trio.Event()
        self.gate.set()
        self.written: list[Completion] = []
        self.waiting = 0
        self.broken: set[uuid.UUID] = set()

    async def complete(self, completion: Completion, claim: Claim) -> Finished:
        if completion.job_id in self.broken:
            raise ValueError("a bug in the completer")
        self.waiting += 1
        await self.gate.wait()
        self.waiting -= 1
        self.written.append(completion)
        return Finished(completion.job_id, completion.outcome.status)


def worker_with(jobs: dict[uuid.UUID, tuple[str, dict]], **overrides) -> Worker:
    worker = Worker(
        dataclasses.replace(settings(), **overrides),
        db=None,  # type: ignore[arg-type]
        app=demo_app,
    )
    worker.claimer = Claimer(jobs)  # type: ignore[assignment]
    worker.completer = Completer()  # type: ignore[assignment]
    return worker


async def wait_until(condition) -> None:
    """Poll the stand-ins' state (they have no events to wait on), for 5 s at most."""
    with trio.fail_after(5.0):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.001)


async def test_each_message_passes_once_and_is_finished_only_after_its_outcome_is_written():
    first, skipped, last = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    worker = worker_with({first: ("noop", {}), last: ("echo", {"n": 1})})
    completer = worker.completer
    completer.gate = trio.Event()  # type: ignore[attr-defined]
    kafka = Kafka(
        [
            Message(0, 0, value(first)),
            Message(0, 1, value(None)),
            Message(0, 2, value(first)),  # the same job again
            Message(0, 3, value(skipped)),
            Message(0, 4, value(last)),
        ]
    )
    offsets, stopping = Offsets(kafka, "jobs.ready"), Stopping()  # type: ignore[arg-type]
    with trio.fail_after(10):  # a hang is a failure
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.pipeline, Feed.of(offsets), stopping)
            await wait_until(lambda: completer.waiting == 2)  # type: ignore[attr-defined]
            await trio.sleep(0.05)
            assert offsets.tracker.positions() == {}  # both ran; neither outcome is written yet
            completer.gate.set()  # type: ignore[attr-defined]
            await wait_until(lambda: offsets.tracker.positions() == {0: 5})
            stopping.set("test")
    assert worker.claimer.calls == [[first, skipped, last]]  # type: ignore[attr-defined]
    written = {c.job_id: c.outcome for c in completer.written}  # type: ignore[attr-defined]
    assert len(completer.written) == 2  # type: ignore[attr-defined]
    assert written[first].status == Status.SUCCEEDED
    assert written[last].result == {"n": 1}
    assert worker.slots_of["default"].held == 0


async def test_a_stop_gives_running_jobs_the_graceful_time_then_cancels_and_writes_them():
    # real time (the consumer's thread hops and a mock clock's jumps do not mix): a graceful
    # time of 0.3 s, far from the slow job's lease deadline (TTL x 0.8 = 7.2 s)
    quick, slow = uuid.uuid4(), uuid.uuid4()
    worker = worker_with(
        {quick: ("sleep", {"seconds": 0.05}), slow: ("sleep", {"seconds": 600.0})},
        shutdown_timeout=0.4,
    )
    kafka = Kafka([Message(0, 0, value(quick)), Message(0, 1, value(slow))])
    offsets, stopping = Offsets(kafka, "jobs.ready"), Stopping()  # type: ignore[arg-type]
    with trio.fail_after(10):  # a hang is a failure
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.pipeline, Feed.of(offsets), stopping)
            await wait_until(lambda: len(worker.executor.running) == 2)
            stopped = trio.current_time()
            stopping.set("test")
    assert 0.3 <= trio.current_time() - stopped < 0.6  # 75% of shutdown_timeout
    written = {c.job_id: c.outcome for c in worker.completer.written}  # type: ignore[attr-defined]
    assert written[quick].status == Status.SUCCEEDED
    assert written[slow].status == Status.FAILED and written[slow].retry_in == 0.0
    assert written[slow].error == "worker shut down before the handler finished"
    assert offsets.tracker.positions() == {0: 2} and worker.slots_of["default"].held == 0


async def test_a_bug_while_handling_a_job_leaves_its_message_unfinished_and_the_worker_running():
    broken, fine = uuid.uuid4(), uuid.uuid4()
    worker = worker_with({broken: ("noop", {}), fine: ("noop", {})})
    worker.completer.broken.add(broken)  # type: ignore[attr-defined]

    def errors() -> float:
        return REGISTRY.get_sample_value("leasework_worker_errors_total") or 0.0

    before = errors()
    kafka = Kafka([Message(0, 0, value(fine)), Message(0, 1, value(broken))])
    offsets, stopping = Offsets(kafka, "jobs.ready"), Stopping()  # type: ignore[arg-type]
    with trio.fail_after(10):  # a hang is a failure
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.pipeline, Feed.of(offsets), stopping)
            await wait_until(lambda: errors() == before + 1)
            kafka.script.append(Message(0, 2, value(fine)))  # the worker is still consuming
            await wait_until(lambda: len(worker.completer.written) == 2)  # type: ignore[attr-defined]
            stopping.set("test")
    assert offsets.tracker.positions() == {0: 1}  # never past the broken job's message
    assert worker.slots_of["default"].held == 0  # its slot was given back all the same


async def test_a_wakeup_starts_a_job_only_while_its_queue_is_quiet_and_holds_no_offset():
    woken, busy = uuid.uuid4(), uuid.uuid4()
    worker = worker_with({woken: ("noop", {}), busy: ("noop", {})})
    completer = worker.completer
    completer.gate = trio.Event()  # type: ignore[attr-defined]
    kafka = Kafka([])
    offsets, stopping = Offsets(kafka, "jobs.ready"), Stopping()  # type: ignore[arg-type]
    slots = worker.slots_of["default"]
    with trio.fail_after(10):  # a hang is a failure
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.pipeline, Feed.of(offsets), stopping)
            assert not worker.wake("emails", woken)  # a queue this worker does not serve
            await wait_until(lambda: worker.wake("default", woken))  # once its stage runs
            await wait_until(lambda: completer.waiting == 1)  # type: ignore[attr-defined]
            assert not worker.wake("default", busy)  # one in flight: Kafka delivers it
            assert slots.lent == 1
            completer.gate.set()  # type: ignore[attr-defined]
            await wait_until(lambda: slots.lent == 0)
            stopping.set("test")
            assert not worker.wake("default", busy)  # stopping
    assert worker.claimer.woken == [woken]  # type: ignore[attr-defined]
    assert [c.job_id for c in completer.written] == [woken]  # type: ignore[attr-defined]
    assert offsets.tracker.positions() == {} and slots.held == 0


async def test_a_wakeup_is_acted_on_only_after_a_tenth_of_a_second_without_a_claim(
    autojump_clock,
):
    woken = [uuid.uuid4() for _ in range(3)]
    claimer = Claimer({j: ("noop", {}) for j in woken})
    started_in, started_out = trio.open_memory_channel(math.inf)
    batches_in, batches_out = trio.open_memory_channel(math.inf)
    slots = Slots(4)
    offsets = Offsets(Kafka([]), "jobs.ready")  # type: ignore[arg-type]
    stage = ClaimStage(claimer, offsets, slots, Stopping(), started_in, ttl=10.0)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stage.run, batches_out)
        await trio.sleep(1.0)
        assert stage.wake(woken[0])  # idle for a second: claimed at once
        (_, first) = await started_out.receive()
        slots.give_back_lent()  # its job ended
        assert not stage.wake(woken[1])  # quiet again, but it claimed a moment ago
        await trio.sleep(IDLE_BEFORE_WAKE)
        assert stage.wake(woken[2])
        await started_out.receive()
        slots.give_back_lent()
        batches_in.close()
    assert first.job.id == woken[0] and claimer.woken == [woken[0], woken[2]]
