"""When a waiting job's Kafka record is lost, judged by Kafka's own positions (pure).

The recovery service (:mod:`leasework.relay.recovery`) watches jobs that wait as ``queued``
with no outbox row: their records were acknowledged by Kafka before the watch began. Each
watch is under a :class:`Mark`, filled from a reading of Kafka (a :class:`Snapshot`) that
started after the mark was committed, so every watched job's record lies below the mark's
high watermark on one of its topic's partitions. :func:`judge` then tells, from a later
reading, whether every such record is gone from the group's way: consumed (the group
committed past every watermark), deleted unconsumed (the log start passed it), or not there
any more (a watermark went backwards, the topic's id changed). A job still waiting, unchanged,
under a mark judged so will never be delivered by the record it had: it is published again.
Where the group's offsets cannot be read, a mark is judged by its age alone (the fallback).

No wall clock decides, save that fallback: a backlog that drains slowly keeps its marks
waiting for as long as it takes, because the group's offsets have not passed them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from leasework.kafka import BandPositions, PartitionPosition


@dataclass(frozen=True)
class Snapshot:
    """One reading of every band's topic: ``started`` on the monotonic clock (one clock for
    every process of a machine) before any request was sent, and each topic's positions."""

    started: float
    topics: Mapping[str, BandPositions]


def parse_sample(sample: Mapping[str, Any]) -> Snapshot | None:
    """The snapshot in one line of the lag probe's (:func:`leasework.relay.lagprobe.sample_line`),
    or None when the line holds none (an error line, or one from an older probe)."""
    bands, started = sample.get("bands"), sample.get("started")
    if not isinstance(bands, list) or not isinstance(started, int | float):
        return None
    topics: dict[str, BandPositions] = {}
    for band in bands:
        try:
            partitions = {
                int(p): PartitionPosition(int(low), int(high), None if c is None else int(c))
                for p, low, high, c in band["partitions"]
            }
            topics[str(band["topic"])] = BandPositions(
                str(band["queue"]),
                int(band["priority"]),
                str(band["topic"]),
                None if band.get("topic_id") is None else str(band["topic_id"]),
                partitions,
                bool(band["group_read"]),
            )
        except (KeyError, TypeError, ValueError):
            continue  # a band this relay cannot read is judged by the fallback
    return Snapshot(float(started), topics)


class Reason(StrEnum):
    """Why every record below a mark is out of its group's way."""

    CONSUMED = "consumed"  # the group committed past every partition's watermark
    DELETED = "deleted"  # the log start passed a watermark the group had not reached
    TRUNCATED = "truncated"  # a partition's high watermark went backwards (or vanished)
    RECREATED = "recreated"  # the topic's id changed: it was deleted and made again
    TIMED_OUT = "timed-out"  # the group could not be read; the mark is older than the bound


@dataclass(frozen=True)
class Mark:
    """A mark as the store holds it: its topic, its age in seconds, and, once filled, the
    topic's id and each partition's high watermark when it was filled (None: not yet)."""

    id: int
    topic: str
    age: float
    topic_id: str | None = None
    high: Mapping[int, int] | None = None

    @property
    def filled(self) -> bool:
        return self.high is not None


def judge(mark: Mark, now: Snapshot, fallback: float) -> Reason | None:
    """Whether every record below ``mark`` is out of its group's way by the reading ``now``
    (the reason), or may still be delivered (None). A mark not filled yet, or whose topic or
    group ``now`` could not read, is judged by its age against ``fallback`` seconds alone."""
    band = now.topics.get(mark.topic)
    if mark.high is None or band is None:
        return Reason.TIMED_OUT if mark.age >= fallback else None
    if mark.topic_id is not None and band.topic_id is not None and band.topic_id != mark.topic_id:
        return Reason.RECREATED
    if any(p not in band.partitions or band.partitions[p].high < h for p, h in mark.high.items()):
        return Reason.TRUNCATED
    deleted = False
    for partition, high in mark.high.items():
        at = band.partitions[partition]
        if high <= 0 or (at.committed is not None and at.committed >= high):
            continue  # nothing was below it, or the group committed past it
        if at.low >= high:
            deleted = True  # gone from the log before the group got there
        elif at.committed is None:
            return Reason.TIMED_OUT if mark.age >= fallback else None
        else:
            return None  # still on its way to the group
    return Reason.DELETED if deleted else Reason.CONSUMED


def fill(band: BandPositions | None) -> tuple[str | None, dict[str, int]] | None:
    """What a mark of ``band``'s topic is filled with (its id, each partition's high
    watermark, keyed as JSON keys are), or None when the reading had no such topic."""
    if band is None:
        return None
    return band.topic_id, {str(p): at.high for p, at in sorted(band.partitions.items())}
