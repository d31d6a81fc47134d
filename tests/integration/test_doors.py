"""Enqueue through the database layer an application already holds (leasework/doors/), on the
real stack's Postgres: a SQLAlchemy ``Session`` and ``Connection`` (psycopg driver), an
``AsyncSession`` and ``AsyncConnection`` (asyncpg driver) and a bare asyncpg connection.

For each door, inside the caller's own transaction beside a row of its own (a shop order):
a commit runs the job once (the worker's ``echo`` returns the payload, on attempt 1); a
rollback leaves neither the order nor the job; an error inside the door (a queue that does
not exist) fails the framework's own block, which rolls the order back with it; and a batch
whose idempotency key conflicts is undone by the framework's own savepoint while the
caller's earlier work commits. The psycopg doors have the same tests in test_application.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import asyncpg
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import leasework
from leasework.doors import async_door, sync_door
from tests.integration.conftest import DIRECT_DSN

URL_TAIL = DIRECT_DSN.removeprefix("postgresql://")
NEW_ORDER = text("INSERT INTO shop_orders (email, amount_cents) VALUES (:email, 1200) RETURNING id")
NEW_ORDER_ASYNCPG = "INSERT INTO shop_orders (email, amount_cents) VALUES ($1, 1200) RETURNING id"


def exists(db, table: str, row_id: Any) -> bool:
    return (
        db.execute(f"SELECT count(*) AS n FROM {table} WHERE id = %s", (row_id,)).fetchone()["n"]
        == 1
    )


def ran_once(client, db, job_id: uuid.UUID, payload: dict) -> None:
    assert client.wait(job_id, timeout=60) == payload
    assert client.get(str(job_id))["attempt"] == 1


# ---------------------------------------------------------------- SQLAlchemy, sync


@pytest.fixture(scope="module")
def engine():
    engine = create_engine(f"postgresql+psycopg://{URL_TAIL}")
    yield engine
    engine.dispose()


SYNC_HOLDERS: dict[str, Callable[[Any], Any]] = {
    "session": lambda engine: Session(engine),
    "connection": lambda engine: engine.connect(),
}


@pytest.mark.parametrize("holder", sorted(SYNC_HOLDERS))
def test_sqlalchemy_commit_runs_the_job_once_beside_the_callers_row(engine, client, db, holder):
    tag = uuid.uuid4().hex
    with SYNC_HOLDERS[holder](engine) as conn:
        order_id = conn.execute(NEW_ORDER, {"email": f"{tag}@example.com"}).scalar_one()
        job_id = leasework.enqueue(conn, "echo", {"order": order_id})
        assert not exists(db, "jobs", job_id)  # not before the caller commits
        conn.commit()
    assert exists(db, "shop_orders", order_id)
    ran_once(client, db, job_id, {"order": order_id})


@pytest.mark.parametrize("holder", sorted(SYNC_HOLDERS))
def test_sqlalchemy_rollback_leaves_neither_the_row_nor_the_job(engine, db, holder):
    with SYNC_HOLDERS[holder](engine) as conn:
        order_id = conn.execute(NEW_ORDER, {"email": "rollback@example.com"}).scalar_one()
        job_ids = leasework.enqueue_many(conn, [leasework.job("noop", {"n": n}) for n in range(3)])
        conn.rollback()
    assert not exists(db, "shop_orders", order_id)
    assert not any(exists(db, "jobs", j) for j in job_ids)


def test_sqlalchemy_an_error_inside_the_door_rolls_the_callers_block_back(engine, db):
    order_ids: list[int] = []
    with pytest.raises(DBAPIError, match="queue"):
        with Session(engine) as session, session.begin():
            order_ids.append(session.execute(NEW_ORDER, {"email": "e@example.com"}).scalar_one())
            leasework.enqueue(session, "echo", {}, queue=f"no-such-queue-{uuid.uuid4().hex[:6]}")
    assert not exists(db, "shop_orders", order_ids[0])


def test_sqlalchemy_a_conflicting_batch_is_undone_by_a_savepoint_the_rest_commits(engine, db):
    key, tag = f"door-{uuid.uuid4().hex}", uuid.uuid4().hex
    with Session(engine) as session:
        leasework.enqueue(session, "noop", {"first": True}, idempotency_key=key)
        order_id = session.execute(NEW_ORDER, {"email": "kept@example.com"}).scalar_one()
        batch = [leasework.job("noop", {"tag": tag, "n": n}) for n in range(3)]
        batch.append(leasework.job("noop", {"other": True}, idempotency_key=key))
        with pytest.raises(leasework.IdempotencyConflict):
            leasework.enqueue_many(session, batch)
        session.commit()
    assert exists(db, "shop_orders", order_id)
    count = db.execute("SELECT count(*) AS n FROM jobs WHERE payload->>'tag' = %s", (tag,))
    assert count.fetchone()["n"] == 0


def test_a_door_that_is_not_one_is_refused_saying_which_there_are(engine):
    with pytest.raises(TypeError, match="SQLAlchemy Session or Connection"):
        leasework.enqueue(object(), "noop")
    with engine.connect() as conn, pytest.raises(TypeError, match="enqueue_async"):
        asyncio.run(leasework.enqueue_async(conn, "noop"))
    assert sync_door(Session(engine)).database()[-1] == async_door_database_name()


def async_door_database_name() -> str:
    return DIRECT_DSN.rsplit("/", 1)[-1]


# ---------------------------------------------------------------- SQLAlchemy asyncio, asyncpg


def async_engine():
    return create_async_engine(f"postgresql+asyncpg://{URL_TAIL}")


def test_sqlalchemy_async_session_and_connection_commit_and_roll_back(client, db):
    async def app_code() -> tuple[list[Any], list[Any], list[Any]]:
        engine = async_engine()
        kept, dropped, orders = [], [], []
        try:
            async with AsyncSession(engine) as session:
                orders.append(
                    (await session.execute(NEW_ORDER, {"email": "s@example.com"})).scalar_one()
                )
                kept.append(await leasework.enqueue_async(session, "echo", {"door": "session"}))
                await session.commit()
            async with engine.connect() as conn:
                kept.append(await leasework.enqueue_async(conn, "echo", {"door": "connection"}))
                await conn.commit()
                orders.append(
                    (await conn.execute(NEW_ORDER, {"email": "r@example.com"})).scalar_one()
                )
                dropped.extend(await leasework.enqueue_many_async(conn, [leasework.job("noop")]))
                await conn.rollback()
        finally:
            await engine.dispose()
        return kept, dropped, orders

    kept, dropped, orders = asyncio.run(app_code())
    ran_once(client, db, kept[0], {"door": "session"})
    ran_once(client, db, kept[1], {"door": "connection"})
    assert exists(db, "shop_orders", orders[0]) and not exists(db, "shop_orders", orders[1])
    assert not exists(db, "jobs", dropped[0])


def test_sqlalchemy_async_an_error_inside_the_door_rolls_the_callers_block_back(db):
    async def app_code() -> list[int]:
        engine = async_engine()
        orders: list[int] = []
        try:
            with pytest.raises(DBAPIError, match="queue"):
                async with AsyncSession(engine) as session, session.begin():
                    result = await session.execute(NEW_ORDER, {"email": "e@example.com"})
                    orders.append(result.scalar_one())
                    await leasework.enqueue_async(session, "echo", {}, queue="no-such-queue-x1")
        finally:
            await engine.dispose()
        return orders

    (order_id,) = asyncio.run(app_code())
    assert not exists(db, "shop_orders", order_id)


def test_asyncpg_commit_rollback_error_and_savepoint(client, db):
    key, tag = f"door-{uuid.uuid4().hex}", uuid.uuid4().hex

    async def app_code() -> dict[str, Any]:
        conn = await asyncpg.connect(DIRECT_DSN)
        seen: dict[str, Any] = {}
        try:
            assert async_door(conn).database()[-1] == async_door_database_name()
            async with conn.transaction():  # commit
                seen["kept_order"] = await conn.fetchval(NEW_ORDER_ASYNCPG, "k@example.com")
                seen["kept"] = await leasework.enqueue_async(conn, "echo", {"door": "asyncpg"})
            tx = conn.transaction()  # rollback
            await tx.start()
            seen["dropped_order"] = await conn.fetchval(NEW_ORDER_ASYNCPG, "d@example.com")
            seen["dropped"] = await leasework.enqueue_async(conn, "noop", {})
            await tx.rollback()
            with pytest.raises(asyncpg.PostgresError, match="queue"):  # an error inside
                async with conn.transaction():
                    seen["error_order"] = await conn.fetchval(NEW_ORDER_ASYNCPG, "e@example.com")
                    await leasework.enqueue_async(conn, "noop", {}, queue="no-such-queue-x2")
            async with conn.transaction():  # a conflicting batch, undone by a savepoint
                await leasework.enqueue_async(conn, "noop", {}, idempotency_key=key)
                seen["savepoint_order"] = await conn.fetchval(NEW_ORDER_ASYNCPG, "s@example.com")
                batch = [leasework.job("noop", {"tag": tag}) for _ in range(2)]
                batch.append(leasework.job("noop", {"other": 1}, idempotency_key=key))
                with pytest.raises(leasework.IdempotencyConflict):
                    await leasework.enqueue_many_async(conn, batch)
        finally:
            await conn.close()
        return seen

    seen = asyncio.run(app_code())
    ran_once(client, db, seen["kept"], {"door": "asyncpg"})
    assert exists(db, "shop_orders", seen["kept_order"])
    assert not exists(db, "shop_orders", seen["dropped_order"])
    assert not exists(db, "jobs", seen["dropped"])
    assert not exists(db, "shop_orders", seen["error_order"])
    assert exists(db, "shop_orders", seen["savepoint_order"])
    count = db.execute("SELECT count(*) AS n FROM jobs WHERE payload->>'tag' = %s", (tag,))
    assert count.fetchone()["n"] == 0


# ------------------------------------------------------- the fence in the caller's transaction


def _held_twice(db) -> tuple[uuid.UUID, leasework.JobContext, leasework.JobContext]:
    """A job (due in an hour: no worker takes it) claimed twice, as the worker's claim writes
    it: the first attempt's fence is stale, the second holds the job."""
    job_id = leasework.enqueue(db, "noop", {}, delay=3600)

    def claim() -> leasework.JobContext:
        fence = db.execute(
            """UPDATE jobs SET status = 'running', fence = fence + 1, attempt = attempt + 1,
                      lease_owner = 'test', lease_expires_at = now() + interval '1 minute'
                WHERE id = %s RETURNING fence""",
            (job_id,),
        ).fetchone()["fence"]
        return leasework.JobContext(job_id, "noop", 1, 3, fence, "test")

    return job_id, claim(), claim()


