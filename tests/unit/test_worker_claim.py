"""The claim stage against a scripted claimer (the real one is driven against Postgres and
Redis in tests/integration/test_services.py): every message it receives ends finished, left
for redelivery, or handed on with its job and its slot; the same job twice in a batch is
claimed once; what the batch could not decide is claimed alone, with backoff, until decided
or until the worker stops."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

import psycopg
import redis
import trio
from prometheus_client import REGISTRY

from leasework.lease import Claim
from leasework.service import Stopping
from leasework.worker.claim import (
    ANNOUNCED_KEPT,
    ClaimResult,
    ClaimStage,
    Skip,
    Started,
    split,
)
from leasework.worker.consumer import Consumed
from leasework.worker.offsets import Offsets
from leasework.worker.slots import Slots
from tests.unit.test_worker_timing import make_job

TTL = 10.0


def skipped_count(reason: str) -> float:
    value = REGISTRY.get_sample_value("leasework_messages_skipped_total", {"reason": reason})
    return value or 0.0


def errors_count() -> float:
    return REGISTRY.get_sample_value("leasework_worker_errors_total") or 0.0


def start(job_id: uuid.UUID) -> Started:
    job = dataclasses.replace(make_job("noop", {}), id=job_id)
    return Started(job, Claim(job_id, "w", 1), 0.0)


class Claimer:
    """Answers each call with ``answer(job_ids)``, which may raise; calls are recorded."""

    def __init__(self, answer: Callable[[list[uuid.UUID]], ClaimResult]) -> None:
        self.answer = answer
        self.calls: list[list[uuid.UUID]] = []
        self.types: list[dict[uuid.UUID, str] | None] = []

    async def claim(self, job_ids: list[uuid.UUID], reserved=None, types=None) -> ClaimResult:
        self.calls.append(list(job_ids))
        self.types.append(None if types is None else dict(types))
        await trio.lowlevel.checkpoint()
        return self.answer(job_ids)


async def run_stage(
    claimer: Claimer,
    messages: list[Consumed],
    stopping: Stopping | None = None,
    announced: tuple[uuid.UUID, ...] = (),
) -> tuple[Offsets, Slots, list[tuple[Consumed, Started]]]:
    """Run the stage over one batch (each message tracked and holding a slot, as the consume
    stage leaves them) until it has decided every message; what it handed on. The jobs of
    ``announced`` were named by wake-ups first (heard before the stage ran: not acted on)."""
    offsets = Offsets(None, "jobs.ready")  # type: ignore[arg-type]
    for m in messages:
        offsets.tracker.start(m.partition, m.offset)
    slots = Slots(len(messages))
    assert await slots.take(len(messages)) == len(messages)
    started_in, started_out = trio.open_memory_channel[tuple[Consumed, Started]](100)
    batches_in, batches_out = trio.open_memory_channel[list[Consumed]](1)
    stage = ClaimStage(
        claimer,  # type: ignore[arg-type]
        offsets,
        slots,
        stopping or Stopping(),
        started_in,
        ttl=TTL,
    )
    for job_id in announced:
        assert not stage.wake(job_id)
    async with batches_in:
        batches_in.send_nowait(messages)
    await stage.run(batches_out)  # returns once the batch is decided, closing started_in
    handed_on = [item async for item in started_out]
    return offsets, slots, handed_on


def test_split_keeps_the_first_message_of_each_job_in_order():
    a, b = uuid.uuid4(), uuid.uuid4()
    messages = [Consumed(0, 0, a), Consumed(0, 1, None), Consumed(1, 0, a), Consumed(0, 2, b)]
    batch = split(messages)
    assert list(batch.first.items()) == [(a, messages[0]), (b, messages[3])]
    assert batch.skipped == [(messages[1], "undecodable"), (messages[2], "duplicate")]


def test_split_of_nothing_to_claim():
    batch = split([Consumed(0, 0, None)])
    assert batch.first == {} and batch.skipped == [(Consumed(0, 0, None), "undecodable")]


async def test_a_batch_is_claimed_once_and_every_message_ends_finished_or_handed_on():
    run, done = uuid.uuid4(), uuid.uuid4()
    messages = [
        Consumed(0, 0, done),
        Consumed(0, 1, None),
        Consumed(0, 2, run),
        Consumed(0, 3, run),  # the same job again in the same batch
    ]
    claimer = Claimer(lambda ids: ClaimResult(started=[start(run)], skipped={done: Skip.MISSING}))
    duplicates, undecodable = skipped_count("duplicate"), skipped_count("undecodable")
    offsets, slots, handed_on = await run_stage(claimer, messages)
    assert claimer.calls == [[done, run]]  # one claim, each job once
    assert [(m, s.job.id) for m, s in handed_on] == [(messages[2], run)]
    assert slots.held == 1  # the started job's, until its outcome is written
    assert offsets.tracker.positions() == {0: 2}  # offset 2 runs; 0, 1 and 3 are finished
    offsets.finish(0, 2)
    assert offsets.tracker.positions() == {0: 4}
    assert skipped_count("duplicate") == duplicates + 1
    assert skipped_count("undecodable") == undecodable + 1


async def test_a_batch_hands_on_the_types_its_messages_name_but_not_an_announced_jobs():
    named, unnamed, announced = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    claimer = Claimer(lambda ids: ClaimResult(skipped=dict.fromkeys(ids, Skip.MISSING)))
    messages = [
        Consumed(0, 0, named, "noop"),
        Consumed(0, 1, unnamed),
        Consumed(0, 2, announced, "noop"),
    ]
    offsets, _, _ = await run_stage(claimer, messages, announced=(announced,))
    assert claimer.calls == [[named, unnamed, announced]]
    assert claimer.types == [{named: "noop"}]  # the others' rows are read first
    assert offsets.tracker.positions() == {0: 3}


def test_a_queue_remembers_its_latest_wakeups_only():
    stage = ClaimStage(None, None, Slots(1), Stopping(), None, ttl=TTL)  # type: ignore[arg-type]
    heard = [uuid.uuid4() for _ in range(ANNOUNCED_KEPT + 1)]
    for job_id in heard:
        stage.wake(job_id)
    assert list(stage._announced) == heard[1:]


async def test_each_batch_claimed_is_counted_by_its_size():
    def batches() -> tuple[float, float]:
        count = REGISTRY.get_sample_value("leasework_claim_batch_size_count") or 0.0
        total = REGISTRY.get_sample_value("leasework_claim_batch_size_sum") or 0.0
        return count, total

    before = batches()
    job_ids = [uuid.uuid4() for _ in range(3)]
    claimer = Claimer(lambda ids: ClaimResult(skipped=dict.fromkeys(ids, Skip.MISSING)))
    await run_stage(claimer, [Consumed(0, i, j) for i, j in enumerate(job_ids)])
    assert batches() == (before[0] + 1, before[1] + 3)


async def test_what_the_batch_could_not_decide_is_claimed_alone_with_backoff(autojump_clock):
    job_id = uuid.uuid4()
    answers = [
        ClaimResult(retry=[job_id]),  # the batch: another worker holds the lease
        ClaimResult(retry=[job_id]),  # alone: still held
        ClaimResult(retry=[job_id], reseeded=True),  # a stale fence: claim again at once
        ClaimResult(started=[start(job_id)]),
    ]
    claimer = Claimer(lambda ids: answers.pop(0))
    begin = trio.current_time()
    offsets, slots, handed_on = await run_stage(claimer, [Consumed(0, 0, job_id)])
    assert trio.current_time() - begin == 0.2  # one wait, after the lease was held
    assert len(claimer.calls) == 4 and [m.job_id for m, _ in handed_on] == [job_id]
    assert slots.held == 1 and offsets.tracker.positions() == {}


async def test_a_job_skipped_on_the_slow_path_is_finished():
    job_id = uuid.uuid4()
    answers = [ClaimResult(retry=[job_id]), ClaimResult(skipped={job_id: Skip.NOT_QUEUED})]
    claimer = Claimer(lambda ids: answers.pop(0))
    offsets, slots, handed_on = await run_stage(claimer, [Consumed(0, 0, job_id)])
    assert handed_on == [] and slots.held == 0 and offsets.tracker.positions() == {0: 1}


async def test_a_failed_batch_claim_claims_each_job_alone_and_waits_out_an_outage(
    autojump_clock,
):
    run, done = uuid.uuid4(), uuid.uuid4()
    outage = [redis.ConnectionError("down"), psycopg.OperationalError("down")]

    def answer(ids: list[uuid.UUID]) -> ClaimResult:
        if len(ids) > 1:
            raise redis.ConnectionError("redis unreachable")
        if ids == [run] and outage:
            raise outage.pop(0)
        if ids == [run]:
            return ClaimResult(started=[start(run)])
        return ClaimResult(skipped={done: Skip.MISSING})

    claimer = Claimer(answer)
    begin = trio.current_time()
    messages = [Consumed(0, 0, run), Consumed(0, 1, done)]
    offsets, slots, handed_on = await run_stage(claimer, messages)
    assert trio.current_time() - begin == 0.2 + 0.4  # backoff doubles through the outage
    assert claimer.calls[0] == [run, done] and sorted(map(len, claimer.calls[1:])) == [1] * 4
    assert [m for m, _ in handed_on] == [messages[0]]
    assert slots.held == 1 and offsets.tracker.positions() == {}  # offset 0 still runs
    offsets.finish(0, 0)
    assert offsets.tracker.positions() == {0: 2}  # the skipped one was finished


async def test_a_stopping_worker_leaves_an_undecided_message_for_redelivery():
    job_id = uuid.uuid4()
    stopping = Stopping()
    stopping.set("test")
    claimer = Claimer(lambda ids: ClaimResult(retry=[job_id]))
    offsets, slots, handed_on = await run_stage(claimer, [Consumed(0, 0, job_id)], stopping)
    assert claimer.calls == [[job_id]]  # the batch's claim; none alone once stopping
    assert handed_on == [] and slots.held == 0
    assert offsets.tracker.positions() == {}  # not finished: its offset is not committed


async def test_a_bug_on_the_slow_path_leaves_the_message_unfinished_and_is_counted():
    def answer(ids: list[uuid.UUID]) -> ClaimResult:
        raise ValueError("a bug")

    job_id = uuid.uuid4()
    before = errors_count()
    offsets, slots, handed_on = await run_stage(Claimer(answer), [Consumed(0, 0, job_id)])
    assert handed_on == [] and slots.held == 0 and offsets.tracker.positions() == {}
    assert errors_count() == before + 1
