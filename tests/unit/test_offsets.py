from leasework.worker.offsets import OffsetTracker


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


def test_a_rewind_without_forget_starts_the_partition_over():
    # what crashed a worker in a chaos run: librdkafka fetched partition 11 again from its
    # committed offset with no revoke seen here
    tracker = OffsetTracker()
    assert tracker.start(0, 5) is False
    assert tracker.start(0, 6) is False
    assert tracker.start(0, 4) is True  # 5 and 6 are still running: the rewind is tracked afresh
    assert tracker.in_flight() == 1
    tracker.finish(0, 4)
    assert tracker.committable() == {0: 5}
    tracker.start(0, 5)  # redelivered
    tracker.finish(0, 6)  # the old delivery of 6 finished: its work is done
    assert tracker.committable() == {0: 5}  # 5 (redelivered) still runs: not past it
    tracker.finish(0, 5)
    assert tracker.committable() == {0: 6}  # 6 is to be redelivered: it will run again
