"""confluent-kafka, kept off the Trio event loop.

librdkafka calls block, so every call runs in a worker thread; each client has its own
limiter of one, which also serialises calls that librdkafka does not want interleaved.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from leasework.priorities import band_consumer_group, band_of_topic

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


@dataclass(frozen=True)
class BandLag:
    """Messages of one partition of a queue's priority band that its consumer group has not
    committed past (the high watermark less the committed offset)."""

    queue: str
    priority: int
    partition: int
    lag: int


def bands_lag(
    admin: AdminClient, base_topic: str, base_group: str, timeout: float = 5.0
) -> tuple[list[BandLag], list[tuple[str, int]]]:
    """The lag of every band of every queue on the cluster (the topics whose names
    :func:`leasework.priorities.band_of_topic` reads as a queue's band), each measured from
    outside its consumer group, so that workers cut off from Kafka still show up as growing
    lag. Three kinds of request: the cluster's metadata, one offset fetch per band's group
    (the admin API takes one group a call; they are sent together), and the high watermarks
    of every partition in one batch per leader. Returns the lags, and the (queue, priority)
    of each band whose group's offsets could not be read this time (no lag of it: its last
    sample stands). Blocking: call from a thread or, as the relay does, a child process
    (:mod:`leasework.relay.lagprobe`)."""
    metadata = admin.list_topics(timeout=timeout)
    bands: dict[str, tuple[str, int, list[TopicPartition]]] = {}
    for topic, found in sorted(metadata.topics.items()):
        band = band_of_topic(base_topic, topic)
        if band is None or found.error is not None or not found.partitions:
            continue
        partitions = [TopicPartition(topic, p) for p in sorted(found.partitions)]
        bands[band_consumer_group(base_group, *band)] = (*band, partitions)
    if not bands:
        return [], []
    fetches = {
        group: admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, partitions)], request_timeout=timeout
        )[group]
        for group, (_, _, partitions) in bands.items()
    }
    latest = admin.list_offsets(
        {tp: OffsetSpec.latest() for _, _, partitions in bands.values() for tp in partitions},
        request_timeout=timeout,
    )
    high = {(tp.topic, tp.partition): future.result().offset for tp, future in latest.items()}
    lags: list[BandLag] = []
    unread: list[tuple[str, int]] = []
    for group, (queue, priority, _) in bands.items():
        try:
            committed = fetches[group].result().topic_partitions
        except KafkaException:
            unread.append((queue, priority))
            continue
        for tp in committed:
            end = high.get((tp.topic, tp.partition))
            if end is not None:
                lags.append(BandLag(queue, priority, tp.partition, max(0, end - max(0, tp.offset))))
    return lags, unread
