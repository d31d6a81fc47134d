"""The HTTP API (Quart-trio on Hypercorn's Trio worker).

``POST /jobs`` writes the job and, when it is due now, its outbox row in one transaction and
answers 202; a delayed job is stored ``scheduled`` and gets its outbox row from the promoter.
Every error is ``application/problem+json``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import uuid
from datetime import datetime
from typing import Any

import psycopg
from quart import request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from leasework import handlers, metrics, store
from leasework.config import Settings
from leasework.db import Database
from leasework.health import Health
from leasework.openapi import OPENAPI
from leasework.problems import Problem
from leasework.service import add_ops_routes
from leasework.states import Status
from leasework.validation import request_hash, validate_submission

log = logging.getLogger("leasework.api")

MAX_LIST_LIMIT = 200
DEFAULT_LIST_LIMIT = 50
MAX_IDEMPOTENCY_KEY = 200


def job_view(row: dict[str, Any]) -> dict[str, Any]:
    view = {
        k: row[k]
        for k in (
            "type",
            "payload",
            "status",
            "attempt",
            "max_attempts",
            "timeout_seconds",
            "ordering_key",
            "last_error",
            "cancel_requested",
        )
    }
    view["id"] = str(row["id"])
    for key in ("run_at", "created_at", "updated_at", "started_at", "finished_at"):
        view[key] = row[key].isoformat() if row[key] is not None else None
    return view


def encode_cursor(row: dict[str, Any]) -> str:
    raw = json.dumps([row["created_at"].isoformat(), str(row["id"])]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, job_id = json.loads(raw)
        return datetime.fromisoformat(created_at), uuid.UUID(job_id)
    except (ValueError, TypeError, binascii.Error):
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


def create_app(settings: Settings, db: Database, health: Health) -> QuartTrio:
    app = QuartTrio("leasework-api")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    add_ops_routes(app, health, settings.process_name)

    @app.errorhandler(Problem)
    async def on_problem(problem: Problem):
        return problem.response(request.path)

    @app.errorhandler(HTTPException)
    async def on_http_error(exc: HTTPException):
        if exc.code == 413:
            problem = Problem(
                413,
                "body-too-large",
                "Request body too large",
                f"the body exceeds {settings.max_body_bytes} bytes; send a smaller payload "
                "(store large data elsewhere and pass a reference)",
            )
        elif exc.code == 405:
            problem = Problem(
                405,
                "method-not-allowed",
                "Method not allowed",
                f"{request.method} is not supported on {request.path}; see /openapi.json",
            )
        else:
            problem = Problem(exc.code or 500, "http-error", exc.name, exc.description or exc.name)
        return problem.response(request.path)

    @app.errorhandler(psycopg.Error)
    async def on_database_error(exc: psycopg.Error):
        log.warning("database unavailable", extra={"error": str(exc)[:300]})
        return (
            Problem(
                503,
                "database-unavailable",
                "Database unavailable",
                "the job store cannot be reached right now; nothing was written. Retry with the "
                "same Idempotency-Key to make the retry safe.",
            ).response(request.path),
            503,
            {"Retry-After": "2"},
        )

    @app.get("/openapi.json")
    async def openapi():
        return OPENAPI

    @app.post("/jobs")
    async def submit():
        content_type = (request.mimetype or "").lower()
        if content_type != "application/json":
            raise Problem(
                415,
                "unsupported-media-type",
                "Unsupported media type",
                f"send the job as JSON with Content-Type: application/json (got "
                f"{request.content_type or 'none'})",
            )
        raw = await request.get_data(as_text=False)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise Problem(
                400,
                "malformed-json",
                "Malformed JSON",
                f"the body is not valid JSON: {exc}; nothing was written",
            ) from None
        result = validate_submission(
            body,
            default_max_attempts=settings.default_max_attempts,
            default_timeout=settings.default_timeout_seconds,
        )
        if isinstance(result, list):
            names = ", ".join(e.field for e in result)
            raise Problem(
                422,
                "invalid-fields",
                "Invalid fields",
                f"fix these fields and resubmit: {names}",
                errors=[e.as_dict() for e in result],
            )
        key = request.headers.get("Idempotency-Key")
        if key is not None and not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY:
            raise Problem(
                422,
                "invalid-idempotency-key",
                "Invalid Idempotency-Key",
                f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY} characters",
            )
        new = store.NewJob(
            type=result.type,
            payload=result.payload,
            run_at=result.run_at,
            max_attempts=result.max_attempts,
            timeout_seconds=result.timeout_seconds,
            ordering_key=result.ordering_key,
            idempotency_key=key,
            request_hash=request_hash(body) if key is not None else None,
        )
        inserted = await db.run(store.job_insert, new, settings.topic_ready)
        if inserted.conflict:
            raise Problem(
                409,
                "idempotency-key-reused",
                "Idempotency-Key reused with a different body",
                "this Idempotency-Key was used for a different request; use a new key for a "
                "new job, or resend the original body to get the original job",
                job_id=str(inserted.job["id"]),
            )
        view = job_view(inserted.job)
        view["replay"] = inserted.replay
        if not inserted.replay:
            metrics.jobs_submitted.labels(handlers.metric_type(result.type)).inc()
        headers = {"Location": f"/jobs/{view['id']}"}
        if inserted.replay:
            headers["Idempotent-Replayed"] = "true"
        return view, 202, headers

    @app.get("/jobs/<job_id>")
    async def get_job(job_id: str):
        row = await db.run(store.job_get, parse_job_id(job_id))
        if row is None:
            raise Problem(404, "job-not-found", "Job not found", f"no job has id {job_id}")
        return job_view(row)

    @app.get("/jobs")
    async def list_jobs():
        args = request.args
        status = args.get("status")
        if status is not None and status not in {s.value for s in Status}:
            raise Problem(
                422,
                "invalid-fields",
                "Invalid fields",
                f"status must be one of: {', '.join(s.value for s in Status)}",
                errors=[{"field": "status", "message": f"unknown status {status!r}"}],
            )
        raw_limit = args.get("limit", str(DEFAULT_LIST_LIMIT))
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
            raise Problem(
                422,
                "invalid-fields",
                "Invalid fields",
                f"limit must be an integer from 1 to {MAX_LIST_LIMIT}",
                errors=[{"field": "limit", "message": f"got {raw_limit!r}"}],
            )
        limit = int(raw_limit)
        after = decode_cursor(args["cursor"]) if args.get("cursor") else None
        rows = await db.run(
            lambda conn: store.job_list(
                conn, status=status, job_type=args.get("type"), after=after, limit=limit + 1
            )
        )
        page = rows[:limit]
        return {
            "jobs": [job_view(r) for r in page],
            "next_cursor": encode_cursor(page[-1]) if len(rows) > limit else None,
        }

    @app.post("/jobs/<job_id>/cancel")
    async def cancel(job_id: str):
        result = await db.run(store.job_cancel, parse_job_id(job_id))
        if result.outcome == "missing":
            raise Problem(404, "job-not-found", "Job not found", f"no job has id {job_id}")
        if result.outcome == "finished":
            raise Problem(
                409,
                "job-finished",
                "Job already finished",
                f"job {job_id} is {result.job['status']}; a finished job cannot be cancelled",
            )
        view = job_view(result.job)
        # 200: cancelled now; 202: the running worker was asked to stop
        return view, (200 if result.outcome == "cancelled" else 202)

    @app.route("/<path:unknown>", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def not_found(unknown: str):
        raise Problem(
            404, "not-found", "Not found", f"/{unknown} is not an endpoint; see /openapi.json"
        )

    return app
