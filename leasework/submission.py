"""A job request, from any door, checked against what the store can keep and against the app
(pure). HTTP bodies are parsed into :class:`JobRequest` by :mod:`leasework.validation`;
``leasework.enqueue`` builds them from keyword arguments. Both then go through
:func:`request_errors` and :func:`insert_row`, so every door refuses the same input with the
same words and writes the same row.
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from leasework import jsonlimits, queues
from leasework.app import App
from leasework.errors import FieldError
from leasework.job import (
    MAX_ATTEMPTS,
    MAX_DELAY_SECONDS,
    MAX_KEY_CHARS,
    MAX_TIMEOUT_SECONDS,
    TYPE_NAME_PATTERN,
)
from leasework.queues.priorities import priority_error
from leasework.unique import Unique, payload_errors

MAX_BATCH = 1000
# what Python's datetime can hold after conversion to UTC; Postgres holds more
MIN_RUN_AT = datetime(1, 1, 2, tzinfo=UTC)
MAX_RUN_AT = datetime(9999, 12, 30, tzinfo=UTC)


# RFC 3339 with an offset the store can keep (Postgres: under 16 hours either way)
RFC3339_PATTERN = (
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,6})?([Zz]|[+-](0\d|1[0-5]):[0-5]\d)$"
)
RFC3339 = re.compile(RFC3339_PATTERN)


def parse_run_at(raw: Any) -> datetime | FieldError:
    if not isinstance(raw, str) or not RFC3339.match(raw):
        return FieldError(
            "run_at",
            "must be RFC 3339 with an offset under 16 hours, e.g. 2026-01-02T03:04:05Z",
        )
    try:
        return datetime.fromisoformat(
            raw.replace("z", "Z").replace("Z", "+00:00").replace("t", "T")
        )
    except ValueError as exc:
        return FieldError("run_at", f"is not a real time ({exc})")


@dataclass(frozen=True)
class JobRequest:
    """What a client asked for. ``None`` means "not given": the type's policy, then the
    process settings, fill it in."""

    type: str
    payload: Any = None
    run_at: datetime | None = None
    delay_seconds: float | None = None
    max_attempts: int | None = None
    timeout_seconds: int | None = None
    ordering_key: str | None = None
    idempotency_key: str | None = None
    # uniqueness this submit asks (None: the type's declared uniqueness, if any)
    unique: Unique | None = None
    # the queue it waits in (None: its type's, else the default queue)
    queue: str | None = None
    # its priority in the queue, 0 (the highest) to 3 (None: its type's, else 0)
    priority: int | None = None


def unique_of(request: JobRequest, app: App | None) -> Unique | None:
    """The uniqueness ``request`` gets: its own, else its type's declared one (when the door
    knows the app; otherwise the insert applies the type's registered one)."""
    if request.unique is not None:
        return request.unique
    job_type = app.get(request.type) if app is not None else None
    return job_type.unique if job_type is not None else None


@dataclass(frozen=True)
class Defaults:
    """The process settings' policy for what neither the request nor the type gives."""

    max_attempts: int | None = None
    timeout_seconds: int | None = None


def _int_errors(name: str, value: Any, low: int, high: int) -> list[FieldError]:
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int):
        return [FieldError(name, f"must be an integer between {low} and {high}")]
    if not low <= value <= high:
        return [FieldError(name, f"must be between {low} and {high}, got {value}")]
    return []


def _key_errors(name: str, value: Any) -> list[FieldError]:
    if value is None:
        return []
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_KEY_CHARS:
        return [FieldError(name, f"must be a string of 1-{MAX_KEY_CHARS} characters")]
    return jsonlimits.text_errors(name, value)


def run_at_errors(name: str, value: Any) -> list[FieldError]:
    if value is None:
        return []
    if not isinstance(value, datetime) or value.tzinfo is None:
        return [FieldError(name, "must be a time with a UTC offset, e.g. 2026-01-02T03:04:05Z")]
    try:
        in_utc = value.astimezone(UTC)
    except (OverflowError, ValueError):
        in_utc = None
    if in_utc is None or not MIN_RUN_AT <= in_utc <= MAX_RUN_AT:
        return [FieldError(name, "must be between 0001-01-02 and 9999-12-30 (UTC)")]
    return []


