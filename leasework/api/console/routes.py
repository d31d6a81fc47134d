"""The operator console under ``/ui``: server-rendered pages (Jinja, autoescaped) and one CSS
file, no script. The api's guard lets ``/ui`` through untouched, so every request here is
checked by :meth:`Console.authenticate` first: a signed session cookie whose token is still
live, the ``read`` scope to see anything, and on every POST the session's CSRF token and a
same-site ``Origin``. Actions (cancel, retry, bulk retry, and the changes to recurring
schedules of :mod:`.schedules`) need the ``cancel`` scope, go through a confirmation page, and
write their audit row in the same transaction as their effect."""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import time
import types
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
from quart import Blueprint, Response, g, redirect, render_template, request, url_for
from quart_trio import QuartTrio
from werkzeug.datastructures import MultiDict

from leasework import audit, operations, store
from leasework.api.auth import Authenticator, RateLimiter
from leasework.api.console import filters, prometheus
from leasework.api.console import queues as queue_pages
from leasework.api.console import schedules as schedule_pages
from leasework.api.console.charts import line_chart
from leasework.api.console.errors import ConsoleError
from leasework.api.console.session import (
    COOKIE,
    COOKIE_PATH,
    CSRF_FIELD,
    LOGIN_COOKIE,
    LOGIN_MAX_AGE,
    SECRET_NAME,
    Session,
    SessionCodec,
    cookie_options,
    csrf_ok,
    safe_next,
    same_origin,
)
from leasework.api.guard import rate_limited
from leasework.api.routes import scope_of
from leasework.api.routing import Route, quart_rule
from leasework.config import Settings
from leasework.db import Database
from leasework.health import Health
from leasework.states import RETRYABLE, TERMINAL, Status
from leasework.store import audit as store_audit
from leasework.store import console as queries
from leasework.store import operators
from leasework.store.jobs import TIME_FIELDS
from leasework.unique import key_view

log = logging.getLogger("leasework.api.console")

VIEW_SCOPE = "read"  # the least a session needs (CONSOLE_ROUTES has each page's)
ACTION_SCOPE = scope_of("POST", "/jobs/{job_id}/cancel")  # cancel, retry and bulk retry
# what a job's page shows of the audit log (its operator actions) needs the audit's scope
JOB_AUDIT_SCOPE = scope_of("GET", "/audit")
SHOWN_BYTES = 65_536  # of a payload or result on the job's page
RUNNING_SHOWN = 2_000  # running jobs on the workers page
WORKER_STALE = 15.0  # seconds without a heartbeat before a worker is shown as stale

