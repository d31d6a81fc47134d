"""The fence, handed to the services a job calls: what a downstream service mounts so that a
stale attempt's call is refused atomically with the effect it would have had.

A worker's lease can run out while its handler is still calling out (a GC pause, a frozen
VM): the job is claimed again under a higher fence, and two attempts may call the same
service. ``ctx.fenced`` protects effects written to leasework's own Postgres; a service
elsewhere needs the token itself (Kleppmann's fencing argument: the *resource* checks it).

The contract (``docs/downstream-fence.md`` spells it out for other languages):

* the job sends ``Leasework-Job-Id: <uuid>`` and ``Leasework-Fence: <integer>``
  (:meth:`leasework.JobContext.fence_headers`);
* the service keeps, in its own database, the highest fence it has seen per job
  (:data:`TABLE_SQL`), and in the transaction of the effect the call asks for, raises the
  stored fence to the call's or refuses the call when the stored one is higher
  (:func:`verify`): one statement, whose row lock makes two calls of one job take turns;
* a refused call is answered ``409`` with the problem type :data:`STALE_FENCE_TYPE`
  (:class:`FenceMiddleware` does it for an ASGI app); the job, on that answer
  (:func:`raise_if_stale`), raises :class:`leasework.StaleFence`, and the worker ends the
  attempt as a stale one (retried only if it still holds the job: its fenced outcome is
  refused otherwise), never as an error of the handler.

An equal fence passes: it is the same attempt calling again (a retried request), which the
fence cannot tell from the first; deduplicate those by ``ctx.idempotency_key`` as before.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from leasework.errors import StaleFence

HEADER_JOB_ID = "Leasework-Job-Id"
HEADER_FENCE = "Leasework-Fence"
STALE_FENCE_TYPE = "https://leasework.dev/problems/stale-fence"
BAD_FENCE_TYPE = "https://leasework.dev/problems/bad-fence-headers"
SCOPE_KEY = "leasework.fence"  # where FenceMiddleware puts the call's Fence in the ASGI scope
MAX_FENCE = 2**63 - 1  # a Postgres bigint

# the downstream service's own table: the highest fence seen per job
TABLE_SQL = """CREATE TABLE IF NOT EXISTS leasework_fences (
    job_id  uuid PRIMARY KEY,
    fence   bigint NOT NULL CHECK (fence > 0),
    seen_at timestamptz NOT NULL DEFAULT now()
)"""
# raise the stored fence to the call's, or leave it (and return nothing) when it is higher;
# the conflicting row is locked either way until the transaction ends
VERIFY_SQL = """INSERT INTO leasework_fences AS f (job_id, fence) VALUES (%s, %s)
ON CONFLICT (job_id) DO UPDATE SET fence = EXCLUDED.fence, seen_at = now()
    WHERE f.fence <= EXCLUDED.fence
RETURNING f.fence"""
HIGHEST_SQL = "SELECT fence FROM leasework_fences WHERE job_id = %s"


class FenceHeaderError(ValueError):
    """A call's fence headers that cannot be read; the message says which and why."""


@dataclass(frozen=True)
class Fence:
    """One attempt's fence: the job and its token."""

    job_id: uuid.UUID
    fence: int

    def headers(self) -> dict[str, str]:
        return {HEADER_JOB_ID: str(self.job_id), HEADER_FENCE: str(self.fence)}

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> Fence | None:
        """The call's fence (header names case-insensitive); None when it sends neither
        header. Raises :class:`FenceHeaderError` for one without the other or a bad value."""
        lower = {k.lower(): v for k, v in headers.items()}
        job, fence = lower.get(HEADER_JOB_ID.lower()), lower.get(HEADER_FENCE.lower())
        if job is None and fence is None:
            return None
        if job is None or fence is None:
            missing = HEADER_JOB_ID if job is None else HEADER_FENCE
            raise FenceHeaderError(f"{missing} is missing: send both fence headers or neither")
        try:
            job_id = uuid.UUID(job.strip())
        except ValueError:
            raise FenceHeaderError(f"{HEADER_JOB_ID} {job[:64]!r} is not a UUID") from None
        text = fence.strip()
        if not (text.isascii() and text.isdigit()) or not 0 < int(text) <= MAX_FENCE:
            raise FenceHeaderError(
                f"{HEADER_FENCE} {fence[:32]!r} is not an integer from 1 to {MAX_FENCE}"
            )
        return cls(job_id, int(text))


