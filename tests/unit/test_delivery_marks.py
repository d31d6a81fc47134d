"""When a waiting job's record is lost, judged by Kafka's positions (leasework.delivery_marks)."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from leasework.config import ConfigError, load
from leasework.delivery_marks import Mark, Reason, Snapshot, fill, judge, parse_sample
from leasework.kafka import BandPositions, PartitionPosition
from leasework.relay.lagprobe import sample_line
from leasework.relay.recovery import Readings

TOPIC = "jobs.ready"
FALLBACK = 600.0


def reading(partitions: dict[int, tuple[int, int, int | None]], topic_id="id-1", read=True):
    """A snapshot of one topic: partition -> (log start, high watermark, committed)."""
    band = BandPositions(
        "default",
        0,
        TOPIC,
        topic_id,
        {p: PartitionPosition(*at) for p, at in partitions.items()},
        read,
    )
    return Snapshot(100.0, {TOPIC: band})


def mark(high: dict[int, int] | None, age=30.0, topic_id="id-1") -> Mark:
    return Mark(1, TOPIC, age, topic_id, high)


MARK = {0: 10, 1: 5, 2: 0}  # partition 2 was empty when the mark was filled


def test_a_mark_waits_while_its_group_has_not_passed_every_watermark():
    # a slow backlog: partition 0 is consumed up to 9 of 10
    assert (
        judge(mark(MARK), reading({0: (0, 40, 9), 1: (0, 30, 5), 2: (0, 3, 0)}), FALLBACK) is None
    )


def test_a_group_committed_past_every_watermark_means_the_records_were_consumed():
    # (a job still waiting under this mark lost its record: offsets reset to latest, say)
    now = reading({0: (0, 40, 10), 1: (0, 30, 30), 2: (0, 3, -1)})
    assert judge(mark(MARK), now, FALLBACK) is Reason.CONSUMED


def test_a_log_start_past_a_watermark_the_group_had_not_reached_means_deleted():
    # workers stopped (committed 2 and none) while retention deleted everything below 12 and 5
    now = reading({0: (12, 12, 2), 1: (5, 9, -1), 2: (0, 0, -1)})
    assert judge(mark(MARK), now, FALLBACK) is Reason.DELETED


def test_a_log_start_short_of_the_watermark_is_not_enough():
    now = reading({0: (9, 12, 2), 1: (5, 9, -1), 2: (0, 0, -1)})
    assert judge(mark(MARK), now, FALLBACK) is None


def test_a_high_watermark_that_went_backwards_means_truncated():
    # an unclean election: the new leader's log ends below what the mark saw
    now = reading({0: (0, 7, 7), 1: (0, 30, 5), 2: (0, 0, 0)})
    assert judge(mark(MARK), now, FALLBACK) is Reason.TRUNCATED


def test_a_partition_gone_from_the_topic_means_truncated():
    now = reading({0: (0, 40, 9), 2: (0, 0, 0)})
    assert judge(mark(MARK), now, FALLBACK) is Reason.TRUNCATED


def test_a_new_topic_id_means_the_topic_was_recreated():
    # even when the new topic already holds more than the old one did
    now = reading({0: (0, 50, 0), 1: (0, 50, 0), 2: (0, 50, 0)}, topic_id="id-2")
    assert judge(mark(MARK), now, FALLBACK) is Reason.RECREATED


def test_an_unknown_topic_id_on_either_side_is_no_verdict_by_itself():
    now = reading({0: (0, 40, 9), 1: (0, 30, 5), 2: (0, 3, 0)}, topic_id=None)
    assert judge(mark(MARK), now, FALLBACK) is None


def test_a_group_that_cannot_be_read_falls_back_to_the_age_bound():
    now = reading({0: (0, 40, None), 1: (0, 30, None), 2: (0, 3, None)}, read=False)
    assert judge(mark(MARK, age=FALLBACK - 1), now, FALLBACK) is None
    assert judge(mark(MARK, age=FALLBACK), now, FALLBACK) is Reason.TIMED_OUT


def test_an_unfilled_mark_or_a_topic_the_reading_lacks_waits_for_the_age_bound():
    assert judge(mark(None), reading({0: (0, 1, 1)}), FALLBACK) is None
    assert judge(mark(None, age=FALLBACK), reading({0: (0, 1, 1)}), FALLBACK) is Reason.TIMED_OUT
    assert judge(mark(MARK), Snapshot(1.0, {}), FALLBACK) is None
    assert judge(mark(MARK, age=FALLBACK + 1), Snapshot(1.0, {}), FALLBACK) is Reason.TIMED_OUT


def test_a_filled_mark_holds_each_partitions_high_watermark_and_the_topics_id():
    now = reading({0: (3, 40, 9), 1: (0, 30, 5)})
    assert fill(now.topics[TOPIC]) == ("id-1", {"0": 40, "1": 30})
    assert fill(None) is None


def test_the_probes_line_reads_back_as_the_same_snapshot():
    band = BandPositions(
        "emails", 2, "jobs.ready.emails.p2", "abc", {0: PartitionPosition(1, 5, -1)}, True
    )
    unread = BandPositions("x", 0, "jobs.ready.x", None, {0: PartitionPosition(0, 0, None)}, False)
    line = json.loads(sample_line([band, unread], 12.5))
    assert line["lag"] == [["emails", 2, 0, 5]] and line["unread"] == [["x", 0]]
    snapshot = parse_sample(line)
    assert snapshot == Snapshot(12.5, {band.topic: band, unread.topic: unread})


def test_an_error_line_or_an_older_probes_line_holds_no_snapshot():
    assert parse_sample({"error": "broker down"}) is None
    assert parse_sample({"lag": [], "unread": []}) is None


def test_the_auditors_stuck_bound_must_outlast_the_recoverys_worst_case():
    with pytest.raises(ConfigError, match="LEASEWORK_AUDIT_STUCK_AFTER"):
        load("relay", {"LEASEWORK_AUDIT_STUCK_AFTER": "600"})
    assert load("relay", {"LEASEWORK_AUDIT_STUCK_AFTER": "611"}).audit_stuck_after == 611
    off = {"LEASEWORK_RECOVERY_AFTER": "never", "LEASEWORK_AUDIT_STUCK_AFTER": "60"}
    assert load("relay", off).recovery_after is None


async def test_a_mark_is_filled_only_by_a_reading_begun_after_it_was_known_committed():
    readings = Readings()
    readings.put(Snapshot(5.0, {}))
    assert (await readings.after(4.0)).started == 5.0  # begun after: usable at once
    got: list[float] = []

    async def wait_for_newer() -> None:
        got.append((await readings.after(5.0)).started)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_newer)
        await trio.testing.wait_all_tasks_blocked()
        readings.put(Snapshot(5.0, {}))  # the same instant again: not newer
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        readings.put(Snapshot(6.5, {}))
    assert got == [6.5]
