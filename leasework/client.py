"""A small client of the leasework HTTP API: :class:`Client` (blocking) and
:class:`AsyncClient` (Trio or asyncio, through httpx and anyio), each over a keep-alive
transport that sends a request in one write (:mod:`leasework.transport`)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import anyio
import httpx

from leasework.errors import JobFailed, WaitTimeout
from leasework.states import TERMINAL
from leasework.tokens import auth_headers, default_token
from leasework.transport import AsyncKeepAliveTransport, KeepAliveTransport, Origin, origin_of

DEFAULT_URL = os.environ.get("LEASEWORK_API_URL", "http://127.0.0.1:8080")


class ApiError(Exception):
    """The API answered with a problem document; ``problem`` holds it."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        detail = problem.get("detail") or problem.get("title") or "error"
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.problem = problem


def submit_body(
    job_type: str,
    payload: Any = None,
    *,
    run_at: str | None = None,
    delay_seconds: float | None = None,
    max_attempts: int | None = None,
    timeout_seconds: int | None = None,
    ordering_key: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"type": job_type, "payload": {} if payload is None else payload}
    optional = {
        "run_at": run_at,
        "delay_seconds": delay_seconds,
        "max_attempts": max_attempts,
        "timeout_seconds": timeout_seconds,
        "ordering_key": ordering_key,
        "queue": queue,
        "priority": priority,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return body


def _result(response: httpx.Response) -> dict[str, Any]:
    return _decoded(response.status_code, response.content)


def _decoded(status: int, content: bytes) -> dict[str, Any]:
    """The answer's JSON document, or raise :class:`ApiError` with its problem document."""
    if status >= 400:
        try:
            problem = json.loads(content)
        except ValueError:
            problem = {"detail": content.decode("utf-8", "replace")[:500]}
        raise ApiError(status, problem)
    return json.loads(content)


def _submit_request(
    http: httpx.Client | httpx.AsyncClient, body: dict[str, Any], idempotency_key: str | None
) -> tuple[Origin, bytes, list[tuple[bytes, bytes]], bytes]:
    """``POST /jobs`` as the transport's ``send`` takes it: origin, target, headers, body.
    The submit is the call a web app makes once per request, so it skips httpx's request and
    response objects (about 40 % of the client's CPU per submit; see
    docs/design-decisions.md); every other call goes through httpx."""
    data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    base = http.base_url
    headers = [
        (b"Host", base.netloc),
        *http.headers.raw,
        (b"Content-Type", b"application/json"),
        (b"Content-Length", str(len(data)).encode()),
    ]
    if idempotency_key:
        headers.append((b"Idempotency-Key", idempotency_key.encode()))
    return origin_of(base), base.raw_path.rstrip(b"/") + b"/jobs", headers, data


def batch_item(job: Mapping[str, Any]) -> dict[str, Any]:
    """One item of ``POST /jobs/batch`` from ``{"type", "payload", "idempotency_key", ...}``
    (the keyword arguments of :meth:`Client.submit`, plus ``type`` and ``payload``)."""
    options = {k: v for k, v in job.items() if k not in ("type", "payload", "idempotency_key")}
    body = submit_body(job["type"], job.get("payload"), **options)
    if job.get("idempotency_key"):
        body["idempotency_key"] = job["idempotency_key"]
    return body


SCHEDULE_OPTIONS = ("payload", "timezone", "overlap", "catch_up", "catch_up_limit", "grace_seconds")


def schedule_body(name: str, job_type: str, cron: str, **options: Any) -> dict[str, Any]:
    """The body of ``POST /schedules``; ``options`` left as None are left out."""
    unknown = sorted(set(options) - set(SCHEDULE_OPTIONS))
    if unknown:
        raise TypeError(f"unknown schedule option(s): {', '.join(unknown)}")
    body: dict[str, Any] = {"name": name, "type": job_type, "cron": cron}
    body.update({k: v for k, v in options.items() if v is not None})
    return body


def _segment(name: str) -> str:
    """``name`` as one path segment (a schedule name is letters, digits and ``_ . : -``;
    anything else is quoted, and the api answers 404 for it)."""
    return quote(name, safe="")


# httpx's defaults the API has no use for (it answers JSON, uncompressed; HTTP/1.1 keeps a
# connection alive unasked): each costs the api a header to parse on every request
UNNEEDED_HEADERS = ("accept", "accept-encoding", "connection")
USER_AGENT = "leasework-client"


def _trim_headers(headers: httpx.Headers) -> None:
    for name in UNNEEDED_HEADERS:
        headers.pop(name, None)
    headers["user-agent"] = USER_AGENT


FINAL = frozenset(str(s) for s in TERMINAL)
WAIT_INTERVAL = 0.2


def _settled(job: dict[str, Any]) -> Any:
    """The result of a finished job, or raise :class:`JobFailed`; None while still going."""
    if job["status"] == "succeeded":
        return job.get("result")
    raise JobFailed(job)


class Client:
    def __init__(
        self, base_url: str = DEFAULT_URL, timeout: float = 10.0, token: str | None = None
    ) -> None:
        """``token``: the API token to send (default :func:`leasework.tokens.default_token`:
        ``$LEASEWORK_TOKEN``, ``$LEASEWORK_TOKEN_FILE``, or the one ``just up`` wrote)."""
        headers = auth_headers(token if token is not None else default_token())
        self.transport = KeepAliveTransport()
        self.http = httpx.Client(
            base_url=base_url, timeout=timeout, headers=headers, transport=self.transport
        )
        _trim_headers(self.http.headers)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def submit(
        self,
        job_type: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        body = submit_body(job_type, payload, **options)
        origin, target, headers, data = _submit_request(self.http, body, idempotency_key)
        timeouts = self.http.timeout.as_dict()
        answer = self.transport.send(origin, "POST", target, headers, data, timeouts)
        return _decoded(answer.status, answer.content)

    def get(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        return _result(self.http.get(f"/jobs/{job_id}"))

    def list(self, **params: Any) -> dict[str, Any]:
        params = {k: v for k, v in params.items() if v is not None}
        return _result(self.http.get("/jobs", params=params))

    def cancel(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        return _result(self.http.post(f"/jobs/{job_id}/cancel"))

    def submit_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Submit up to 1,000 jobs in one request, all or nothing (``POST /jobs/batch``)."""
        body = {"jobs": [batch_item(job) for job in jobs]}
        return _result(self.http.post("/jobs/batch", json=body))["jobs"]

    def retry(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        """Put a dead or cancelled job back in the queue with a fresh attempt budget."""
        return _result(self.http.post(f"/jobs/{job_id}/retry"))

    def retry_many(self, **filters: Any) -> int:
        """Retry dead (or ``status="cancelled"``) jobs by ``type``, ``finished_after``,
        ``finished_before`` (RFC 3339), at most ``limit``; returns how many."""
        body = {k: v for k, v in filters.items() if v is not None}
        return _result(self.http.post("/jobs/retry", json=body))["retried"]

    # ------------------------------------------------------------ recurring schedules

    def schedules(self, *, limit: int | None = None, after: str | None = None) -> dict[str, Any]:
        """A page of schedules by name (``next_after`` names the next page's ``after``)."""
        params = {k: v for k, v in {"limit": limit, "after": after}.items() if v is not None}
        return _result(self.http.get("/schedules", params=params))

    def schedule(self, name: str, *, ticks: int | None = None) -> dict[str, Any]:
        """One schedule with its latest ``ticks`` ticks (default 50), newest first."""
        params = {"ticks": ticks} if ticks is not None else {}
        return _result(self.http.get(f"/schedules/{_segment(name)}", params=params))

    def create_schedule(
        self, name: str, job_type: str, cron: str, **options: Any
    ) -> dict[str, Any]:
        """Create a schedule; ``options``: ``payload``, ``timezone``, ``overlap``,
        ``catch_up``, ``catch_up_limit``, ``grace_seconds``."""
        body = schedule_body(name, job_type, cron, **options)
        return _result(self.http.post("/schedules", json=body))

    def pause_schedule(self, name: str) -> dict[str, Any]:
        return _result(self.http.post(f"/schedules/{_segment(name)}/pause"))

    def resume_schedule(self, name: str) -> dict[str, Any]:
        return _result(self.http.post(f"/schedules/{_segment(name)}/resume"))

    def trigger_schedule(self, name: str) -> dict[str, Any]:
        """Run a schedule once now; returns its ``job_id`` and ``tick_at``."""
        return _result(self.http.post(f"/schedules/{_segment(name)}/trigger"))

    def backfill_schedule(self, name: str, since: str, until: str) -> dict[str, Any]:
        """Run each tick in ``[since, until]`` (RFC 3339) that never fired, a job each."""
        body = {"from": since, "until": until}
        return _result(self.http.post(f"/schedules/{_segment(name)}/backfill", json=body))

    def delete_schedule(self, name: str) -> dict[str, Any]:
        return _result(self.http.delete(f"/schedules/{_segment(name)}"))

    def wait(self, job_id: str | uuid.UUID, timeout: float = 60.0) -> Any:
        """Wait for the job to finish and return its result; raises :class:`JobFailed` (with
        its last error) when it ended dead or cancelled, :class:`WaitTimeout` after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.get(job_id)
            if job["status"] in FINAL:
                return _settled(job)
            if time.monotonic() >= deadline:
                raise WaitTimeout(job, timeout)
            time.sleep(WAIT_INTERVAL)


class AsyncClient:
    def __init__(
        self, base_url: str = DEFAULT_URL, timeout: float = 10.0, token: str | None = None
    ) -> None:
        """``token``: the API token to send (default :func:`leasework.tokens.default_token`:
        ``$LEASEWORK_TOKEN``, ``$LEASEWORK_TOKEN_FILE``, or the one ``just up`` wrote)."""
        headers = auth_headers(token if token is not None else default_token())
        self.transport = AsyncKeepAliveTransport()
        self.http = httpx.AsyncClient(
            base_url=base_url, timeout=timeout, headers=headers, transport=self.transport
        )
        _trim_headers(self.http.headers)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def submit(
        self,
        job_type: str,
        payload: Any = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        body = submit_body(job_type, payload, **options)
        origin, target, headers, data = _submit_request(self.http, body, idempotency_key)
        timeouts = self.http.timeout.as_dict()
        answer = await self.transport.send(origin, "POST", target, headers, data, timeouts)
        return _decoded(answer.status, answer.content)

    async def get(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        return _result(await self.http.get(f"/jobs/{job_id}"))

    async def list(self, **params: Any) -> dict[str, Any]:
        params = {k: v for k, v in params.items() if v is not None}
        return _result(await self.http.get("/jobs", params=params))

    async def cancel(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        return _result(await self.http.post(f"/jobs/{job_id}/cancel"))

    async def submit_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
        body = {"jobs": [batch_item(job) for job in jobs]}
        return _result(await self.http.post("/jobs/batch", json=body))["jobs"]

    async def retry(self, job_id: str | uuid.UUID) -> dict[str, Any]:
        return _result(await self.http.post(f"/jobs/{job_id}/retry"))

    async def retry_many(self, **filters: Any) -> int:
        body = {k: v for k, v in filters.items() if v is not None}
        return _result(await self.http.post("/jobs/retry", json=body))["retried"]

    # ------------------------------------------------------------ recurring schedules (see Client)

    async def schedules(
        self, *, limit: int | None = None, after: str | None = None
    ) -> dict[str, Any]:
        params = {k: v for k, v in {"limit": limit, "after": after}.items() if v is not None}
        return _result(await self.http.get("/schedules", params=params))

    async def schedule(self, name: str, *, ticks: int | None = None) -> dict[str, Any]:
        params = {"ticks": ticks} if ticks is not None else {}
        return _result(await self.http.get(f"/schedules/{_segment(name)}", params=params))

    async def create_schedule(
        self, name: str, job_type: str, cron: str, **options: Any
    ) -> dict[str, Any]:
        body = schedule_body(name, job_type, cron, **options)
        return _result(await self.http.post("/schedules", json=body))

    async def pause_schedule(self, name: str) -> dict[str, Any]:
        return _result(await self.http.post(f"/schedules/{_segment(name)}/pause"))

    async def resume_schedule(self, name: str) -> dict[str, Any]:
        return _result(await self.http.post(f"/schedules/{_segment(name)}/resume"))

    async def trigger_schedule(self, name: str) -> dict[str, Any]:
        return _result(await self.http.post(f"/schedules/{_segment(name)}/trigger"))

    async def backfill_schedule(self, name: str, since: str, until: str) -> dict[str, Any]:
        body = {"from": since, "until": until}
        return _result(await self.http.post(f"/schedules/{_segment(name)}/backfill", json=body))

    async def delete_schedule(self, name: str) -> dict[str, Any]:
        return _result(await self.http.delete(f"/schedules/{_segment(name)}"))

    async def wait(self, job_id: str | uuid.UUID, timeout: float = 60.0) -> Any:  # noqa: ASYNC109
        """See :meth:`Client.wait`. ``timeout`` rather than the caller's cancel scope, so the
        :class:`WaitTimeout` it raises can carry the job as last seen."""
        deadline = anyio.current_time() + timeout
        while True:
            job = await self.get(job_id)
            if job["status"] in FINAL:
                return _settled(job)
            if anyio.current_time() >= deadline:
                raise WaitTimeout(job, timeout)
            await anyio.sleep(WAIT_INTERVAL)
