"""Which partitions a preferred leader election can move back: those led elsewhere while
their preferred replica (the first listed) is in sync. Metadata stand-ins; the election
itself runs against the real brokers in tests/integration/test_stack_is_real.py."""

from __future__ import annotations

from types import SimpleNamespace

from devstack.services.kafka_admin import leaders_off_preferred


def partition(leader: int, replicas: list[int], isrs: list[int]) -> SimpleNamespace:
    return SimpleNamespace(leader=leader, replicas=replicas, isrs=isrs)


def metadata(**topics: dict[int, SimpleNamespace]) -> SimpleNamespace:
    return SimpleNamespace(
        topics={name: SimpleNamespace(partitions=parts) for name, parts in topics.items()}
    )


def test_only_partitions_led_elsewhere_with_their_preferred_replica_in_sync_are_listed():
    md = metadata(
        jobs_ready={
            0: partition(1, [1, 2, 3], [1, 2, 3]),  # on its preferred replica
            1: partition(3, [2, 3, 1], [3, 1, 2]),  # off it, and 2 is in sync: movable
            2: partition(3, [2, 3, 1], [3, 1]),  # off it, but 2 is still catching up
        },
        jobs_dlq={0: partition(3, [1, 3, 2], [3, 2, 1])},
    )
    assert leaders_off_preferred(md) == [("jobs_dlq", 0), ("jobs_ready", 1)]


def test_a_partition_without_replicas_is_never_listed():
    assert leaders_off_preferred(metadata(t={0: partition(-1, [], [])})) == []
