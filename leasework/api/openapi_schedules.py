"""The OpenAPI operations and schemas of the schedule endpoints (:mod:`leasework.api.schedules`),
one function per operation, named beside its handler in the route table
(:data:`leasework.api.routes.ROUTES`). The create body's ``type`` lists the loaded app's job
types, so its schema is built with the app (:func:`schedule_schemas`)."""

from __future__ import annotations

from typing import Any

from leasework.api.openapi_parts import (
    NULLABLE_STRING,
    TIME_SCHEMA,
    TYPE_NAME,
    json_response,
    nullable,
    problem,
    ref,
)
from leasework.api.schedules import (
    DEFAULT_LIST_LIMIT,
    DEFAULT_TICKS_SHOWN,
    MAX_LIST_LIMIT,
    MAX_TICKS_SHOWN,
)
from leasework.app import App, JobType
from leasework.schedules import CatchUp, Overlap, SkipReason
from leasework.schedules.operations import MAX_BACKFILL, MAX_CRON_CHARS, MAX_TIMEZONE_CHARS

NAME = {"name": "name", "in": "path", "required": True, "schema": TYPE_NAME}
_TIME = {"type": "string", "format": "date-time"}
_NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}
_NOT_FOUND = problem("No schedule of that name (`GET /schedules` lists them)")
_BODY_ANSWERS = {
    "400": problem("Malformed JSON"),
    "413": problem("Body too large"),
    "415": problem("Not application/json"),
}


def list_schedules() -> dict:
    """GET ``/schedules``."""
    return {
        "summary": "List schedules by name: next fire time, paused, the last tick, counts",
        "parameters": [
            {
                "name": "limit",
                "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT},
                "description": f"schedules per page (default {DEFAULT_LIST_LIMIT})",
            },
            {
                "name": "after",
                "in": "query",
                "schema": TYPE_NAME,
                "description": "the previous page's next_after",
            },
        ],
        "responses": {
            "200": json_response(
                {
                    "type": "object",
                    "required": ["schedules", "next_after", "ticks_counted"],
                    "properties": {
                        "schedules": {"type": "array", "items": ref("ScheduleSummary")},
                        "next_after": NULLABLE_STRING,
                        "ticks_counted": {
                            "type": "integer",
                            "description": "each schedule's counts are of its latest this "
                            "many ticks (counts_capped says when it has more)",
                        },
                    },
                },
                "A page of schedules",
            ),
            "422": problem("Invalid limit or after"),
        },
    }


def create_schedule() -> dict:
    """POST ``/schedules``."""
    return {
        "summary": "Create a recurring schedule; it first fires at its first tick after now",
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ref("ScheduleRequest")}},
        },
        "responses": {
            "201": {
                **json_response(ref("ScheduleSummary"), "Created"),
                "headers": {"Location": {"schema": {"type": "string"}}},
            },
            **_BODY_ANSWERS,
            "409": problem("A schedule of that name exists"),
            "422": problem(
                "Invalid fields (a cron expression, time zone or policy it cannot use, a job "
                "type the app does not define, a payload the type refuses); `errors` names each"
            ),
        },
    }


def get_schedule() -> dict:
    """GET ``/schedules/{name}``."""
    return {
        "summary": "A schedule with its latest ticks, newest first (skips with their reason)",
        "parameters": [
            NAME,
            {
                "name": "ticks",
                "in": "query",
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_TICKS_SHOWN},
                "description": f"how many ticks (default {DEFAULT_TICKS_SHOWN})",
            },
        ],
        "responses": {
            "200": json_response(
                {
                    "allOf": [
                        ref("ScheduleSummary"),
                        {
                            "type": "object",
                            "required": ["ticks"],
                            "properties": {
                                "ticks": {"type": "array", "items": ref("ScheduleTick")}
                            },
                        },
                    ]
                },
                "The schedule",
            ),
            "404": _NOT_FOUND,
            "422": problem("Invalid ticks"),
        },
    }


