"""The console's schedule forms, read without a server: the create form as the api's body,
its errors placed beside their fields, and a backfill's bounds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from leasework.api.console.schedules import (
    GENERAL,
    backfill_bounds,
    by_field,
    create_body,
    definition_from_form,
    zoned,
)
from leasework.demo import app
from leasework.errors import FieldError
from leasework.schedules import Definition

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
FIELDS = ("name", "type", "cron", "payload", "timezone")


def test_blank_fields_are_left_out_and_numbers_read_as_numbers():
    body, errors = create_body(
        {
            "name": " nightly ",
            "type": "noop",
            "cron": "0 3 * * *",
            "timezone": "",
            "catch_up_limit": "3",
            "grace_seconds": "ten",
        }  # fmt: skip
    )
    assert errors == []
    assert body == {
        "name": "nightly",
        "type": "noop",
        "cron": "0 3 * * *",
        "catch_up_limit": 3,
        "grace_seconds": "ten",  # kept as text, for definition_of to refuse by name
    }


def test_a_payload_that_is_not_json_is_named_and_its_defaults_errors_are_not():
    form = {"name": "n", "type": "echo", "cron": "* * * * *", "payload": "{oops"}
    parsed = definition_from_form(form, app, NOW)
    assert isinstance(parsed, list)
    assert [e.field for e in parsed] == ["payload"]
    assert "is not JSON" in parsed[0].message


def test_a_good_form_is_a_definition():
    form = {"name": "n", "type": "noop", "cron": "*/5 * * * *", "timezone": "Asia/Tokyo"}
    parsed = definition_from_form(form, app, NOW)
    assert isinstance(parsed, Definition)
    assert (parsed.name, parsed.timezone, parsed.cron) == ("n", "Asia/Tokyo", "*/5 * * * *")


def test_errors_are_shown_beside_their_field_and_the_rest_in_general():
    errors = [
        FieldError("cron", "bad"),
        FieldError("payload.n", "must be an integer"),
        FieldError("colour", "unknown field"),
        FieldError(GENERAL, "something else"),
    ]
    shown = by_field(errors, FIELDS)
    assert shown == {
        "cron": ["bad"],
        "payload": ["payload.n: must be an integer"],
        GENERAL: ["colour: unknown field", "something else"],
    }


def test_a_backfill_reads_local_times_as_utc_and_refuses_the_future():
    since, until = backfill_bounds({"from": "2026-01-01T00:00", "until": "2026-01-02T00:00"}, NOW)
    assert since == datetime(2026, 1, 1, tzinfo=UTC) and until - since == timedelta(days=1)
    refused = backfill_bounds({"from": "2026-01-01T00:00", "until": "2027-01-01T00:00"}, NOW)
    assert isinstance(refused, list) and "future" in refused[0].message
    unreadable = backfill_bounds({"from": "yesterday", "until": ""}, NOW)
    assert isinstance(unreadable, list)
    assert [e.field for e in unreadable] == ["from"] and "yesterday" in unreadable[0].message


def test_a_time_on_the_schedules_own_wall_clock():
    assert zoned(NOW, "Asia/Tokyo") == "2026-12-04 21:00:00 JST"
    assert zoned(None, "UTC") == "—"
