"""An operator's operations on jobs, one owner for every door: cancel, retry, and retry by
filter (bulk retry). The api (:mod:`leasework.api.jobs`) and the console
(:mod:`leasework.api.console.routes`) both call these and differ only in how they render the
answer (a JSON document or problem, a redirect with a notice or an error page).

Each operation is a function of an open transaction (``await db.run(operations.cancel, ...)``)
and writes its audit row (:func:`leasework.store.operators.audit_add`) in that transaction, so
the row commits with the change or not at all.

**What is audited.** An audit row records a change that happened; a request that was refused or
changed nothing is not one and writes no row: a cancel of a job that is missing or already
finished, a retry of a job that is missing or neither dead nor cancelled, a bulk retry that
matched no job. (The console used to write a row for each of those and the api one for an
empty bulk retry; both doors now do the same.) A cancel asked of a running job is a change
(the request is stamped on the job for its worker to see) and is recorded each time it is made.
Every row names who asked (the token's name) and the door (``detail.via``: ``api`` or
``console``). A single job's row has the job's id as its target and the outcome in its detail;
a bulk retry's has the filter in words (:func:`describe`) as its target and in its detail the
filter's fields (:func:`filter_fields`), the limit and how many jobs were retried.

**One filter.** A bulk retry selects by :class:`~leasework.store.jobs.JobFilter`, the record the
console's jobs page lists and counts by, and the store's query takes it whole, so what a page
shows, what its confirmation counts and what the retry requeues are one WHERE clause. Both
doors' filters are read by one parser, :func:`parse_job_filter`; what differs between the api's
JSON body and the console's query string is written down in one :class:`FilterSpelling` each
(:data:`API_BODY`, :data:`CONSOLE_QUERY`), and their error messages are the ones each door has
always given.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from leasework import store
from leasework.errors import FieldError
from leasework.job import TYPE_NAME_HINT, TYPE_NAME_PATTERN
from leasework.jsonlimits import whole_numbers
from leasework.states import RETRYABLE, Status
from leasework.store import operators
from leasework.store.jobs import TIME_FIELDS, JobFilter
from leasework.submission import parse_run_at

BULK_RETRY_LIMIT = 10_000  # jobs one bulk retry requeues at most, at either door

# the outcomes that changed the job, and so are audited
CHANGED = frozenset(
    {store.CancelOutcome.CANCELLED, store.CancelOutcome.REQUESTED, store.RetryOutcome.RETRIED}
)


@dataclass(frozen=True)
class Actor:
    """Who asks for an operation (the token's name) and through which door."""

    name: str
    via: str  # "api" or "console"


@dataclass(frozen=True)
class BulkRetry:
    """A bulk retry: the jobs it selects (their status ``dead`` or ``cancelled``) and how many
    it requeues at most. Make one with :func:`bulk_retry`."""

    jobs: JobFilter
    limit: int = BULK_RETRY_LIMIT


@dataclass(frozen=True)
class BulkRetryResult:
    retried: int  # jobs put back in the queue


# ---------------------------------------------------------------- the operations


def cancel(conn: psycopg.Connection, job_id: uuid.UUID, actor: Actor) -> store.CancelResult:
    """Cancel a waiting job now, or ask the worker running it to stop (cooperative)."""
    result = store.job_cancel(conn, job_id)
    if result.outcome in CHANGED:
        _audit_job(conn, actor, "cancel", job_id, result.outcome)
    return result


def retry(
    conn: psycopg.Connection, job_id: uuid.UUID, actor: Actor, *, topic: str
) -> store.RetryResult:
    """Put a dead or cancelled job back in the queue with a fresh attempt budget."""
    result = store.job_retry(conn, job_id, topic)
    if result.outcome in CHANGED:
        _audit_job(conn, actor, "retry", job_id, result.outcome)
    return result


def retry_matching(
    conn: psycopg.Connection, bulk: BulkRetry, actor: Actor, *, topic: str
) -> BulkRetryResult:
    """Retry up to ``bulk.limit`` of the jobs ``bulk.jobs`` selects, oldest finish first."""
    retried = store.jobs_retry_matching(conn, bulk.jobs, limit=bulk.limit, topic=topic)
    if retried:
        detail = {
            "via": actor.via,
            "filter": filter_fields(bulk.jobs),
            "limit": bulk.limit,
            "retried": retried,
        }
        operators.audit_add(conn, actor.name, "retry-many", describe(bulk.jobs), detail)
    return BulkRetryResult(retried)


def _audit_job(
    conn: psycopg.Connection, actor: Actor, action: str, job_id: uuid.UUID, outcome: str
) -> None:
    detail = {"via": actor.via, "outcome": str(outcome)}
    operators.audit_add(conn, actor.name, action, str(job_id), detail)


# ---------------------------------------------------------------- the filter (pure)


def parse_time(raw: str) -> datetime:
    """An ISO 8601 time, as an HTML ``datetime-local`` field sends it (``2026-01-02T03:04``,
    read as UTC) or with an offset. Raises ValueError."""
    value = datetime.fromisoformat(raw.strip())
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _rfc3339(raw: Any) -> datetime:
    parsed = parse_run_at(raw)
    if isinstance(parsed, FieldError):
        raise ValueError(parsed.message)
    return parsed


def _form_time(raw: str) -> datetime:
    try:
        return parse_time(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not a time like 2026-01-02T03:04 (UTC)") from None


@dataclass(frozen=True)
class FilterSpelling:
    """How one door writes a job filter. The parser is one (:func:`parse_job_filter`); what
    differs between the doors is only what is listed here."""

    since: str  # the field of the lower time bound (inclusive)
    until: str  # the field of the upper time bound (exclusive)
    time_field: str | None  # the field naming which time the bounds are on; None: finished_at
    limit: str | None  # the field of a bulk retry's limit; None: not given, default_limit
    default_limit: int
    statuses: tuple[str, ...]  # what the status may be
    status_choices: str  # how a refusal of the status lists them
    default_status: str | None  # a status left out
    read_time: Callable[[Any], datetime]  # a bound's value; ValueError(message) refuses it
    # a query string: every value is text and a blank one is left out, fields not named here
    # are the page's own (not refused), and the bounds must be in order
    query_string: bool


# POST /jobs/retry: a JSON object, for retrying only; RFC 3339 times on the finish time
API_BODY = FilterSpelling(
    since="finished_after",
    until="finished_before",
    time_field=None,
    limit="limit",
    default_limit=1000,
    statuses=tuple(sorted(RETRYABLE)),
    status_choices=", ".join(sorted(str(s) for s in RETRYABLE)),
    default_status="dead",
    read_time=_rfc3339,
    query_string=False,
)

# the console's jobs page (and its bulk retry): any status, datetime-local times (UTC)
CONSOLE_QUERY = FilterSpelling(
    since="since",
    until="until",
    time_field="time_field",
    limit=None,
    default_limit=BULK_RETRY_LIMIT,
    statuses=tuple(s.value for s in Status),
    status_choices=", ".join(s.value for s in Status),
    default_status=None,
    read_time=_form_time,
    query_string=True,
)


@dataclass(frozen=True)
class ParsedFilter:
    """What :func:`parse_job_filter` read: the filter (a field it could not use left out),
    the limit of a bulk retry, and an error per field it could not use."""

    job_filter: JobFilter
    limit: int
    errors: tuple[FieldError, ...]


def parse_job_filter(fields: Any, spelling: FilterSpelling) -> ParsedFilter:
    """The job filter ``fields`` (a JSON body or a query string) asks for, read as ``spelling``
    says, in one pass that names every field it cannot use."""
    if not isinstance(fields, Mapping):
        error = FieldError("(body)", "must be a JSON object of filters")
        return ParsedFilter(JobFilter(), spelling.default_limit, (error,))
    reader = _FieldReader(fields, spelling)
    errors = reader.unknown_fields()
    status = reader.status(errors)
    job_type = reader.job_type(errors)
    time_field = reader.time_field(errors)
    since, until = reader.time(spelling.since, errors), reader.time(spelling.until, errors)
    if spelling.query_string and since is not None and until is not None and since >= until:
        errors.append(FieldError(spelling.until, f"must be after {spelling.since}"))
        until = None
    limit = reader.limit(errors)
    return ParsedFilter(JobFilter(status, job_type, since, until, time_field), limit, tuple(errors))


class _FieldReader:
    """Each field of a filter, read as its spelling says (pure)."""

    def __init__(self, fields: Mapping[str, Any], spelling: FilterSpelling) -> None:
        self.fields = fields
        self.spelling = spelling

    def value(self, name: str) -> Any:
        """The field's value; None when left out (in a query string: blank)."""
        raw = self.fields.get(name)
        if self.spelling.query_string:
            return (raw or "").strip() or None
        return raw

    def unknown_fields(self) -> list[FieldError]:
        if self.spelling.query_string:
            return []
        s = self.spelling
        names = ("status", "type", s.since, s.until, s.time_field, s.limit)
        allowed = {name for name in names if name is not None}
        message = "unknown field; allowed: " + ", ".join(sorted(allowed))
        return [FieldError(k, message) for k in sorted(set(self.fields) - allowed, key=str)]

    def status(self, errors: list[FieldError]) -> str | None:
        raw = self.value("status")
        status = self.spelling.default_status if raw is None else raw
        allowed = self.spelling.statuses
        if status is not None and (not isinstance(status, str) or status not in allowed):
            errors.append(FieldError("status", f"must be one of {self.spelling.status_choices}"))
            return None
        return status

    def job_type(self, errors: list[FieldError]) -> str | None:
        job_type = self.value("type")
        if job_type is not None and (
            not isinstance(job_type, str) or not TYPE_NAME_PATTERN.match(job_type)
        ):
            errors.append(FieldError("type", f"must be {TYPE_NAME_HINT}"))
            return None
        return job_type

    def time_field(self, errors: list[FieldError]) -> str:
        name = self.spelling.time_field
        if name is None:
            return "finished_at"
        raw = self.fields.get(name)
        field = (raw or "created_at").strip() if isinstance(raw, str) or raw is None else raw
        if field not in TIME_FIELDS:
            errors.append(FieldError(name, f"must be one of {', '.join(TIME_FIELDS)}"))
            return "created_at"
        return field

    def time(self, name: str, errors: list[FieldError]) -> datetime | None:
        raw = self.value(name)
        if raw is None:
            return None
        try:
            return self.spelling.read_time(raw)
        except ValueError as exc:
            errors.append(FieldError(name, str(exc)))
            return None

    def limit(self, errors: list[FieldError]) -> int:
        default = self.spelling.default_limit
        raw = None if self.spelling.limit is None else self.value(self.spelling.limit)
        if self.spelling.query_string and raw is not None:
            raw = int(raw) if raw.isdigit() else raw  # a query string's number
        limit = whole_numbers(default if raw is None else raw)
        whole = isinstance(limit, int) and not isinstance(limit, bool)
        if not whole or not 1 <= limit <= BULK_RETRY_LIMIT:
            errors.append(FieldError("limit", f"must be an integer from 1 to {BULK_RETRY_LIMIT}"))
            return default
        return limit


def bulk_retry_refusal(job_filter: JobFilter) -> str | None:
    """Why this filter cannot be retried in bulk, or None when it can."""
    if job_filter.status not in RETRYABLE:
        return (
            "bulk retry takes a filter on status "
            + " or ".join(sorted(RETRYABLE))
            + " (only those can be retried)"
        )
    return None


def bulk_retry(job_filter: JobFilter, limit: int = BULK_RETRY_LIMIT) -> BulkRetry:
    """The bulk retry of exactly what ``job_filter`` selects; ValueError (the refusal) when
    its status is not one a retry takes."""
    refusal = bulk_retry_refusal(job_filter)
    if refusal is not None:
        raise ValueError(refusal)
    return BulkRetry(job_filter, limit)


def filter_fields(job_filter: JobFilter) -> dict[str, str]:
    """The fields ``job_filter`` sets, as the console's query string writes them (its links,
    and the audit row of a bulk retry); :data:`CONSOLE_QUERY` parses them back to the same
    filter."""
    fields: dict[str, str] = {}
    if job_filter.status is not None:
        fields["status"] = job_filter.status
    if job_filter.job_type is not None:
        fields["type"] = job_filter.job_type
    if job_filter.since is not None or job_filter.until is not None:
        fields["time_field"] = job_filter.time_field
    if job_filter.since is not None:
        fields["since"] = job_filter.since.isoformat()
    if job_filter.until is not None:
        fields["until"] = job_filter.until.isoformat()
    return fields


def describe(job_filter: JobFilter) -> str:
    """The filter in words, for the audit log's target and the confirmation page."""
    parts = [f"status={job_filter.status or 'any'}", f"type={job_filter.job_type or 'any'}"]
    if job_filter.since is not None:
        parts.append(f"{job_filter.time_field}>={job_filter.since.isoformat()}")
    if job_filter.until is not None:
        parts.append(f"{job_filter.time_field}<{job_filter.until.isoformat()}")
    return " ".join(parts)
