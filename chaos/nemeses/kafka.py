"""``kafka_kill``: SIGKILL one broker; healed by starting it again and waiting until every
partition has at least two in-sync replicas. The target ``coordinator`` is resolved when the
fault starts: the broker coordinating the workers' consumer group, asked of the cluster
through the direct inter-broker listeners."""

from __future__ import annotations

import random
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from chaos.nemeses.base import KAFKA_NODES, START_TIMEOUT, Fault, Hands
from devstack.layout import KAFKA_DIRECT_BOOTSTRAP

if TYPE_CHECKING:
    from chaos.nemesis import Injection

RANK = 3

# a kafka_kill target resolved when the fault starts: the workers' group coordinator
COORDINATOR = "coordinator"
WORKERS_GROUP = "leasework-workers"
HEAL_TIMEOUT = 90.0  # seconds for the cluster to have its replicas back in sync


def coordinator_broker(group: str = WORKERS_GROUP, timeout: float = 10.0) -> str:
    """The stack name (``kafka-N``) of the broker coordinating ``group`` (blocking; asks
    the cluster through the direct inter-broker listeners)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP, "log_level": 0})
    described = admin.describe_consumer_groups([group], request_timeout=timeout)
    return f"kafka-{described[group].result(timeout=timeout).coordinator.id}"


@dataclass(frozen=True)
class KafkaKill(Fault):
    family: ClassVar[str] = "kafka"
    colour: ClassVar[str] = "#9467bd"

    def target_problem(self, target: str | None) -> str | None:
        if target in KAFKA_NODES or target == COORDINATOR:
            return None
        return (
            f"{target!r} is not a Kafka node; expected one of {', '.join(KAFKA_NODES)}, or "
            f"{COORDINATOR!r} for the broker coordinating the workers' consumer group"
        )

    def random_target(
        self, rng: random.Random, processes: Sequence[str], proxies: Sequence[str]
    ) -> str:
        return rng.choice(list(KAFKA_NODES))

    def affected(self, target: str | None) -> str:
        if not target:
            return str(target)
        return (
            f"broker {target}: its partition leaders fail over; the relay's producer and the "
            "workers' consumers reconnect to the other brokers"
        )

    async def resolve(self, hands: Hands, target: str | None) -> str | None:
        if target != COORDINATOR:
            return target
        try:
            return await hands.calls(coordinator_broker)
        except Exception as exc:  # the start fails on the unresolved name
            hands.say(f"nemesis: cannot find the group coordinator: {exc}")
            return target

    async def start(self, hands: Hands, injection: Injection) -> None:
        await hands.bank(injection)
        await hands.calls(hands.stack.kill, injection.target, signal.SIGKILL)

    async def heal(self, hands: Hands, injection: Injection) -> None:
        await hands.calls(hands.stack.start, injection.target, timeout=START_TIMEOUT)
        await hands.calls(hands.stack.wait_kafka_cluster, HEAL_TIMEOUT)


FAULTS: tuple[Fault, ...] = (KafkaKill("kafka_kill", instant=True),)
