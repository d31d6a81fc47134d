"""A handler's fenced effects: what ``ctx.fenced`` queues, run by the worker in the
transaction that records the attempt's outcome (pure declarations; no import of the rest)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

Effect = Callable[[psycopg.Connection], Any]


@dataclass(frozen=True)
class EffectCall:
    """``fn(conn, *args, **kwargs)``: an effect queued with its arguments, which pickles
    when ``fn`` is a module-level function (the process lane sends effects back this way)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self, conn: psycopg.Connection) -> Any:
        return self.fn(conn, *self.args, **self.kwargs)
