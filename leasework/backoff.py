"""Retry delays: exponential backoff with full jitter (AWS architecture blog's 'Full Jitter')."""

from __future__ import annotations

import random


def retry_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before the attempt after ``attempt`` (1-based) failed.

    Uniform in ``[0, min(cap, base * 2 ** (attempt - 1))]``.
    """
    if attempt < 1:
        raise ValueError(f"attempt is 1-based, got {attempt}")
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 62))
    return (rng or random).uniform(0.0, ceiling)