def test_a_stale_attempts_write_through_a_sqlalchemy_session_is_refused_and_rolled_back(engine, db):
    job_id, stale, holder = _held_twice(db)
    email = f"{uuid.uuid4().hex}@fence.example"
    for ctx in (stale, holder):
        with pytest.raises(leasework.StaleFence) if ctx is stale else nullcontext():
            with Session(engine) as session, session.begin():
                session.execute(NEW_ORDER, {"email": email})
                ctx.confirm_fence(session)  # the last statement before the commit
    found = db.execute("SELECT count(*) AS n FROM shop_orders WHERE email = %s", (email,))
    assert found.fetchone()["n"] == 1  # the holder's write; the stale one rolled back
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        with pytest.raises(leasework.FenceUnavailable, match="inside the transaction"):
            holder.confirm_fence(conn)
    db.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (job_id,))


def test_a_stale_attempts_write_through_asyncpg_and_an_async_session_is_refused(db):
    job_id, stale, holder = _held_twice(db)
    email = f"{uuid.uuid4().hex}@fence.example"

    async def app_code() -> list[str]:
        refused: list[str] = []
        conn = await asyncpg.connect(DIRECT_DSN)
        engine = async_engine()
        try:
            for ctx in (stale, holder):
                try:
                    async with conn.transaction():
                        await conn.fetchval(NEW_ORDER_ASYNCPG, email)
                        await ctx.confirm_fence_async(conn)
                except leasework.StaleFence:
                    refused.append(f"asyncpg {ctx.fence}")
                try:
                    async with AsyncSession(engine) as session, session.begin():
                        await session.execute(NEW_ORDER, {"email": email})
                        await ctx.confirm_fence_async(session)
                except leasework.StaleFence:
                    refused.append(f"session {ctx.fence}")
            with pytest.raises(leasework.FenceUnavailable, match="inside the transaction"):
                await holder.confirm_fence_async(conn)  # no transaction open
        finally:
            await conn.close()
            await engine.dispose()
        return refused

    refused = asyncio.run(app_code())
    assert refused == [f"asyncpg {stale.fence}", f"session {stale.fence}"]
    found = db.execute("SELECT count(*) AS n FROM shop_orders WHERE email = %s", (email,))
    assert found.fetchone()["n"] == 2  # the holder's two writes, none of the stale attempt's
    db.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (job_id,))


def test_the_fence_is_refused_in_a_database_without_leaseworks_tables(stack):
    other = DIRECT_DSN.rsplit("/", 1)[0] + "/postgres"
    ctx = leasework.JobContext(uuid.uuid4(), "noop", 1, 3, 1, "test")
    with psycopg.connect(other) as conn:
        with pytest.raises(leasework.FenceUnavailable, match="no leasework tables"):
            ctx.confirm_fence(conn)
