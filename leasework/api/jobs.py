"""The api's job endpoints past the submit (:mod:`leasework.api.submit`): get one, list them
(keyset pages behind an opaque cursor), the loaded app's job types, and the operators' cancel,
retry and bulk retry, which are :mod:`leasework.operations`' (the console calls the same) and
differ here only in how their answer is rendered."""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from datetime import datetime
from typing import Any

import psycopg
from quart import request

from leasework import operations, store
from leasework.api.bodies import invalid, json_body
from leasework.api.context import ApiContext, caller
from leasework.api.problems import Problem
from leasework.errors import FieldError
from leasework.job import TYPE_NAME_HINT, TYPE_NAME_PATTERN, Job
from leasework.states import RETRYABLE, Status
from leasework.unique import key_view

MAX_LIST_LIMIT = 200
DEFAULT_LIST_LIMIT = 50

JOB_FIELDS = (
    "type",
    "payload",
    "attempt",
    "max_attempts",
    "timeout_seconds",
    "ordering_key",
    "last_error",
    "cancel_requested",
    "result",
    "deferrals",
    "schedule",
    "queue",
    "priority",
)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def job_view(job: Job) -> dict[str, Any]:
    view: dict[str, Any] = {k: getattr(job, k) for k in JOB_FIELDS}
    view["status"] = str(job.status)
    view["id"] = str(job.id)
    for key in ("run_at", "created_at", "updated_at", "started_at", "finished_at", "tick_at"):
        view[key] = _iso(getattr(job, key))
    view["unique"] = key_view(job.unique_key, job.unique_states, job.status)
    return view


