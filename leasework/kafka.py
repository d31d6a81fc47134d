"""confluent-kafka, kept off the Trio event loop.

librdkafka calls block, so every call runs in a worker thread; each client has its own
limiter of one, which also serialises calls that librdkafka does not want interleaved.
"""

from __future__ import annotations

import json
import time
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
        # the relay flushes once per pass, and a flush sends at once whatever linger says
        # (a lone produce-and-flush took 2.8 ms at linger.ms 5 and at 0): the pass is the
        # batch, paced by the relay (leasework.pacing), and linger only bounds a produce
        # made outside a pass
        linger_ms=5,
        # one batch per partition per pass: a pass is at most 1,000 rows of a few hundred
        # bytes, well under librdkafka's default 1 MB
        batch_size=1_000_000,
        # none: the brokers decompress every batch to validate it, and at these sizes lz4
        # cost them more than it saved (single row, brokers 0.37 -> 0.91 ms of CPU per job)
        compression_type="none",
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


PARTITIONS_TTL = 30.0  # seconds a topic's partition count is used before it is asked again
BY_KEY = -1  # librdkafka's partitioner chooses the partition from the key


class BlockingPublisher:
    """Publish a batch and wait for every delivery report. Blocking: call from a thread."""

    def __init__(self, brokers: Sequence[str], client_id: str, extra: Properties = ()) -> None:
        self.producer = Producer(producer_config(brokers, client_id, extra))
        self._partitions: dict[str, tuple[int, float]] = {}  # topic: (count, when asked)

    def partitions(self, topics: Sequence[str], timeout: float = 2.0) -> dict[str, int]:
        """The partition count of each of ``topics`` that the cluster answers for (asked at
        most every :data:`PARTITIONS_TTL` s; a topic it cannot tell is left out)."""
        now = time.monotonic()
        counts = {}
        for topic in set(topics):
            cached = self._partitions.get(topic)
            if cached is None or now - cached[1] > PARTITIONS_TTL:
                try:
                    found = self.producer.list_topics(topic, timeout=timeout).topics.get(topic)
                except KafkaException:
                    found = None
                if found is None or found.error is not None or not found.partitions:
                    if cached is None:
                        continue
                else:
                    cached = (len(found.partitions), now)
                    self._partitions[topic] = cached
            counts[topic] = cached[0]
        return counts

    def publish(
        self,
        messages: Sequence[tuple[str, str, object, dict]],
        timeout: float,
        partitions: Sequence[int] | None = None,
    ) -> list[PublishResult]:
        """Produce ``messages`` (topic, key, value, headers), message i to ``partitions[i]``
        when given (:data:`BY_KEY`: the key's partition), and wait for every report."""
        results: list[PublishResult | None] = [None] * len(messages)

        def report(index: int):
            def on_delivery(err: KafkaError | None, _msg) -> None:
                results[index] = PublishResult(err is None, None if err is None else str(err))

            return on_delivery

        for index, (topic, key, value, headers) in enumerate(messages):
            payload = value if isinstance(value, bytes) else json.dumps(value).encode()
            partition = BY_KEY if partitions is None else partitions[index]
            while True:
                try:
                    self.producer.produce(
                        topic,
                        key=key.encode(),
                        value=payload,
                        partition=partition,
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
