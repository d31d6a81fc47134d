"""``leasework schedules ...`` without a server: the runbook's exact forms parse, each action
calls the client method it names with what was typed, and the answers print as a person
reads them (a table, the facts and ticks, one sentence per change)."""

from __future__ import annotations

from typing import Any

import pytest

from leasework.cli import API_COMMANDS, build_parser, main
from leasework.schedules import commands as schedule_cli


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_the_runbooks_forms_parse():
    show = parse("schedules", "show", "nightly")
    assert (show.command, show.schedules_command, show.name) == ("schedules", "show", "nightly")
    backfill = parse(
        "schedules", "backfill", "nightly", "--from", "2026-01-01T00:00:00Z",
        "--until", "2026-01-02T00:00:00Z",
    )  # fmt: skip
    assert (backfill.since, backfill.until) == ("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z")
    assert API_COMMANDS["schedules"] is schedule_cli.run


def test_backfill_needs_both_bounds(capsys):
    with pytest.raises(SystemExit):
        parse("schedules", "backfill", "nightly", "--from", "2026-01-01T00:00:00Z")
    assert "--until" in capsys.readouterr().err


class FakeClient:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> dict[str, Any]:
            self.calls.append((name, args, kwargs))
            return ANSWERS[name]

        return record


SCHEDULE = {
    "name": "nightly",
    "type": "noop",
    "payload": {"k": 1},
    "cron": "0 3 * * *",
    "timezone": "Europe/Berlin",
    "overlap": "skip",
    "catch_up": "all",
    "catch_up_limit": 3,
    "grace_seconds": 60,
    "paused": False,
    "next_fire_at": "2026-03-02T02:00:00+00:00",
    "source": "api",
    "declared_by": "ops",
    "created_at": "2026-03-01T10:00:00+00:00",
    "updated_at": "2026-03-01T10:00:00+00:00",
}
FIRED = {
    "nominal_at": "2026-03-01T02:00:00+00:00",
    "outcome": "fired",
    "reason": None,
    "source": "cron",
    "job_id": "2b1e0a52-1111-4c4c-9999-000000000001",
    "job_status": "succeeded",
}
SKIPPED = {**FIRED, "outcome": "skipped", "reason": "catch_up", "job_id": None, "job_status": None}
SUMMARY = {**SCHEDULE, "last_tick": FIRED, "fired": 12, "skipped": 2, "counts_capped": False}
ANSWERS: dict[str, dict[str, Any]] = {
    "schedules": {"schedules": [SUMMARY], "next_after": None, "ticks_counted": 1000},
    "schedule": {
        **SUMMARY,
        "ticks": [
            {**FIRED, "recorded_at": FIRED["nominal_at"]},
            {**SKIPPED, "nominal_at": "2026-02-28T02:00:00+00:00", "recorded_at": "x"},
        ],
    },
    "create_schedule": SUMMARY,
    "pause_schedule": {**SCHEDULE, "paused": True, "changed": True},
    "resume_schedule": {**SCHEDULE, "changed": False},
    "trigger_schedule": {"schedule": "nightly", "job_id": "j-1", "tick_at": "2026-03-01T10:00Z"},
    "backfill_schedule": {
        "schedule": "nightly",
        "from": "2026-02-01T00:00:00+00:00",
        "until": "2026-02-03T00:00:00+00:00",
        "ticks": 2,
        "fired": [{"tick_at": "2026-02-01T02:00:00+00:00", "job_id": "j-2"}],
        "already": 1,
    },
    "delete_schedule": {**SCHEDULE, "source": "app", "declared_by": "shop"},
}


def run(capsys, *argv: str) -> tuple[FakeClient, str]:
    client = FakeClient()
    parser = build_parser()
    args = parser.parse_args(list(argv))
    assert schedule_cli.run(client, args, parser) == 0  # type: ignore[arg-type]
    return client, capsys.readouterr().out


