"""Rate limits (pure): what ``rate="10/s"`` means, a job's limit key, and the reservation
rule the Redis script (:mod:`leasework.ratelimit`) applies on Redis's clock.

A limit allows ``count`` starts per ``per`` seconds, so one every ``interval`` =
``per / count`` seconds, with up to ``burst`` of them at once after a quiet spell. The rule
is GCRA (the generic cell rate algorithm) with a reservation: each request is given the
earliest start the limit allows, ``max(tat - tau, now)``, and moves the limit's theoretical
arrival time ``tat`` one interval past ``max(tat, now)``; ``tau`` is ``(burst - 1)``
intervals. A request whose start is later than now waits for it; nothing asks again.

A limit whose state is missing (never used, expired while idle, or lost with Redis) starts
*empty*: ``tat = now + tau``, no burst, then one start per interval; and never before the
latest start already reserved for a waiting job (``floor``, read from Postgres), so a wipe
cannot hand out a promised slot twice. Over any window the starts stay within the steady
rate plus the burst. A limit's state is kept until it has been full again for
:data:`KEEP_FULL_MS` (so a burst is there after a quiet spell of up to that long).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

PER = {"s": 1.0, "m": 60.0, "h": 3600.0}
RATE_PATTERN = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*(s|m|h)\s*$")
KEEP_FULL_MS = 600_000  # how long a limit's state outlives its refill
RATE_RULE = "N/s, N/m or N/h (N starts per second, minute or hour), e.g. 10/s or 100/m"


@dataclass(frozen=True)
class Rate:
    """``count`` starts per ``per`` seconds, ``burst`` at once, per value of the payload
    field ``key`` (None: in all)."""

    count: int
    per: float
    burst: int = 1
    key: str | None = None

    @property
    def interval_ms(self) -> int:
        return max(1, math.ceil(self.per * 1000 / self.count))

    @property
    def tau_ms(self) -> int:
        return (self.burst - 1) * self.interval_ms

    def spec(self) -> dict[str, Any]:
        """The JSON registered in ``job_types.rate``."""
        return {"count": self.count, "per": self.per, "burst": self.burst, "key": self.key}

    def __str__(self) -> str:
        unit = {seconds: u for u, seconds in PER.items()}.get(self.per)
        text = f"{self.count}/{unit}" if unit else f"{self.count} per {self.per:g}s"
        return text + (f" (burst {self.burst})" if self.burst > 1 else "")


def parse_rate(text: object, burst: int = 1, key: str | None = None) -> Rate:
    """``"10/s"`` (or ``"100/m"``, ``"5/10s"``) as a :class:`Rate`; ``ValueError`` says
    what to write."""
    match = RATE_PATTERN.match(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"rate {text!r} is not {RATE_RULE}")
    count, multiple, unit = int(match[1]), int(match[2] or 1), match[3]
    if count < 1 or multiple < 1:
        raise ValueError(f"rate {text!r}: both numbers must be at least 1")
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ValueError(f"rate burst must be a whole number of at least 1, got {burst!r}")
    return Rate(count, multiple * PER[unit], burst, key)


def limit_key(job_type: str, payload: Any, rate: Rate) -> str:
    """The limit a job counts against: its type's name, and ``/`` and the key field's text
    when the limit names one (a missing field, or a payload that is no object, counts as
    the empty value)."""
    if rate.key is None:
        return job_type
    value = payload.get(rate.key) if isinstance(payload, dict) else None
    if value is None:
        text = ""
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, separators=(",", ":"))
    return f"{job_type}/{text}"


def reserve(tat: int | None, now: int, rate: Rate, floor: int | None) -> tuple[int, int]:
    """(the reserved start, the new ``tat``), all in ms: the script's rule, in Python for the
    tests. ``tat`` None: the state is missing, and ``floor`` is the latest reserved start
    Postgres keeps (None or 0: none)."""
    interval, tau = rate.interval_ms, rate.tau_ms
    if tat is None:
        tat = now + tau
        if floor:
            tat = max(tat, floor + tau + interval)
    start = max(tat - tau, now)
    return start, max(tat, now) + interval
