"""What a handler is given about the attempt it runs: :class:`JobContext`."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from leasework.downstream import Fence
from leasework.effects import Effect, EffectCall

# the worker name of an attempt leasework.testing runs (a rehearsal: see JobContext)
REHEARSAL_WORKER = "leasework.testing"


class Cancelled(Exception):
    """Raised by :meth:`JobContext.raise_if_cancelled` in a handler whose attempt was
    cancelled (its lease lost, its timeout passed, a cancel requested, the worker stopping):
    what the attempt came to is already decided, and nothing it returns counts."""


@dataclass
class JobContext:
    """The job and this attempt of it.

    ``fence`` is the attempt's fence token: it grows with every claim, so a third party that
    keeps the largest token it has seen can refuse a stale writer. ``fenced(fn)`` queues
    ``fn(conn)`` to run in the transaction that records the attempt's outcome: it commits only
    if the job succeeds *and* this attempt still holds the fence, so a database effect written
    this way happens at most once even when the handler body runs twice.
    """

    job_id: uuid.UUID
    type: str
    attempt: int
    max_attempts: int
    fence: int
    worker: str
    payload: Any = None  # the stored JSON, as sent; the handler's argument is the decoded one
    effects: list[Effect] = field(default_factory=list)
    timeout_seconds: float | None = None  # this attempt's own bound (None: not known)
    # leasework.testing's attempt, whose job has no row: the fence is confirmed as far as the
    # transaction and the database go, and a Django task leaves the test's connection alone
    rehearsal: bool = False
    # set when the attempt is cancelled; read by handlers that run outside the worker's loop
    # (a thread can only stop itself); not sent to a child process, which is killed instead
    _cancel: threading.Event = field(
        default_factory=threading.Event, init=False, repr=False, compare=False
    )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_cancel", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cancel = threading.Event()

    @property
    def cancelled(self) -> bool:
        """Whether this attempt was cancelled: a handler in a thread, which cannot be stopped
        from outside, should return (or :meth:`raise_if_cancelled`) when it turns true."""
        return self._cancel.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise :class:`Cancelled` if this attempt was cancelled."""
        if self._cancel.is_set():
            raise Cancelled(f"attempt {self.attempt} of job {self.job_id} was cancelled")

    def cancel(self) -> None:
        """Mark the attempt cancelled (the worker does, as it cancels the handler)."""
        self._cancel.set()

    @property
    def idempotency_key(self) -> str:
        """The same for every attempt of this job: hand it to third parties that deduplicate
        requests (payment providers, mail services), so a retried call takes effect once."""
        return f"leasework:{self.job_id}"

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def fence_headers(self) -> dict[str, str]:
        """``Leasework-Job-Id`` and ``Leasework-Fence`` for a call to a service that verifies
        the fence (:mod:`leasework.downstream`): it refuses the call of an attempt whose
        lease a newer one took. Check its answer with
        :func:`leasework.downstream.raise_if_stale`."""
        return Fence(self.job_id, self.fence).headers()

    def confirm_fence(self, conn: Any) -> None:
        """Confirm this attempt's fence in the transaction ``conn`` has open, your own (a
        Django connection, a SQLAlchemy ``Session`` or ``Connection``, a psycopg
        ``Connection``): call it as the last statement before the commit of a transaction that
        writes an effect through your own ORM. It locks the job's row until that commit (a
        newer claim of the job waits for it) and raises :class:`~leasework.StaleFence` unless
        this attempt still holds the job, so the effect commits only while the fence holds; a
        stale attempt's transaction fails and rolls back. :class:`~leasework.FenceUnavailable`
        outside a transaction, or in a database without leasework's tables. Unlike
        :meth:`fenced`, the effect commits with your transaction, not with the attempt's
        outcome: an attempt that fails after it is retried, and its retry writes again
        (``leasework.django.fenced_atomic`` wraps this for Django)."""
        from leasework.doors import confirm_fence

        confirm_fence(conn, self.job_id, self.fence, rehearsal=self.rehearsal)

    async def confirm_fence_async(self, conn: Any) -> None:
        """:meth:`confirm_fence` on an asyncio connection (a SQLAlchemy ``AsyncSession`` or
        ``AsyncConnection``, an asyncpg ``Connection``, a psycopg ``AsyncConnection``), in the
        asyncio lane."""
        from leasework.doors import confirm_fence_async

        await confirm_fence_async(conn, self.job_id, self.fence, rehearsal=self.rehearsal)

    def fenced(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
        """Run ``fn(conn, *args, **kwargs)`` (``conn`` a psycopg connection, rows as dicts)
        inside the fenced outcome transaction of this attempt. Returns ``fn``, so it also
        works as a decorator. In the process lane ``fn`` must be a module-level function (it
        travels back to the worker by pickle; a lambda or a nested function is refused)."""
        self.effects.append(EffectCall(fn, args, kwargs) if args or kwargs else fn)
        return fn
