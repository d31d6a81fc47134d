"""The jobs page's query string (pure): its filter (read by :mod:`leasework.operations`'s one
parser, written by :func:`leasework.operations.filter_fields`), its keyset cursor and its quick
time windows. Everything here round-trips: the links the console renders parse back to the
same filter, so a page, its next page and its bulk retry select the same jobs."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from leasework import operations
from leasework.store.jobs import JobFilter

PAGE_SIZE = 50

# the quick windows the jobs page offers, as (label, length)
WINDOWS = (
    ("15 min", timedelta(minutes=15)),
    ("1 hour", timedelta(hours=1)),
    ("24 hours", timedelta(hours=24)),
    ("7 days", timedelta(days=7)),
)


def format_time(value: datetime) -> str:
    """What a ``datetime-local`` field shows for ``value``: UTC, to the second."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def parse_job_filter(args: Mapping[str, str]) -> tuple[JobFilter, list[str]]:
    """The filter a query string asks for (:data:`leasework.operations.CONSOLE_QUERY`, the
    one parser both doors use), and a message per field it could not use (that field is
    then left out of the filter). Empty fields mean no bound."""
    parsed = operations.parse_job_filter(args, operations.CONSOLE_QUERY)
    return parsed.job_filter, [f"{e.field}: {e.message}" for e in parsed.errors]


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
