"""The jobs page's query string (leasework/api/console/filters.py; its filter is read by the
one parser in leasework/operations.py, tested on its own in test_operations.py)."""

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from leasework import operations
from leasework.api.console import filters
from leasework.store.console import JobFilter

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_an_empty_query_is_every_job():
    job_filter, errors = filters.parse_job_filter({})
    assert job_filter == JobFilter() and errors == []
    assert job_filter.where() == ("true", {})


def test_datetime_local_fields_are_utc_and_offsets_are_kept():
    assert operations.parse_time("2026-01-02T03:04") == datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    plus_two = operations.parse_time("2026-01-02T05:04:05+02:00")
    assert plus_two == T0 and plus_two.utcoffset() == timedelta(hours=2)
    assert filters.format_time(plus_two) == "2026-01-02T03:04:05"
    with pytest.raises(ValueError):
        operations.parse_time("yesterday")


def test_every_filter_round_trips_through_its_links():
    job_filter = JobFilter("dead", "fail", T0, T0 + timedelta(hours=1), "finished_at")
    query = operations.filter_fields(job_filter)
    assert filters.parse_job_filter(query) == (job_filter, [])
    where, params = job_filter.where()
    assert "finished_at >= %(since)s" in where and "finished_at < %(until)s" in where
    assert params == {
        "status": "dead",
        "type": "fail",
        "since": T0,
        "until": T0 + timedelta(hours=1),
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"status": "stuck"}, "status: must be one of"),
        ({"type": "no spaces"}, "type: must be 1-100"),
        ({"time_field": "run_at; DROP TABLE jobs"}, "time_field: must be one of"),
        ({"since": "soon"}, "since: 'soon' is not a time"),
        ({"since": "2026-01-02T04:00", "until": "2026-01-02T03:00"}, "until: must be after since"),
    ],
)
def test_a_field_that_cannot_be_used_is_named_and_left_out(args, message):
    job_filter, errors = filters.parse_job_filter(args)
    assert len(errors) == 1 and errors[0].startswith(message)
    assert job_filter.time_field in ("created_at", "finished_at")


def test_a_time_field_outside_the_list_never_reaches_sql():
    with pytest.raises(ValueError):
        JobFilter(time_field="run_at")


def test_the_cursor_round_trips_and_refuses_what_the_console_did_not_write():
    job_id = uuid.uuid4()
    assert filters.parse_cursor(filters.cursor_query(T0, job_id)) == (T0, job_id)
    assert filters.parse_cursor({}) is None
    for bad in (
        {"before": T0.isoformat()},
        {"before": "2026-01-02T03:04:05", "before_id": str(job_id)},
        {"before": T0.isoformat(), "before_id": "not-a-uuid"},
    ):
        with pytest.raises(ValueError):
            filters.parse_cursor(bad)


def test_bulk_retry_needs_a_retryable_status_and_retries_exactly_the_filter():
    assert operations.bulk_retry_refusal(JobFilter()) is not None
    assert operations.bulk_retry_refusal(JobFilter("succeeded")) is not None
    with pytest.raises(ValueError, match="bulk retry takes a filter on status cancelled or dead"):
        operations.bulk_retry(JobFilter("running"))
    page, _ = filters.parse_job_filter({"status": "dead", "type": "fail", "since": "2026-01-02"})
    bulk = operations.bulk_retry(page)
    assert bulk == operations.BulkRetry(page, operations.BULK_RETRY_LIMIT)
    assert bulk.jobs.where() == page.where()  # the page's own WHERE clause, nothing else


def test_describe_names_every_bound():
    text = operations.describe(JobFilter("dead", None, T0, None))
    assert text == "status=dead type=any created_at>=2026-01-02T03:04:05+00:00"
