"""The run's messages on ``jobs.ready``, read straight from Kafka after the run (through the
inter-broker listeners: no proxy, so toxics never hide a message), and what they show: outbox
rows produced more than once (:func:`message_view`, pure)."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from devstack.layout import KAFKA_DIRECT_BOOTSTRAP

READY_TOPIC = "jobs.ready"


def _kafka_consumer() -> Any:
    from confluent_kafka import Consumer

    return Consumer(
        {
            # the inter-broker listeners: no proxy, so toxics never hide a message
            "bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP,
            "group.id": f"chaos-harness-{uuid.uuid4().hex[:8]}",  # assign() only, never joins
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )


def topic_end_offsets(topic: str = READY_TOPIC) -> dict[int, int]:
    """High watermark of every partition (blocking)."""
    from confluent_kafka import TopicPartition

    consumer = _kafka_consumer()
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        }
    finally:
        consumer.close()


def topic_messages(
    start: Mapping[int, int], topic: str = READY_TOPIC, patience: float = 60.0
) -> list[dict[str, Any]]:
    """Every message from ``start`` (partition -> offset) to the current end (blocking)."""
    from confluent_kafka import KafkaError, TopicPartition

    ends = topic_end_offsets(topic)
    todo = {p for p, end in ends.items() if end > start.get(p, 0)}
    consumer = _kafka_consumer()
    values: list[dict[str, Any]] = []
    try:
        if not todo:
            return values
        consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in sorted(todo)])
        deadline = time.monotonic() + patience
        while todo and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            partition = message.partition()
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    todo.discard(partition)
                continue
            if message.offset() >= ends[partition] - 1:
                todo.discard(partition)
            if message.offset() >= ends[partition]:
                continue
            try:
                value = json.loads(message.value() or b"")
            except ValueError:
                continue
            if isinstance(value, dict):
                values.append(value)
        if todo:
            raise TimeoutError(f"partitions {sorted(todo)} not read to their end in time")
        return values
    finally:
        consumer.close()


@dataclass(frozen=True)
class MessageView:
    """The run's messages on ``jobs.ready``: each outbox row is one message with a distinct
    (job_id, attempt); a pair seen more than once was produced again (the relay died, or
    gave up waiting for an acknowledgement, after producing and before marking the row
    published)."""

    messages: int
    duplicate_messages: int  # copies beyond the first
    jobs_with_duplicates: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def message_view(messages: Iterable[Mapping[str, Any]], job_ids: Iterable[str]) -> MessageView:
    """``messages``: decoded values ``{"job_id", "type", "attempt"}``; only the run's jobs
    (``job_ids``) count."""
    ours = set(job_ids)
    seen: Counter[tuple[str, Any]] = Counter()
    for message in messages:
        job_id = str(message.get("job_id"))
        if job_id in ours:
            seen[(job_id, message.get("attempt"))] += 1
    extra = sum(n - 1 for n in seen.values() if n > 1)
    jobs = len({job for (job, _), n in seen.items() if n > 1})
    return MessageView(sum(seen.values()), extra, jobs)
