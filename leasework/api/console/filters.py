"""The jobs page's query string (pure): filters, keyset cursor, and the bulk retry a filter
stands for. Everything here round-trips: the links the console renders parse back to the
same filter, so a page, its next page and its bulk retry select the same jobs."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from leasework.app import TYPE_NAME_PATTERN
from leasework.states import RETRYABLE, Status
from leasework.store.console import TIME_FIELDS, JobFilter

PAGE_SIZE = 50
BULK_RETRY_LIMIT = 10_000  # jobs one bulk retry requeues at most (the API's bound too)

# the quick windows the jobs page offers, as (label, length)
WINDOWS = (
    ("15 min", timedelta(minutes=15)),
    ("1 hour", timedelta(hours=1)),
    ("24 hours", timedelta(hours=24)),
    ("7 days", timedelta(days=7)),
)


def parse_time(raw: str) -> datetime:
    """An ISO 8601 time, as an HTML ``datetime-local`` field sends it (``2026-01-02T03:04``,
    read as UTC) or with an offset. Raises ValueError."""
    value = datetime.fromisoformat(raw.strip())
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def format_time(value: datetime) -> str:
    """What a ``datetime-local`` field shows for ``value``: UTC, to the second."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def parse_job_filter(args: Mapping[str, str]) -> tuple[JobFilter, list[str]]:
    """The filter a query string asks for, and a message per field it could not use (that
    field is then left out of the filter). Empty fields mean no bound."""
    errors: list[str] = []
    status = (args.get("status") or "").strip() or None
    if status is not None and status not in {s.value for s in Status}:
        errors.append(f"status: must be one of {', '.join(s.value for s in Status)}")
        status = None
    job_type = (args.get("type") or "").strip() or None
    if job_type is not None and not TYPE_NAME_PATTERN.match(job_type):
        errors.append("type: must be 1-100 letters, digits and _ . : -")
        job_type = None
    field = (args.get("time_field") or "created_at").strip()
    if field not in TIME_FIELDS:
        errors.append(f"time_field: must be one of {', '.join(TIME_FIELDS)}")
        field = "created_at"
    bounds: dict[str, datetime | None] = {}
    for name in ("since", "until"):
        raw = (args.get(name) or "").strip()
        bounds[name] = None
        if raw:
            try:
                bounds[name] = parse_time(raw)
            except ValueError:
                errors.append(f"{name}: {raw!r} is not a time like 2026-01-02T03:04 (UTC)")
    since, until = bounds["since"], bounds["until"]
    if since is not None and until is not None and since >= until:
        errors.append("until: must be after since")
        until = None
    return JobFilter(status, job_type, since, until, field), errors


def filter_query(job_filter: JobFilter) -> dict[str, str]:
    """The query string of ``job_filter`` (only the fields it sets)."""
    query: dict[str, str] = {}
    if job_filter.status is not None:
        query["status"] = job_filter.status
    if job_filter.job_type is not None:
        query["type"] = job_filter.job_type
    if job_filter.since is not None or job_filter.until is not None:
        query["time_field"] = job_filter.time_field
    if job_filter.since is not None:
        query["since"] = job_filter.since.isoformat()
    if job_filter.until is not None:
        query["until"] = job_filter.until.isoformat()
    return query


def parse_cursor(args: Mapping[str, str]) -> tuple[datetime, uuid.UUID] | None:
    """The keyset position (``before``, ``before_id``: the last row of the previous page), or
    None for the first page. Raises ValueError for a position this console did not write."""
    raw_at, raw_id = args.get("before"), args.get("before_id")
    if not raw_at and not raw_id:
        return None
    if not raw_at or not raw_id:
        raise ValueError("before and before_id come together (from a 'next page' link)")
    at = datetime.fromisoformat(raw_at)
    if at.tzinfo is None:
        raise ValueError("before needs an offset")
    return at, uuid.UUID(raw_id)


def cursor_query(created_at: datetime, job_id: uuid.UUID) -> dict[str, str]:
    return {"before": created_at.isoformat(), "before_id": str(job_id)}


def bulk_retry_refusal(job_filter: JobFilter) -> str | None:
    """Why this filter cannot be retried in bulk, or None when it can."""
    if job_filter.status not in RETRYABLE:
        return (
            "bulk retry takes a filter on status "
            + " or ".join(sorted(RETRYABLE))
            + " (only those can be retried)"
        )
    return None


def retry_matching_args(job_filter: JobFilter) -> dict[str, Any]:
    """The keyword arguments of :func:`leasework.store.jobs_retry_matching` that retry
    exactly what ``job_filter`` selects (at most :data:`BULK_RETRY_LIMIT`)."""
    refusal = bulk_retry_refusal(job_filter)
    if refusal is not None:
        raise ValueError(refusal)
    by_finish = job_filter.time_field == "finished_at"
    return {
        "statuses": [job_filter.status],
        "job_type": job_filter.job_type,
        "finished_after": job_filter.since if by_finish else None,
        "finished_before": job_filter.until if by_finish else None,
        "created_after": None if by_finish else job_filter.since,
        "created_before": None if by_finish else job_filter.until,
        "limit": BULK_RETRY_LIMIT,
    }


def describe(job_filter: JobFilter) -> str:
    """The filter in words, for the audit log's target and the confirmation page."""
    parts = [f"status={job_filter.status or 'any'}", f"type={job_filter.job_type or 'any'}"]
    if job_filter.since is not None:
        parts.append(f"{job_filter.time_field}>={job_filter.since.isoformat()}")
    if job_filter.until is not None:
        parts.append(f"{job_filter.time_field}<{job_filter.until.isoformat()}")
    return " ".join(parts)
