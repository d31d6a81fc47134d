"""Admin-side Kafka checks through the direct (inter-broker) listeners, never the proxy,
so that toxics on ``kafka-N`` proxies cannot fool readiness or block topic creation."""

from __future__ import annotations

import logging
import time

from ..errors import StackError
from ..layout import (
    KAFKA_DIRECT_BOOTSTRAP,
    KAFKA_NODE_IDS,
    KAFKA_SECURE_PASSWORD,
    KAFKA_SECURE_USER,
    KAFKA_TOPICS,
)

log = logging.getLogger("devstack")


def _admin(bootstrap: str):  # -> confluent_kafka.admin.AdminClient
    from confluent_kafka.admin import AdminClient

    return AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "chaos-stack",
            "log_level": 0,  # connection-refused chatter while brokers boot is expected
            "socket.connection.setup.timeout.ms": 2000,
        }
    )


def live_broker_ids(bootstrap: str, timeout: float = 2.0) -> set[int]:
    """Broker ids in the metadata answered by ``bootstrap`` (registered, unfenced)."""
    md = _admin(bootstrap).list_topics(timeout=timeout)
    return set(md.brokers)


def ensure_topics(bootstrap: str = KAFKA_DIRECT_BOOTSTRAP, timeout: float = 30.0) -> list[str]:
    """Create the stack's topics if missing; returns the names created. Warns (does not
    fail) when an existing topic has a different partition count."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap)
    existing = admin.list_topics(timeout=timeout).topics
    todo = []
    for name, spec in KAFKA_TOPICS.items():
        if name in existing:
            have = len(existing[name].partitions)
            if have != spec["partitions"]:
                log.warning(
                    "topic %s has %d partitions, expected %s", name, have, spec["partitions"]
                )
            continue
        todo.append(
            NewTopic(
                name,
                num_partitions=int(spec["partitions"]),  # type: ignore[call-overload]
                replication_factor=int(spec["replication"]),  # type: ignore[call-overload]
                config=dict(spec["config"]),  # type: ignore[call-overload]
            )
        )
    created = []
    if not todo:
        return created
    for name, fut in admin.create_topics(todo, operation_timeout=timeout).items():
        try:
            fut.result(timeout=timeout)
            created.append(name)
        except KafkaException as e:
            err = e.args[0]
            if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise StackError(f"kafka: creating topic {name} failed: {err.str()}") from e
    return created


def cluster_problems(bootstrap: str = KAFKA_DIRECT_BOOTSTRAP, timeout: float = 3.0) -> list[str]:
    """Why the cluster is not fully ready (empty list = ready): all brokers present, every
    stack topic exists and each partition has a leader and ISR >= 2."""
    md = _admin(bootstrap).list_topics(timeout=timeout)
    problems = []
    missing = set(KAFKA_NODE_IDS) - set(md.brokers)
    if missing:
        problems.append(f"brokers missing from metadata: {sorted(missing)}")
    for name in KAFKA_TOPICS:
        topic = md.topics.get(name)
        if topic is None or topic.error is not None:
            problems.append(f"topic {name} missing")
            continue
        for pid, part in sorted(topic.partitions.items()):
            if part.leader < 0:
                problems.append(f"{name}[{pid}] has no leader")
            elif len(part.isrs) < 2:
                problems.append(f"{name}[{pid}] ISR {part.isrs} < 2")
    return problems


def cluster_metadata(bootstrap: str = KAFKA_DIRECT_BOOTSTRAP, timeout: float = 5.0):
    """The cluster's metadata (brokers, topics, partitions with leader, replicas and ISR)."""
    return _admin(bootstrap).list_topics(timeout=timeout)


def leaders_off_preferred(md) -> list[tuple[str, int]]:
    """The partitions (topic, partition) led by another broker than their preferred replica
    (the first of their replicas) while that replica is in sync: a preferred election can move
    them back."""
    return [
        (name, pid)
        for name, topic in sorted(md.topics.items())
        for pid, part in sorted(topic.partitions.items())
        if part.replicas and part.leader != part.replicas[0] and part.replicas[0] in part.isrs
    ]


def elect_preferred_leaders(
    bootstrap: str = KAFKA_DIRECT_BOOTSTRAP, timeout: float = 30.0
) -> tuple[int, int]:
    """Move every partition's leadership back to its preferred replica, where that replica
    is in sync; returns (partitions moved, partitions still off it after ``timeout``).

    Brokers that start one after another leave the first one up leading every partition (a
    fresh `up`: broker 3 led all 112), and Kafka moves them back only at its imbalance check,
    every 300 s by default: until then one broker takes every produce, fetch and follower
    fetch (in fresh bench runs one broker's CPU per job was three to four times the others',
    and its produce round trips reached 0.5-1.3 s under load). Never fails the caller: a
    cluster whose leaders stay off their preferred replicas works, only slower."""
    from confluent_kafka import ElectionType, KafkaException, TopicPartition

    admin = _admin(bootstrap)
    deadline = time.monotonic() + timeout
    moved, off = 0, []
    while True:
        try:
            off = leaders_off_preferred(admin.list_topics(timeout=5.0))
            if not off:
                return moved, 0
            partitions = [TopicPartition(topic, pid) for topic, pid in off]
            # no timeouts passed: confluent-kafka 2.16.1's binding refuses its own keyword
            # arguments ("more argument specifiers than keyword list entries")
            results = admin.elect_leaders(ElectionType.PREFERRED, partitions).result(20.0)
            moved += sum(error is None for error in results.values())
        except (KafkaException, TimeoutError) as exc:
            log.warning("kafka: preferred leader election failed, trying again: %s", exc)
        if time.monotonic() > deadline:
            return moved, len(off)
        time.sleep(0.5)  # the metadata catches up with the elections


def ensure_scram_user(
    user: str = KAFKA_SECURE_USER,
    password: str = KAFKA_SECURE_PASSWORD,
    bootstrap: str = KAFKA_DIRECT_BOOTSTRAP,
    timeout: float = 30.0,
) -> None:
    """The SECURE listener's SCRAM-SHA-512 user, set (again) through the admin API: an upsert,
    so it is idempotent; in KRaft the credentials live in the cluster metadata."""
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = _admin(bootstrap)
    upsert = UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), password.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert], request_timeout=timeout).values():
        try:
            future.result(timeout)
        except Exception as exc:  # a KafkaException with the broker's reason
            raise StackError(f"kafka: cannot set the SCRAM user {user!r}: {exc}") from exc
