"""The api's submit endpoints: ``POST /jobs`` (one job, through the group commit, on the ASGI
fast path) and ``POST /jobs/batch`` (up to a thousand, all or nothing).

Each job is checked against the loaded app (its type, its payload model) and the store's
limits, then written with, when it is due now, its outbox row in one transaction, and
answered 202. A delayed job is stored ``scheduled`` and gets its outbox row from the promoter.
A job whose unique key another job holds is not written: the answer is 200 with the holder
and ``"duplicate": true`` (a batch marks the item; the others are written).
A large body is decoded and checked off the event loop (:func:`leasework.api.bodies.off_loop`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import psycopg
from quart import request

from leasework import metrics, store
from leasework.api.bodies import invalid, off_loop, parse_body
from leasework.api.context import ApiContext
from leasework.api.known_queues import queue_of
from leasework.api.problems import Problem
from leasework.api.validation import batch_requests, job_request
from leasework.errors import FieldError
from leasework.jsonlimits import MAX_BATCH_STRUCTURE, compact
from leasework.submission import MAX_KEY_CHARS, JobRequest, insert_row


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def accepted_view(job: JobRequest, inserted: store.Inserted) -> dict[str, Any]:
    """The answer to a submit: the job as accepted (a replay: the earlier job, now; a
    duplicate: the job that holds the unique key, now)."""
    return {
        "id": str(inserted.id),
        "type": job.type,
        "status": str(inserted.status),
        "run_at": _iso(inserted.run_at),
        "created_at": _iso(inserted.created_at),
        "max_attempts": inserted.max_attempts,
        "timeout_seconds": inserted.timeout_seconds,
        "ordering_key": job.ordering_key,
        "replay": inserted.replay,
        "duplicate": inserted.duplicate,
    }


def conflict(key: str | None, job_id: Any, index: int | None = None) -> Problem:
    where = f"jobs[{index}]: " if index is not None else ""
    return Problem(
        409,
        "idempotency-key-reused",
        "Idempotency-Key reused with a different body",
        f"{where}the idempotency key {key!r} was used for a different request; use a new key "
        "for a new job, or resend the original body to get the original job; nothing was "
        "written",
        job_id=str(job_id),
        **({"index": index} if index is not None else {}),
    )


def decode_submit(
    ctx: ApiContext, content_type: str | None, raw: bytes, key: str | None
) -> tuple[JobRequest, dict[str, Any]]:
    """A single submit's body, checked, and its row (pure CPU: off the loop if large)."""
    body = parse_body(content_type, raw, ctx.settings.max_body_bytes)
    if key is not None and not 1 <= len(key) <= MAX_KEY_CHARS:
        raise Problem(
            422,
            "invalid-idempotency-key",
            "Invalid Idempotency-Key",
            f"Idempotency-Key must be 1-{MAX_KEY_CHARS} characters",
        )
    parsed = job_request(body, ctx.jobs_app, idempotency_key=key)
    if isinstance(parsed, list):
        header = "Idempotency-Key (header)"
        raise invalid(
            [FieldError(header, e.message) if e.field == "idempotency_key" else e for e in parsed]
        )
    return parsed, insert_row(parsed, ctx.jobs_app, ctx.defaults)


async def submit(
    ctx: ApiContext, headers: Mapping[str, str], raw: bytes
) -> tuple[dict[str, Any], int, dict[str, str]]:
    """``POST /jobs`` (on the fast path): one job, inserted in the next group commit."""
    key = headers.get("idempotency-key")
    parsed, row = await off_loop(
        len(raw), decode_submit, ctx, headers.get("content-type"), raw, key
    )
    await ctx.queues.check(ctx.db, [queue_of(parsed, ctx.jobs_app)])
    inserted = await ctx.group.insert(row)
    if inserted.conflict:
        raise conflict(parsed.idempotency_key, inserted.id)
    if not (inserted.replay or inserted.duplicate):
        metrics.jobs_submitted.labels(metrics.type_label(parsed.type)).inc()
    view = accepted_view(parsed, inserted)
    answer_headers = {"Location": f"/jobs/{view['id']}"}
    if inserted.replay:
        answer_headers["Idempotent-Replayed"] = "true"
    # a duplicate accepted nothing new: 200 with the job that holds the key, not 202
    return view, 200 if inserted.duplicate else 202, answer_headers


def decode_batch(
    ctx: ApiContext, content_type: str | None, raw: bytes
) -> tuple[list[JobRequest], store.EncodedRows]:
    """A batch body, checked, and its rows encoded for the insert (pure CPU: off the loop if
    large). What it returns holds no payload: the decoded body is freed here."""
    body = parse_body(
        content_type, raw, ctx.settings.max_batch_bytes, max_values=MAX_BATCH_STRUCTURE
    )
    parsed = batch_requests(body, ctx.jobs_app)
    if parsed and isinstance(parsed[0], FieldError):
        raise invalid(parsed, "fix these items and resubmit the whole batch")  # type: ignore[arg-type]
    jobs: list[JobRequest] = parsed  # type: ignore[assignment]
    rows = store.EncodedRows(
        compact([insert_row(job, ctx.jobs_app, ctx.defaults) for job in jobs]), len(jobs)
    )
    return [dataclasses.replace(job, payload=None) for job in jobs], rows


async def insert_batch(
    ctx: ApiContext, jobs: list[JobRequest], rows: store.EncodedRows
) -> list[store.Inserted]:
    """Every job of a batch in one transaction, or none: a conflicting idempotency key rolls
    it back; a duplicate (a unique key another job holds) is that item's answer alone."""

    await ctx.queues.check(ctx.db, {queue_of(j, ctx.jobs_app) for j in jobs}, batch=True)

    def write(conn: psycopg.Connection) -> list[store.Inserted]:
        inserted = store.jobs_insert(conn, rows, ctx.settings.topic_ready)
        for index, result in enumerate(inserted):
            if result.conflict:
                raise conflict(jobs[index].idempotency_key, result.id, index)
        return inserted

    inserted = await ctx.db.run(write)
    for job, result in zip(jobs, inserted, strict=True):
        if not (result.replay or result.duplicate):
            metrics.jobs_submitted.labels(metrics.type_label(job.type)).inc()
    return inserted


async def submit_batch(ctx: ApiContext) -> tuple[dict[str, Any], int]:
    """``POST /jobs/batch``."""
    raw = await request.get_data(as_text=False)
    jobs, rows = await off_loop(len(raw), decode_batch, ctx, request.content_type, raw)
    inserted = await insert_batch(ctx, jobs, rows)
    # 202 for the batch whatever its items were (as for replays): each item says duplicate
    return {"jobs": [accepted_view(j, i) for j, i in zip(jobs, inserted, strict=True)]}, 202