def encode_cursor(job: Job) -> str:
    raw = json.dumps([job.created_at.isoformat(), str(job.id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, job_id = json.loads(raw)
        parsed = datetime.fromisoformat(created_at)
        if parsed.tzinfo is None:
            raise ValueError("no offset")
        return parsed, uuid.UUID(job_id)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise Problem(
            400,
            "bad-cursor",
            "Invalid cursor",
            "cursor is not one this API handed out; pass next_cursor from a previous page "
            "unchanged, or omit it to start from the newest job",
        ) from None


def parse_job_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise Problem(
            404, "job-not-found", "Job not found", f"{raw!r} is not a job id (job ids are UUIDs)"
        ) from None


def no_such_job(job_id: str) -> Problem:
    return Problem(404, "job-not-found", "Job not found", f"no job has id {job_id}")


def query_type(raw: str | None) -> str | None:
    if raw is not None and not TYPE_NAME_PATTERN.match(raw):
        raise invalid([FieldError("type", f"must be {TYPE_NAME_HINT}")])
    return raw


# ---------------------------------------------------------------- reads


async def get_job(ctx: ApiContext, job_id: str) -> dict[str, Any]:
    """``GET /jobs/{job_id}``."""
    job = await ctx.db.run(store.job_get, parse_job_id(job_id))
    if job is None:
        raise no_such_job(job_id)
    return job_view(job)


def list_query(args: Any) -> tuple[str | None, str | None, int, tuple[datetime, uuid.UUID] | None]:
    """(status, type, page size, cursor position) of ``GET /jobs``, or a 422 or 400."""
    status = args.get("status")
    if status is not None and status not in {s.value for s in Status}:
        raise invalid(
            [FieldError("status", f"must be one of: {', '.join(s.value for s in Status)}")]
        )
    job_type = query_type(args.get("type"))
    raw_limit = args.get("limit", str(DEFAULT_LIST_LIMIT))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
        raise invalid([FieldError("limit", f"must be an integer from 1 to {MAX_LIST_LIMIT}")])
    after = decode_cursor(args["cursor"]) if "cursor" in args else None
    return status, job_type, int(raw_limit), after


async def list_jobs(ctx: ApiContext) -> dict[str, Any]:
    """``GET /jobs``: newest first, a page at a time."""
    status, job_type, limit, after = list_query(request.args)
    rows = await ctx.db.run(
        lambda conn: store.job_list(
            conn, status=status, job_type=job_type, after=after, limit=limit + 1
        )
    )
    page = rows[:limit]
    return {
        "jobs": [job_view(r) for r in page],
        "next_cursor": encode_cursor(page[-1]) if len(rows) > limit else None,
    }


async def job_types(ctx: ApiContext) -> dict[str, Any]:
    """``GET /job-types``: the loaded app's types, their payload schemas and policy."""
    settings = ctx.settings
    return {
        "app": ctx.jobs_app.name,
        "job_types": [
            {
                "name": t.name,
                "description": t.description,
                "payload_schema": t.payload_schema(),
                "max_attempts": t.max_attempts or settings.default_max_attempts,
                "timeout_seconds": t.timeout_seconds or settings.default_timeout_seconds,
                "backoff": list(t.backoff or (settings.retry_base, settings.retry_cap)),
            }
            for t in ctx.jobs_app
        ],
    }


# ---------------------------------------------------------------- operations


async def cancel(ctx: ApiContext, job_id: str) -> tuple[dict[str, Any], int]:
    """``POST /jobs/{job_id}/cancel``: 200 cancelled now; 202 the running worker was asked
    to stop."""
    result = await ctx.db.run(operations.cancel, parse_job_id(job_id), caller())
    if result.outcome == store.CancelOutcome.MISSING:
        raise no_such_job(job_id)
    if result.outcome == store.CancelOutcome.FINISHED:
        raise Problem(
            409,
            "job-finished",
            "Job already finished",
            f"job {job_id} is {result.job.status}; a finished job cannot be cancelled",
        )
    return job_view(result.job), (200 if result.outcome == store.CancelOutcome.CANCELLED else 202)


async def retry(ctx: ApiContext, job_id: str) -> tuple[dict[str, Any], int]:
    """``POST /jobs/{job_id}/retry``."""
    jid, who, topic = parse_job_id(job_id), caller(), ctx.settings.topic_ready
    result = await ctx.db.run(lambda conn: operations.retry(conn, jid, who, topic=topic))
    if result.outcome == store.RetryOutcome.MISSING:
        raise no_such_job(job_id)
    if result.outcome == store.RetryOutcome.NOT_RETRYABLE:
        raise Problem(
            409,
            "job-not-retryable",
            "Job cannot be retried",
            f"job {job_id} is {result.job.status}; only "
            f"{' or '.join(sorted(RETRYABLE))} jobs can be retried",
        )
    if result.outcome == store.RetryOutcome.DUPLICATE:
        raise Problem(
            409,
            "unique-key-held",
            "Another job holds this job's unique key",
            f"job {job_id} would be a duplicate of job {result.holder}, which holds its unique "
            "key; retry it once that job has left the key's states",
            holder=str(result.holder),
        )
    return job_view(result.job), 200


def bulk_retry_body(body: Any) -> operations.BulkRetry:
    """The bulk retry a ``POST /jobs/retry`` body asks for
    (:data:`leasework.operations.API_BODY`), or a 422 naming each field (pure)."""
    parsed = operations.parse_job_filter(body, operations.API_BODY)
    if parsed.errors:
        raise invalid(list(parsed.errors))
    return operations.bulk_retry(parsed.job_filter, parsed.limit)


async def retry_matching(ctx: ApiContext) -> tuple[dict[str, int], int]:
    """``POST /jobs/retry``: dead (or cancelled) jobs by filter."""
    bulk = await json_body(ctx.limits.small, bulk_retry_body)
    who, topic = caller(), ctx.settings.topic_ready

    def retry_them(conn: psycopg.Connection) -> operations.BulkRetryResult:
        return operations.retry_matching(conn, bulk, who, topic=topic)

    result = await ctx.db.run(retry_them)
    return {"retried": result.retried}, 200
