"""Request bodies: strict JSON under a size limit, and the problems that refuse them.

The guard has already read the body under its route's cap (:mod:`leasework.api.limits`); what is
left to bound is the CPU of decoding and checking it, so a body over
:data:`~leasework.api.limits.OFFLOAD_BYTES` is decoded and checked in a worker thread
(:func:`off_loop`), never on the event loop, and a body that could hold more values than its
door allows is refused before it is decoded at all.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import trio
from quart import request

from leasework.api.limits import OFFLOAD_BYTES, PARSE_CONCURRENCY
from leasework.api.problems import Problem
from leasework.errors import FieldError
from leasework.jsonlimits import MalformedJSON, TooDeep, parse_json, structure_estimate

T = TypeVar("T")

_parsers = trio.CapacityLimiter(PARSE_CONCURRENCY)


async def off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: on the event loop for a small body of ``size`` bytes, else in a worker
    thread, at most PARSE_CONCURRENCY at once per process.

    In the thread, Python's cycle collector is held off (a decoded body is a tree, freed by
    reference counts; a million new containers would otherwise set off full collections that
    hold the GIL, and so the event loop, for tens of milliseconds each), and a refusal drops
    its traceback there, so the decoded body it refers to is freed in the thread, not on the
    loop."""
    if size <= OFFLOAD_BYTES:
        return fn(*args)
    return await trio.to_thread.run_sync(_in_thread, fn, args, limiter=_parsers)


_collector_holds = 0
_collector_lock = threading.Lock()


def _in_thread(fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    global _collector_holds
    with _collector_lock:
        if _collector_holds == 0:
            gc.disable()
        _collector_holds += 1
    try:
        return fn(*args)
    except Exception as exc:
        exc.__context__ = exc.__cause__ = None
        raise exc.with_traceback(None) from None
    finally:
        with _collector_lock:
            _collector_holds -= 1
            if _collector_holds == 0:
                gc.enable()


def invalid(errors: list[FieldError], what: str = "fix these fields and resubmit") -> Problem:
    names = ", ".join(dict.fromkeys(e.field for e in errors[:20]))
    return Problem(
        422,
        "invalid-fields",
        "Invalid fields",
        f"{what}: {names}; nothing was written",
        errors=[e.as_dict() for e in errors],
    )


async def json_body(limit: int, check: Callable[[Any], T]) -> T:
    """``check`` of the current Quart request's body as JSON (see :func:`parse_body`): both
    the decoding and the check run off the event loop when the body is large."""
    raw = await request.get_data(as_text=False)
    content_type = request.content_type

    def decode_and_check() -> T:
        return check(parse_body(content_type, raw, limit))

    return await off_loop(len(raw), decode_and_check)


def parse_body(
    content_type: str | None, raw: bytes, limit: int, max_values: int | None = None
) -> Any:
    """A request body as strict JSON; every refusal is a :class:`Problem`. With
    ``max_values``, a body whose :func:`~leasework.jsonlimits.structure_estimate` passes it is
    refused before it is decoded."""
    mimetype = (content_type or "").split(";", 1)[0].strip().lower()
    if mimetype != "application/json":
        raise Problem(
            415,
            "unsupported-media-type",
            "Unsupported media type",
            f"send JSON with Content-Type: application/json (got {content_type or 'none'})",
        )
    if len(raw) > limit:
        raise body_too_large(limit)
    if max_values is not None and structure_estimate(raw) > max_values:
        raise Problem(
            413,
            "body-too-complex",
            "Request body too complex",
            f"the body holds more than {max_values} values (counted by its commas, brackets "
            "and braces) before it is even decoded; send fewer jobs per batch or smaller "
            "payloads; nothing was written",
            limit_values=max_values,
        )
    try:
        return parse_json(raw)
    except TooDeep as exc:  # JSON, but beyond any field's limit: the body is the field
        raise invalid([FieldError("(body)", str(exc))]) from None
    except MalformedJSON as exc:
        raise Problem(
            400,
            "malformed-json",
            "Malformed JSON",
            f"the body is not valid JSON: {exc}; nothing was written",
        ) from None


def body_too_large(limit: int) -> Problem:
    return Problem(
        413,
        "body-too-large",
        "Request body too large",
        f"the body exceeds {limit} bytes, this endpoint's limit; send a smaller payload "
        "(store large data elsewhere and pass a reference), or split a batch; nothing was "
        "written",
        limit_bytes=limit,
    )
