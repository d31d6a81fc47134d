"""A small local "mail service": a stand-in for a third party that deduplicates requests.

``POST /send`` with an ``Idempotency-Key`` header "sends" an email once per key: a repeat with
the same key answers the first message's id and only counts the call. Its ledger is the
``shop_mail`` table, so a test can count emails sent against calls made.
"""

from __future__ import annotations

import uuid

import psycopg
import trio
from psycopg_pool import ConnectionPool
from quart import request
from quart_trio import QuartTrio


def send(pool: ConnectionPool, key: str, to: str, subject: str, body: str) -> dict:
    with pool.connection() as conn:
        message_id, calls = conn.execute(
            """INSERT INTO shop_mail (idempotency_key, message_id, recipient, subject, body)
               VALUES (%s, %s, %s, %s, %s)
               ON CONFLICT (idempotency_key) DO UPDATE
                   SET calls = shop_mail.calls + 1, last_call_at = now()
               RETURNING message_id, calls""",
            (key, f"msg-{uuid.uuid4().hex[:16]}", to, subject, body),
        ).fetchone()
    return {"message_id": message_id, "duplicate": calls > 1}


def create_app(pool: ConnectionPool) -> QuartTrio:
    web = QuartTrio("shop-mail")
    limiter = trio.CapacityLimiter(8)

    @web.get("/healthz")
    async def healthz():
        return {"status": "alive"}

    @web.post("/send")
    async def send_mail():
        key = request.headers.get("Idempotency-Key")
        body = await request.get_json(silent=True)
        if not key:
            return {"error": "an Idempotency-Key header is required"}, 400
        if not isinstance(body, dict) or not all(
            isinstance(body.get(k), str) for k in ("to", "subject", "body")
        ):
            return {"error": 'send {"to", "subject", "body"} as strings'}, 422
        try:
            sent = await trio.to_thread.run_sync(
                send, pool, key, body["to"], body["subject"], body["body"], limiter=limiter
            )
        except psycopg.OperationalError:
            return {"error": "mail ledger unreachable; nothing was sent"}, 503
        return sent, 200

    return web