def _toggle(summary: str) -> dict:
    return {
        "summary": summary,
        "parameters": [NAME],
        "responses": {
            "200": json_response(
                {
                    "allOf": [
                        ref("Schedule"),
                        {
                            "type": "object",
                            "required": ["changed"],
                            "properties": {"changed": {"type": "boolean"}},
                        },
                    ]
                },
                "The schedule; `changed` is false when it was so already (not audited)",
            ),
            "404": _NOT_FOUND,
        },
    }


def pause_schedule() -> dict:
    """POST ``/schedules/{name}/pause``."""
    return _toggle("Pause a schedule: no tick fires until it is resumed")


def resume_schedule() -> dict:
    """POST ``/schedules/{name}/resume``."""
    return _toggle(
        "Resume a paused schedule from its first tick after now (ticks due while it was "
        "paused do not run; backfill them if they should)"
    )


def trigger_schedule() -> dict:
    """POST ``/schedules/{name}/trigger``."""
    return {
        "summary": "Run a schedule once now, outside its calendar (a tick of source trigger)",
        "parameters": [NAME],
        "responses": {
            "202": json_response(
                {
                    "type": "object",
                    "required": ["schedule", "job_id", "tick_at"],
                    "properties": {
                        "schedule": {"type": "string"},
                        "job_id": {"type": "string", "format": "uuid"},
                        "tick_at": _TIME,
                    },
                },
                "The tick's job was accepted",
            ),
            "404": _NOT_FOUND,
        },
    }


def backfill_schedule() -> dict:
    """POST ``/schedules/{name}/backfill``."""
    return {
        "summary": f"Run each tick of the calendar from `from` to `until` (inclusive, in the "
        f"past, at most {MAX_BACKFILL}) that never fired: a job each. Ticks that fired before "
        "are left alone, so backfilling a range twice runs nothing twice",
        "parameters": [NAME],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ref("BackfillRequest")}},
        },
        "responses": {
            "200": json_response(
                {
                    "type": "object",
                    "required": ["schedule", "from", "until", "ticks", "fired", "already"],
                    "properties": {
                        "schedule": {"type": "string"},
                        "from": _TIME,
                        "until": _TIME,
                        "ticks": {"type": "integer", "description": "the calendar's, in range"},
                        "fired": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["tick_at", "job_id"],
                                "properties": {
                                    "tick_at": _TIME,
                                    "job_id": {"type": "string", "format": "uuid"},
                                },
                            },
                        },
                        "already": {"type": "integer", "description": "ticks that had fired"},
                    },
                },
                "What was fired",
            ),
            **_BODY_ANSWERS,
            "404": _NOT_FOUND,
            "422": problem(
                "Invalid range (out of order, in the future) or more than "
                f"{MAX_BACKFILL} ticks (`split_at` says where to split it)"
            ),
        },
    }


def delete_schedule() -> dict:
    """DELETE ``/schedules/{name}``."""
    return {
        "summary": "Delete a schedule and its ticks; its jobs stay. One an app declares is "
        "stored again when a process of the app starts",
        "parameters": [NAME],
        "responses": {
            "200": json_response(ref("Schedule"), "Deleted; the schedule as it was"),
            "404": _NOT_FOUND,
        },
    }


_SCHEDULE: dict[str, Any] = {
    "type": "object",
    "required": [
        "name",
        "type",
        "payload",
        "cron",
        "timezone",
        "overlap",
        "catch_up",
        "catch_up_limit",
        "grace_seconds",
        "paused",
        "next_fire_at",
        "source",
        "created_at",
        "updated_at",
    ],
    "properties": {
        "name": {"type": "string"},
        "type": {"type": "string"},
        "payload": {},
        "cron": {"type": "string"},
        "timezone": {"type": "string"},
        "overlap": {"type": "string", "enum": list(Overlap)},
        "catch_up": {"type": "string", "enum": list(CatchUp)},
        "catch_up_limit": {"type": "integer"},
        "grace_seconds": {"type": "integer"},
        "paused": {"type": "boolean"},
        "next_fire_at": {**_NULLABLE_TIME, "description": "null: the calendar has no tick left"},
        "source": {"type": "string", "enum": ["app", "api"]},
        "declared_by": NULLABLE_STRING,
        "created_at": _TIME,
        "updated_at": _TIME,
    },
}

