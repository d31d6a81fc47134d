"""Job handlers: async functions registered by type name, each given a :class:`JobContext`.

A handler's database effects go through ``ctx.fenced(fn)``: ``fn(conn)`` runs in the same
transaction as the job's outcome, which commits only while the worker's fence still holds.
A handler that raises fails the attempt (retried with backoff); :class:`PoisonPayload`
means the payload can never work, and the job goes straight to ``dead``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import trio

from leasework import store


class PoisonPayload(ValueError):
    """The payload cannot be handled by this handler, now or ever; retrying is pointless."""


@dataclass
class JobContext:
    job_id: uuid.UUID
    type: str
    payload: Any
    attempt: int
    max_attempts: int
    fence: int
    worker: str
    effects: list[Callable[[psycopg.Connection], None]] = field(default_factory=list)

    @property
    def idempotency_key(self) -> str:
        """Stable across attempts: hand it to third parties that deduplicate requests."""
        return f"leasework:{self.job_id}"

    def fenced(self, fn: Callable[[psycopg.Connection], None]) -> None:
        """Run ``fn(conn)`` inside the fenced terminal transaction of this attempt."""
        self.effects.append(fn)


Handler = Callable[[JobContext], Awaitable[None]]


@dataclass(frozen=True)
class Registered:
    handler: Handler
    validate: Callable[[Any], None]


REGISTRY: dict[str, Registered] = {}


def _accept_any(payload: Any) -> None:
    return None


def register(name: str, validate: Callable[[Any], None] = _accept_any):
    def decorate(fn: Handler) -> Handler:
        REGISTRY[name] = Registered(fn, validate)
        return fn

    return decorate


def _require_object(payload: Any) -> dict:
    if not isinstance(payload, dict):
        raise PoisonPayload(f"payload must be a JSON object, got {type(payload).__name__}")
    return payload


def _number(payload: dict, key: str, default: float, low: float, high: float) -> float:
    value = payload.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise PoisonPayload(f"payload.{key} must be a number in [{low}, {high}], got {value!r}")
    return float(value)


@register("noop")
async def noop(ctx: JobContext) -> None:
    return None


def _validate_sleep(payload: Any) -> None:
    _number(_require_object(payload), "seconds", 1.0, 0.0, 3600.0)


@register("sleep", _validate_sleep)
async def sleep(ctx: JobContext) -> None:
    await trio.sleep(_number(ctx.payload, "seconds", 1.0, 0.0, 3600.0))


class DeliberateFailure(RuntimeError):
    """Raised by the ``fail`` handler on purpose."""


def _validate_fail(payload: Any) -> None:
    _number(_require_object(payload), "times", 1, 0, 1000)


@register("fail", _validate_fail)
async def fail(ctx: JobContext) -> None:
    """Fails its first ``times`` attempts, then succeeds."""
    times = int(_number(ctx.payload, "times", 1, 0, 1000))
    if ctx.attempt <= times:
        raise DeliberateFailure(f"failing on purpose: attempt {ctx.attempt} of the first {times}")


def _validate_ledger(payload: Any) -> None:
    payload = _require_object(payload)
    _number(payload, "seconds", 0.0, 0.0, 3600.0)


@register("ledger", _validate_ledger)
async def ledger(ctx: JobContext) -> None:
    """Writes one effect row through the fenced transaction (after an optional sleep)."""
    seconds = _number(ctx.payload, "seconds", 0.0, 0.0, 3600.0)
    if seconds:
        await trio.sleep(seconds)
    data = {"attempt": ctx.attempt, "worker": ctx.worker}
    ctx.fenced(lambda conn: store.effect_insert(conn, ctx.job_id, ctx.fence, "ledger", data))


def lookup(job_type: str) -> Registered | None:
    return REGISTRY.get(job_type)


def metric_type(job_type: str) -> str:
    """The value of the ``type`` metric label: bounded to registered names."""
    return job_type if job_type in REGISTRY else "other"
