"""Validation of a submit request body, pure: a dict in, a :class:`Submission` or the list of
every field error out."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

MAX_DELAY_SECONDS = 366 * 86400
MAX_TIMEOUT_SECONDS = 86400
MAX_ATTEMPTS = 100
TYPE_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
KNOWN_FIELDS = {
    "type",
    "payload",
    "run_at",
    "delay_seconds",
    "max_attempts",
    "timeout_seconds",
    "ordering_key",
}


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "message": self.message}


@dataclass(frozen=True)
class Submission:
    type: str
    payload: Any
    run_at: datetime | None  # None: now
    max_attempts: int
    timeout_seconds: int
    ordering_key: str | None


def _int(body: dict, name: str, low: int, high: int, errors: list[FieldError]) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        errors.append(FieldError(name, f"must be an integer between {low} and {high}"))
        return None
    if not low <= value <= high:
        errors.append(FieldError(name, f"must be between {low} and {high}, got {value}"))
        return None
    return value


def validate_submission(
    body: Any, *, default_max_attempts: int, default_timeout: int, now: datetime | None = None
) -> Submission | list[FieldError]:
    if not isinstance(body, dict):
        return [FieldError("(body)", "must be a JSON object with at least a 'type' field")]
    errors: list[FieldError] = []
    for unknown in sorted(set(body) - KNOWN_FIELDS):
        errors.append(
            FieldError(unknown, f"unknown field; allowed: {', '.join(sorted(KNOWN_FIELDS))}")
        )

    job_type = body.get("type")
    if not isinstance(job_type, str) or not TYPE_PATTERN.match(job_type):
        errors.append(
            FieldError("type", "required: 1-100 characters of letters, digits and _ . : -")
        )
    payload = body.get("payload", {})

    run_at: datetime | None = None
    if "run_at" in body and "delay_seconds" in body:
        errors.append(FieldError("run_at", "give run_at or delay_seconds, not both"))
    elif body.get("run_at") is not None:
        raw = body["run_at"]
        if not isinstance(raw, str) or not RFC3339.match(raw):
            errors.append(
                FieldError("run_at", "must be RFC 3339 with an offset, e.g. 2026-01-02T03:04:05Z")
            )
        else:
            run_at = datetime.fromisoformat(raw.replace("z", "Z").replace("Z", "+00:00"))
    elif body.get("delay_seconds") is not None:
        delay = body["delay_seconds"]
        if (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not (0 <= delay <= MAX_DELAY_SECONDS)
        ):
            errors.append(
                FieldError("delay_seconds", f"must be a number between 0 and {MAX_DELAY_SECONDS}")
            )
        elif delay > 0:
            run_at = (now or datetime.now(UTC)) + timedelta(seconds=delay)

    max_attempts = _int(body, "max_attempts", 1, MAX_ATTEMPTS, errors)
    timeout = _int(body, "timeout_seconds", 1, MAX_TIMEOUT_SECONDS, errors)
    ordering_key = body.get("ordering_key")
    if ordering_key is not None and (
        not isinstance(ordering_key, str) or not 1 <= len(ordering_key) <= 200
    ):
        errors.append(FieldError("ordering_key", "must be a string of 1-200 characters"))
        ordering_key = None

    if errors:
        return errors
    return Submission(
        type=job_type,
        payload=payload,
        run_at=run_at,
        max_attempts=max_attempts or default_max_attempts,
        timeout_seconds=timeout or default_timeout,
        ordering_key=ordering_key,
    )


def request_hash(body: Any) -> str:
    """Fingerprint of a request body, insensitive to key order and whitespace."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()
