"""Where the relay puts a pass's messages (:func:`leasework.relay.placement.place`): free
messages on few partitions per pass, spread over all of them across passes and within a
burst; ordered ones (and unknown topics) by their key."""

from __future__ import annotations

import random
from collections import Counter

from leasework.kafka import BY_KEY
from leasework.relay.placement import place

TOPIC = "jobs.ready"


def test_a_trickle_costs_one_partition_per_pass():
    rng = random.Random(1)
    for n in (1, 5, 32):
        placed = place([TOPIC] * n, [True] * n, {TOPIC: 12}, rng)
        assert len(set(placed)) == 1 and 0 <= placed[0] < 12


def test_a_burst_is_spread_over_every_partition_evenly():
    placed = place([TOPIC] * 1000, [True] * 1000, {TOPIC: 12}, random.Random(2))
    counts = Counter(placed)
    assert sorted(counts) == list(range(12))
    assert max(counts.values()) - min(counts.values()) <= 1


def test_a_pass_of_40_uses_two_partitions():
    placed = place([TOPIC] * 40, [True] * 40, {TOPIC: 12}, random.Random(3))
    assert sorted(Counter(placed).values()) == [20, 20]


def test_passes_reach_every_partition_over_time():
    rng = random.Random(4)
    seen = Counter(place([TOPIC] * 3, [True] * 3, {TOPIC: 12}, rng)[0] for _ in range(1200))
    assert sorted(seen) == list(range(12))
    assert min(seen.values()) > 50  # about 100 each


def test_ordered_messages_and_unknown_topics_go_by_key():
    topics = [TOPIC, TOPIC, "jobs.dlq", TOPIC]
    placed = place(topics, [True, False, True, True], {TOPIC: 12}, random.Random(5))
    assert placed[1] == BY_KEY  # an ordering key: its key's partition, in order
    assert placed[2] == BY_KEY  # no partition count for the topic yet
    assert placed[0] == placed[3] != BY_KEY


def test_nothing_to_place():
    assert place([], [], {TOPIC: 12}, random.Random(6)) == []
