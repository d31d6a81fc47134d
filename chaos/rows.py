"""The tables' rows as the checkers read them: a mapping or a tuple in the documented column
order, timestamps as aware datetimes; and the nearest-rank percentile the verdict reports."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any


def as_datetime(value: Any) -> datetime | None:
    """A timestamp from the tables: a datetime or an ISO 8601 string; naive means UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise ValueError(f"expected a timestamp, got {value!r}")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def row_of(row: Mapping[str, Any] | Sequence[Any], names: tuple[str, ...]) -> dict[str, Any]:
    """A table row given as a mapping, or as a tuple in the documented column order."""
    if isinstance(row, Mapping):
        missing = [n for n in names if n not in row]
        if missing:
            raise ValueError(f"row lacks {', '.join(missing)}: {dict(row)!r}")
        return {n: row[n] for n in names}
    if len(row) < len(names):
        raise ValueError(f"row {tuple(row)!r} has fewer columns than ({', '.join(names)})")
    return dict(zip(names, row, strict=False))


JOB_COLUMNS = ("id", "type", "status")
JOB_OPTIONAL = (
    "attempt",
    "max_attempts",
    "idempotency_key",
    "run_at",
    "started_at",
    "finished_at",
    "created_at",
    "last_error",
)
EFFECT_COLUMNS = ("job_id", "fence", "kind")  # fence None: the effect's writer records none
# job types whose success must come with exactly one effect, and that effect's kind
EFFECT_KINDS: dict[str, str] = {
    "ledger": "ledger",
    "send_receipt": "receipt",
    "keyed": "keyed",
    "rated": "rated",
    "ledger_thread": "ledger",
    "ledger_asyncio": "ledger",
    "ledger_process": "ledger",
}
ATTEMPT_COLUMNS = ("job_id", "attempt", "fence", "worker", "started_at", "outcome")


def job_of(row: Mapping[str, Any]) -> dict[str, Any]:
    job = row_of(row, JOB_COLUMNS)
    job.update({n: row.get(n) for n in JOB_OPTIONAL})
    job["id"] = str(job["id"])
    for name in ("run_at", "started_at", "finished_at", "created_at"):
        job[name] = as_datetime(job[name])
    return job


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (0 < p <= 100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]
