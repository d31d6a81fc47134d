"""A topic deleted and made again under a worker's running consumer (leasework/worker/feed.py,
topic_watch.py), against the real brokers on a throwaway topic and group: librdkafka's consumer
would fetch nothing more (confluent-kafka-python#1787); the feed sees the topic's new id,
replaces its consumer and consumes the new topic from its log start. The shared ``jobs.ready``
topics and the live workers' groups are left alone."""

from __future__ import annotations

import math
import time
import uuid

import pytest
import trio
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import REGISTRY

from devstack.layout import KAFKA_DIRECT_BOOTSTRAP
from leasework.kafka import BlockingPublisher
from leasework.queues.priorities import HIGHEST
from leasework.service import Stopping
from leasework.worker.consumer import Consumed, consume
from leasework.worker.feed import Feed
from leasework.worker.slots import Slots
from leasework.worker.topic_watch import TopicWatch
from tests.integration.test_offset_reset import (
    PARTITIONS,
    PER_PARTITION,
    QUEUE,
    delete_group,
    produce,
    worker_settings,
)

pytestmark = pytest.mark.usefixtures("stack")

AFTER = 3  # records produced to each partition of the topic made again
DEADLINE = 90.0  # seconds for each stage of the test


def create(admin: AdminClient, name: str) -> None:
    """Create the topic, again and again while the cluster still finishes deleting it."""
    spec = NewTopic(name, PARTITIONS, 1, config={"min.insync.replicas": "1"})
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            for future in admin.create_topics([spec]).values():
                future.result(30)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def delete(admin: AdminClient, name: str) -> None:
    for future in admin.delete_topics([name]).values():
        future.result(30)


def renewals() -> float:
    value = REGISTRY.get_sample_value(
        "leasework_consumer_renewals_total", {"queue": QUEUE, "priority": str(HIGHEST)}
    )
    return value or 0.0


async def test_a_topic_made_again_under_the_consumer_is_consumed_by_a_new_one():
    admin = AdminClient({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP})
    topic = f"test.topic-recreated.{uuid.uuid4().hex[:12]}"
    settings = worker_settings()
    before = renewals()
    await trio.to_thread.run_sync(create, admin, topic)
    await trio.to_thread.run_sync(produce, topic, {p: PER_PARTITION for p in range(PARTITIONS)})
    watch = TopicWatch(settings, [topic], every=0.5)
    await watch.read()
    old_id = watch.id_of(topic)
    feed = Feed(settings, QUEUE, HIGHEST, topic, watch)
    await feed.open()
    stopping, slots = Stopping(), Slots(10_000)
    batches_in, batches_out = trio.open_memory_channel[list[Consumed]](math.inf)
    arrived: list[Consumed] = []

    async def receive_until(count: int) -> None:
        with trio.move_on_after(DEADLINE):
            async for batch in batches_out:
                for message in batch:
                    arrived.append(message)
                    feed.offsets.finish(message.partition, message.offset, message.generation)
                    slots.release()
                if len(arrived) >= count:
                    return

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch.run)
            nursery.start_soon(consume, feed, slots, stopping, batches_in)
            nursery.start_soon(feed.offsets.run)
            await receive_until(PARTITIONS * PER_PARTITION)
            assert len(arrived) == PARTITIONS * PER_PARTITION
            await trio.to_thread.run_sync(delete, admin, topic)
            await trio.to_thread.run_sync(create, admin, topic)
            # the consumer is replaced (librdkafka's may or may not follow the new topic by
            # itself: the records come after the replacement, so only the new one can have them)
            with trio.fail_after(DEADLINE):
                while renewals() == before:  # noqa: ASYNC110 (a counter: no event to wait on)
                    await trio.sleep(0.1)
            await trio.to_thread.run_sync(produce, topic, {p: AFTER for p in range(PARTITIONS)})
            await receive_until(PARTITIONS * (PER_PARTITION + AFTER))
            stopping.set("test over")
            nursery.cancel_scope.cancel()
    finally:
        await feed.close()
        await trio.to_thread.run_sync(delete_group, settings)
        await trio.to_thread.run_sync(delete, admin, topic)
    new = [(m.partition, m.offset) for m in arrived if m.generation == 1]
    assert sorted(new) == [(p, o) for p in range(PARTITIONS) for o in range(AFTER)], arrived
    assert all(m.generation == 0 for m in arrived[: PARTITIONS * PER_PARTITION])
    assert renewals() - before == 1
    assert watch.id_of(topic) not in (None, old_id) and feed.topic_id == watch.id_of(topic)


def test_the_relays_publisher_replaces_its_producer_when_a_topic_is_made_again():
    admin = AdminClient({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP})
    topic = f"test.topic-recreated.{uuid.uuid4().hex[:12]}"
    create(admin, topic)
    publisher = BlockingPublisher([KAFKA_DIRECT_BOOTSTRAP], "test-publisher", topic_check_every=0)
    one = [(topic, "k", b"{}", {})]
    try:
        assert publisher.renew_if_recreated([topic]) == []  # its id, read for the first time
        assert [r.ok for r in publisher.publish(one, timeout=30)] == [True]
        before = publisher.producer
        delete(admin, topic)
        create(admin, topic)
        deadline = time.monotonic() + DEADLINE
        while not (changed := publisher.renew_if_recreated([topic])):
            # a broker may describe the topic as it was, or not at all, for a moment
            assert time.monotonic() < deadline, "the topic's new id was never read"
            time.sleep(0.1)
        assert changed == [topic]
        assert publisher.renewals == 1 and publisher.producer is not before
        assert [r.ok for r in publisher.publish(one, timeout=30)] == [True]
        assert publisher.renew_if_recreated([topic]) == []  # the same topic since
    finally:
        publisher.close()
        delete(admin, topic)
