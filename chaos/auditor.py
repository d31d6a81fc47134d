"""The product's auditor, seen from a chaos run: the relay's auditor (leasework.relay.auditor)
runs through every scenario like any user's would; once the run is quiet, the harness waits
for its watermark to pass the run's last finished job and reads what it recorded about the
run's jobs. The judge then holds it to the checker's verdict (:func:`chaos.judge.auditor_agrees`):
nothing found in a fenced run, every job the checker found doubled found in an unsafe one.

:func:`read_auditor` reads (blocking); :class:`AuditorView` is pure.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from chaos.tables import run_like
from devstack.layout import POSTGRES_DIRECT_DSN
from leasework.states import TERMINAL

# the relay's auditor takes a job 5 s after it finished and passes every 5 s
WAIT_SECONDS = 30.0
# the kinds that say a job took effect, or recorded success, twice: the checker's doubled
DOUBLE_KINDS = ("effects_twice", "succeeded_twice")
# the kind that says a schedule's tick had more than one job: the tick checker's doubled
TICK_KINDS = ("tick_twice",)


@dataclass(frozen=True)
class AuditorView:
    """``reached``: the auditor's watermark passed the run's last finished job within
    ``waited`` seconds; ``violations``: what it recorded about the run's jobs (kind, job_id,
    detail)."""

    reached: bool
    waited: float
    violations: tuple[dict[str, str], ...] = ()

    def jobs(self, kinds: Collection[str] = ()) -> set[str]:
        return {v["job_id"] for v in self.violations if not kinds or v["kind"] in kinds}

    def by_kind(self) -> dict[str, int]:
        return dict(sorted(Counter(v["kind"] for v in self.violations).items()))

    def cell(self) -> str:
        """The summary table's column."""
        if not self.reached:
            return "not reached"
        if not self.violations:
            return "0 found"
        kinds = ", ".join(f"{k} {n}" for k, n in self.by_kind().items())
        return f"{len(self.jobs())} job(s): {kinds}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "reached": self.reached,
            "waited": round(self.waited, 1),
            "by_kind": self.by_kind(),
            "violations": list(self.violations),
        }


def read_auditor(prefix: str, *, wait: float = WAIT_SECONDS) -> AuditorView:
    """Wait (up to ``wait`` seconds) for the auditor's watermark to pass the run's last
    finished job (its idempotency keys, and its schedules' names, start with ``prefix``), then
    read its violations of the run's jobs."""
    started = time.monotonic()
    like = run_like(prefix)
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True, row_factory=dict_row) as conn:
        last = conn.execute(
            "SELECT max(finished_at) AS last FROM jobs "
            "WHERE (idempotency_key LIKE %s OR schedule LIKE %s) AND status = ANY(%s)",
            (like, like, [str(s) for s in TERMINAL]),
        ).fetchone()["last"]
        reached = False
        while True:
            row = conn.execute("SELECT finished_after FROM invariant_audit").fetchone()
            mark = row["finished_after"] if row else None
            reached = last is None or (mark is not None and mark >= last)
            if reached or time.monotonic() - started > wait:
                break
            time.sleep(0.5)
        rows = conn.execute(
            "SELECT v.kind, v.job_id::text AS job_id, v.detail FROM invariant_violations v "
            "JOIN jobs j ON j.id = v.job_id "
            "WHERE j.idempotency_key LIKE %s OR j.schedule LIKE %s ORDER BY v.id",
            (like, like),
        ).fetchall()
    return AuditorView(reached, time.monotonic() - started, tuple(dict(r) for r in rows))
