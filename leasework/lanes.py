"""Lanes: where a job type's handler runs in the worker, chosen per type with ``runs_in``.

- ``trio``: an ``async def`` on the worker's own Trio loop (the default for ``async def``).
  The cheapest lane, and the only one whose handler can block every other job of the worker:
  it must never block (no ``time.sleep``, no blocking client, no long CPU loop).
- ``thread``: a plain ``def`` in a thread of a bounded pool (the default for a plain ``def``):
  the code Python teams have (Django's ORM, ``requests``, ``boto3``, every Celery task). A
  blocking call blocks only its thread. Cancellation is cooperative: Python cannot stop a
  thread, so a cancelled handler is abandoned (its slot in the lane stays taken until it
  returns) and ``ctx.cancelled`` turns true, which a long handler can check
  (``ctx.raise_if_cancelled()``).
- ``asyncio``: an ``async def`` on a real asyncio loop the worker owns, in a thread of its
  own: asyncpg, aiohttp, SQLAlchemy's asyncio engine, ``redis.asyncio``. Waiting for a
  result holds no thread; a cancelled handler's task is cancelled (``CancelledError`` at its
  next ``await``).
- ``process``: a plain ``def`` in a pool of child processes (trio-parallel, started by
  ``spawn`` or a ``forkserver``, never ``fork``): CPU-bound work, and any code that holds
  the GIL. The handler, its payload, its result, its exceptions and the effects it queues
  with ``ctx.fenced`` cross between processes by pickle: module-level functions only (a
  lambda or a nested function does not pickle, and is refused when the type is declared or
  the effect returned). A cancelled handler's child is killed.

Pure declarations here (:class:`Lane`, :func:`lane_of`); the worker's side is
:mod:`leasework.worker.lanes`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from leasework.errors import AppError


class Lane(StrEnum):
    TRIO = "trio"
    THREAD = "thread"
    ASYNCIO = "asyncio"
    PROCESS = "process"


ASYNC_LANES = frozenset({Lane.TRIO, Lane.ASYNCIO})  # their handlers are ``async def``


def lane_of(name: str, handler: Callable[..., Any], runs_in: str | None) -> Lane:
    """The lane of job type ``name``: ``runs_in`` when given, else ``trio`` for an
    ``async def`` and ``thread`` for a plain ``def``. Refuses a handler of the wrong kind for
    its lane, and a process-lane handler that a child process cannot import."""
    is_async = inspect.iscoroutinefunction(handler)
    if runs_in is None:
        return Lane.TRIO if is_async else Lane.THREAD
    try:
        lane = Lane(runs_in)
    except ValueError:
        raise AppError(
            f"{name}: runs_in is one of {', '.join(repr(str(lane)) for lane in Lane)}, "
            f"got {runs_in!r}"
        ) from None
    if lane in ASYNC_LANES and not is_async:
        raise AppError(f"{name}: runs_in={lane.value!r} takes an async function (async def)")
    if lane not in ASYNC_LANES and is_async:
        raise AppError(
            f"{name}: runs_in={lane.value!r} takes a plain function (def); an async one runs "
            "in 'trio' or 'asyncio'"
        )
    if lane is Lane.PROCESS and (problem := unimportable(handler)) is not None:
        raise AppError(f"{name}: runs_in='process' {problem}")
    return lane


def unimportable(fn: Callable[..., Any]) -> str | None:
    """Why a child process could not import ``fn`` by its name (None: it can): a lambda, a
    function defined inside another, or one of ``__main__`` (a spawned child's ``__main__``
    is not the worker's)."""
    qualname = getattr(fn, "__qualname__", "")
    module = getattr(fn, "__module__", None)
    if not qualname or "<lambda>" in qualname:
        return "takes a module-level function: a lambda does not pickle to a child process"
    if "<locals>" in qualname:
        return (
            f"takes a module-level function: {qualname} is defined inside a function, so a "
            "child process cannot import it"
        )
    if module in (None, "__main__"):
        return (
            f"takes a function of an importable module: {qualname} is in __main__, which a "
            "child process does not share"
        )
    return None
