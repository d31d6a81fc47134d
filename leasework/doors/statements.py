"""The statements every door runs, in SQLAlchemy's named-parameter form (each door adapts
them), and the normalising of an insert's rows across drivers."""

from __future__ import annotations

import uuid
from typing import Any

from leasework.store import Inserted

JOBS_INSERT_TEXT = "SELECT * FROM leasework_jobs_insert(CAST(:rows AS jsonb), :topic) ORDER BY ord"
UNREGISTERED_TEXT = """SELECT r.name FROM unnest(CAST(:names AS text[])) AS r(name)
                       WHERE NOT EXISTS (SELECT 1 FROM job_types t WHERE t.name = r.name)"""
FENCE_TEXT = "SELECT fence, status FROM jobs WHERE id = CAST(:job_id AS uuid) FOR SHARE"
LEASEWORK_HERE_TEXT = "SELECT to_regproc('leasework_jobs_insert') IS NOT NULL AS here"


def inserted(row: Any) -> Inserted:
    """An insert's row as any driver returns it (psycopg2 gives a uuid as text and bytea as
    a memoryview; asyncpg gives a Record)."""
    values = dict(row)
    if not isinstance(values["id"], uuid.UUID):
        values["id"] = uuid.UUID(str(values["id"]))
    if values.get("unique_key") is not None:
        values["unique_key"] = bytes(values["unique_key"])
    return Inserted.from_row(values)


def checked(rows: list[Any], expected: int) -> list[Inserted]:
    found = [inserted(r) for r in rows]
    if len(found) != expected:
        raise RuntimeError(f"leasework_jobs_insert answered {len(found)} rows for {expected}")
    return found


__all__ = [
    "FENCE_TEXT",
    "JOBS_INSERT_TEXT",
    "LEASEWORK_HERE_TEXT",
    "UNREGISTERED_TEXT",
    "Inserted",
    "checked",
    "inserted",
]
