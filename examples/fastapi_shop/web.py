"""The service: ``uvicorn examples.fastapi_shop.web:api``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy import BigInteger, DateTime, Integer, String
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import leasework
from examples.fastapi_shop import jobs

engine = create_async_engine(jobs.DSN.replace("postgresql://", "postgresql+asyncpg://", 1))
Sessions = async_sessionmaker(engine, expire_on_commit=False)


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "fastapi_orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(320))
    total_cents: Mapped[int] = mapped_column(Integer)
    receipt_sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    receipt_fence: Mapped[int | None] = mapped_column(BigInteger)
    receipts_recorded: Mapped[int] = mapped_column(Integer, default=0)


async def create_tables() -> None:
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    await create_tables()
    yield
    await engine.dispose()


api = FastAPI(title="fastapi_shop", lifespan=lifespan)


async def session() -> AsyncIterator[AsyncSession]:
    async with Sessions() as opened:
        yield opened


class NewOrder(BaseModel):
    email: str = Field(min_length=3, max_length=320)
    total_cents: int = Field(ge=0)
    fail_after_enqueue: bool = False  # the example's proof: the job goes with the order


@api.post("/orders", status_code=201)
async def create_order(body: NewOrder, db: AsyncSession = Depends(session)) -> dict:
    async with db.begin():  # one transaction: the order and its job, or neither
        order = Order(email=body.email, total_cents=body.total_cents)
        db.add(order)
        await db.flush()
        job_id = await leasework.enqueue_async(
            db, "fastapi_shop.record_receipt", {"order_id": order.id}, app=jobs.app
        )
        if body.fail_after_enqueue:
            raise HTTPException(500, "failed after the enqueue")
    return {"order_id": order.id, "job_id": str(job_id)}


@api.get("/orders/{order_id}")
async def get_order(order_id: int, db: AsyncSession = Depends(session)) -> dict:
    order = await db.get(Order, order_id)
    if order is None:
        raise HTTPException(404, "no such order")
    return {
        "id": order.id,
        "receipt_fence": order.receipt_fence,
        "receipts_recorded": order.receipts_recorded,
    }
