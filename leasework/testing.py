"""Test your own handlers without Kafka or Redis: one attempt, a real context, your Postgres.

::

    async def test_send_receipt(conn):          # a psycopg connection to your test database
        run = await leasework.testing.run_job(app, "send_receipt",
                                              {"order_id": 1, "email": "a@example.com"},
                                              conn=conn)
        assert run.status == "succeeded" and run.result == {"sent_to": "a@example.com"}

From synchronous test code (a ``unittest.TestCase``, a plain pytest test),
:func:`run_job_sync` does the same on a Trio loop of its own.

The payload takes the path it takes in production: checked against the type (and the store's
limits) as ``enqueue`` would, sent through a JSON round trip, decoded by the type's adapter.
The handler's fenced effects run on ``conn`` in a savepoint of its open transaction when the
attempt succeeds (they are undone, and the run is ``failed``, if one raises), so a test that
rolls its transaction back leaves nothing behind. Timeouts, permanent errors and the result's
size cap behave as in the worker. The job's own row is not written: ``ctx.job_id`` is made
up, and the fence is the one given.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
import trio

from leasework import store
from leasework.app import App, JobType
from leasework.context import REHEARSAL_WORKER, JobContext
from leasework.enqueue import job, prepare
from leasework.errors import LeaseworkError
from leasework.lanes import Lane
from leasework.states import Status
from leasework.worker.execution import HandlerResult, call_handler, describe
from leasework.worker.lanes import run_here


@dataclass(frozen=True)
class JobRun:
    """What one attempt came to. ``status`` is ``succeeded``, ``failed`` (the worker would
    retry it, or kill it after the last attempt) or ``dead`` (a permanent error)."""

    status: Status
    result: Any
    error: str | None
    ctx: JobContext
    effects_applied: int

    @property
    def succeeded(self) -> bool:
        return self.status == Status.SUCCEEDED


async def run_job(
    app: App,
    job_type: str,
    payload: Any = None,
    *,
    conn: psycopg.Connection | None = None,
    attempt: int = 1,
    max_attempts: int | None = None,
    fence: int = 1,
    timeout_seconds: float | None = None,
    job_id: uuid.UUID | None = None,
    same_thread: bool = False,
) -> JobRun:
    """Run one attempt of ``job_type`` of ``app`` with ``payload``. Raises
    :class:`~leasework.InvalidJob` where every door would refuse the request. ``conn`` is
    needed only by handlers that use ``ctx.fenced``. ``same_thread`` runs a ``thread``- or
    ``process``-lane handler in the calling thread (an ``asyncio`` one on a loop there), so it
    sees what that thread's database connection sees: a Django ``TestCase``'s open
    transaction. Its timeout is then not enforced (nothing can stop it in the calling
    thread)."""
    (row,) = prepare([job(job_type, payload)], app)
    definition = app.get(job_type)
    assert definition is not None, "prepare() refuses unknown types"
    stored = json.loads(json.dumps(row["payload"]))  # as jsonb gives it back
    ctx = JobContext(
        job_id=job_id or uuid.uuid4(),
        type=job_type,
        attempt=attempt,
        max_attempts=max_attempts or definition.max_attempts or 5,
        fence=fence,
        worker=REHEARSAL_WORKER,
        payload=stored,
        rehearsal=True,
    )
    limit = timeout_seconds or definition.timeout_seconds or 300
    handled: HandlerResult | None = None
    with trio.move_on_after(limit):
        handled = await call_handler(definition, ctx, in_this_thread if same_thread else run_here)
    if handled is None:
        return JobRun(Status.FAILED, None, f"timed out after {limit:g}s", ctx, 0)
    if not handled.ok:
        status = Status.DEAD if handled.permanent else Status.FAILED
        return JobRun(status, None, handled.error, ctx, 0)
    if ctx.effects:
        if conn is None:
            raise LeaseworkError(
                f"{job_type} wrote fenced effects (ctx.fenced); pass conn= to run them"
            )
        failure = await trio.to_thread.run_sync(store.effects_apply, conn, ctx.effects)
        if failure is not None:
            status = Status.DEAD if definition.is_permanent(failure) else Status.FAILED
            return JobRun(status, None, f"a fenced effect raised {describe(failure)}", ctx, 0)
    return JobRun(Status.SUCCEEDED, handled.result, None, ctx, len(ctx.effects))


async def in_this_thread(job_type: JobType, ctx: JobContext, args: tuple[Any, ...]) -> Any:
    """A handler run in the calling thread, whatever its lane (``same_thread``)."""
    if job_type.lane is Lane.TRIO:
        return await job_type.handler(*args)
    if job_type.lane is Lane.ASYNCIO:
        return asyncio.run(job_type.handler(*args))
    return job_type.handler(*args)


def run_job_sync(app: App, job_type: str, payload: Any = None, **options: Any) -> JobRun:
    """:func:`run_job` (the same arguments) from synchronous test code (a
    ``unittest.TestCase``, a plain pytest test): the attempt runs on a Trio loop of its own,
    in any lane, and returns when it is decided. Not from inside a running event loop (there,
    ``await run_job(...)``).

    ::

        def test_send_receipt(self):
            run = leasework.testing.run_job_sync(app, "send_receipt", {"order_id": 1})
            self.assertTrue(run.succeeded)
    """
    return trio.run(functools.partial(run_job, app, job_type, payload, **options))
