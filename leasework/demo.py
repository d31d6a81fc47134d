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
* ``ledger_thread``, ``ledger_asyncio``, ``ledger_process``: ``ledger`` in the thread lane (a
  plain function, ``time.sleep``), the asyncio lane (``asyncio.sleep``) and the process lane
  (pure-Python CPU work for ``seconds``): one fenced effect row each, naming the lane.
* ``block_trio``, ``block_thread``, ``block_asyncio``, ``block_process``: badly behaved code
  in each lane, for the lanes' matrix: ``how`` is ``sleep`` (``time.sleep``), ``spin`` (a
  pure-Python loop) or ``gil`` (one C call that holds the GIL: ``sum(range(n))``), for
  ``seconds``; then one fenced effect row.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Literal

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


# ------------------------------------------------------------------ the lanes (leasework.lanes)


def _ledger_data(ctx: JobContext, lane: str) -> dict[str, Any]:
    return {"attempt": ctx.attempt, "worker": ctx.worker, "lane": lane, "pid": os.getpid()}


@app.job("ledger_thread")
def ledger_thread(ctx: JobContext, payload: Ledger) -> None:
    """``ledger`` as a plain function in the thread lane: blocks its thread for ``seconds``."""
    if payload.seconds:
        time.sleep(payload.seconds)
    ctx.fenced(effect_insert, ctx, "ledger", _ledger_data(ctx, "thread"))


@app.job("ledger_asyncio", runs_in="asyncio")
async def ledger_asyncio(ctx: JobContext, payload: Ledger) -> None:
    """``ledger`` on the asyncio lane's loop: ``asyncio.sleep`` for ``seconds``."""
    if payload.seconds:
        await asyncio.sleep(payload.seconds)
    ctx.fenced(effect_insert, ctx, "ledger", _ledger_data(ctx, "asyncio"))


@app.job("ledger_process", runs_in="process")
def ledger_process(ctx: JobContext, payload: Ledger) -> None:
    """``ledger`` in a child process: pure-Python CPU work for ``seconds`` (it holds the
    GIL of its own process only)."""
    end = time.monotonic() + payload.seconds
    while time.monotonic() < end:
        pass
    ctx.fenced(effect_insert, ctx, "ledger", _ledger_data(ctx, "process"))


@app.job("noop_thread")
def noop_thread(ctx: JobContext) -> None:
    """``noop`` in the thread lane (the bench's lanes row compares the lanes' overheads)."""


@app.job("noop_asyncio", runs_in="asyncio")
async def noop_asyncio(ctx: JobContext) -> None:
    """``noop`` on the asyncio lane's loop."""


@app.job("noop_process", runs_in="process")
def noop_process(ctx: JobContext) -> None:
    """``noop`` in a child process."""


class Block(BaseModel):
    how: Literal["sleep", "spin", "gil"] = "sleep"
    seconds: float = Field(1.0, ge=0, le=600)


_SUMMED_PER_SECOND: list[float] = []  # sum(range(n)) speed, measured once per process


def _gil_rate() -> float:
    if not _SUMMED_PER_SECOND:
        n, began = 2_000_000, time.perf_counter()
        sum(range(n))
        _SUMMED_PER_SECOND.append(n / max(time.perf_counter() - began, 1e-6))
    return _SUMMED_PER_SECOND[0]


def block(how: str, seconds: float) -> None:
    """Misbehave for ``seconds``: sleep, spin in Python (the GIL changes hands every 5 ms),
    or hold the GIL in a single C call (no other thread of the process runs meanwhile)."""
    if how == "sleep":
        time.sleep(seconds)
    elif how == "spin":
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    else:
        sum(range(int(_gil_rate() * seconds)))


def _blocked(ctx: JobContext, lane: str) -> None:
    ctx.fenced(effect_insert, ctx, "ledger", _ledger_data(ctx, lane))


@app.job("block_trio", runs_in="trio")
async def block_trio(ctx: JobContext, payload: Block) -> None:
    """Blocks the worker's own loop (what the trio lane must never do)."""
    block(payload.how, payload.seconds)
    _blocked(ctx, "trio")


@app.job("block_thread", runs_in="thread")
def block_thread(ctx: JobContext, payload: Block) -> None:
    block(payload.how, payload.seconds)
    _blocked(ctx, "thread")


@app.job("block_asyncio", runs_in="asyncio")
async def block_asyncio(ctx: JobContext, payload: Block) -> None:
    """Blocks the asyncio lane's loop."""
    block(payload.how, payload.seconds)
    _blocked(ctx, "asyncio")


@app.job("block_process", runs_in="process")
def block_process(ctx: JobContext, payload: Block) -> None:
    block(payload.how, payload.seconds)
    _blocked(ctx, "process")
