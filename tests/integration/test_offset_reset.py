"""A worker's consumer with ``auto.offset.reset`` ``error`` (leasework/worker/consumer.py), run
as the worker runs it (its config, :func:`consume`, its offsets stage) against the real brokers,
on a throwaway topic and group of its own: a partition without a usable offset is logged,
counted and consumed again from its log start, and no record Kafka still holds is skipped.
The shared ``jobs.ready`` topics and the live workers' groups are left alone."""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Iterator

import pytest
import trio
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import REGISTRY

from devstack.layout import KAFKA_DIRECT_BOOTSTRAP
from leasework import config
from leasework.queues.priorities import HIGHEST, band_consumer_group
from leasework.service import Stopping
from leasework.worker.consumer import Consumed, consume
from leasework.worker.feed import Feed
from leasework.worker.slots import Slots

pytestmark = pytest.mark.usefixtures("stack")

PARTITIONS = 3
PER_PARTITION = 10  # records produced to each partition before the consumer starts
QUEUE = "resets"  # the metric's queue label, and part of the group's name
DEADLINE = 60.0  # seconds the consumer has to consume what a test wants


@pytest.fixture
def topic() -> Iterator[str]:
    """A scratch topic of 3 partitions, 10 records each, deleted afterwards."""
    admin = AdminClient({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP})
    name = f"test.offset-reset.{uuid.uuid4().hex[:12]}"
    spec = NewTopic(name, PARTITIONS, 1, config={"min.insync.replicas": "1"})
    for future in admin.create_topics([spec]).values():
        future.result(30)
    produce(name, {p: PER_PARTITION for p in range(PARTITIONS)})
    yield name
    for future in admin.delete_topics([name]).values():
        future.result(30)


def worker_settings(**rdkafka: str) -> config.Settings:
    """A worker's settings with a consumer group of this test's own, direct to the brokers,
    with further librdkafka properties as a deployment sets them (LEASEWORK_RDKAFKA_*)."""
    return config.load(
        "doctor",
        {
            "LEASEWORK_KAFKA_BROKERS": KAFKA_DIRECT_BOOTSTRAP,
            "LEASEWORK_CONSUMER_GROUP": f"test-offset-reset-{uuid.uuid4().hex[:12]}",
            **{f"LEASEWORK_RDKAFKA_{name.upper()}": value for name, value in rdkafka.items()},
        },
    )


@pytest.fixture
def settings() -> config.Settings:
    return worker_settings()


def produce(topic: str, counts: dict[int, int]) -> None:
    producer = Producer({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP})
    for partition, count in counts.items():
        for _ in range(count):
            value = json.dumps({"job_id": str(uuid.uuid4())}).encode()
            producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0


def group_of(settings: config.Settings) -> str:
    return band_consumer_group(settings.consumer_group, QUEUE, HIGHEST)


