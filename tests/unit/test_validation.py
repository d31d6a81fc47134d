"""HTTP bodies into job requests (pure), against the demo app."""

from datetime import UTC, datetime

import pytest

from leasework.api.validation import batch_requests, job_request
from leasework.demo import app
from leasework.errors import FieldError
from leasework.submission import MAX_BATCH, JobRequest


def fields(result):
    assert isinstance(result, list), result
    return {e.field for e in result}


def test_minimal_submission_leaves_the_policy_to_the_type_and_settings():
    assert job_request({"type": "noop"}, app) == JobRequest("noop", {})


def test_delay_and_run_at():
    assert job_request({"type": "noop", "delay_seconds": 30}, app).delay_seconds == 30
    result = job_request({"type": "noop", "run_at": "2026-02-03T04:05:06+02:00"}, app)
    assert result.run_at == datetime(2026, 2, 3, 2, 5, 6, tzinfo=UTC)


def test_each_invalid_field_is_named():
    result = job_request(
        {
            "type": "has spaces",
            "run_at": "tomorrow",
            "max_attempts": 0,
            "timeout_seconds": "10",
            "ordering_key": "",
            "colour": "red",
        },
        app,
    )
    assert fields(result) == {
        "type",
        "run_at",
        "max_attempts",
        "timeout_seconds",
        "ordering_key",
        "colour",
    }
    assert all(isinstance(e, FieldError) and e.message for e in result)


def test_run_at_needs_an_offset_a_real_date_and_excludes_delay():
    assert fields(job_request({"type": "noop", "run_at": "2026-02-03T04:05:06"}, app)) == {"run_at"}
    assert fields(job_request({"type": "noop", "run_at": "2026-13-45T04:05:06Z"}, app)) == {
        "run_at"
    }
    assert fields(job_request({"type": "noop", "run_at": "0000-01-01T00:00:00Z"}, app)) == {
        "run_at"
    }
    assert fields(job_request({"type": "noop", "run_at": "0001-01-01T00:00:00+01:00"}, app)) == {
        "run_at"
    }
    both = {"type": "noop", "run_at": "2026-02-03T04:05:06Z", "delay_seconds": 1}
    assert fields(job_request(both, app)) == {"run_at"}


def test_unknown_type_and_invalid_payload_are_refused_with_the_models_own_errors():
    unknown = job_request({"type": "no_such_type"}, app)
    assert fields(unknown) == {"type"} and "echo, fail" in unknown[0].message
    bad = job_request({"type": "sleep", "payload": {"seconds": "soon"}}, app)
    assert fields(bad) == {"payload.seconds"}
    assert "valid number" in bad[0].message


def test_body_must_be_an_object():
    assert fields(job_request([1, 2], app)) == {"(body)"}


def test_a_batch_names_each_bad_item_by_index():
    body = {
        "jobs": [
            {"type": "noop"},
            {"type": "sleep", "payload": {"seconds": -1}},
            {"type": "noop", "idempotency_key": ""},
            {"type": "nope"},
        ]
    }
    assert fields(batch_requests(body, app)) == {
        "jobs[1].payload.seconds",
        "jobs[2].idempotency_key",
        "jobs[3].type",
    }


def test_a_batch_item_carries_its_own_key_and_a_single_submit_does_not():
    (item,) = batch_requests({"jobs": [{"type": "noop", "idempotency_key": "k"}]}, app)
    assert item.idempotency_key == "k"
    assert fields(job_request({"type": "noop", "idempotency_key": "k"}, app)) == {"idempotency_key"}


@pytest.mark.parametrize(
    "body",
    [{}, {"jobs": []}, {"jobs": "x"}, {"jobs": [{"type": "noop"}] * (MAX_BATCH + 1)}],
)
def test_a_batch_holds_one_to_a_thousand_jobs(body):
    assert fields(batch_requests(body, app)) == {"jobs"}
