"""Faults in which Kafka forgets: records a waiting job needs are gone (issue 54).

``records_delete`` deletes every record a ready topic holds now (each partition up to its
high watermark), what retention does to a backlog older than it. ``topic_recreate`` deletes
the topic and makes it again, shaped as before (its consumer group's offsets go with it).
``offsets_reset`` moves the topic's consumer group to the end of every partition, as an
operator's ``--reset-offsets --to-latest`` does: it needs the group empty, so a scenario
stops the workers first (it waits for their session to expire). ``retention_shrink`` sets a
small ``retention.bytes`` (or ``retention.ms``) and ``segment.ms`` on the topic until its
heal, so the brokers' retention deletes a backlog nobody consumed (the brokers check every
few seconds: ``log.retention.check.interval.ms`` in ``devstack/services/kafka.py``).

The target is a queue band's topic (``jobs.ready`` unless the scenario names another). None
of these is in the default random mix. Each talks to the brokers' direct inter-broker
listeners, past Toxiproxy: the operator's tool, not a client's link.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from chaos.nemeses.base import Fault, Hands, NemesisError, Param
from devstack.layout import KAFKA_DIRECT_BOOTSTRAP
from leasework.queues.priorities import band_consumer_group, band_of_topic

if TYPE_CHECKING:
    from chaos.nemesis import Injection

RANK = 7

TOPIC = "jobs.ready"  # the default target: the default queue's first band
GROUP = "leasework-workers"  # the workers' base consumer group (LEASEWORK_CONSUMER_GROUP)
TIMEOUT = 30.0  # seconds an admin call, or a wait for the cluster, may take


def _admin():
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP, "log_level": 0})


def _partitions(admin, topic: str) -> list[int]:
    found = admin.list_topics(topic, timeout=TIMEOUT).topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise NemesisError(f"topic {topic} is not on the cluster")
    return sorted(found.partitions)


def delete_records(topic: str) -> int:
    """Delete every record ``topic`` holds now (blocking); returns how many were held."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    admin = _admin()
    partitions = [TopicPartition(topic, p) for p in _partitions(admin, topic)]
    starts = admin.list_offsets(
        {tp: OffsetSpec.earliest() for tp in partitions}, request_timeout=TIMEOUT
    )
    low = {tp.partition: f.result().offset for tp, f in starts.items()}
    asked = [TopicPartition(topic, tp.partition, -1) for tp in partitions]  # -1: the end
    done = admin.delete_records(asked, request_timeout=TIMEOUT)
    return sum(f.result().low_watermark - low[tp.partition] for tp, f in done.items())


def recreate_topic(topic: str) -> int:
    """Delete ``topic`` and make it again with its partition count, replication and
    ``min.insync.replicas`` (blocking); returns its partition count."""
    from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

    admin = _admin()
    found = admin.list_topics(topic, timeout=TIMEOUT).topics[topic]
    partitions = len(found.partitions)
    replication = len(next(iter(found.partitions.values())).replicas)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    described = admin.describe_configs([resource], request_timeout=TIMEOUT)[resource].result()
    min_isr = described["min.insync.replicas"].value
    admin.delete_topics([topic], operation_timeout=TIMEOUT)[topic].result()
    deadline = time.monotonic() + TIMEOUT
    while True:
        new = NewTopic(topic, partitions, replication, config={"min.insync.replicas": min_isr})
        try:
            admin.create_topics([new], operation_timeout=TIMEOUT)[topic].result()
            return partitions
        except Exception as exc:  # still being deleted: TOPIC_ALREADY_EXISTS, or marked
            if time.monotonic() > deadline:
                raise NemesisError(f"topic {topic} could not be made again: {exc}") from exc
            time.sleep(0.5)