def commit(settings: config.Settings, topic: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` (partition -> next offset) as the group's, as a worker that read
    that far and stopped would have left them."""
    committer = Consumer(
        {
            "bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP,
            "group.id": group_of(settings),
            "enable.auto.commit": False,
        }
    )
    try:
        parts = [TopicPartition(topic, p, o) for p, o in offsets.items()]
        committer.commit(offsets=parts, asynchronous=False)
    finally:
        committer.close()


def delete_records(topic: str, before: dict[int, int]) -> None:
    """What retention does to old records: each partition's records below ``before``."""
    admin = AdminClient({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP})
    parts = [TopicPartition(topic, p, o) for p, o in before.items()]
    for future in admin.delete_records(parts).values():
        future.result(30)


def delete_group(settings: config.Settings) -> None:
    """The test's group, empty once its consumer closed, is not left behind."""
    admin = AdminClient({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP})
    for future in admin.delete_consumer_groups([group_of(settings)]).values():
        future.result(30)


def resets(reason: str) -> float:
    value = REGISTRY.get_sample_value(
        "leasework_consumer_offset_resets_total",
        {"queue": QUEUE, "priority": str(HIGHEST), "reason": reason},
    )
    return value or 0.0


def reset_logs(caplog: pytest.LogCaptureFixture, topic: str) -> dict[int, logging.LogRecord]:
    """The consumer's reset record of each partition of ``topic`` (exactly one each)."""
    found: dict[int, logging.LogRecord] = {}
    for record in caplog.records:
        if record.name == "leasework.worker.consumer" and getattr(record, "reason", None):
            if record.topic == topic:
                assert record.partition not in found, "a partition's reset was logged twice"
                found[record.partition] = record
    return found


async def consume_until(
    settings: config.Settings,
    topic: str,
    wanted: dict[int, set[int]],
    also: dict[int, int] | None = None,
    capacity: int = 10_000,
) -> dict[int, list[int]]:
    """Run the worker's consume stage on ``topic`` until every offset in ``wanted`` has
    arrived (then ``also``: records produced while it runs, partition -> count, and their
    offsets are wanted too); the offsets that arrived, by partition, in arrival order. With
    a ``capacity`` of 1 (a worker of concurrency 1) each poll returns one message or event."""
    feed = Feed(settings, QUEUE, HIGHEST, topic)
    await feed.open()
    offsets = feed.offsets
    stopping = Stopping()
    slots = Slots(capacity)
    batches_in, batches_out = trio.open_memory_channel[list[Consumed]](math.inf)
    arrived: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}

    def missing() -> dict[int, set[int]]:
        return {p: w - set(arrived[p]) for p, w in wanted.items() if w - set(arrived[p])}

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, feed, slots, stopping, batches_in)
            with trio.move_on_after(DEADLINE):
                async for batch in batches_out:
                    for message in batch:
                        arrived[message.partition].append(message.offset)
                        offsets.finish(message.partition, message.offset)
                        slots.release()
                    if not missing():
                        if not also:
                            break
                        await trio.to_thread.run_sync(produce, topic, also)
                        for partition, count in also.items():
                            end = max(wanted.get(partition, set()) | {PER_PARTITION - 1}) + 1
                            wanted.setdefault(partition, set()).update(range(end, end + count))
                        also = None
            stopping.set("test over")
    finally:
        await feed.close()
        await trio.to_thread.run_sync(delete_group, settings)
    assert not missing(), f"never consumed: {missing()}; consumed: {arrived}"
    return arrived


# the default (eager) protocol sets the whole assignment again; a cooperative one (a
# deployment may choose it) restarts the partition alone
@pytest.mark.parametrize("strategy", ["range,roundrobin", "cooperative-sticky"])
async def test_records_deleted_past_the_group_offset_are_said_and_the_rest_consumed(
    topic, caplog, strategy
):
    settings = worker_settings(partition_assignment_strategy=strategy)
    caplog.set_level(logging.DEBUG, logger="leasework.worker.consumer")
    before = resets("out_of_range")
    # the group read 3 records of each partition; then Kafka deleted partition 0's first 6
    # and all of partition 1's; partition 2 still holds everything
    commit(settings, topic, {0: 3, 1: 3, 2: 3})
    delete_records(topic, {0: 6, 1: PER_PARTITION})
    arrived = await consume_until(
        settings,
        topic,
        {0: set(range(6, 10)), 2: set(range(3, 10))},
        also={1: 2},  # partition 1, emptied, is consumed again: its new records arrive
    )
    # nothing Kafka still held was skipped, nothing below the group's offset was read again
    assert sorted(arrived[0]) == list(range(6, 10))
    assert sorted(arrived[1]) == [10, 11]
    assert sorted(arrived[2]) == list(range(3, 10))
    assert resets("out_of_range") - before == 2
    logs = reset_logs(caplog, topic)
    assert sorted(logs) == [0, 1]
    for partition, low in ((0, 6), (1, PER_PARTITION)):
        record = logs[partition]
        assert record.levelno == logging.WARNING
        assert record.reason == "out_of_range"
        assert record.asked_offset == 3
        assert record.log_start_offset == low
        assert record.high_watermark == PER_PARTITION
        assert record.resumed_at == low
        assert record.queue == QUEUE and record.priority == "0"


# capacity 1: each partition's reset event comes in a poll of its own, after the others'
# partitions were started again (each restart sets the whole assignment again)
@pytest.mark.parametrize("capacity", [1, 10_000])
async def test_a_new_group_starts_at_the_log_start_and_says_so_at_info(
    topic, settings, caplog, capacity
):
    caplog.set_level(logging.DEBUG, logger="leasework.worker.consumer")
    before = resets("no_committed_offset")
    delete_records(topic, {0: 4})  # so that the log start is not offset 0
    arrived = await consume_until(
        settings,
        topic,
        {0: set(range(4, 10)), 1: set(range(10)), 2: set(range(10))},
        capacity=capacity,
    )
    assert sorted(arrived[0]) == list(range(4, 10))
    assert sorted(arrived[1]) == sorted(arrived[2]) == list(range(10))
    assert resets("no_committed_offset") - before == PARTITIONS
    logs = reset_logs(caplog, topic)
    assert sorted(logs) == list(range(PARTITIONS))
    for partition, record in logs.items():
        assert record.levelno == logging.INFO
        assert record.reason == "no_committed_offset"
        assert record.asked_offset is None
        assert record.resumed_at == (4 if partition == 0 else 0)


async def test_a_group_offset_past_the_log_end_is_a_truncated_log(topic, settings, caplog):
    caplog.set_level(logging.DEBUG, logger="leasework.worker.consumer")
    before = resets("log_truncated")
    # as after the topic was recreated: the group's offset of partition 0 is past its end
    commit(settings, topic, {0: 50, 1: PER_PARTITION, 2: PER_PARTITION})
    arrived = await consume_until(settings, topic, {0: set(range(10))}, also={2: 1})
    assert sorted(arrived[0]) == list(range(10))
    assert arrived[1] == [] and arrived[2] == [PER_PARTITION]
    assert resets("log_truncated") - before == 1
    record = reset_logs(caplog, topic)[0]
    assert record.levelno == logging.WARNING
    assert record.asked_offset == 50
    assert (record.log_start_offset, record.high_watermark) == (0, PER_PARTITION)
    assert record.resumed_at == 0
