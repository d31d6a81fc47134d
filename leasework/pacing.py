"""Adaptive batching, written once: :class:`Pacer`.

Every stage of the pipeline that writes in batches (the relay's produce, the worker's
receive, the completer's fenced write) used to wait a fixed window after the first item of a
batch, so that a stream of items became few large writes. That window was paid by a lone job
too: three of them put some 60 ms between an idle stack's insert and the job's start.

A pacer makes the window an upper bound instead of a wait. It spaces the *starts* of a
stage's batches at least ``window`` seconds apart, and nothing more:

* when the stage is idle (its last batch started ``window`` ago or longer) the next item goes
  at once, with whatever else is already waiting;
* under load, items arriving while a batch is in flight, or within ``window`` of its start,
  wait for the next batch, which starts ``window`` after the last one started (at once, if
  the last one took longer than that). Batches grow with the arrival rate by themselves, as
  Nagle's algorithm grows segments, and each batch's fixed cost (a Kafka round trip to every
  broker, a transaction, a Redis call) is shared by the items the window gathered.

So a lone job never waits, a stream of ``r`` items per second costs at most ``1/window``
batches per second, and no item waits more than ``window`` plus the batch before it. The
clock is passed in, so the rule is tested without sleeping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Pacer:
    """When the next batch of one stage may start: at least ``window`` seconds after the
    start of the last one. Times are any monotonic clock's seconds."""

    window: float
    last_start: float = field(default=-math.inf)

    def __post_init__(self) -> None:
        if not self.window >= 0:
            raise ValueError(f"a pacer's window is a number of seconds >= 0, got {self.window}")

    def delay(self, now: float) -> float:
        """Seconds a batch whose first item is here at ``now`` waits before it starts: zero
        when the stage has been idle for a window, else what is left of the window."""
        return max(0.0, self.last_start + self.window - now)

    def started(self, now: float) -> None:
        """A batch started at ``now``."""
        self.last_start = now
