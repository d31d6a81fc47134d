import trio
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from leasework.worker.offsets import STORE_OFFSETS_EVERY, Offsets, OffsetTracker


def test_commits_only_the_contiguous_finished_prefix():
    tracker = OffsetTracker()
    for offset in (10, 11, 12, 13):
        tracker.start(0, offset)
    tracker.finish(0, 12)
    assert tracker.committable() == {}  # 10 and 11 still run
    tracker.finish(0, 10)
    assert tracker.committable() == {0: 11}
    tracker.committed(0, 11)
    assert tracker.committable() == {}
    tracker.finish(0, 11)
    assert tracker.committable() == {0: 13}  # 10, 11, 12 done; 13 still runs
    tracker.finish(0, 13)
    assert tracker.committable() == {0: 14}


def test_partitions_are_independent_and_gaps_in_offsets_are_fine():
    tracker = OffsetTracker()
    tracker.start(1, 5)
    tracker.start(1, 9)  # 6-8 were never delivered (control records, compaction)
    tracker.start(2, 0)
    tracker.finish(1, 9)
    tracker.finish(2, 0)
    assert tracker.committable() == {2: 1}
    tracker.finish(1, 5)
    assert tracker.committable() == {1: 10, 2: 1}


def test_revoked_partition_is_forgotten_and_late_finishes_are_ignored():
    tracker = OffsetTracker()
    tracker.start(3, 100)
    tracker.forget(3)
    tracker.finish(3, 100)
    assert tracker.committable() == {}
    assert tracker.in_flight() == 0


def test_a_rewind_without_forget_starts_the_partition_over():
    # what crashed a worker in a chaos run: librdkafka fetched partition 11 again from its
    # committed offset with no revoke seen here
    tracker = OffsetTracker()
    assert tracker.start(0, 5) is False
    assert tracker.start(0, 6) is False
    assert tracker.start(0, 4) is True  # 5 and 6 are still running: the rewind is tracked afresh
    assert tracker.in_flight() == 1
    tracker.finish(0, 4)
    assert tracker.committable() == {0: 5}
    tracker.start(0, 5)  # redelivered
    tracker.finish(0, 6)  # the old delivery of 6 finished: its work is done
    assert tracker.committable() == {0: 5}  # 5 (redelivered) still runs: not past it
    tracker.finish(0, 5)
    assert tracker.committable() == {0: 6}  # 6 is to be redelivered: it will run again


# ---------------------------------------------------------------- the stage around it


class Kafka:
    """What Offsets asks of confluent-kafka's consumer; ``failing`` makes each call raise."""

    def __init__(self) -> None:
        self.stored: list[list[tuple[int, int]]] = []
        self.commits: list[list[tuple[int, int]]] = []
        self.failing = False

    def _record(self, into: list, offsets: list[TopicPartition]) -> None:
        if self.failing:
            raise KafkaException("broker unreachable")
        assert {o.topic for o in offsets} == {"jobs.ready"}
        into.append(sorted((o.partition, o.offset) for o in offsets))

    def store_offsets(self, offsets: list[TopicPartition]) -> None:
        self._record(self.stored, offsets)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert not asynchronous
        self._record(self.commits, offsets)


def offsets_of(kafka: Kafka, arrived: dict[int, list[int]]) -> Offsets:
    offsets = Offsets(kafka, "jobs.ready")  # type: ignore[arg-type]
    for partition, numbers in arrived.items():
        for offset in numbers:
            offsets.tracker.start(partition, offset)
    return offsets


async def test_store_hands_over_the_grown_prefix_once_and_again_after_a_failure():
    kafka = Kafka()
    offsets = offsets_of(kafka, {0: [10, 11], 1: [3]})
    offsets.finish(0, 10)
    offsets.finish(0, 11)
    await offsets.store()
    assert kafka.stored == [[(0, 12)]]  # partition 1's message still runs
    await offsets.store()
    assert kafka.stored == [[(0, 12)]]  # nothing grew: nothing handed over
    kafka.failing = True
    offsets.finish(1, 3)
    await offsets.store()
    kafka.failing = False
    await offsets.store()
    assert kafka.stored == [[(0, 12)], [(1, 4)]]  # not stored the first time: again


async def test_the_loop_stores_after_a_finish_at_most_every_interval():
    # real time: a mock clock's jumps and the store's thread hop do not mix
    kafka = Kafka()
    offsets = offsets_of(kafka, {0: [0, 1, 2]})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(offsets.run)
        await trio.sleep(0.05)
        assert kafka.stored == []  # nothing finished: nothing stored
        offsets.finish(0, 0)
        await trio.sleep(0.05)
        assert kafka.stored == [[(0, 1)]]
        offsets.finish(0, 1)  # within the interval: waits for the next store
        await trio.sleep(0.05)
        assert kafka.stored == [[(0, 1)]]
        await trio.sleep(STORE_OFFSETS_EVERY)
        assert kafka.stored == [[(0, 1)], [(0, 2)]]
        nursery.cancel_scope.cancel()


