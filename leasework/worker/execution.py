"""Running one attempt of a handler and turning what happened into an outcome.

The worker and :mod:`leasework.testing` share this, so a user's test sees exactly what
production does: the payload decoded by the type's adapter, permanent errors classified by
the type's policy, the result encoded to JSON under the size cap.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pydantic
import pydantic_core

from leasework.app import JobType, pydantic_field_errors
from leasework.context import JobContext
from leasework.errors import Retry, StaleFence
from leasework.jsonlimits import MAX_RESULT_BYTES, storable_errors
from leasework.worker.lanes import ChildFailure, run_here

ERROR_CHARS = 2000


@dataclass(frozen=True)
class HandlerResult:
    """What one call of a handler came to: a JSON ``result``, or an ``error`` message that is
    ``permanent`` (no retry) or not."""

    result: Any = None
    error: str | None = None
    permanent: bool = False
    stale: bool = False  # a service refused the attempt's fence (leasework.StaleFence)
    retry_after: float | None = None  # the handler asked for its retry then (leasework.Retry)

    @property
    def ok(self) -> bool:
        return self.error is None


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]


def decode_payload(job_type: JobType, payload: Any) -> tuple[Any, str | None]:
    """(the handler's payload argument, None) or (None, why it cannot be decoded)."""
    try:
        return job_type.decode(payload), None
    except pydantic.ValidationError as exc:
        fields = "; ".join(f"{e.field}: {e.message}" for e in pydantic_field_errors(exc, "payload"))
        return None, f"payload does not fit type {job_type.name!r}: {fields}"[:ERROR_CHARS]


def encode_result(value: Any, limit: int = MAX_RESULT_BYTES) -> tuple[Any, str | None]:
    """(the handler's return value as JSON, None) or (None, why it cannot be stored)."""
    if value is None:
        return None, None
    try:
        jsonable = pydantic_core.to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as exc:
        return None, f"the handler returned a {type(value).__name__}, which has no JSON form: {exc}"
    problems = storable_errors(jsonable, "result")
    if problems:
        return (
            None,
            f"the handler's result cannot be stored: {problems[0].field} {problems[0].message}",
        )
    size = len(json.dumps(jsonable, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limit:
        return None, (
            f"the handler's result is {size} bytes as JSON, over the {limit}-byte limit; return "
            "a reference (an id, a URL) to data stored elsewhere"
        )
    return jsonable, None


Runner = Callable[[JobType, JobContext, tuple[Any, ...]], Awaitable[Any]]


async def call_handler(
    job_type: JobType, ctx: JobContext, runner: Runner = run_here
) -> HandlerResult:
    """Decode ``ctx.payload``, run the handler in its lane (``runner``: the worker's
    :meth:`Lanes.run`, or :func:`run_here` without a worker), encode its result.
    Cancellation propagates (the caller's scopes decide what a cancelled attempt means);
    every other exception is the attempt's outcome. A payload that does not decode and a
    result that cannot be stored are permanent: retrying would give the same answer."""
    if job_type.takes_payload:
        unreadable = storable_errors(ctx.payload)  # stored past the checks of every door
        if unreadable:
            first = unreadable[0]
            return HandlerResult(
                error=f"the stored payload cannot be read back: {first.field} {first.message}",
                permanent=True,
            )
        payload, problem = decode_payload(job_type, ctx.payload)
        if problem is not None:
            return HandlerResult(error=problem, permanent=True)
        args: tuple[Any, ...] = (ctx, payload)
    else:
        args = (ctx,)
    try:
        value = await runner(job_type, ctx, args)
    except StaleFence as exc:  # not the handler's failure: a newer attempt holds the job
        return HandlerResult(error=describe(exc), stale=True)
    except Retry as asked:
        return HandlerResult(error=str(asked), retry_after=asked.after)
    except ChildFailure as failure:  # the process lane's: judged in the child already
        return HandlerResult(
            error=failure.description,
            permanent=failure.permanent,
            stale=failure.stale,
            retry_after=failure.retry_after,
        )
    except Exception as exc:  # a handler's failure is the attempt's outcome
        return HandlerResult(error=describe(exc), permanent=job_type.is_permanent(exc))
    result, problem = encode_result(value)
    if problem is not None:
        return HandlerResult(error=problem, permanent=True)
    return HandlerResult(result=result)
