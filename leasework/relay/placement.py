"""Where the relay puts each message of a pass: few partitions per pass, so Kafka costs per
batch, not per job.

A broker's work for a produce request grows with the partitions it touches as much as with
the bytes: each partition is its own log append, its own entry in every follower's fetch
(acks=all waits for two of three replicas), its own high watermark and its own entry in the
consumers' fetch responses. Keyed by job id, a pass of ten jobs touched ten of the twelve
partitions of ``jobs.ready``, so every job paid a partition's share of all of that.

A message whose key is its job's own id (no ordering key) may go to any partition: the
worker that gets it claims it under a lease and a fence wherever it lands. So a pass puts
such messages on ``ceil(n / per_partition)`` partitions (all of them at most), drawn at
random anew for every pass: a trickle costs one partition per pass, a burst is still spread
over every partition (and so over every worker), and over many passes each partition gets
its share. A message with an ordering key keeps the key's partition (librdkafka's
partitioner, the same for every relay), which is what orders it after its predecessors.

Pure: the random source and the partition counts are passed in.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence

from leasework.kafka import BY_KEY

PER_PARTITION = 32  # free messages a pass puts on one partition before it uses another


def place(
    topics: Sequence[str],
    free: Sequence[bool],
    partitions: Mapping[str, int],
    rng: random.Random,
    per_partition: int = PER_PARTITION,
) -> list[int]:
    """The partition of each message of a pass, in order: ``topics[i]`` is message i's
    topic and ``free[i]`` whether it may go anywhere (its key is its job's id). A message
    that is not free, or whose topic's partition count is unknown (``partitions`` lacks it:
    metadata not yet fetched), goes :data:`BY_KEY`."""
    placed = [BY_KEY] * len(topics)
    by_topic: dict[str, list[int]] = {}
    for index, (topic, anywhere) in enumerate(zip(topics, free, strict=True)):
        if anywhere and partitions.get(topic, 0) > 0:
            by_topic.setdefault(topic, []).append(index)
    for topic, indexes in by_topic.items():
        count = partitions[topic]
        used = rng.sample(range(count), min(count, math.ceil(len(indexes) / per_partition)))
        for position, index in enumerate(indexes):
            placed[index] = used[position * len(used) // len(indexes)]
    return placed
