"""The shop's job types: ``LEASEWORK_APP=examples.shop.jobs:app``.

``send_receipt`` asks the mail service to send the receipt, passing ``ctx.idempotency_key``
(a retried attempt sends one email) and the attempt's fence (``ctx.fence_headers()``: an
attempt that lost its lease to a newer one is refused, and ends as a stale attempt), then
records the receipt on the order through the fence, so it is recorded once.
"""

from __future__ import annotations

import os

import httpx
from pydantic import BaseModel, Field

import leasework
from leasework import downstream

MAIL_URL = os.environ.get("SHOP_MAIL_URL", "http://127.0.0.1:8025")

app = leasework.App("shop")


class Receipt(BaseModel):
    order_id: int = Field(gt=0)
    # \s differs between pydantic's Rust regex (Unicode White_Space: U+0085) and the JSON
    # Schema's ECMA regex (U+FEFF): both named, so the api and its OpenAPI document agree
    email: str = Field(
        min_length=3, max_length=320, pattern=r"^[^@\s\u0085\ufeff]+@[^@\s\u0085\ufeff]+$"
    )


class OrderMissing(Exception):
    """The order of a receipt is gone: retrying cannot bring it back."""


@app.job("send_receipt", max_attempts=5, timeout=30, backoff=(2, 600), permanent=(OrderMissing,))
async def send_receipt(ctx: leasework.JobContext, payload: Receipt) -> dict:
    """Email the receipt of an order once, and record it on the order through the fence."""
    async with httpx.AsyncClient(base_url=MAIL_URL, timeout=10) as http:
        response = await http.post(
            "/send",
            json={
                "to": payload.email,
                "subject": f"Your receipt for order {payload.order_id}",
                "body": f"Thank you for order {payload.order_id}.",
            },
            headers={"Idempotency-Key": ctx.idempotency_key, **ctx.fence_headers()},
        )
    # 409 stale-fence: a newer attempt of this job has called; this one stops, as stale
    downstream.raise_if_stale(response.status_code, response.content)
    response.raise_for_status()  # a 5xx or an unreachable service: retried with backoff
    message_id = response.json()["message_id"]

    def record(conn) -> None:
        updated = conn.execute(
            """UPDATE shop_orders SET receipts_recorded = receipts_recorded + 1,
                      receipt_message_id = %s, receipt_job_id = %s, receipt_sent_at = now()
               WHERE id = %s""",
            (message_id, ctx.job_id, payload.order_id),
        )
        if updated.rowcount == 0:
            raise OrderMissing(f"order {payload.order_id} does not exist")

    ctx.fenced(record)
    return {"sent_to": payload.email, "message_id": message_id}