async def test_commit_sends_the_finished_prefix_whether_stored_or_not():
    kafka = Kafka()
    offsets = offsets_of(kafka, {0: [0, 1], 2: [7]})
    await offsets.commit()
    assert kafka.commits == []  # nothing finished
    offsets.finish(0, 0)
    await offsets.store()
    offsets.finish(2, 7)
    await offsets.commit()
    assert kafka.commits == [[(0, 1), (2, 8)]]
    kafka.failing = True
    await offsets.commit()  # logged, not raised: the next owner starts from the last commit


async def test_a_revoke_commits_the_revoked_partitions_prefix_and_forgets_them():
    kafka = Kafka()
    offsets = offsets_of(kafka, {0: [0, 1], 1: [5, 6]})
    offsets.finish(0, 0)
    offsets.finish(1, 5)
    # librdkafka calls it from inside consume(), in the poll thread
    revoked = [TopicPartition("jobs.ready", 1)]
    await trio.to_thread.run_sync(offsets.on_revoke, kafka, revoked)
    assert kafka.commits == [[(1, 6)]]
    offsets.finish(1, 6)  # finishes after the revoke: another consumer's to commit now
    assert offsets.tracker.positions() == {0: 1}


# ---------------------------------------------------------------- a renewed consumer


class Assignable(Kafka):
    """Also records assign() (incremental_assign() with ``cooperative``: assign() then
    raises _STATE, as librdkafka does in a cooperative rebalance)."""

    def __init__(self, cooperative: bool = False) -> None:
        super().__init__()
        self.cooperative = cooperative
        self.assigned: list[tuple[str, list[tuple[int, int]]]] = []

    def assign(self, partitions: list[TopicPartition]) -> None:
        if self.cooperative:
            raise KafkaException(KafkaError(KafkaError._STATE))
        self.assigned.append(("assign", [(p.partition, p.offset) for p in partitions]))

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned.append(("incremental", [(p.partition, p.offset) for p in partitions]))


def assignment(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition("jobs.ready", p) for p in partitions]


async def test_a_replaced_consumer_counts_nothing_of_the_old_one_and_commits_only_its_own():
    old, new = Kafka(), Assignable()
    offsets = offsets_of(old, {0: [40, 41]})
    offsets.finish(0, 40)
    offsets.replace(new)  # type: ignore[arg-type]
    assert offsets.generation == 1 and offsets.tracker.positions() == {}
    offsets.finish(0, 41)  # a job of the old topic's message finished: nothing to commit
    assert offsets.tracker.positions() == {}
    offsets.tracker.start(0, 41)  # the new topic's offset 41, not yet finished
    offsets.finish(0, 41, generation=0)  # the old one's 41 does not finish it
    assert offsets.tracker.positions() == {}
    offsets.finish(0, 41, generation=1)
    await offsets.commit()
    assert old.commits == [] and new.commits == [[(0, 42)]]


def test_a_replaced_consumer_starts_each_partition_at_the_log_start_on_its_first_assignment():
    plain = Assignable()
    Offsets(plain, "jobs.ready").on_assign(plain, assignment(0, 1))  # type: ignore[arg-type]
    assert plain.assigned == []  # an ordinary consumer starts where the group committed
    new = Assignable()
    offsets = Offsets(Kafka(), "jobs.ready")  # type: ignore[arg-type]
    offsets.replace(new)  # type: ignore[arg-type]
    offsets.on_assign(new, assignment(0, 1))  # type: ignore[arg-type]
    assert new.assigned == [("assign", [(0, OFFSET_BEGINNING), (1, OFFSET_BEGINNING)])]
    # a rebalance: 0 and 1 were started already (where the group committed), 2 is new
    offsets.on_assign(new, assignment(0, 1, 2))  # type: ignore[arg-type]
    assert new.assigned[1] == (
        "assign",
        [(0, OFFSET_INVALID), (1, OFFSET_INVALID), (2, OFFSET_BEGINNING)],
    )
    offsets.on_assign(new, assignment(2))  # type: ignore[arg-type]
    assert len(new.assigned) == 2  # nothing new: the consumer assigns it as ever


def test_a_replaced_cooperative_consumer_assigns_incrementally():
    new = Assignable(cooperative=True)
    offsets = Offsets(Kafka(), "jobs.ready")  # type: ignore[arg-type]
    offsets.replace(new)  # type: ignore[arg-type]
    offsets.on_assign(new, assignment(3))  # type: ignore[arg-type]
    assert new.assigned == [("incremental", [(3, OFFSET_BEGINNING)])]
