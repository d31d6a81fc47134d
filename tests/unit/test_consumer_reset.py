"""What a worker's consumer makes of a partition without a usable offset (pure): the reason it
logs and counts, where consumption resumes (leasework/worker/consumer.py, judge_reset), and
where the other partitions of the assignment start when it is set again (known_start). The
error texts are librdkafka's own, as it words an ``_AUTO_OFFSET_RESET`` event's cause."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, KafkaError

from leasework import config, metrics
from leasework.worker.consumer import (
    LOG_TRUNCATED,
    NO_COMMITTED_OFFSET,
    OTHER,
    OUT_OF_RANGE,
    RESET_MESSAGES,
    RESET_REASONS,
    judge_reset,
    known_start,
)
from leasework.worker.feed import consumer_config

# as librdkafka words them (rdkafka_partition.c, rdkafka_fetcher.c, rdkafka_offset.c)
NO_OFFSET = "no previously committed offset available: Local: No offset stored"
OUT_OF_RANGE_TEXT = (
    "fetch failed due to requested offset not available on the broker: "
    "Broker: Offset out of range (broker 2)"
)
TRUNCATED = (
    "Partition log truncation detected at offset 120 (leader epoch 3): broker end offset is "
    "100 (offset leader epoch 4). Reset to INVALID.: Local: Partition log truncation detected"
)
DENIED = "failed to query logical offset: Broker: Topic authorization failed (broker 1)"


def test_the_texts_matched_are_librdkafkas_own():
    # the classification rests on these descriptions; a librdkafka that rewords them fails here
    assert KafkaError(KafkaError._NO_OFFSET).str() in NO_OFFSET
    assert KafkaError(KafkaError._LOG_TRUNCATION).str() in TRUNCATED
    assert KafkaError(KafkaError.OFFSET_OUT_OF_RANGE).str() in OUT_OF_RANGE_TEXT


def test_a_group_without_a_committed_offset_starts_at_the_log_start():
    reset = judge_reset(NO_OFFSET, None, 4, 10)
    assert (reset.reason, reset.resume_at) == (NO_COMMITTED_OFFSET, 4)
    assert reset.level == logging.INFO  # a new queue's first start is no incident


def test_records_deleted_past_the_group_offset_are_out_of_range():
    reset = judge_reset(OUT_OF_RANGE_TEXT, 3, 6, 10)
    assert (reset.reason, reset.resume_at) == (OUT_OF_RANGE, 6)
    assert reset.level == logging.WARNING


def test_a_partition_emptied_by_deletion_resumes_at_its_end():
    reset = judge_reset(OUT_OF_RANGE_TEXT, 3, 10, 10)
    assert (reset.reason, reset.resume_at) == (OUT_OF_RANGE, 10)


def test_an_offset_past_the_log_end_is_a_truncated_log_and_resumes_at_its_start():
    # the topic recreated (its offsets begin again) or an unclean election cut its end off:
    # the records the log now holds may be ones the group never read, so all are read again
    reset = judge_reset(OUT_OF_RANGE_TEXT, 50, 0, 10)
    assert (reset.reason, reset.resume_at) == (LOG_TRUNCATED, 0)
    assert reset.level == logging.WARNING


def test_an_offset_at_the_log_end_is_not_past_it():
    # fetching at the high watermark waits for the next record: Kafka refused it when the
    # log was shorter or started later, so it counts as out of range, as within the log
    assert judge_reset(OUT_OF_RANGE_TEXT, 10, 0, 10).reason == OUT_OF_RANGE
    assert judge_reset(OUT_OF_RANGE_TEXT, 5, 0, 10).reason == OUT_OF_RANGE


def test_a_truncation_librdkafka_detected_is_a_truncated_log_even_without_an_offset():
    assert judge_reset(TRUNCATED, None, 0, 100).reason == LOG_TRUNCATED
    assert judge_reset(TRUNCATED, 120, 0, 200).reason == LOG_TRUNCATED


def test_any_other_cause_is_other_and_still_resumes_at_the_log_start():
    reset = judge_reset(DENIED, None, 7, 9)
    assert (reset.reason, reset.resume_at) == (OTHER, 7)
    assert reset.level == logging.WARNING


@pytest.mark.parametrize("low, high", [(None, None), (-1, -1)])
def test_unread_watermarks_resume_at_the_log_start_librdkafka_finds(low, high):
    reset = judge_reset(OUT_OF_RANGE_TEXT, 3, low, high)
    assert (reset.reason, reset.resume_at) == (OUT_OF_RANGE, OFFSET_BEGINNING)
    assert judge_reset(NO_OFFSET, None, low, high).resume_at == OFFSET_BEGINNING


def test_every_reason_has_its_message_and_is_a_label_value():
    assert set(RESET_MESSAGES) == set(RESET_REASONS)
    for reason in RESET_REASONS:
        metrics.consumer_offset_resets.labels("default", "0", reason)  # a valid child


def test_a_partition_that_returned_messages_starts_where_it_stands():
    assert known_start(42, 10, 30) == 42
    assert known_start(0, None, OFFSET_INVALID) == 0


def test_a_partition_that_returned_nothing_starts_at_the_later_of_restart_and_commit():
    # below where this consumer started it: deleted; below the committed offset: done
    assert known_start(OFFSET_INVALID, 10, 30) == 30
    assert known_start(OFFSET_INVALID, 30, 10) == 30
    assert known_start(OFFSET_INVALID, None, 25) == 25
    assert known_start(OFFSET_INVALID, 12, OFFSET_INVALID) == 12


def test_a_partition_known_nowhere_is_left_to_the_committed_offset():
    assert known_start(OFFSET_INVALID, None, OFFSET_INVALID) == OFFSET_INVALID


def test_the_worker_consumer_reports_resets_instead_of_jumping():
    settings = config.load("doctor", {"LEASEWORK_KAFKA_BROKERS": "127.0.0.1:1"})
    assert consumer_config(settings)["auto.offset.reset"] == "error"
    assert "auto.offset.reset" in config.RDKAFKA_FIXED  # no deployment can set it back
