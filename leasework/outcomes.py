"""What an attempt came to, as the domain says it: an :class:`Outcome` (the status it moves
the job to, its error, retry delay or result) and a :class:`Completion` (that outcome under
the fence it was reached at, with the fenced effects it carries). The worker and the reaper
decide them; :mod:`leasework.store` writes them."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from leasework.context import Effect
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
