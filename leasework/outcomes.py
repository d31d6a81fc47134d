"""What an attempt came to, as the domain says it: an :class:`Outcome` (the status it moves
the job to, its error, retry delay or result) and a :class:`Completion` (that outcome under
the fence it was reached at, with the fenced effects it carries). The worker and the reaper
decide them; :mod:`leasework.store` writes them."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from leasework.backoff import retry_or_dead
from leasework.effects import Effect
from leasework.job import Job
from leasework.states import Status


@dataclass(frozen=True)
class Outcome:
    status: Status  # succeeded, failed (retry later), dead or cancelled
    error: str | None = None
    retry_in: float | None = None  # seconds, for failed
    result: Any = None  # JSON, for succeeded


@dataclass(frozen=True)
class Completion:
    """One attempt's outcome waiting for its fenced write: the job under ``fence``, what
    became of it, the handler's effects (applied only if the job succeeded and the fence
    holds), and what the outcome becomes if one of those effects raises."""

    job_id: uuid.UUID
    fence: int
    outcome: Outcome
    effects: tuple[Effect, ...] = ()
    effect_failed: Callable[[Exception], Outcome] | None = None


@dataclass(frozen=True)
class RetryDefaults:
    """The backoff of a job whose row carries none of its own (the settings')."""

    base: float
    cap: float


def retry_outcome(
    job: Job,
    error: str,
    defaults: RetryDefaults,
    *,
    permanent: bool = False,
    immediate: bool = False,
    after: float | None = None,
    rng: random.Random | None = None,
) -> Outcome:
    """``failed`` with the job's own backoff (else the defaults; ``after`` seconds when the
    handler asked for it), or ``dead``: the one decision for an attempt that did not succeed
    (the worker) and a lease that expired (the reaper)."""
    decision = retry_or_dead(
        job.attempt,
        job.max_attempts,
        job.retry_base or defaults.base,
        job.retry_cap or defaults.cap,
        permanent=permanent,
        immediate=immediate,
        rng=rng,
    )
    if after is not None and decision.status is Status.FAILED:
        decision = replace(decision, delay=after)
    return Outcome(decision.status, error, retry_in=decision.delay)
