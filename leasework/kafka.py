"""confluent-kafka, kept off the Trio event loop.

librdkafka calls block, so every call runs in a worker thread; each client has its own
limiter of one, which also serialises calls that librdkafka does not want interleaved.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from leasework.queues.priorities import band_consumer_group, band_of_topic

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

    def __init__(
        self,
        brokers: Sequence[str],
        client_id: str,
        extra: Properties = (),
        topic_check_every: float | None = None,
    ) -> None:
        self._config = producer_config(brokers, client_id, extra)
        self.producer = Producer(self._config)
        self._partitions: dict[str, tuple[int, float]] = {}  # topic: (count, when asked)
        # a topic deleted and made again is not produced to by the producer that knew the old
        # one (its partitions' leader epochs run ahead of the new topic's: every record times
        # out); the ids of the topics published to are read every ``topic_check_every`` s
        # (None: never) and a changed one replaces the producer (renewals counts them)
        self.topic_check_every = topic_check_every
        self.renewals = 0
        self._ids: dict[str, str] = {}
        self._ids_read = -math.inf
        self._admin = (
            AdminClient(client_config(brokers, f"{client_id}-topics", extra))
            if topic_check_every is not None
            else None
        )

    def renew_if_recreated(self, topics: Sequence[str], timeout: float = 2.0) -> list[str]:
        """Replace the producer when one of ``topics`` (or one published to before) has a
        new id since it was last read, at most every ``topic_check_every`` s; the topics
        whose ids changed. What the old producer still held is purged: reported failed, so
        the outbox keeps those rows for the new one."""
        now = time.monotonic()
        if self._admin is None or now - self._ids_read < (self.topic_check_every or 0):
            return []
        self._ids_read = now
        seen = topic_ids(self._admin, sorted({*topics, *self._ids}), timeout)
        changed = sorted(t for t, i in seen.items() if topic_recreated(self._ids.get(t), i))
        self._ids.update(seen)
        if changed:
            old, self.producer = self.producer, Producer(self._config)
            old.purge()
            old.flush(0)
            self._partitions.clear()
            self.renewals += 1
        return changed

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


NO_OFFSET = -1  # a partition its group has committed nothing for (librdkafka says -1001)


@dataclass(frozen=True)
class PartitionPosition:
    """Where one partition stands: the first offset it still holds (its log start), the next
    offset it will write (its high watermark), and its group's committed offset
    (:data:`NO_OFFSET` when the group committed nothing there; None when the group could not
    be read)."""

    low: int
    high: int
    committed: int | None


@dataclass(frozen=True)
class BandPositions:
    """One queue's priority band as Kafka holds it now: its topic, the topic's id (a topic
    deleted and made again has a new one; None when the cluster did not say), and each
    partition's position. ``group_read``: whether its consumer group's offsets were read."""

    queue: str
    priority: int
    topic: str
    topic_id: str | None
    partitions: dict[int, PartitionPosition]
    group_read: bool

    def lags(self) -> list[BandLag]:
        """The lag of each partition, when the group was read (none otherwise)."""
        if not self.group_read:
            return []
        return [
            BandLag(self.queue, self.priority, p, max(0, at.high - max(0, at.committed or 0)))
            for p, at in sorted(self.partitions.items())
        ]


def topic_recreated(known: str | None, seen: str | None) -> bool:
    """Whether a topic known by id ``known`` now stands for another topic: its id ``seen``
    (None: not described this time) is read and differs. Without a ``known`` id nothing can
    be told; a topic not described (deleted, not yet made again) is no verdict either."""
    return known is not None and seen is not None and seen != known


def topic_ids(admin: AdminClient, topics: list[str], timeout: float) -> dict[str, str]:
    """Each of ``topics``' id, as far as the cluster says (a topic it does not describe, or
    all of them when the cluster cannot be asked, is left out). Blocking."""
    try:
        futures = admin.describe_topics(TopicCollection(topics), request_timeout=timeout)
    except KafkaException:
        return {}
    ids = {}
    for topic, future in futures.items():
        try:
            ids[topic] = str(future.result().topic_id)
        except KafkaException:
            continue
    return ids


def bands_positions(
    admin: AdminClient, base_topic: str, base_group: str, timeout: float = 5.0
) -> list[BandPositions]:
    """Every band of every queue on the cluster (the topics whose names
    :func:`leasework.queues.priorities.band_of_topic` reads as a queue's band), each measured from
    outside its consumer group, so that workers cut off from Kafka still show up. The
    requests: the cluster's metadata, the topics' ids, one offset fetch per band's group (the
    admin API takes one group a call; they are sent together), and the log start and high
    watermark of every partition, a batch per leader each. A band whose group's offsets could
    not be read this time has ``group_read`` false. Blocking: call from a thread or, as the
    relay does, a child process (:mod:`leasework.relay.lagprobe`)."""
    metadata = admin.list_topics(timeout=timeout)
    bands: dict[str, tuple[str, int, str, list[TopicPartition]]] = {}
    for topic, found in sorted(metadata.topics.items()):
        band = band_of_topic(base_topic, topic)
        if band is None or found.error is not None or not found.partitions:
            continue
        partitions = [TopicPartition(topic, p) for p in sorted(found.partitions)]
        bands[band_consumer_group(base_group, *band)] = (*band, topic, partitions)
    if not bands:
        return []
    fetches = {
        group: admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, partitions)], request_timeout=timeout
        )[group]
        for group, (_, _, _, partitions) in bands.items()
    }
    every = [tp for *_, partitions in bands.values() for tp in partitions]
    ends = {}
    for spec in ("earliest", "latest"):
        asked = admin.list_offsets(
            {tp: getattr(OffsetSpec, spec)() for tp in every}, request_timeout=timeout
        )
        ends[spec] = {(tp.topic, tp.partition): f.result().offset for tp, f in asked.items()}
    ids = topic_ids(admin, [topic for _, _, topic, _ in bands.values()], timeout)
    found: list[BandPositions] = []
    for group, (queue, priority, topic, partitions) in bands.items():
        try:
            committed = {
                tp.partition: tp.offset if tp.offset >= 0 else NO_OFFSET
                for tp in fetches[group].result().topic_partitions
            }
            read = True
        except KafkaException:
            committed, read = {}, False
        positions = {
            tp.partition: PartitionPosition(
                ends["earliest"][(topic, tp.partition)],
                ends["latest"][(topic, tp.partition)],
                committed.get(tp.partition, NO_OFFSET) if read else None,
            )
            for tp in partitions
        }
        found.append(BandPositions(queue, priority, topic, ids.get(topic), positions, read))
    return found


def bands_lag(
    admin: AdminClient, base_topic: str, base_group: str, timeout: float = 5.0
) -> tuple[list[BandLag], list[tuple[str, int]]]:
    """The lag of every band of every queue on the cluster (:func:`bands_positions`), and the
    (queue, priority) of each band whose group's offsets could not be read this time (no lag
    of it: its last sample stands). Blocking."""
    positions = bands_positions(admin, base_topic, base_group, timeout)
    lags = [lag for band in positions for lag in band.lags()]
    unread = [(band.queue, band.priority) for band in positions if not band.group_read]
    return lags, unread
