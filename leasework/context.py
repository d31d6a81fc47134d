"""What a handler is given about the attempt it runs: :class:`JobContext`."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from leasework.downstream import Fence

Effect = Callable[[psycopg.Connection], Any]


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

    def fenced(self, fn: Effect) -> Effect:
        """Run ``fn(conn)`` (a psycopg connection, rows as dicts) inside the fenced outcome
        transaction of this attempt. Returns ``fn``, so it also works as a decorator."""
        self.effects.append(fn)
        return fn
