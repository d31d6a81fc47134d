"""Retry delays: exponential backoff with full jitter (AWS architecture blog's 'Full Jitter')."""

from __future__ import annotations

import random
from dataclasses import dataclass

from leasework.states import Status


def retry_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before the attempt after ``attempt`` (1-based) failed.

    Uniform in ``[0, min(cap, base * 2 ** (attempt - 1))]``.
    """
    if attempt < 1:
        raise ValueError(f"attempt is 1-based, got {attempt}")
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 62))
    return (rng or random).uniform(0.0, ceiling)


@dataclass(frozen=True)
class RetryDecision:
    """What becomes of a job whose attempt did not succeed: ``failed`` with a delay before
    the next attempt, or ``dead``."""

    status: Status
    delay: float | None = None


def retry_or_dead(
    attempt: int,
    max_attempts: int,
    base: float,
    cap: float,
    *,
    permanent: bool = False,
    immediate: bool = False,
    rng: random.Random | None = None,
) -> RetryDecision:
    """The one retry-or-dead decision, for the worker (a failed attempt) and the reaper (an
    expired lease). ``permanent``: retrying cannot help; ``immediate``: the attempt was cut
    short by a shutdown, not by the job, so the retry need not wait."""
    if permanent or attempt >= max_attempts:
        return RetryDecision(Status.DEAD)
    delay = 0.0 if immediate else retry_delay(attempt, base, cap, rng)
    return RetryDecision(Status.FAILED, delay)
