"""Handlers and effects for the lane tests, at module level so that a child process of the
process lane can import them by name."""

from __future__ import annotations

import asyncio
import os
import time

import leasework


def add(ctx: leasework.JobContext, payload: dict) -> dict:
    ctx.fenced(record, payload["a"] + payload["b"])
    return {"sum": payload["a"] + payload["b"], "pid": os.getpid()}


def record(conn, value: int) -> int:  # an effect: called with the outcome's connection
    return value


def refuses(ctx: leasework.JobContext, payload: dict) -> None:
    raise leasework.Permanent(f"no: {payload}")


class Unpicklable(Exception):
    def __init__(self, a: int, b: int) -> None:  # two arguments: unpickles with one
        super().__init__(f"{a}/{b}")


def fails_oddly(ctx: leasework.JobContext) -> None:
    raise Unpicklable(1, 2)


def queues_a_lambda(ctx: leasework.JobContext) -> None:
    ctx.fenced(lambda conn: None)


def sleeps(ctx: leasework.JobContext, payload: dict) -> str:
    time.sleep(payload["seconds"])
    return "slept"


def spins(ctx: leasework.JobContext, payload: dict) -> int:
    """Pure-Python CPU work for ``seconds``."""
    end, n = time.monotonic() + payload["seconds"], 0
    while time.monotonic() < end:
        n += 1
    return n


async def on_asyncio(ctx: leasework.JobContext, payload: dict) -> dict:
    await asyncio.sleep(payload.get("seconds", 0.01))
    loop = asyncio.get_running_loop()
    return {"loop": type(loop).__name__}


def my_pid(ctx: leasework.JobContext) -> int:
    return os.getpid()


def retries_in_a_minute(ctx: leasework.JobContext) -> None:
    raise leasework.Retry(after=60, reason="the bank is closed")


app = leasework.App("lane-handlers")


@app.job("decorated", runs_in="process")
def decorated(ctx: leasework.JobContext, payload: dict) -> int:
    """Declared with the decorator: this module's ``decorated`` is the JobType, not the
    function, so a child finds the handler through the type."""
    return os.getpid()