SECURITY_HEADERS = {
    # no script at all, styles only from this origin, forms only to this origin
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # same-origin, not no-referrer: under no-referrer Chromium posts forms with "Origin: null"
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

# what a redirect after an action says, by code (the query string carries the code only)
NOTICES = {
    "cancelled": "Cancelled.",
    "requested": "Cancel requested: the worker running it stops it at its next heartbeat.",
    "finished": "Not cancelled: the job had already finished.",
    "retried": "Retried: queued again with a fresh attempt budget.",
    "not-retryable": "Not retried: only dead or cancelled jobs can be retried.",
    "duplicate": "Not retried: another job holds its unique key (retry once that job ends).",
    "logged-out": "Logged out.",
}


def no_such_job(jid: uuid.UUID) -> ConsoleError:
    return ConsoleError(404, "No such job", f"No job has id {jid} (or it was pruned).")


def _job_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise ConsoleError(404, "No such job", f"{raw!r} is not a job id") from None


def _pretty(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    if len(text) > SHOWN_BYTES:
        return text[:SHOWN_BYTES] + f"\n… ({len(text) - SHOWN_BYTES} more characters not shown)"
    return text


def _when(value: datetime | None) -> str:
    return "—" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _ago(value: datetime | None) -> str:
    if value is None:
        return "—"
    seconds = (datetime.now(UTC) - value).total_seconds()
    return _seconds(abs(seconds)) + (" ago" if seconds >= 0 else " from now")


def _seconds(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _duration(start: datetime | None, end: datetime | None) -> str:
    return "—" if start is None or end is None else _seconds((end - start).total_seconds())


def _percent(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value * 100:.{digits}f}%"


class Console:
    def __init__(
        self,
        db: Database,
        auth: Authenticator,
        settings: Settings,
        limiter: RateLimiter | None = None,
        health: Health | None = None,
    ) -> None:
        self.db = db
        self.auth = auth
        self.settings = settings
        self.limiter = limiter
        self.health = health  # the overview shows the start-up checks it overrode
        self._codec: SessionCodec | None = None

    async def codec(self) -> SessionCodec:
        """The signer, keyed by the deployment's shared secret (read once)."""
        if self._codec is None:
            self._codec = SessionCodec(await self.db.run(operators.secret, SECRET_NAME))
        return self._codec

    # ------------------------------------------------------------ the gate

    async def authenticate(self) -> Response | None:
        """Before every console request but the login page and the stylesheet: a live
        session whose token has the endpoint's scope (:func:`console_scope`, the same as its
        API twin's), within the token's rate limit."""
        endpoint = (request.endpoint or "console.not_found").removeprefix("console.")
        needs = console_scope(endpoint)
        if needs is None:
            return None
        codec = await self.codec()
        session = codec.loads(request.cookies.get(COOKIE))
        if session is None or not self.auth.is_live(session.token_id):
            if request.method == "GET":
                response = redirect(url_for("console.login", next=request.full_path.rstrip("?")))
                response.delete_cookie(COOKIE, path=COOKIE_PATH)
                return response
            raise ConsoleError(403, "Not logged in", "Your session ended; log in again.")
        g.session = session
        if not session.allows(needs):
            have = ", ".join(sorted(session.scopes))
            raise ConsoleError(
                403,
                "Forbidden",
                f"Token {session.name!r} has scopes {have}; this page needs {needs!r} "
                "(or admin), as its API operation does.",
            )
        principal = self.auth.live_principal(session.token_id)
        if principal is not None and self.limiter is not None:
            refused = await rate_limited(self.limiter, principal)
            if refused is not None:
                problem, headers = refused
                raise ConsoleError(429, "Too many requests", problem.detail, headers)
        if request.method == "POST":
            form = await request.form
            if not same_origin(request.headers.get("Origin"), request.host):
                raise ConsoleError(403, "Forbidden", "This form was posted from another site.")
            if not csrf_ok(session, form.get(CSRF_FIELD)):
                raise ConsoleError(
                    403,
                    "Forbidden",
                    "The form's CSRF token is missing or wrong (a form from an older session, "
                    "or not from this console). Reload the page and try again.",
                )
        return None

    # ------------------------------------------------------------ rendering

    async def page(self, template: str, status: int = 200, **context: Any) -> Response:
        session: Session | None = g.get("session")
        body = await render_template(
            f"console/{template}",
            session=session,
            csrf_field=CSRF_FIELD,
            can_act=session is not None and session.allows(ACTION_SCOPE),
            can_see=lambda endpoint: (
                session is not None and session.allows(console_scope(endpoint) or VIEW_SCOPE)
            ),
            **context,
        )
        return Response(body, status=status, content_type="text/html; charset=utf-8")

    @staticmethod
    def helpers() -> dict[str, Callable[..., Any]]:
        return {
            "when": _when,
            "ago": _ago,
            "seconds": _seconds,
            "duration": _duration,
            "percent": _percent,
            "pretty": _pretty,
            "zoned": schedule_pages.zoned,
        }

    # ------------------------------------------------------------ login, logout

    async def login(self) -> Response:
        codec = await self.codec()
        if request.method == "GET":
            return await self.login_page(codec, safe_next(request.args.get("next")))
        form = await request.form
        target = safe_next(form.get("next"))
        if not same_origin(request.headers.get("Origin"), request.host):
            raise ConsoleError(403, "Forbidden", "This form was posted from another site.")
        if not codec.login_ok(request.cookies.get(LOGIN_COOKIE), form.get("nonce")):
            return await self.login_page(
                codec, target, "The login form expired; enter the token again.", 400
            )
        principal = await self.auth.principal((form.get("token") or "").strip()[:200])
        if principal is None:
            return await self.login_page(
                codec, target, "Not a valid token (unknown, malformed or revoked).", 401
            )
        if not principal.allows(VIEW_SCOPE):
            return await self.login_page(
                codec, target, f"Token {principal.name!r} lacks scope 'read'.", 403
            )
        session = Session.start(principal)
        await self.db.run(
            operators.audit_add, session.name, "console-login", None, {"via": "console"}
        )
        response = redirect(target, 303)
        response.set_cookie(COOKIE, codec.dumps(session), **cookie_options(secure=self.secure()))
        response.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
        return response

    async def login_page(
        self, codec: SessionCodec, target: str, error: str | None = None, status: int = 200
    ) -> Response:
        nonce, cookie = codec.login_nonce()
        response = await self.page("login.html", status, nonce=nonce, next=target, error=error)
        options = cookie_options(secure=self.secure(), max_age=LOGIN_MAX_AGE)
        response.set_cookie(LOGIN_COOKIE, cookie, **options)
        return response

    def secure(self) -> bool:
        """Whether the browser reached us over TLS: directly, or through a proxy the
        operator declared trusted (``LEASEWORK_TRUSTED_PROXIES``) that says so."""
        client = request.scope.get("client")
        return served_over_tls(
            request.scheme,
            client[0] if client else None,
            request.headers.get("X-Forwarded-Proto"),
            self.settings.trusted_proxies,
        )

    async def logout(self) -> Response:
        session: Session = g.session
        await self.db.run(
            operators.audit_add, session.name, "console-logout", None, {"via": "console"}
        )
        response = redirect(url_for("console.login"), 303)
        response.delete_cookie(COOKIE, path=COOKIE_PATH)
        return response

    # ------------------------------------------------------------ pages

    async def overview(self) -> Response:
        now = time.time()
        async with httpx.AsyncClient() as client:
            metrics = await prometheus.overview(client, self.settings.prometheus_url, now)

        def read(conn: psycopg.Connection) -> tuple[Any, ...]:
            return (
                queries.job_counts(conn),
                store.outbox_pending(conn),
                operators.workers_list(conn, seen_within=WORKER_STALE),
                operators.alerts_list(conn, limit=5),
            )

        counts, (backlog, backlog_age), workers, notifications = await self.db.run(read)
        totals = {s.value: sum(c.by_status.get(s.value, 0) for c in counts) for s in Status}
        start = now - prometheus.WINDOW
        return await self.page(
            "overview.html",
            nav="overview",
            metrics=metrics,
            statuses=[s.value for s in Status],
            counts=counts,
            totals=totals,
            backlog=backlog,
            backlog_age=backlog_age,
            workers=workers,
            notifications=notifications,
            throughput=line_chart(metrics.throughput, start=start, end=now),
            delay=line_chart(metrics.delay, start=start, end=now, threshold=prometheus.SLO_SECONDS),
            slo_seconds=prometheus.SLO_SECONDS,
            slo_target=prometheus.SLO_TARGET,
            overridden=self.health.overridden if self.health is not None else [],
        )

    async def jobs(self) -> Response:
        job_filter, errors = filters.parse_job_filter(request.args)
        try:
            before = filters.parse_cursor(request.args)
        except ValueError as exc:
            errors.append(f"page: {exc}; start again from the first page")
            before = None
        limit = filters.PAGE_SIZE

        def read(conn: psycopg.Connection) -> tuple[Any, ...]:
            page = queries.jobs_page(conn, job_filter, before=before, limit=limit + 1)
            return page, queries.job_type_names(conn)

        rows, types = await self.db.run(read)
        page = rows[:limit]
        query = operations.filter_fields(job_filter)
        next_query = (
            {**query, **filters.cursor_query(page[-1].created_at, page[-1].id)}
            if len(rows) > limit
            else None
        )
        now = datetime.now(UTC)
        windows = [
            (label, {**query, "time_field": job_filter.time_field,
                     "since": (now - length).isoformat(), "until": ""})
            for label, length in filters.WINDOWS
        ]  # fmt: skip
        retried = request.args.get("retried", "")
        return await self.page(
            "jobs.html",
            status=400 if errors else 200,
            nav="jobs",
            jobs=page,
            errors=errors,
            job_filter=job_filter,
            query=query,
            next_query=next_query,
            first_page=bool(before),
            types=types,
            statuses=[s.value for s in Status],
            time_fields=TIME_FIELDS,
            format_time=filters.format_time,
            windows=windows,
            bulk_refusal=operations.bulk_retry_refusal(job_filter),
            retried=int(retried) if retried.isdigit() else None,
        )

    async def job(self, job_id: str) -> Response:
        jid = _job_id(job_id)

        def read(conn: psycopg.Connection) -> tuple[Any, ...]:
            return (
                store.job_get(conn, jid),
                queries.attempts_of(conn, jid),
                queries.fence_rejections_of(conn, jid),
                operators.audit_list(conn, target=str(jid), limit=100),
            )

        job, attempts, rejections, audit = await self.db.run(read)
        if job is None:
            raise no_such_job(jid)
        audit_shown = g.session.allows(JOB_AUDIT_SCOPE)
        return await self.page(
            "job.html",
            nav="jobs",
            job=job,
            attempts=attempts,
            rejections=rejections,
            audit=audit if audit_shown else [],
            audit_shown=audit_shown,
            cancellable=job.status not in TERMINAL,
            retryable=job.status in RETRYABLE,
            unique=key_view(job.unique_key, job.unique_states, job.status),
            notice=NOTICES.get(request.args.get("notice", "")),
        )

    async def workers(self) -> Response:
        def read(conn: psycopg.Connection) -> tuple[Any, ...]:
            return (
                operators.workers_list(conn),
                queries.jobs_running(conn, limit=RUNNING_SHOWN + 1),
            )

        workers, running = await self.db.run(read)
        by_worker: dict[str | None, list[queries.RunningJob]] = {}
        for job in running[:RUNNING_SHOWN]:
            by_worker.setdefault(job.worker, []).append(job)
        known = {w.name for w in workers}
        now = datetime.now(UTC)
        return await self.page(
            "workers.html",
            nav="workers",
            workers=workers,
            by_worker=by_worker,
            orphans={k: v for k, v in by_worker.items() if k not in known},
            stale={w.name for w in workers if (now - w.last_seen).total_seconds() > WORKER_STALE},
            truncated=len(running) > RUNNING_SHOWN,
            running_shown=RUNNING_SHOWN,
            stale_after=WORKER_STALE,
        )

    async def audit(self) -> Response:
        target = (request.args.get("target") or "").strip()[:200] or None
        entries = await self.db.run(
            lambda conn: operators.audit_list(conn, target=target, limit=200)
        )
        return await self.page("audit.html", nav="audit", entries=entries, target=target)

    async def invariants(self) -> Response:
        """What the auditor checked, up to when, and every violation it found, with its job."""

        def read(conn: psycopg.Connection) -> dict[str, Any]:
            return {
                "state": store_audit.audit_state(conn),
                "counts": store_audit.violation_counts(conn),
                "violations": store_audit.violations_recent(conn, limit=200),
            }

        return await self.page(
            "invariants.html", nav="invariants", meaning=audit.MEANING, **await self.db.run(read)
        )

    async def alerts(self) -> Response:
        rows = await self.db.run(lambda conn: operators.alerts_list(conn, limit=200))
        return await self.page("alerts.html", nav="alerts", notifications=rows)

    # ------------------------------------------------------------ actions

    async def cancel(self, job_id: str) -> Response:
        return await self.act_on_job(job_id, "cancel", operations.cancel)

    async def retry(self, job_id: str) -> Response:
        topic = self.settings.topic_ready
        return await self.act_on_job(
            job_id, "retry", functools.partial(operations.retry, topic=topic)
        )

    async def act_on_job(
        self,
        job_id: str,
        action: str,
        operation: Callable[
            [psycopg.Connection, uuid.UUID, operations.Actor],
            store.CancelResult | store.RetryResult,
        ],
    ) -> Response:
        """GET: the confirmation page; POST: the operation (its audit row in its
        transaction), then the job's page with a notice of the outcome."""
        session: Session = g.session
        jid = _job_id(job_id)
        if request.method == "GET":
            return await self.confirm_one(jid, action)
        result = await self.db.run(operation, jid, operations.Actor(session.name, "console"))
        if result.job is None:  # the outcome is MISSING
            raise no_such_job(jid)
        return redirect(url_for("console.job", job_id=jid, notice=str(result.outcome)), 303)

    async def confirm_one(self, jid: uuid.UUID, action: str) -> Response:
        job = await self.db.run(store.job_get, jid)
        if job is None:
            raise no_such_job(jid)
        return await self.page(
            "confirm.html",
            nav="jobs",
            action=action,
            job=job,
            post_to=url_for(f"console.{action}", job_id=jid),
            back=url_for("console.job", job_id=jid),
        )

    async def retry_many(self) -> Response:
        session: Session = g.session
        source: MultiDict = request.args if request.method == "GET" else await request.form
        job_filter, errors = filters.parse_job_filter(source)
        refusal = operations.bulk_retry_refusal(job_filter)
        if errors or refusal:
            raise ConsoleError(400, "Cannot retry these", "; ".join(errors or [refusal or ""]))
        bulk = operations.bulk_retry(job_filter)
        query = operations.filter_fields(job_filter)
        if request.method == "GET":
            return await self.confirm_many(bulk, query)
        actor = operations.Actor(session.name, "console")
        topic = self.settings.topic_ready
        result = await self.db.run(
            lambda conn: operations.retry_matching(conn, bulk, actor, topic=topic)
        )
        return redirect(url_for("console.jobs", **query, retried=result.retried), 303)

    async def confirm_many(self, bulk: operations.BulkRetry, query: dict[str, str]) -> Response:
        matching = await self.db.run(
            lambda conn: queries.jobs_count(conn, bulk.jobs, up_to=bulk.limit + 1)
        )
        return await self.page(
            "confirm.html",
            nav="jobs",
            action="retry-many",
            job=None,
            described=operations.describe(bulk.jobs),
            matching=matching,
            limit=bulk.limit,
            hidden=query,
            post_to=url_for("console.retry_many"),
            back=url_for("console.jobs", **query),
        )

    async def not_found(self, rest: str) -> Response:
        raise ConsoleError(404, "Not found", f"/ui/{rest} is not a page of the console.")

    # ------------------------------------------------------------ errors, headers

    async def on_console_error(self, exc: ConsoleError) -> Response:
        response = await self.page("error.html", exc.status, title=exc.title, message=exc.message)
        response.headers.update(exc.headers)
        return response

    async def on_database_error(self, exc: psycopg.Error) -> Response:
        log.warning("console: database unavailable", extra={"error": str(exc)[:300]})
        return await self.page(
            "error.html",
            503,
            title="Database unavailable",
            message="The job store cannot be reached right now; nothing was changed. "
            "Reload in a moment.",
        )

    @staticmethod
    async def harden(response: Response) -> Response:
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    def blueprint(self) -> Blueprint:
        bp = Blueprint(
            "console",
            __name__,
            url_prefix="/ui",
            template_folder="templates",
            static_folder="static",
            static_url_path="/static",
        )
        bp.before_request(self.authenticate)
        bp.after_request(self.harden)
        bp.context_processor(self.helpers)
        bp.register_error_handler(ConsoleError, self.on_console_error)
        bp.register_error_handler(psycopg.OperationalError, self.on_database_error)
        bp.register_error_handler(psycopg.InterfaceError, self.on_database_error)
        for route in CONSOLE_ROUTES:
            view = types.MethodType(route.handler, self)
            rule = quart_rule(route.path)
            bp.add_url_rule(rule, route.name, view, methods=[route.method], strict_slashes=False)
        return bp


def served_over_tls(
    scheme: str, peer: str | None, forwarded_proto: str | None, trusted: tuple[Any, ...]
) -> bool:
    """Whether a request reached us over TLS (pure): its own scheme, or the
    ``X-Forwarded-Proto`` of a peer the operator declared a trusted proxy. Anyone else's
    header is ignored: a client cannot talk the console into a cookie it will not get back."""
    if scheme == "https":
        return True
    if peer is None or (forwarded_proto or "").strip().lower() != "https":
        return False
    try:
        address = ipaddress.ip_address(peer)
    except ValueError:
        return False
    return any(address in network for network in trusted)


def add_console_routes(
    app: QuartTrio,
    *,
    db: Database,
    auth: Authenticator,
    settings: Settings,
    limiter: RateLimiter | None = None,
    health: Health | None = None,
) -> None:
    """Mount the console at ``/ui`` (see the module docstring)."""
    app.register_blueprint(Console(db, auth, settings, limiter, health).blueprint())


# ---------------------------------------------------------------- the route table


def twin(method: str, path: str) -> str | None:
    """The scope of the API operation that shows or changes the same data as a console page
    (its twin), so the two doors cannot drift apart: the audit log is ``admin`` in both."""
    return scope_of(method, path)


# every page and action of the console, under /ui; a handler is a method of Console
CONSOLE_ROUTES: tuple[Route, ...] = (
    # counts by type and status, workers, the latest notifications: no API twin
    Route("GET", "/", Console.overview, VIEW_SCOPE, "overview"),
    Route("GET", "/login", Console.login, None, "login"),
    Route("POST", "/login", Console.login, None, "login"),
    Route("POST", "/logout", Console.logout, VIEW_SCOPE, "logout"),
    Route("GET", "/jobs", Console.jobs, twin("GET", "/jobs"), "jobs"),
    Route("GET", "/jobs/retry", Console.retry_many, twin("POST", "/jobs/retry"), "retry_many"),
    Route("POST", "/jobs/retry", Console.retry_many, twin("POST", "/jobs/retry"), "retry_many"),
    Route("GET", "/jobs/{job_id}", Console.job, twin("GET", "/jobs/{job_id}"), "job"),
    Route("GET", "/jobs/{job_id}/cancel", Console.cancel,
          twin("POST", "/jobs/{job_id}/cancel"), "cancel"),
    Route("POST", "/jobs/{job_id}/cancel", Console.cancel,
          twin("POST", "/jobs/{job_id}/cancel"), "cancel"),
    Route("GET", "/jobs/{job_id}/retry", Console.retry,
          twin("POST", "/jobs/{job_id}/retry"), "retry"),
    Route("POST", "/jobs/{job_id}/retry", Console.retry,
          twin("POST", "/jobs/{job_id}/retry"), "retry"),
    # recurring schedules (leasework/api/console/schedules.py: handlers of a Console)
    Route("GET", "/schedules", schedule_pages.schedules, twin("GET", "/schedules"), "schedules"),
    Route("POST", "/schedules", schedule_pages.schedule_create,
          twin("POST", "/schedules"), "schedule_create"),
    Route("GET", "/schedules/{name}", schedule_pages.schedule,
          twin("GET", "/schedules/{name}"), "schedule"),
    Route("GET", "/schedules/{name}/pause", schedule_pages.schedule_pause,
          twin("POST", "/schedules/{name}/pause"), "schedule_pause"),
    Route("POST", "/schedules/{name}/pause", schedule_pages.schedule_pause,
          twin("POST", "/schedules/{name}/pause"), "schedule_pause"),
    Route("GET", "/schedules/{name}/resume", schedule_pages.schedule_resume,
          twin("POST", "/schedules/{name}/resume"), "schedule_resume"),
    Route("POST", "/schedules/{name}/resume", schedule_pages.schedule_resume,
          twin("POST", "/schedules/{name}/resume"), "schedule_resume"),
    Route("GET", "/schedules/{name}/trigger", schedule_pages.schedule_trigger,
          twin("POST", "/schedules/{name}/trigger"), "schedule_trigger"),
    Route("POST", "/schedules/{name}/trigger", schedule_pages.schedule_trigger,
          twin("POST", "/schedules/{name}/trigger"), "schedule_trigger"),
    Route("GET", "/schedules/{name}/backfill", schedule_pages.schedule_backfill,
          twin("POST", "/schedules/{name}/backfill"), "schedule_backfill"),
    Route("POST", "/schedules/{name}/backfill", schedule_pages.schedule_backfill,
          twin("POST", "/schedules/{name}/backfill"), "schedule_backfill"),
    Route("GET", "/schedules/{name}/delete", schedule_pages.schedule_delete,
          twin("DELETE", "/schedules/{name}"), "schedule_delete"),
    Route("POST", "/schedules/{name}/delete", schedule_pages.schedule_delete,
          twin("DELETE", "/schedules/{name}"), "schedule_delete"),
    # queues (leasework/api/console/queues.py: handlers of a Console)
    Route("GET", "/queues", queue_pages.queues, twin("GET", "/queues"), "queues"),
    Route("GET", "/queues/{name}/pause", queue_pages.queue_pause,
          twin("POST", "/queues/{name}/pause"), "queue_pause"),
    Route("POST", "/queues/{name}/pause", queue_pages.queue_pause,
          twin("POST", "/queues/{name}/pause"), "queue_pause"),
    Route("GET", "/queues/{name}/resume", queue_pages.queue_resume,
          twin("POST", "/queues/{name}/resume"), "queue_resume"),
    Route("POST", "/queues/{name}/resume", queue_pages.queue_resume,
          twin("POST", "/queues/{name}/resume"), "queue_resume"),
    Route("GET", "/queues/{name}/concurrency", queue_pages.queue_concurrency,
          twin("PUT", "/queues/{name}/concurrency"), "queue_concurrency"),
    Route("POST", "/queues/{name}/concurrency", queue_pages.queue_concurrency,
          twin("PUT", "/queues/{name}/concurrency"), "queue_concurrency"),
    Route("GET", "/workers", Console.workers, twin("GET", "/workers"), "workers"),
    Route("GET", "/audit", Console.audit, twin("GET", "/audit"), "audit"),
    # Alertmanager's notifications (the overview shows the latest too): no API twin
    Route("GET", "/invariants", Console.invariants, VIEW_SCOPE, "invariants"),
    Route("GET", "/alerts", Console.alerts, VIEW_SCOPE, "alerts"),
    Route("GET", "/{rest:path}", Console.not_found, VIEW_SCOPE, "not_found"),
    Route("POST", "/{rest:path}", Console.not_found, VIEW_SCOPE, "not_found"),
)  # fmt: skip

# the console's stylesheet, served by the blueprint itself (no route of the table): public
STATIC_ENDPOINT = "static"


def _scopes(routes: tuple[Route, ...]) -> dict[str, str | None]:
    """Endpoint -> scope; a ValueError when an endpoint's methods would need two."""
    scopes: dict[str, str | None] = {STATIC_ENDPOINT: None}
    for route in routes:
        if scopes.setdefault(route.name, route.scope) != route.scope:
            raise ValueError(f"console endpoint {route.name} has two scopes")
    return scopes


_SCOPES = _scopes(CONSOLE_ROUTES)


def console_scope(endpoint: str) -> str | None:
    """The scope a console endpoint (``jobs``, ``audit``, …) needs; KeyError for one the
    table does not know, so a new page cannot be served without an entry."""
    return _SCOPES[endpoint]
