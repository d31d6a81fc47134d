"""When a lower priority band's consumer runs.

Each priority of a queue is a band with a topic and a consumer group of its own
(:mod:`leasework.priorities`). Level 0 carries most jobs and its consumer always runs; a
lower band is idle most of the time, and an idle consumer still costs a heartbeat every 2 s
and a long poll per broker every 3 s, on the worker and on the brokers (measured: six of them
per worker were about 10% of the CPU a job costs at the bench's one-job-per-transaction row).
So a lower band's consumer runs only while its band has work:

- it is opened when the worker starts (whatever was published before is drained), and again
  whenever the relay has published to the band's topic since it was closed: the relay counts
  what it publishes to each lower band in ``band_publishes`` (migration 0019), and the worker
  reads the counts with the paused queues, every half second;
- it is closed once nothing was published to the band for ``idle_close`` seconds, nothing it
  received is unfinished, its queue is not paused (a paused band's backlog is not fetched, so
  it would not be seen again at resume) and it has caught up with every partition it owns
  (:func:`caught_up`).

A read that fails counts as a change: the band opens, or stays open (never less delivery
than the always-open consumers had). What it costs: the first job of a band closed for a while
waits for the next read, the group's join and the first fetch, a few hundred milliseconds
(docs/design-decisions.md), against tens for an open band; a steady trickle keeps the band
open.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import Consumer, TopicPartition

# librdkafka's "no offset known" (RD_KAFKA_OFFSET_INVALID)
OFFSET_INVALID = -1001


class BandGate:
    """Whether one lower band's consumer should run: the clock is the caller's (monotonic
    seconds), ``published`` the band's count of messages the relay published (None: the read
    failed). ``idle_close`` None keeps the band open for good (the consumers before 0019)."""

    def __init__(self, idle_close: float | None, now: float) -> None:
        self.idle_close = idle_close
        self.published: int | None = None
        self.changed_at = now

    def observe(self, published: int | None, now: float) -> bool:
        """Record a read of the band's count; True when it changed (or the read failed),
        that is when a closed consumer must open."""
        if published is not None and published == self.published:
            return False
        if published is not None:
            self.published = published
        self.changed_at = now
        return True

    def may_close(self, now: float, unfinished: int, paused: bool, caught_up: bool) -> bool:
        """Whether the open consumer may close now."""
        return (
            self.idle_close is not None
            and not paused
            and unfinished == 0
            and caught_up
            and now - self.changed_at >= self.idle_close
        )


def caught_up_with(positions: Iterable[int], high_watermarks: Iterable[int]) -> bool:
    """Whether a consumer has been given everything of its partitions: each partition's high
    watermark is known (a fetch answered) and its position is not behind it. A position not
    known yet (nothing consumed since the consumer opened) with a known watermark is caught up:
    the fetch that told the watermark brought whatever was below it, and the poll that asks
    this found nothing."""
    for position, high in zip(positions, high_watermarks, strict=True):
        if high == OFFSET_INVALID or (position != OFFSET_INVALID and position < high):
            return False
    return True


def caught_up(consumer: Consumer) -> bool:
    """:func:`caught_up_with` for the partitions ``consumer`` owns now, from what librdkafka
    knows already (no request to a broker). Blocking: call it in the consumer's thread."""
    assigned: list[TopicPartition] = consumer.assignment()
    if not assigned:
        return True  # nothing of the band is this consumer's to fetch
    positions = [p.offset for p in consumer.position(assigned)]
    highs = []
    for partition in assigned:
        known = consumer.get_watermark_offsets(partition, cached=True)
        highs.append(OFFSET_INVALID if known is None else known[1])
    return caught_up_with(positions, highs)