def request_errors(request: JobRequest, app: App | None, prefix: str = "") -> list[FieldError]:
    """Every reason the store or the app cannot take ``request``; empty when it can.
    ``prefix`` (``jobs[3].``) places the fields of a batch item."""
    errors: list[FieldError] = []
    if not isinstance(request.type, str) or not TYPE_NAME_PATTERN.match(request.type):
        errors.append(
            FieldError("type", "required: 1-100 characters of letters, digits and _ . : -")
        )
    elif app is not None and request.type not in app:
        known = ", ".join(app.names) or "none"
        errors.append(
            FieldError("type", f"unknown job type {request.type!r}; this app defines: {known}")
        )
    payload_problems = jsonlimits.payload_errors(request.payload)
    errors.extend(payload_problems)
    job_type = app.get(request.type) if app is not None else None
    if not payload_problems and job_type is not None:
        errors.extend(job_type.payload_errors(request.payload))
    if request.unique is not None and not isinstance(request.unique, Unique):
        errors.append(FieldError("unique", "must be a leasework.Unique"))
    elif not payload_problems and (unique := unique_of(request, app)) is not None:
        fields = job_type.payload_fields() if job_type is not None else None
        errors.extend(payload_errors(unique, request.payload, fields))
    if request.run_at is not None and request.delay_seconds is not None:
        errors.append(FieldError("run_at", "give run_at or delay_seconds, not both"))
    errors.extend(run_at_errors("run_at", request.run_at))
    delay = request.delay_seconds
    if delay is not None and (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not math.isfinite(delay)
        or not 0 <= delay <= MAX_DELAY_SECONDS
    ):
        errors.append(
            FieldError("delay_seconds", f"must be a number between 0 and {MAX_DELAY_SECONDS}")
        )
    errors.extend(_int_errors("max_attempts", request.max_attempts, 1, MAX_ATTEMPTS))
    errors.extend(_int_errors("timeout_seconds", request.timeout_seconds, 1, MAX_TIMEOUT_SECONDS))
    errors.extend(_key_errors("ordering_key", request.ordering_key))
    errors.extend(_key_errors("idempotency_key", request.idempotency_key))
    if request.queue is not None and (problem := queues.name_error(request.queue)) is not None:
        errors.append(FieldError("queue", problem))
    if request.priority is not None and (problem := priority_error(request.priority)):
        errors.append(FieldError("priority", problem))
    return [FieldError(prefix + e.field, e.message) for e in errors] if prefix else errors


def insert_row(
    request: JobRequest, app: App | None, defaults: Defaults, job_id: uuid.UUID | None = None
) -> dict[str, Any]:
    """The JSON object ``leasework_jobs_insert`` takes for ``request`` (already checked):
    what the client asked, plus the door's policy for what it left out."""
    job_type = app.get(request.type) if app is not None else None
    row: dict[str, Any] = {"id": str(job_id or uuid.uuid4()), "type": request.type}
    row["payload"] = request.payload
    if request.run_at is not None:
        row["run_at"] = request.run_at.isoformat()
    if request.delay_seconds:
        row["delay_seconds"] = request.delay_seconds
    for key in ("max_attempts", "timeout_seconds", "ordering_key", "idempotency_key"):
        if (value := getattr(request, key)) is not None:
            row[key] = value
    max_attempts = job_type.max_attempts if job_type else None
    timeout = job_type.timeout_seconds if job_type else None
    if (value := max_attempts or defaults.max_attempts) is not None:
        row["default_max_attempts"] = value
    if (value := timeout or defaults.timeout_seconds) is not None:
        row["default_timeout_seconds"] = value
    if job_type is not None and job_type.backoff is not None:
        row["retry_base"], row["retry_cap"] = job_type.backoff
    if request.queue is not None:
        row["queue"] = request.queue
    elif job_type is not None and job_type.queue is not None:
        row["default_queue"] = job_type.queue
    if request.priority is not None:
        row["priority"] = request.priority
    elif job_type is not None and job_type.priority is not None:
        row["default_priority"] = job_type.priority
    if request.unique is not None:
        row["unique"] = request.unique.spec()
    elif job_type is not None and job_type.unique is not None:
        row["default_unique"] = job_type.unique.spec()
    return row


def delay_of(value: float | timedelta | None) -> float | None:
    """``delay=`` of ``enqueue`` in seconds (a number or a timedelta)."""
    if value is None or isinstance(value, bool):
        return value  # a bool is refused by request_errors
    return value.total_seconds() if isinstance(value, timedelta) else value
