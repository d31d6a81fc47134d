"""The shop's web endpoint: place an order and enqueue its receipt in the same transaction.

``POST /orders {"email": ..., "amount_cents": ...}`` inserts the order and calls
``leasework.enqueue`` on the same connection, so the order and its ``send_receipt`` job commit
together or not at all: no order without its receipt, no receipt for an order that was rolled
back. An ``Idempotency-Key`` header makes a retried request find its order instead of placing a
second one (the key is also the receipt job's key).
"""

from __future__ import annotations

import sys

import psycopg
import trio
from psycopg_pool import ConnectionPool, PoolTimeout
from quart import request
from quart_trio import QuartTrio

import leasework
from examples.shop.jobs import Receipt
from examples.shop.jobs import app as jobs_app

POOL_WAIT = 3.0  # seconds to wait for a pooled connection before taking one of its own


class StaleConnection(Exception):
    """The first statement of the order failed on a dead connection: nothing was sent that
    could commit, so the order may be tried again on a fresh one."""


def place_order(pool: ConnectionPool, email: str, amount: int, key: str | None) -> dict:
    """:func:`place_order_on` a pooled connection; when the pool's connection turned out dead
    before anything was written, or the pool has none to give yet (Postgres just restarted,
    the pool still reconnecting), on a connection of its own instead, once."""
    try:
        with pool.connection(timeout=POOL_WAIT) as conn:  # commits on exit
            return place_order_on(conn, email, amount, key)
    except (StaleConnection, PoolTimeout):
        with psycopg.connect(pool.conninfo, connect_timeout=5) as conn:  # commits on exit
            try:
                return place_order_on(conn, email, amount, key)
            except StaleConnection as again:
                raise again.__cause__ from None  # type: ignore[misc]


def place_order_on(conn: psycopg.Connection, email: str, amount: int, key: str | None) -> dict:
    """One transaction: the order row, its receipt job (and the job's outbox row)."""
    try:
        row = conn.execute(
            """INSERT INTO shop_orders (email, amount_cents, idempotency_key)
               VALUES (%s, %s, %s) ON CONFLICT (idempotency_key) DO NOTHING RETURNING id""",
            (email, amount, key),
        ).fetchone()
    except psycopg.OperationalError as exc:
        if conn.broken:
            raise StaleConnection from exc
        raise
    if row is None:  # a retry of an order already placed: answer with it
        order_id, job_id = conn.execute(
            "SELECT id, receipt_job_id FROM shop_orders WHERE idempotency_key = %s", (key,)
        ).fetchone()
        return {"order_id": order_id, "receipt_job_id": str(job_id), "replay": True}
    order_id = row[0]
    job_id = leasework.enqueue(
        conn,
        "send_receipt",
        Receipt(order_id=order_id, email=email),
        app=jobs_app,
        idempotency_key=key,
    )
    conn.execute("UPDATE shop_orders SET receipt_job_id = %s WHERE id = %s", (job_id, order_id))
    return {"order_id": order_id, "receipt_job_id": str(job_id), "replay": False}


def create_app(pool: ConnectionPool) -> QuartTrio:
    web = QuartTrio("shop")
    limiter = trio.CapacityLimiter(8)

    @web.get("/healthz")
    async def healthz():
        return {"status": "alive"}

    @web.post("/orders")
    async def orders():
        body = await request.get_json(silent=True)
        if not isinstance(body, dict):
            return {"error": 'send a JSON object: {"email": ..., "amount_cents": ...}'}, 400
        email, amount = body.get("email"), body.get("amount_cents")
        if not isinstance(email, str) or "@" not in email or len(email) > 320:
            return {"error": "email must be an email address"}, 422
        if isinstance(amount, bool) or not isinstance(amount, int) or not 0 < amount < 10**9:
            return {"error": "amount_cents must be a positive integer"}, 422
        key = request.headers.get("Idempotency-Key")
        try:
            placed = await trio.to_thread.run_sync(
                place_order, pool, email, amount, key, limiter=limiter
            )
        except leasework.InvalidJob as exc:
            return {"error": str(exc)}, 422
        except psycopg.OperationalError as exc:
            print(f"shop: order refused, database unreachable: {exc}", file=sys.stderr, flush=True)
            return {"error": "the database is unreachable; nothing was written"}, 503
        return placed, 200 if placed["replay"] else 201

    @web.get("/orders/<int:order_id>")
    async def order(order_id: int):
        def read() -> dict | None:
            with pool.connection() as conn:
                cur = conn.execute(
                    """SELECT id, email, amount_cents, receipt_job_id::text, receipts_recorded,
                              receipt_message_id, receipt_sent_at::text FROM shop_orders
                       WHERE id = %s""",
                    (order_id,),
                )
                row = cur.fetchone()
                return (
                    None
                    if row is None
                    else dict(zip([c.name for c in cur.description], row, strict=True))
                )

        found = await trio.to_thread.run_sync(read, limiter=limiter)
        return (found, 200) if found else ({"error": f"no order {order_id}"}, 404)

    return web