def install(conn: psycopg.Connection[Any]) -> None:
    """Create the service's ``leasework_fences`` table if it is not there (a psycopg
    connection; commit is the caller's)."""
    conn.execute(TABLE_SQL)


def _stale(fence: Fence, highest: tuple[Any, ...] | None) -> StaleFence:
    return StaleFence(fence.job_id, fence.fence, None if highest is None else int(highest[0]))


def verify(conn: psycopg.Connection[Any], fence: Fence) -> None:
    """In the caller's open transaction (a psycopg connection, any row factory) on the
    service's database: record ``fence`` as the highest seen for its job, or raise
    :class:`StaleFence` when a higher one was seen. Write the effect in the same
    transaction: it commits only with a fence no call has beaten, and a concurrent call of
    the same job waits for it."""
    with conn.cursor(row_factory=tuple_row) as cur:
        if cur.execute(VERIFY_SQL, (fence.job_id, fence.fence)).fetchone() is None:
            raise _stale(fence, cur.execute(HIGHEST_SQL, (fence.job_id,)).fetchone())


async def verify_async(conn: psycopg.AsyncConnection[Any], fence: Fence) -> None:
    """:func:`verify` on a psycopg ``AsyncConnection``."""
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(VERIFY_SQL, (fence.job_id, fence.fence))
        if await cur.fetchone() is None:
            await cur.execute(HIGHEST_SQL, (fence.job_id,))
            raise _stale(fence, await cur.fetchone())


def problem(exc: StaleFence) -> dict[str, Any]:
    """The ``409`` body that says a call's fence is stale."""
    return {
        "type": STALE_FENCE_TYPE,
        "title": "stale fence",
        "status": 409,
        "detail": str(exc),
        "job_id": str(exc.job_id),
        "fence": exc.fence,
        "highest": exc.highest,
    }


def raise_if_stale(status_code: int, body: bytes | str | Mapping[str, Any] | None) -> None:
    """For a job calling a fenced service: raise :class:`StaleFence` when the answer
    (``response.status_code, response.content``) is the stale-fence problem; else nothing."""
    if status_code != 409 or body is None:
        return
    data: Any = body
    if isinstance(body, bytes | str):
        try:
            data = json.loads(body)
        except ValueError:
            return
    if not isinstance(data, Mapping) or data.get("type") != STALE_FENCE_TYPE:
        return
    try:
        job_id = uuid.UUID(str(data["job_id"]))
        fence = int(data["fence"])
        highest = None if data.get("highest") is None else int(data["highest"])
    except (KeyError, TypeError, ValueError):
        raise StaleFence(None, None, None, detail=str(data.get("detail") or "")) from None
    raise StaleFence(job_id, fence, highest)


# ---------------------------------------------------------------- ASGI

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _headers(scope: Scope) -> dict[str, str]:
    raw: Iterable[tuple[bytes, bytes]] = scope.get("headers") or ()
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in raw}


async def _answer(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(data)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


class FenceMiddleware:
    """ASGI middleware for a downstream service: reads the call's fence headers into
    ``scope["leasework.fence"]`` (a :class:`Fence`, or None for a call without them; with
    ``required=True`` such a call is refused, ``428``), answers ``400`` for headers it cannot
    read, and turns a :class:`StaleFence` the app raises (from :func:`verify`, inside the
    transaction of the effect) before it started answering into the ``409`` stale-fence
    problem."""

    def __init__(self, app: ASGIApp, *, required: bool = False) -> None:
        self.app, self.required = app, required

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        try:
            fence = Fence.from_headers(_headers(scope))
        except FenceHeaderError as exc:
            await _answer(send, 400, _bad(str(exc)))
            return
        if fence is None and self.required:
            await _answer(send, 428, _bad(f"send {HEADER_JOB_ID} and {HEADER_FENCE}", 428))
            return
        scope[SCOPE_KEY] = fence
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message.get("type") == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except StaleFence as exc:
            if started:
                raise
            await _answer(send, 409, problem(exc))


def _bad(detail: str, status: int = 400) -> dict[str, Any]:
    return {
        "type": BAD_FENCE_TYPE,
        "title": "bad fence headers",
        "status": status,
        "detail": detail,
    }
