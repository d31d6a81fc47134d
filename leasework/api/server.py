"""The HTTP API (Quart-trio on Hypercorn's Trio worker).

``POST /jobs`` and ``POST /jobs/batch`` check each job against the loaded app (its type, its
payload model) and the store's limits, then write the jobs and, for those due now, their
outbox rows in one transaction, and answer 202. A delayed job is stored ``scheduled`` and gets
its outbox row from the promoter. Every error is ``application/problem+json`` and says what
to do; only a store that really cannot be reached is a 503.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import logging
import uuid
from datetime import datetime
from typing import Any

import psycopg
from quart import request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from leasework import metrics, operations, store
from leasework.api.auth import Authenticator, RateLimiter, Routes
from leasework.api.bodies import body_too_large, invalid, json_body, off_loop, parse_body
from leasework.api.console import add_console_routes
from leasework.api.groupcommit import GroupCommit
from leasework.api.guard import ClientGone, Guard
from leasework.api.limits import MAX_BATCH_STRUCTURE, BodyLimits
from leasework.api.openapi import openapi_document
from leasework.api.operators import actor, add_operator_routes
from leasework.api.problems import Problem
from leasework.app import TYPE_NAME_PATTERN, App
from leasework.config import Settings
from leasework.db import Database
from leasework.errors import FieldError
from leasework.health import Health
from leasework.job import Job
from leasework.jsonlimits import compact
from leasework.service import add_ops_routes
from leasework.states import RETRYABLE, Status
from leasework.submission import MAX_KEY_CHARS, Defaults, JobRequest, insert_row
from leasework.validation import batch_requests, job_request

log = logging.getLogger("leasework.api.server")

PROBLEM = "application/problem+json"

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
)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def job_view(job: Job) -> dict[str, Any]:
    view: dict[str, Any] = {k: getattr(job, k) for k in JOB_FIELDS}
    view["status"] = str(job.status)
    view["id"] = str(job.id)
    for key in ("run_at", "created_at", "updated_at", "started_at", "finished_at"):
        view[key] = _iso(getattr(job, key))
    return view


def accepted_view(job: JobRequest, inserted: store.Inserted) -> dict[str, Any]:
    """The answer to a submit: the job as accepted (a replay: the earlier job, now)."""
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
    }


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


def conflict(key: str | None, job_id: uuid.UUID, index: int | None = None) -> Problem:
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


def query_type(raw: str | None) -> str | None:
    if raw is not None and not TYPE_NAME_PATTERN.match(raw):
        raise invalid([FieldError("type", "must be 1-100 letters, digits and _ . : -")])
    return raw


def retry_filter(body: Any) -> operations.BulkRetry:
    """The bulk retry a ``POST /jobs/retry`` body asks for
    (:data:`leasework.operations.API_BODY`), or a 422 naming each field (pure)."""
    parsed = operations.parse_job_filter(body, operations.API_BODY)
    if parsed.errors:
        raise invalid(list(parsed.errors))
    return operations.bulk_retry(parsed.job_filter, parsed.limit)


def problem_of(exc: Exception, path: str) -> tuple[Problem, dict[str, str]]:
    """The problem document (and extra headers) an exception of a request answers with."""
    if isinstance(exc, Problem):
        return exc, {}
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        log.warning("database unavailable", extra={"error": str(exc)[:300]})
        problem = Problem(
            503,
            "database-unavailable",
            "Database unavailable",
            "the job store cannot be reached right now; nothing was written. Retry with the "
            "same Idempotency-Key to make the retry safe.",
        )
        return problem, {"Retry-After": "2"}
    if isinstance(exc, psycopg.DataError):
        # the checks before every write should make this unreachable; if one was missed, it
        # is still the client's input, not an outage, and retrying it cannot help
        log.error("store refused a value the checks let through", extra={"error": str(exc)[:300]})
        problem = Problem(
            422,
            "value-refused",
            "Value refused by the job store",
            f"the job store cannot keep a value of this request ({exc.diag.message_primary}); "
            "nothing was written. Change the request; retrying it as is will fail again.",
        )
        return problem, {}
    log.error("unhandled error", extra={"path": path}, exc_info=exc)
    problem = Problem(
        500,
        "internal-error",
        "Internal error",
        "leasework failed on this request (a bug, logged with its traceback); nothing of it "
        "is known to be written unless GET says so. Please report it.",
    )
    return problem, {}


def create_app(
    settings: Settings,
    db: Database,
    health: Health,
    jobs_app: App,
    group: GroupCommit,
    *,
    auth: Authenticator,
    limiter: RateLimiter | None = None,
) -> Guard:
    """The api as an ASGI app: the guard (tokens, scopes, rate limits, 405s) in front of
    ``POST /jobs`` on a fast path of its own and the rest a Quart app. Single submits go
    through ``group``; the caller starts ``group.run``, ``auth.run`` and ``limiter.run``."""
    limits = BodyLimits.from_settings(settings)
    # no static folder: the console's stylesheet is the only file served, by its blueprint
    app = QuartTrio("leasework-api", static_folder=None)
    # the guard has capped every body already; Quart's own limits are the second line
    app.config["MAX_CONTENT_LENGTH"] = limits.largest()
    app.config["MAX_FORM_MEMORY_SIZE"] = limits.form
    app.config["MAX_FORM_PARTS"] = 100
    add_ops_routes(
        app,
        health,
        settings.process_name,
        metrics=settings.internal_addr is None,
        detail=False,
    )
    add_console_routes(app, db=db, auth=auth, settings=settings, limiter=limiter)
    add_operator_routes(app, db, limits)
    defaults = Defaults(settings.default_max_attempts, settings.default_timeout_seconds)
    spec = openapi_document(jobs_app)

    @app.errorhandler(Problem)
    async def on_problem(problem: Problem):
        return problem.response(request.path)

    @app.errorhandler(HTTPException)
    async def on_http_error(exc: HTTPException):
        if exc.code == 413:
            problem = body_too_large(limits.for_request(None, request.method, request.path))
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

    @app.errorhandler(Exception)
    async def on_error(exc: Exception):
        problem, headers = problem_of(exc, request.path)
        response = problem.response(request.path)
        response.headers.update(headers)
        return response

    @app.get("/openapi.json")
    async def openapi():
        return spec

    @app.get("/job-types")
    async def job_types():
        return {
            "app": jobs_app.name,
            "job_types": [
                {
                    "name": t.name,
                    "description": t.description,
                    "payload_schema": t.payload_schema(),
                    "max_attempts": t.max_attempts or settings.default_max_attempts,
                    "timeout_seconds": t.timeout_seconds or settings.default_timeout_seconds,
                    "backoff": list(t.backoff or (settings.retry_base, settings.retry_cap)),
                }
                for t in jobs_app
            ],
        }

    async def insert_batch(
        jobs: list[JobRequest], rows: list[dict[str, Any]]
    ) -> list[store.Inserted]:
        def write(conn: psycopg.Connection) -> list[store.Inserted]:
            inserted = store.jobs_insert(conn, rows, settings.topic_ready)
            for index, result in enumerate(inserted):
                if result.conflict:
                    # all or nothing: the transaction rolls back whatever else was inserted
                    raise conflict(jobs[index].idempotency_key, result.id, index)
            return inserted

        inserted = await db.run(write)
        for job, result in zip(jobs, inserted, strict=True):
            if not result.replay:
                metrics.jobs_submitted.labels(metrics.type_label(job.type)).inc()
        return inserted

    def decode_submit(
        content_type: str | None, raw: bytes, key: str | None
    ) -> tuple[JobRequest, dict[str, Any]]:
        """A single submit's body, checked, and its row (pure CPU: off the loop if large)."""
        body = parse_body(content_type, raw, settings.max_body_bytes)
        if key is not None and not 1 <= len(key) <= MAX_KEY_CHARS:
            raise Problem(
                422,
                "invalid-idempotency-key",
                "Invalid Idempotency-Key",
                f"Idempotency-Key must be 1-{MAX_KEY_CHARS} characters",
            )
        parsed = job_request(body, jobs_app, idempotency_key=key)
        if isinstance(parsed, list):
            header = "Idempotency-Key (header)"
            raise invalid(
                [
                    FieldError(header, e.message) if e.field == "idempotency_key" else e
                    for e in parsed
                ]
            )
        return parsed, insert_row(parsed, jobs_app, defaults)

    async def submit(content_type: str | None, raw: bytes, key: str | None):
        """POST /jobs, answered by :class:`SubmitFastPath`: (view, status, headers)."""
        parsed, row = await off_loop(len(raw), decode_submit, content_type, raw, key)
        inserted = await group.insert(row)
        if inserted.conflict:
            raise conflict(parsed.idempotency_key, inserted.id)
        if not inserted.replay:
            metrics.jobs_submitted.labels(metrics.type_label(parsed.type)).inc()
        view = accepted_view(parsed, inserted)
        headers = {"Location": f"/jobs/{view['id']}"}
        if inserted.replay:
            headers["Idempotent-Replayed"] = "true"
        return view, 202, headers

    def decode_batch(
        content_type: str | None, raw: bytes
    ) -> tuple[list[JobRequest], store.EncodedRows]:
        """A batch body, checked, and its rows encoded for the insert (pure CPU: off the loop
        if large). What it returns holds no payload: the decoded body is freed here."""
        body = parse_body(
            content_type, raw, settings.max_batch_bytes, max_values=MAX_BATCH_STRUCTURE
        )
        parsed = batch_requests(body, jobs_app)
        if parsed and isinstance(parsed[0], FieldError):
            raise invalid(parsed, "fix these items and resubmit the whole batch")  # type: ignore[arg-type]
        jobs: list[JobRequest] = parsed  # type: ignore[assignment]
        rows = store.EncodedRows(
            compact([insert_row(job, jobs_app, defaults) for job in jobs]), len(jobs)
        )
        return [dataclasses.replace(job, payload=None) for job in jobs], rows

    @app.post("/jobs/batch")
    async def submit_batch():
        raw = await request.get_data(as_text=False)
        jobs, rows = await off_loop(len(raw), decode_batch, request.content_type, raw)
        inserted = await insert_batch(jobs, rows)
        return {"jobs": [accepted_view(j, i) for j, i in zip(jobs, inserted, strict=True)]}, 202

    @app.get("/jobs/<job_id>")
    async def get_job(job_id: str):
        job = await db.run(store.job_get, parse_job_id(job_id))
        if job is None:
            raise no_such_job(job_id)
        return job_view(job)

    @app.get("/jobs")
    async def list_jobs():
        args = request.args
        status = args.get("status")
        if status is not None and status not in {s.value for s in Status}:
            raise invalid(
                [FieldError("status", f"must be one of: {', '.join(s.value for s in Status)}")]
            )
        job_type = query_type(args.get("type"))
        raw_limit = args.get("limit", str(DEFAULT_LIST_LIMIT))
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
            raise invalid([FieldError("limit", f"must be an integer from 1 to {MAX_LIST_LIMIT}")])
        limit = int(raw_limit)
        after = decode_cursor(args["cursor"]) if "cursor" in args else None
        rows = await db.run(
            lambda conn: store.job_list(
                conn, status=status, job_type=job_type, after=after, limit=limit + 1
            )
        )
        page = rows[:limit]
        return {
            "jobs": [job_view(r) for r in page],
            "next_cursor": encode_cursor(page[-1]) if len(rows) > limit else None,
        }

    @app.post("/jobs/<job_id>/cancel")
    async def cancel(job_id: str):
        who = operations.Actor(actor(), "api")
        result = await db.run(operations.cancel, parse_job_id(job_id), who)
        if result.outcome == store.CancelOutcome.MISSING:
            raise no_such_job(job_id)
        if result.outcome == store.CancelOutcome.FINISHED:
            raise Problem(
                409,
                "job-finished",
                "Job already finished",
                f"job {job_id} is {result.job.status}; a finished job cannot be cancelled",
            )
        view = job_view(result.job)
        # 200: cancelled now; 202: the running worker was asked to stop
        return view, (200 if result.outcome == store.CancelOutcome.CANCELLED else 202)

    @app.post("/jobs/<job_id>/retry")
    async def retry(job_id: str):
        jid, who = parse_job_id(job_id), operations.Actor(actor(), "api")
        result = await db.run(
            lambda conn: operations.retry(conn, jid, who, topic=settings.topic_ready)
        )
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
        return job_view(result.job), 200

    @app.post("/jobs/retry")
    async def retry_many():
        bulk = await json_body(limits.small, retry_filter)
        who = operations.Actor(actor(), "api")
        result = await db.run(
            lambda conn: operations.retry_matching(conn, bulk, who, topic=settings.topic_ready)
        )
        return {"retried": result.retried}, 200

    @app.route("/<path:unknown>", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def not_found(unknown: str):
        raise Problem(
            404, "not-found", "Not found", f"/{unknown} is not an endpoint; see /openapi.json"
        )

    fast = SubmitFastPath(app, submit)
    return Guard(fast, Routes(spec), auth, limiter, limits)


class SubmitFastPath:
    """ASGI: ``POST /jobs`` answered without Quart's request and response machinery (about a
    third of the api's CPU per submit, measured with ``just bench``), everything else by the
    Quart app. The answer is the same document and headers either way."""

    def __init__(self, app: QuartTrio, submit: Any) -> None:
        self.app = app
        self.submit = submit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/jobs" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        content_type = "application/json"
        try:
            raw = await self._body(receive)
            view, status, extra = await self.submit(
                headers.get("content-type"), raw, headers.get("idempotency-key")
            )
        except ClientGone:
            return
        except Exception as exc:  # every refusal and failure answers a problem document
            problem, extra = problem_of(exc, scope["path"])
            view, status, content_type = problem.body(scope["path"]), problem.status, PROBLEM
        body = json.dumps(view).encode()
        response_headers = [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in extra.items()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": response_headers})
        await send({"type": "http.response.body", "body": body})

    async def _body(self, receive: Any) -> bytes:
        """The whole body, in one message: the guard in front has read it under its cap and
        deadline (and ``parse_body`` checks the size once more)."""
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        return message.get("body", b"")
