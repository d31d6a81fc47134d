"""leasework.schedules.operations without I/O: a create's body read strictly into a Definition
(every
refusal names its field and says what to write), a backfill's range checked, and the ticks of
a range bounded before anything is written; Cron.between, which the bound rests on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from leasework import demo
from leasework.errors import FieldError
from leasework.schedules import CatchUp, Cron, Definition, Overlap
from leasework.schedules import operations as schedule_ops
from leasework.schedules.operations import (
    MAX_BACKFILL,
    TooManyTicks,
    backfill_range,
    backfill_ticks,
    definition_of,
)

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def fields(errors: list[FieldError] | Definition) -> dict[str, str]:
    assert isinstance(errors, list), errors
    return {e.field: e.message for e in errors}


def test_a_full_body_is_the_definition_it_spells():
    body = {
        "name": "nightly.report",
        "type": "sleep",
        "cron": "30 2 * * *",
        "payload": {"seconds": 1},
        "timezone": "Europe/Berlin",
        "overlap": "skip",
        "catch_up": "all",
        "catch_up_limit": 3,
        "grace_seconds": 5.0,  # a whole number is the integer JSON Schema says it is
    }
    d = definition_of(body, demo.app, NOW)
    assert d == Definition(
        name="nightly.report",
        type="sleep",
        cron="30 2 * * *",
        payload={"seconds": 1},
        timezone="Europe/Berlin",
        overlap=Overlap.SKIP,
        catch_up=CatchUp.ALL,
        catch_up_limit=3,
        grace_seconds=5,
    )


def test_left_out_and_null_options_take_the_defaults():
    d = definition_of(
        {"name": "n", "type": "noop", "cron": "* * * * *", "timezone": None, "overlap": None},
        demo.app,
        NOW,
    )
    assert isinstance(d, Definition)
    assert (d.payload, d.timezone, d.overlap, d.catch_up) == ({}, "UTC", "allow", "latest")
    assert (d.catch_up_limit, d.grace_seconds) == (1, 60)


def test_every_bad_field_is_named_with_what_to_write():
    errors = fields(
        definition_of(
            {
                "name": "has space",
                "type": "nope",
                "cron": "61 * * * *",
                "timezone": "Mars/Olympus",
                "overlap": "sometimes",
                "catch_up": 3,
                "catch_up_limit": 0,
                "grace_seconds": -1,
                "colour": "red",
            },
            demo.app,
            NOW,
        )
    )
    assert set(errors) == {
        "name",
        "type",
        "cron",
        "timezone",
        "overlap",
        "catch_up",
        "catch_up_limit",
        "grace_seconds",
        "colour",
    }
    assert "letters, digits" in errors["name"]
    assert (
        "this app defines: block_asyncio, block_process, block_thread, block_trio, echo, "
        "fail, keyed, ledger, ledger_asyncio, ledger_process, ledger_thread, noop, noop_asyncio, "
        "noop_process, noop_thread, notify, rated, sleep" in (errors["type"])
    )
    assert "five fields" in errors["cron"] and "'*/5 * * * *'" in errors["cron"]
    assert "IANA name such as 'UTC'" in errors["timezone"]
    assert errors["overlap"].startswith("must be one of allow, skip, buffer_one")
    assert errors["catch_up"].startswith("must be one of skip, latest, all")
    assert errors["catch_up_limit"] == "must be an integer from 1 to 1000"
    assert errors["grace_seconds"] == "must be an integer from 0 to 86400"
    assert errors["colour"].startswith("unknown field; allowed: name, type, cron")


def test_required_fields_and_wrong_kinds_are_refused():
    assert set(fields(definition_of({}, demo.app, NOW))) == {"name", "type", "cron"}
    assert fields(definition_of([], demo.app, NOW)) == {
        "(body)": "must be a JSON object with name, type and cron"
    }
    wrong = fields(
        definition_of(
            {"name": 5, "type": "noop", "cron": "* * * * *", "catch_up_limit": True},
            demo.app,
            NOW,
        )
    )
    assert set(wrong) == {"name", "catch_up_limit"}
    nul = fields(definition_of({"name": "n", "type": "noop", "cron": "* *\x00"}, demo.app, NOW))
    assert set(nul) == {"cron"}
    long = fields(definition_of({"name": "n", "type": "noop", "cron": "*" * 201}, demo.app, NOW))
    assert "at most 200" in long["cron"]


def test_the_payload_is_checked_against_the_types_model():
    errors = fields(
        definition_of(
            {"name": "n", "type": "sleep", "cron": "* * * * *", "payload": {"seconds": "x"}},
            demo.app,
            NOW,
        )
    )
    assert list(errors) == ["payload.seconds"]
    nul = fields(
        definition_of(
            {"name": "n", "type": "noop", "cron": "* * * * *", "payload": {"k": "a\x00"}},
            demo.app,
            NOW,
        )
    )
    assert list(nul) == ["payload.k"]


def test_a_backfill_range_must_be_in_order_and_in_the_past():
    names = ("from", "until")
    assert backfill_range(utc(2026, 1, 1), utc(2026, 1, 2), NOW, names) == []
    assert backfill_range(utc(2026, 1, 1), utc(2026, 1, 1), NOW, names) == []
    reversed_ = fields(backfill_range(utc(2026, 1, 2), utc(2026, 1, 1), NOW, names))
    assert reversed_ == {"until": "must not be before from"}
    future = fields(backfill_range(utc(2026, 1, 1), NOW + timedelta(seconds=1), NOW, names))
    assert "must not be in the future" in future["until"]
    ancient = fields(backfill_range(utc(1969, 12, 31), utc(2026, 1, 1), NOW, names))
    assert ancient == {"from": "must not be before 1970-01-01T00:00:00Z"}
    missing = fields(backfill_range(None, None, NOW, names))
    assert set(missing) == {"from", "until"}


def test_backfill_ticks_are_the_calendars_in_the_inclusive_range():
    hourly = Definition(name="h", type="noop", cron="0 * * * *")
    assert backfill_ticks(hourly, utc(2026, 1, 1, 1), utc(2026, 1, 1, 3)) == [
        utc(2026, 1, 1, 1),
        utc(2026, 1, 1, 2),
        utc(2026, 1, 1, 3),
    ]
    assert backfill_ticks(hourly, utc(2026, 1, 1, 1, 1), utc(2026, 1, 1, 1, 59)) == []


def test_a_range_of_more_ticks_than_the_bound_is_refused_naming_where_to_split():
    secondly = Definition(name="s", type="noop", cron="* * * * * *")
    start = utc(2026, 1, 1)
    exactly = backfill_ticks(secondly, start, start + timedelta(seconds=MAX_BACKFILL - 1))
    assert len(exactly) == MAX_BACKFILL
    with pytest.raises(TooManyTicks) as refused:
        backfill_ticks(secondly, start, start + timedelta(days=3650))  # 315 million ticks
    assert refused.value.last_allowed == start + timedelta(seconds=MAX_BACKFILL - 1)
    assert f"more than {MAX_BACKFILL} ticks" in str(refused.value)
    assert "split the range there" in str(refused.value)


def test_between_stops_one_past_its_limit_and_keeps_whole_seconds():
    every = Cron("* * * * * *")
    got = every.between(utc(2026, 1, 1), utc(2026, 1, 2), 5)
    assert got == [utc(2026, 1, 1) + timedelta(seconds=s) for s in range(6)]
    half = datetime(2026, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC)
    assert every.between(half, utc(2026, 1, 1, 0, 0, 2), 10) == [
        utc(2026, 1, 1, 0, 0, 1),
        utc(2026, 1, 1, 0, 0, 2),
    ]
    # New York's spring-forward night: 02:30 does not exist; it ticks once, at 03:00 EDT
    new_york = Cron("30 2 * * *", "America/New_York")
    assert new_york.between(utc(2026, 3, 7, 12), utc(2026, 3, 9, 12), 10) == [
        utc(2026, 3, 8, 7, 0),
        utc(2026, 3, 9, 6, 30),
    ]


def test_audit_targets_name_the_schedule():
    assert schedule_ops.target("nightly") == "schedule:nightly"
