"""A paused queue, seen from a chaos run: the windows the harness's ``queue_pause`` faults
held a queue paused (from the audit log, where each pause records the instant it took hold
and each resume its own), and the attempts of the run's jobs of that queue that started
inside one. The judge (:func:`chaos.judge.pauses_held`) requires none, and that the pause
held something back (jobs of the run created before the resume whose first attempt came
after it), so a pause that did nothing does not pass for one that held.

:func:`read_pauses` reads (blocking); :class:`PauseView` is pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from chaos.tables import run_like
from devstack.layout import POSTGRES_DIRECT_DSN

ACTOR = "chaos"  # chaos.nemeses.queues.ACTOR's name


@dataclass(frozen=True)
class PauseWindow:
    """One pause of ``queue``: from the instant it took hold to the resume (None: never
    resumed); the run's attempts of the queue's jobs that started inside it, and the run's
    jobs it held back (created before the resume, first started after it)."""

    queue: str
    paused_at: datetime
    resumed_at: datetime | None
    started_inside: list[str] = field(default_factory=list)  # job ids
    held_back: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "paused_at": self.paused_at.isoformat(),
            "resumed_at": None if self.resumed_at is None else self.resumed_at.isoformat(),
            "started_inside": self.started_inside,
            "held_back": self.held_back,
        }


@dataclass(frozen=True)
class PauseView:
    windows: tuple[PauseWindow, ...] = ()

    def cell(self) -> str:
        """The log's line."""
        if not self.windows:
            return "no pause"
        return "; ".join(
            f"{w.queue} paused {_span(w)}: {len(w.started_inside)} started inside, "
            f"{w.held_back} held back"
            for w in self.windows
        )

    def to_dict(self) -> dict[str, Any]:
        return {"windows": [w.to_dict() for w in self.windows]}


def _span(w: PauseWindow) -> str:
    if w.resumed_at is None:
        return "and never resumed"
    return f"{(w.resumed_at - w.paused_at).total_seconds():.1f}s"


def windows_of(entries: list[dict[str, Any]]) -> list[tuple[str, datetime, datetime | None]]:
    """(queue, paused_at, resumed_at) of each pause in ``entries`` (the audit log's
    ``queue-pause`` and ``queue-resume`` rows, in order; pure)."""
    windows: list[tuple[str, datetime, datetime | None]] = []
    open_: dict[str, datetime] = {}
    for e in entries:
        queue = e["target"].removeprefix("queue:")
        if e["action"] == "queue-pause":
            open_[queue] = datetime.fromisoformat(e["detail"]["paused_at"])
        elif queue in open_:
            resumed = datetime.fromisoformat(e["detail"]["resumed_at"])
            windows.append((queue, open_.pop(queue), resumed))
    windows += [(q, at, None) for q, at in open_.items()]
    return windows


def read_pauses(prefix: str, since: datetime) -> PauseView:
    """The harness's pauses since ``since`` and what they held (blocking)."""
    like = run_like(prefix)
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True, row_factory=dict_row) as conn:
        entries = conn.execute(
            "SELECT action, target, detail FROM audit_log WHERE actor = %s AND at >= %s "
            "AND action IN ('queue-pause', 'queue-resume') ORDER BY id",
            (ACTOR, since),
        ).fetchall()
        views = []
        for queue, paused_at, resumed_at in windows_of(entries):
            inside = conn.execute(
                "SELECT DISTINCT a.job_id::text AS id FROM attempts a "
                "JOIN jobs j ON j.id = a.job_id WHERE j.idempotency_key LIKE %s "
                "AND j.queue = %s AND a.started_at >= %s "
                "AND (%s::timestamptz IS NULL OR a.started_at < %s)",
                (like, queue, paused_at, resumed_at, resumed_at),
            ).fetchall()
            held = conn.execute(
                "SELECT count(*) AS n FROM jobs j WHERE j.idempotency_key LIKE %s "
                "AND j.queue = %s AND j.created_at < %s AND (SELECT min(a.started_at) "
                "FROM attempts a WHERE a.job_id = j.id) >= %s",
                (like, queue, resumed_at or paused_at, resumed_at or paused_at),
            ).fetchone()["n"]
            views.append(
                PauseWindow(queue, paused_at, resumed_at, [r["id"] for r in inside], int(held))
            )
    return PauseView(tuple(views))
