from datetime import UTC, datetime, timedelta

from leasework.validation import FieldError, Submission, request_hash, validate_submission

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def validate(body):
    return validate_submission(body, default_max_attempts=5, default_timeout=300, now=NOW)


def fields(result):
    assert isinstance(result, list), result
    return {e.field for e in result}


def test_minimal_submission_takes_defaults():
    result = validate({"type": "noop"})
    assert result == Submission("noop", {}, None, 5, 300, None)


def test_delay_and_run_at():
    assert validate({"type": "noop", "delay_seconds": 30}).run_at == NOW + timedelta(seconds=30)
    result = validate({"type": "noop", "run_at": "2026-02-03T04:05:06+02:00"})
    assert result.run_at == datetime(2026, 2, 3, 2, 5, 6, tzinfo=UTC)


def test_each_invalid_field_is_named():
    result = validate(
        {
            "type": "has spaces",
            "run_at": "tomorrow",
            "max_attempts": 0,
            "timeout_seconds": "10",
            "ordering_key": "",
            "colour": "red",
        }
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


def test_run_at_needs_an_offset_and_excludes_delay():
    assert fields(validate({"type": "x", "run_at": "2026-02-03T04:05:06"})) == {"run_at"}
    both = {"type": "x", "run_at": "2026-02-03T04:05:06Z", "delay_seconds": 1}
    assert fields(validate(both)) == {"run_at"}


def test_body_must_be_an_object():
    assert fields(validate([1, 2])) == {"(body)"}


def test_request_hash_ignores_key_order_but_not_values():
    assert request_hash({"a": 1, "b": [1, 2]}) == request_hash({"b": [1, 2], "a": 1})
    assert request_hash({"a": 1}) != request_hash({"a": 2})