_TICK_PROPERTIES: dict[str, Any] = {
    "nominal_at": _TIME,
    "outcome": {"type": "string", "enum": ["fired", "skipped"]},
    "reason": {"type": ["string", "null"], "enum": [*SkipReason, None]},
    "source": {"type": "string", "enum": ["cron", "catch_up", "trigger", "backfill"]},
    "job_id": {"type": ["string", "null"], "format": "uuid"},
    "job_status": {**NULLABLE_STRING, "description": "null for a skip or a pruned job"},
}


# what generates a valid value of each (the schema cannot say it): tools/schemathesis_hooks.py
CRON_FORMAT = "cron"
ZONE_FORMAT = "iana-time-zone"
PAST_TIME_FORMAT = "past-date-time"

_REQUEST_OPTIONS: dict[str, Any] = {
    "name": TYPE_NAME,
    "cron": {
        "type": "string",
        "format": CRON_FORMAT,
        "minLength": 1,
        "maxLength": MAX_CRON_CHARS,
        "description": "five fields (minute hour day-of-month month day-of-week), or six "
        "with seconds first; e.g. '*/5 * * * *'",
    },
    "timezone": nullable(
        {
            "type": "string",
            "format": ZONE_FORMAT,
            "minLength": 1,
            "maxLength": MAX_TIMEZONE_CHARS,
            "default": "UTC",
            "description": "an IANA name, e.g. Europe/Berlin",
        }
    ),
    "overlap": nullable({"type": "string", "enum": list(Overlap), "default": str(Overlap.ALLOW)}),
    "catch_up": nullable({"type": "string", "enum": list(CatchUp), "default": str(CatchUp.LATEST)}),
    "catch_up_limit": nullable({"type": "integer", "minimum": 1, "maximum": 1000, "default": 1}),
    "grace_seconds": nullable({"type": "integer", "minimum": 0, "maximum": 86400, "default": 60}),
}


def _request(job_type: JobType, payload: dict) -> dict:
    required = ["name", "type", "cron"]
    if job_type.payload_errors({}):  # the payload has required fields: it cannot be left out
        required.append("payload")
    return {
        "type": "object",
        "required": required,
        "additionalProperties": False,
        "properties": {
            "type": {"const": job_type.name},
            "payload": {
                **payload,
                "description": "the job's payload at each tick (default {}), checked "
                "against the type's model",
            },
            **_REQUEST_OPTIONS,
        },
    }


def schedule_schemas(app: App, payloads: dict[str, dict]) -> dict[str, Any]:
    """The schedules' schemas; a create's ``type`` is one of ``app``'s job types, each with
    its payload's schema (``payloads``, by type, as the submit's)."""
    requests = {f"ScheduleRequest.{t.name}": _request(t, payloads[t.name]) for t in app}
    past_time = {
        **TIME_SCHEMA,
        "format": PAST_TIME_FORMAT,
        "description": "RFC 3339 with an offset, not after now",
    }
    return {
        "Schedule": _SCHEDULE,
        "ScheduleSummary": {
            "allOf": [
                ref("Schedule"),
                {
                    "type": "object",
                    "required": ["last_tick", "fired", "skipped", "counts_capped"],
                    "properties": {
                        "last_tick": {
                            "anyOf": [
                                {
                                    "type": "object",
                                    "required": list(_TICK_PROPERTIES),
                                    "properties": _TICK_PROPERTIES,
                                },
                                {"type": "null"},
                            ]
                        },
                        "fired": {"type": "integer", "minimum": 0},
                        "skipped": {"type": "integer", "minimum": 0},
                        "counts_capped": {"type": "boolean"},
                    },
                },
            ]
        },
        "ScheduleTick": {
            "type": "object",
            "required": [*_TICK_PROPERTIES, "recorded_at"],
            "properties": {**_TICK_PROPERTIES, "recorded_at": _TIME},
        },
        **requests,
        "ScheduleRequest": {"oneOf": [ref(n) for n in requests]} if requests else {"not": {}},
        "BackfillRequest": {
            "type": "object",
            "required": ["from", "until"],
            "additionalProperties": False,
            "properties": {"from": past_time, "until": past_time},
        },
    }
