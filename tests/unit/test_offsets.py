import pytest

from leasework.offsets import OffsetTracker


def test_commits_only_the_contiguous_finished_prefix():
    tracker = OffsetTracker()
    for offset in (10, 11, 12, 13):
        tracker.start(0, offset)
    tracker.finish(0, 12)
    assert tracker.committable() == {}  # 10 and 11 still run
    tracker.finish(0, 10)
    assert tracker.committable() == {0: 11}
    tracker.committed(0, 11)
    assert tracker.committable() == {}
    tracker.finish(0, 11)
    assert tracker.committable() == {0: 13}  # 10, 11, 12 done; 13 still runs
    tracker.finish(0, 13)
    assert tracker.committable() == {0: 14}


def test_partitions_are_independent_and_gaps_in_offsets_are_fine():
    tracker = OffsetTracker()
    tracker.start(1, 5)
    tracker.start(1, 9)  # 6-8 were never delivered (control records, compaction)
    tracker.start(2, 0)
    tracker.finish(1, 9)
    tracker.finish(2, 0)
    assert tracker.committable() == {2: 1}
    tracker.finish(1, 5)
    assert tracker.committable() == {1: 10, 2: 1}


def test_revoked_partition_is_forgotten_and_late_finishes_are_ignored():
    tracker = OffsetTracker()
    tracker.start(3, 100)
    tracker.forget(3)
    tracker.finish(3, 100)
    assert tracker.committable() == {}
    assert tracker.in_flight() == 0


def test_a_rewind_without_forget_is_refused():
    tracker = OffsetTracker()
    tracker.start(0, 5)
    with pytest.raises(ValueError, match="forget"):
        tracker.start(0, 4)
