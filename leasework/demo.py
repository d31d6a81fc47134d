"""The demo app: built-in job types for tests, the chaos harness, the bench and the fencing
demonstration. Load it like any user app: ``LEASEWORK_APP=leasework.demo:app``.

* ``noop``: does nothing; any payload.
* ``sleep``: sleeps ``seconds``.
* ``fail``: fails its first ``times`` attempts, then succeeds; ``permanent: true`` raises
  :class:`leasework.Permanent` instead (no retry).
* ``ledger``: writes one row to ``effects`` through the fenced transaction, after an optional
  sleep: the chaos checker counts these rows.
* ``echo``: returns its payload as the job's result.
* ``keyed``: at most two run at once per ``key`` across all workers; sleeps ``seconds``,
  then writes an effect row saying when its handler began (the limits' chaos checker reads
  each effect's span: from that instant to the row's commit).
* ``rated``: at most five start per second per ``key`` across all workers; writes an
  effect row saying when its handler began.
"""

from __future__ import annotations

import time
from typing import Any

import trio
from pydantic import BaseModel, Field

from leasework.app import App
from leasework.context import JobContext
from leasework.errors import Permanent

app = App(name="leasework.demo")


@app.job("noop")
async def noop(ctx: JobContext) -> None:
    return None


class Sleep(BaseModel):
    seconds: float = Field(1.0, ge=0, le=3600)


@app.job("sleep")
async def sleep(ctx: JobContext, payload: Sleep) -> None:
    await trio.sleep(payload.seconds)


class DeliberateFailure(RuntimeError):
    """Raised by the ``fail`` job on purpose."""


class Fail(BaseModel):
    times: int = Field(1, ge=0, le=1000)
    permanent: bool = False


@app.job("fail")
async def fail(ctx: JobContext, payload: Fail) -> dict[str, int]:
    """Fails its first ``times`` attempts, then succeeds."""
    if ctx.attempt <= payload.times:
        message = f"failing on purpose: attempt {ctx.attempt} of the first {payload.times}"
        raise Permanent(message) if payload.permanent else DeliberateFailure(message)
    return {"succeeded_on_attempt": ctx.attempt}


class Ledger(BaseModel):
    seconds: float = Field(0.0, ge=0, le=3600)


def effect_insert(conn: Any, ctx: JobContext, kind: str, data: dict[str, Any]) -> None:
    from psycopg.types.json import Jsonb

    conn.execute(
        "INSERT INTO effects (job_id, fence, kind, data) VALUES (%s, %s, %s, %s)",
        (ctx.job_id, ctx.fence, kind, Jsonb(data)),
    )


@app.job("ledger")
async def ledger(ctx: JobContext, payload: Ledger) -> None:
    """Writes one effect row through the fenced transaction (after an optional sleep)."""
    if payload.seconds:
        await trio.sleep(payload.seconds)
    data = {"attempt": ctx.attempt, "worker": ctx.worker}
    ctx.fenced(lambda conn: effect_insert(conn, ctx, "ledger", data))


@app.job("echo")
async def echo(ctx: JobContext, payload: Any) -> Any:
    """Returns its payload: the job's result."""
    return payload


@app.job("notify", queue="emails")
async def notify(ctx: JobContext, payload: Any) -> Any:
    """Waits in the ``emails`` queue (its own Kafka topic and consumer group, served by the
    demo's workers beside ``default``); returns its payload."""
    return payload


class Keyed(BaseModel):
    key: str = Field(max_length=200)
    seconds: float = Field(0.0, ge=0, le=3600)


@app.job("keyed", concurrency=2, concurrency_key="key")
async def keyed(ctx: JobContext, payload: Keyed) -> None:
    """At most two run at once per ``key``; sleeps, then writes one fenced effect row."""
    began = time.time()
    if payload.seconds:
        await trio.sleep(payload.seconds)
    data = {"attempt": ctx.attempt, "worker": ctx.worker, "key": payload.key, "began": began}
    ctx.fenced(lambda conn: effect_insert(conn, ctx, "keyed", data))


class Rated(BaseModel):
    key: str = Field(max_length=200)


@app.job("rated", rate="5/s", rate_key="key")
async def rated(ctx: JobContext, payload: Rated) -> None:
    """At most five start per second per ``key``; writes one fenced effect row saying when
    its handler began."""
    began = time.time()
    data = {"attempt": ctx.attempt, "worker": ctx.worker, "key": payload.key, "began": began}
    ctx.fenced(lambda conn: effect_insert(conn, ctx, "rated", data))
