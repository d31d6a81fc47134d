"""The service's job: ``LEASEWORK_APP=examples.fastapi_shop.jobs:app``."""

from __future__ import annotations

import os

import asyncpg
from pydantic import BaseModel, Field

import leasework

DSN = os.environ.get("LEASEWORK_POSTGRES_DSN", "postgresql://localhost/leasework")
QUEUE = "fastapi-shop"

app = leasework.App("fastapi_shop")
pool: asyncpg.Pool | None = None


class Receipt(BaseModel):
    order_id: int = Field(gt=0)


@app.on_lane_start("asyncio")
async def open_pool() -> None:
    """One asyncpg pool per worker, on the asyncio lane's own loop."""
    global pool
    pool = await asyncpg.create_pool(DSN, min_size=1, max_size=4)


@app.on_lane_stop("asyncio")
async def close_pool() -> None:
    if pool is not None:
        await pool.close()


RECORD = """UPDATE fastapi_orders
               SET receipt_sent_at = now(), receipt_fence = $2,
                   receipts_recorded = receipts_recorded + 1
             WHERE id = $1
         RETURNING email"""


@app.job(
    "fastapi_shop.record_receipt",
    runs_in="asyncio",
    queue=QUEUE,
    max_attempts=5,
    backoff=(1, 60),
)
async def record_receipt(ctx: leasework.JobContext, payload: Receipt) -> dict:
    """Record the receipt on the order, committed only while this attempt holds the job."""
    assert pool is not None, "the asyncio lane's start hook opens the pool"
    async with pool.acquire() as conn, conn.transaction():
        email = await conn.fetchval(RECORD, payload.order_id, ctx.fence)
        if email is None:
            raise leasework.Permanent(f"order {payload.order_id} is gone")
        await ctx.confirm_fence_async(conn)  # the last statement before the commit
    return {"order_id": payload.order_id, "sent_to": email}
