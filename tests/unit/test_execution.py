"""One attempt of a handler, as the worker and leasework.testing run it (no servers)."""

from __future__ import annotations

import uuid

import trio
from pydantic import BaseModel

import leasework
from leasework.context import JobContext
from leasework.jsonlimits import MAX_RESULT_BYTES
from leasework.worker.execution import call_handler, encode_result

app = leasework.App("execution")


class Order(BaseModel):
    order_id: int


class Flaky(Exception):
    pass


@app.job("typed", permanent=(LookupError,))
async def typed(ctx: JobContext, payload: Order) -> dict:
    if payload.order_id == 0:
        raise KeyError("order 0")  # a LookupError: permanent by the type's policy
    if payload.order_id < 0:
        raise Flaky("try again")
    return {"order": payload.order_id, "attempt": ctx.attempt}


@app.job("huge")
async def huge(ctx: JobContext) -> str:
    return "x" * (MAX_RESULT_BYTES + 1)


@app.job("opaque")
async def opaque(ctx: JobContext) -> object:
    return object()


@app.job("sleepy")
async def sleepy(ctx: JobContext) -> None:
    await trio.sleep(10)


def context(payload=None, attempt=1) -> JobContext:
    return JobContext(uuid.uuid4(), "t", attempt, 5, 1, "w", payload=payload)


async def test_the_result_is_the_handlers_return_value_as_json():
    handled = await call_handler(app.get("typed"), context({"order_id": 7}, attempt=2))
    assert handled.ok and handled.result == {"order": 7, "attempt": 2}


async def test_a_payload_that_does_not_decode_is_permanent():
    handled = await call_handler(app.get("typed"), context({"order_id": "seven"}))
    assert handled.permanent and "payload.order_id" in handled.error


async def test_exceptions_are_permanent_only_by_policy():
    permanent = await call_handler(app.get("typed"), context({"order_id": 0}))
    assert permanent.permanent and permanent.error.startswith("KeyError")
    retried = await call_handler(app.get("typed"), context({"order_id": -1}))
    assert not retried.permanent and retried.error == "Flaky: try again"


async def test_a_result_too_large_or_without_json_form_is_a_clear_permanent_error():
    too_large = await call_handler(app.get("huge"), context())
    assert too_large.permanent and "over the 65536-byte limit" in too_large.error
    opaque_result = await call_handler(app.get("opaque"), context())
    assert opaque_result.permanent and "no JSON form" in opaque_result.error


async def test_cancellation_propagates_to_the_callers_scope():
    with trio.move_on_after(0.01) as scope:
        await call_handler(app.get("sleepy"), context())
    assert scope.cancelled_caught


def test_encode_result_accepts_models_and_refuses_unstorable_text():
    assert encode_result(Order(order_id=3)) == ({"order_id": 3}, None)
    assert encode_result(None) == (None, None)
    _, problem = encode_result({"text": "a\x00b"})
    assert "NUL" in problem


@app.job("calls-out", permanent=(Exception,))
async def calls_out(ctx: JobContext) -> None:
    raise leasework.StaleFence(ctx.job_id, ctx.fence, ctx.fence + 1)


async def test_a_service_refusing_the_fence_is_a_stale_attempt_even_where_all_is_permanent():
    """StaleFence is not the handler's failure: neither Permanent nor the type's classes."""
    handled = await call_handler(app.get("calls-out"), context())
    assert handled.stale and not handled.permanent
    assert handled.error is not None and "it has seen fence 2" in handled.error