def reset_offsets_to_latest(topic: str) -> int:
    """Move ``topic``'s consumer group to every partition's high watermark (blocking), once
    the group is empty (its members' sessions expired); returns how many records that
    skipped."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    band = band_of_topic(TOPIC, topic)
    assert band is not None  # target_problem said so
    group = band_consumer_group(GROUP, *band)
    admin = _admin()
    partitions = [TopicPartition(topic, p) for p in _partitions(admin, topic)]
    committed = {
        tp.partition: tp.offset
        for tp in admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group, partitions)], request_timeout=TIMEOUT
        )[group]
        .result()
        .topic_partitions
    }
    latest = {tp: OffsetSpec.latest() for tp in partitions}
    ends = admin.list_offsets(latest, request_timeout=TIMEOUT)
    high = {tp.partition: f.result().offset for tp, f in ends.items()}
    moved = [TopicPartition(topic, p, h) for p, h in high.items()]
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, moved)], request_timeout=TIMEOUT
            )[group].result()
            break
        except Exception as exc:  # the group still has members: wait for their sessions
            if time.monotonic() > deadline:
                raise NemesisError(
                    f"group {group} could not be reset (stop its workers first): {exc}"
                ) from exc
            time.sleep(1.0)
    return sum(h - max(0, committed.get(p, 0)) for p, h in high.items())


SHRUNK = ("retention.bytes", "retention.ms", "segment.ms")


def set_retention(topic: str, settings: dict[str, str | None]) -> None:
    """Set (a value) or remove (None) ``settings`` of ``topic`` (blocking)."""
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entries = [
        ConfigEntry(
            name,
            value if value is not None else "",
            incremental_operation=AlterConfigOpType.SET
            if value is not None
            else AlterConfigOpType.DELETE,
        )
        for name, value in settings.items()
    ]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    admin = _admin()  # held until the answer: a client destroyed first fails its futures
    admin.incremental_alter_configs([resource], request_timeout=TIMEOUT)[resource].result()


@dataclass(frozen=True)
class RecordsFault(Fault):
    family: ClassVar[str] = "records"
    colour: ClassVar[str] = "#8c564b"

    def target_problem(self, target: str | None) -> str | None:
        if target is None or band_of_topic(TOPIC, target) is not None:
            return None
        return (
            f"{target!r}: {self.name} acts on a queue band's topic "
            "(jobs.ready, jobs.ready.<queue>, jobs.ready.<queue>.p<n>)"
        )

    def random_target(
        self, rng: random.Random, processes: Sequence[str], proxies: Sequence[str]
    ) -> str:
        return TOPIC

    def affected(self, target: str | None) -> str:
        return f"the records of {target or TOPIC}: every worker consuming it, nothing else"


@dataclass(frozen=True)
class OneOff(RecordsFault):
    """A one-off on the topic: ``act(topic)`` once, what it did said in the run's log as
    ``told`` (with ``{topic}`` and ``{done}``, what ``act`` returned); nothing to heal."""

    act: Callable[[str], object] = delete_records
    told: str = "{topic}: {done}"

    async def start(self, hands: Hands, injection: Injection) -> None:
        topic = injection.target or TOPIC
        done = await hands.calls(self.act, topic)
        hands.say("nemesis: " + self.told.format(topic=topic, done=done))

    async def heal(self, hands: Hands, injection: Injection) -> None:
        return  # what was done stays done


@dataclass(frozen=True)
class RetentionShrink(RecordsFault):
    def random_params(self, rng: random.Random) -> dict[str, Any]:
        return {"bytes": 4096, "segment_ms": 2000}

    async def start(self, hands: Hands, injection: Injection) -> None:
        topic, params = injection.target or TOPIC, injection.spec.params
        settings = {"segment.ms": str(int(params.get("segment_ms", 2000)))}
        if "bytes" in params:
            settings["retention.bytes"] = str(int(params["bytes"]))
        if "ms" in params:
            settings["retention.ms"] = str(int(params["ms"]))
        await hands.calls(set_retention, topic, settings)
        hands.say(f"nemesis: {topic} retention set to {settings}")

    async def heal(self, hands: Hands, injection: Injection) -> None:
        await hands.calls(set_retention, injection.target or TOPIC, dict.fromkeys(SHRUNK))


FAULTS: tuple[Fault, ...] = (
    *(
        OneOff(
            name,
            lasts=False,
            instant=True,
            default_target=TOPIC,
            random_mix=False,
            act=act,
            told=told,
        )
        for name, act, told in (
            ("records_delete", delete_records, "deleted {done} record(s) of {topic}"),
            (
                "topic_recreate",
                recreate_topic,
                "{topic} deleted and made again ({done} partitions)",
            ),
            (
                "offsets_reset",
                reset_offsets_to_latest,
                "{topic}'s group reset to latest, skipping {done} record(s)",
            ),
        )
    ),
    RetentionShrink(
        "retention_shrink",
        params=(
            Param("bytes", low=1, high=1 << 40),
            Param("ms", low=1, high=1 << 40),
            Param("segment_ms", low=100, high=3_600_000),
        ),
        default_target=TOPIC,
        random_mix=False,
    ),
)
