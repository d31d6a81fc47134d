"""A small local "mail service": a stand-in for a third party the shop's jobs call.

``POST /send {"to", "subject", "body"}`` "sends" an email: a row of ``shop_emails``, which
records the calling job and its fence (the ``Leasework-Job-Id`` and ``Leasework-Fence``
headers of ``ctx.fence_headers()``), so a test can count the emails each job caused.

Two guards, chosen by ``SHOP_MAIL_GUARD`` (a comma list; default ``key,fence``; ``none`` for
neither), stand for what a real service may or may not offer:

* ``key``: an ``Idempotency-Key`` header is required, and a repeat with the same key sends
  nothing, answers the first message's id and only counts the call (the ``shop_mail``
  ledger). This stops a retried attempt from sending twice.
* ``fence``: the service keeps the highest fence it has seen per job
  (:mod:`leasework.downstream`'s ``leasework_fences``) and refuses a call whose fence is
  lower, in the transaction that would send: ``409`` stale-fence, the refusal logged in
  ``shop_mail_refused``. This stops an attempt that lost its lease (a frozen worker whose
  job another worker took over) from acting after the newer one, and tells it so, where a
  key alone would answer it "sent" and let it go on.

Many real services (SMTP relays, SMS gateways, webhooks) have no idempotency key: the chaos
scenarios ``t-shop-mail-fence`` and ``u-shop-mail-unsafe`` run this service with ``fence``
alone and with ``none``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import psycopg
import trio
from psycopg_pool import ConnectionPool
from quart import request
from quart_trio import QuartTrio

from examples.shop.guard import MailGuard
from leasework import StaleFence, downstream
from leasework.downstream import Fence


@dataclass(frozen=True)
class Email:
    to: str
    subject: str
    body: str


def _record_refusal(pool: ConnectionPool, exc: StaleFence) -> None:
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO shop_mail_refused (job_id, fence, highest) VALUES (%s, %s, %s)",
            (exc.job_id, exc.fence, exc.highest),
        )


def send(
    pool: ConnectionPool, guard: MailGuard, email: Email, key: str | None, fence: Fence | None
) -> dict:
    """Send ``email`` once under the guards, in one transaction: the fence checked (raising
    :class:`StaleFence`, nothing sent), then the key's earlier message answered, else the
    email recorded as sent."""
    try:
        with pool.connection() as conn, conn.transaction():
            if guard.fence and fence is not None:
                downstream.verify(conn, fence)
            message_id = f"msg-{uuid.uuid4().hex[:16]}"
            if guard.key and key is not None:
                first_id, calls = conn.execute(
                    """INSERT INTO shop_mail (idempotency_key, message_id, recipient, subject,
                                              body)
                       VALUES (%s, %s, %s, %s, %s)
                       ON CONFLICT (idempotency_key) DO UPDATE
                           SET calls = shop_mail.calls + 1, last_call_at = now()
                       RETURNING message_id, calls""",
                    (key, message_id, email.to, email.subject, email.body),
                ).fetchone()
                if calls > 1:
                    return {"message_id": first_id, "duplicate": True}
            conn.execute(
                """INSERT INTO shop_emails (message_id, job_id, fence, idempotency_key,
                                            recipient, subject, body)
                   VALUES (%s, %s, %s, %s, %s, %s, %s)""",
                (
                    message_id,
                    fence.job_id if fence else None,
                    fence.fence if fence else None,
                    key,
                    email.to,
                    email.subject,
                    email.body,
                ),
            )
        return {"message_id": message_id, "duplicate": False}
    except StaleFence as exc:
        _record_refusal(pool, exc)
        raise


def create_app(pool: ConnectionPool, guard: MailGuard | None = None) -> QuartTrio:
    guard = guard or MailGuard.from_env()
    web = QuartTrio("shop-mail")
    # reads the fence headers into the scope; a call with unreadable ones is answered 400
    web.asgi_app = downstream.FenceMiddleware(web.asgi_app)  # type: ignore[method-assign]
    limiter = trio.CapacityLimiter(8)

    @web.get("/healthz")
    async def healthz():
        return {"status": "alive", "guard": str(guard)}

    @web.post("/send")
    async def send_mail():
        key = request.headers.get("Idempotency-Key")
        body = await request.get_json(silent=True)
        if guard.key and not key:
            return {"error": "an Idempotency-Key header is required"}, 400
        if not isinstance(body, dict) or not all(
            isinstance(body.get(k), str) for k in ("to", "subject", "body")
        ):
            return {"error": 'send {"to", "subject", "body"} as strings'}, 422
        email = Email(body["to"], body["subject"], body["body"])
        fence = request.scope.get(downstream.SCOPE_KEY)
        try:
            sent = await trio.to_thread.run_sync(
                send, pool, guard, email, key, fence, limiter=limiter
            )
        except StaleFence as exc:
            # Quart would answer an exception 500; the stale-fence problem is the contract
            return downstream.problem(exc), 409, {"Content-Type": "application/problem+json"}
        except psycopg.OperationalError:
            return {"error": "mail ledger unreachable; nothing was sent"}, 503
        return sent, 200

    return web