def test_list_is_a_table_with_state_next_fire_last_tick_and_counts(capsys):
    client, out = run(capsys, "schedules", "list")
    assert client.calls == [("schedules", (), {"limit": None, "after": None})]
    header, row = out.splitlines()
    assert header.split() == [
        "NAME", "TYPE", "CRON", "ZONE", "STATE", "NEXT", "FIRE", "LAST", "TICK", "FIRED", "SKIPPED",
    ]  # fmt: skip
    assert "nightly" in row and "active" in row and "2026-03-02 02:00:00Z" in row
    assert "2026-03-01 02:00:00Z cron: succeeded" in row and row.split()[-2:] == ["12", "2"]


def test_show_gives_the_facts_and_the_ticks_skips_with_their_reason(capsys):
    client, out = run(capsys, "schedules", "show", "nightly", "--ticks", "5")
    assert client.calls == [("schedule", ("nightly",), {"ticks": 5})]
    assert "calendar  0 3 * * * in Europe/Berlin" in out
    assert "overlap skip, catch-up all up to 3, grace 60 s" in out
    assert "12 fired, 2 skipped" in out
    assert "skipped: catch_up" in out and "succeeded" in out


def test_create_sends_the_typed_options_and_the_payload_as_json(capsys):
    client, out = run(
        capsys, "schedules", "create", "nightly", "noop", "0 3 * * *", '{"k": 1}',
        "--timezone", "Europe/Berlin", "--overlap", "skip", "--catch-up", "all",
        "--catch-up-limit", "3", "--grace", "60",
    )  # fmt: skip
    name, args, kwargs = client.calls[0]
    assert (name, args) == ("create_schedule", ("nightly", "noop", "0 3 * * *"))
    assert kwargs == {
        "payload": {"k": 1},
        "timezone": "Europe/Berlin",
        "overlap": "skip",
        "catch_up": "all",
        "catch_up_limit": 3,
        "grace_seconds": 60,
    }
    assert out.strip() == "created schedule nightly: first fire 2026-03-02 02:00:00Z"


def test_a_payload_that_is_not_json_is_refused_before_any_request(capsys):
    client = FakeClient()
    parser = build_parser()
    args = parser.parse_args(["schedules", "create", "n", "noop", "* * * * *", "{oops"])
    assert schedule_cli.run(client, args, parser) == 2  # type: ignore[arg-type]
    assert client.calls == [] and "not JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("action", "said"),
    [
        ("pause", "paused schedule nightly"),
        ("resume", "schedule nightly was resumed already; nothing changed"),
        ("trigger", "triggered schedule nightly: job j-1"),
        ("delete", "a process of that app stores it again when it starts"),
    ],
)
def test_each_change_is_one_sentence(capsys, action, said):
    client, out = run(capsys, "schedules", action, "nightly")
    assert client.calls == [(f"{action}_schedule", ("nightly",), {})]
    assert said in out


def test_backfill_says_what_fired_and_what_had(capsys):
    client, out = run(
        capsys, "schedules", "backfill", "nightly", "--from", "2026-02-01T00:00:00Z",
        "--until", "2026-02-03T00:00:00Z",
    )  # fmt: skip
    assert client.calls == [
        ("backfill_schedule", ("nightly", "2026-02-01T00:00:00Z", "2026-02-03T00:00:00Z"), {})
    ]
    assert "2 tick(s) in range, 1 fired now, 1 had fired before" in out
    assert "2026-02-01 02:00:00Z  job j-2" in out


def test_json_prints_the_apis_answer(capsys):
    _, out = run(capsys, "schedules", "trigger", "nightly", "--json")
    assert '"job_id": "j-1"' in out


def test_an_unreachable_api_is_said_plainly(capsys):
    code = main(["--url", "http://127.0.0.1:9", "schedules", "list"])
    assert code == 1 and "cannot reach the API" in capsys.readouterr().err
