"""confluent-kafka, kept off the Trio event loop.

librdkafka calls block, so every call runs in a worker thread; each client has its own
limiter of one, which also serialises calls that librdkafka does not want interleaved.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

Properties = Sequence[tuple[str, str]]  # further librdkafka properties (Settings.kafka_properties)


def client_config(
    brokers: Sequence[str], client_id: str, extra: Properties = (), **properties: object
) -> dict:
    """Every Kafka client leasework makes: where the brokers are, who it is, its own
    ``properties`` (dots written as underscores: ``socket_timeout_ms``), and last the
    deployment's further ones (SASL, TLS, tuning: ``LEASEWORK_RDKAFKA_*``), which cannot touch
    what the promise rests on (:data:`leasework.config.RDKAFKA_FIXED`, refused when the
    settings are read)."""
    own = {name.replace("_", "."): value for name, value in properties.items()}
    return {"bootstrap.servers": ",".join(brokers), "client.id": client_id, **own, **dict(extra)}


def producer_config(brokers: Sequence[str], client_id: str, extra: Properties = ()) -> dict:
    return client_config(
        brokers,
        client_id,
        extra,
        enable_idempotence=True,
        acks="all",
        linger_ms=5,
        # a batch that cannot be acknowledged in this long is reported failed and retried
        # by the relay from the outbox, which still holds it
        message_timeout_ms=15_000,
        socket_connection_setup_timeout_ms=5_000,
        reconnect_backoff_max_ms=2_000,
    )


@dataclass(frozen=True)
class PublishResult:
    ok: bool
    error: str | None = None


class BlockingPublisher:
    """Publish a batch and wait for every delivery report. Blocking: call from a thread."""

    def __init__(self, brokers: Sequence[str], client_id: str, extra: Properties = ()) -> None:
        self.producer = Producer(producer_config(brokers, client_id, extra))

    def publish(
        self, messages: Sequence[tuple[str, str, object, dict]], timeout: float
    ) -> list[PublishResult]:
        results: list[PublishResult | None] = [None] * len(messages)

        def report(index: int):
            def on_delivery(err: KafkaError | None, _msg) -> None:
                results[index] = PublishResult(err is None, None if err is None else str(err))

            return on_delivery

        for index, (topic, key, value, headers) in enumerate(messages):
            payload = value if isinstance(value, bytes) else json.dumps(value).encode()
            while True:
                try:
                    self.producer.produce(
                        topic,
                        key=key.encode(),
                        value=payload,
                        headers=[(k, str(v).encode()) for k, v in headers.items()],
                        on_delivery=report(index),
                    )
                    break
                except BufferError:
                    self.producer.poll(0.1)
        remaining = self.producer.flush(timeout)
        if remaining:
            # not acknowledged in time: counted as failed here; the outbox keeps the rows
            for index, result in enumerate(results):
                if result is None:
                    results[index] = PublishResult(False, "no delivery report within timeout")
        return [r if r is not None else PublishResult(False, "no report") for r in results]

    def close(self, timeout: float = 5.0) -> None:
        self.producer.flush(timeout)


def cluster_probe(admin: AdminClient, topics: Sequence[str], timeout: float = 3.0) -> str | None:
    """None if a broker answers and every topic exists with leaders; else what is wrong."""
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        return f"kafka unreachable: {exc.args[0] if exc.args else exc}"
    if not metadata.brokers:
        return "kafka: no broker in metadata"
    for topic in topics:
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return f"kafka: topic {topic} missing ({found.error if found else 'absent'})"
        if any(p.leader < 0 for p in found.partitions.values()):
            return f"kafka: topic {topic} has partitions without a leader"
    return None


def group_lag(probe: Consumer, topic: str, timeout: float = 5.0) -> dict[int, int]:
    """Messages behind the high watermark per partition for the group of ``probe``, measured
    from outside the group (so a worker cut off from Kafka still shows up as growing lag).

    ``probe`` is a consumer configured with the workers' ``group.id`` that never subscribes, so
    it reads the group's committed offsets without joining the group. Blocking: call from a
    thread. Plain synchronous calls, no admin futures.
    """
    metadata = probe.list_topics(topic, timeout=timeout)
    partitions = [TopicPartition(topic, p) for p in sorted(metadata.topics[topic].partitions)]
    committed = {tp.partition: tp.offset for tp in probe.committed(partitions, timeout=timeout)}
    lag: dict[int, int] = {}
    for tp in partitions:
        _low, high = probe.get_watermark_offsets(tp, timeout=timeout, cached=False)
        lag[tp.partition] = max(0, high - max(0, committed.get(tp.partition, 0)))
    return lag
