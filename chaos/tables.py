"""The run's rows, read straight from Postgres (the direct port, never the proxy, so toxics
never fool the harness), and ``tables.json``, the rows the checker saw, so that a run can be
checked again offline.

``jobs``, ``effects`` and ``attempts`` of the run's jobs (those whose Idempotency-Key starts
with the run's prefix), and the example shop's orders and mail ledger (:mod:`chaos.shop`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from chaos.shop import email_effects, read_shop, receipt_effects
from devstack.layout import POSTGRES_DIRECT_DSN
from leasework.states import TERMINAL, Status

TABLES_JSON = "tables.json"


def like_escaped(text: str) -> str:
    """``text`` matched literally in a LIKE pattern (``\\``, ``%`` and ``_`` escaped)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def run_like(prefix: str) -> str:
    """The LIKE pattern of the idempotency keys of a run's jobs."""
    return like_escaped(prefix) + "-%"


def pending_jobs(prefix: str, schedules: Sequence[str] = ()) -> dict[str, int]:
    """Jobs of the run that are not terminal yet, by status (blocking): the workload's, and
    those the run's ``schedules`` inserted."""
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT status, count(*) AS n FROM jobs WHERE idempotency_key LIKE %s GROUP BY status",
            (run_like(prefix),),
        ).fetchall()
        if schedules:  # the partial index of a schedule's unfinished jobs
            rows += conn.execute(
                "SELECT status, count(*) AS n FROM jobs WHERE schedule = ANY(%s) "
                "AND status = ANY(%s) GROUP BY status",
                (list(schedules), [str(s) for s in Status if s not in TERMINAL]),
            ).fetchall()
    pending: dict[str, int] = {}
    for r in rows:
        if r["status"] not in TERMINAL:
            pending[r["status"]] = pending.get(r["status"], 0) + r["n"]
    return pending


def read_tables(prefix: str) -> dict[str, list[dict[str, Any]]]:
    """The run's rows of ``jobs``, ``effects`` and ``attempts``, and of the example shop's
    tables (:func:`chaos.shop.read_shop`; blocking). ``effects`` holds, after the rows of the
    ``effects`` table, one row of kind ``receipt`` per receipt recorded on an order of the
    run and one of kind ``email`` per email the mail service sent for a job of the run
    (:mod:`chaos.shop`), so a receipt recorded twice, or a receipt emailed twice, is a
    doubled effect."""
    like = run_like(prefix)
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True, row_factory=dict_row) as conn:
        jobs = conn.execute(
            "SELECT id::text AS id, type, status, attempt, max_attempts, idempotency_key, "
            "run_at, started_at, finished_at, created_at, last_error "
            "FROM jobs WHERE idempotency_key LIKE %s ORDER BY created_at, id",
            (like,),
        ).fetchall()
        effects = conn.execute(
            "SELECT e.job_id::text AS job_id, e.fence, e.kind FROM effects e "
            "JOIN jobs j ON j.id = e.job_id WHERE j.idempotency_key LIKE %s ORDER BY e.id",
            (like,),
        ).fetchall()
        attempts = conn.execute(
            "SELECT a.job_id::text AS job_id, a.attempt, a.fence, a.worker, a.started_at, "
            "a.outcome FROM attempts a JOIN jobs j ON j.id = a.job_id "
            "WHERE j.idempotency_key LIKE %s ORDER BY a.id",
            (like,),
        ).fetchall()
        shop = read_shop(conn, like)
    effects += receipt_effects(shop["shop_orders"]) + email_effects(shop["shop_emails"])
    return {"jobs": jobs, "effects": effects, "attempts": attempts, **shop}


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"not JSON serialisable: {value!r}")


def save_tables(path: Path, tables: Mapping[str, Any], run_started_at: datetime) -> None:
    data = {"run_started_at": run_started_at.isoformat(), **tables}
    path.write_text(json.dumps(data, default=jsonable) + "\n", encoding="utf-8")


def load_tables(path: Path) -> dict[str, Any]:
    """``tables.json`` of a report directory: run_started_at, jobs, effects (receipts
    included), attempts, and the shop's shop_orders, shop_mail, shop_emails and
    shop_mail_refused (absent in older reports)."""
    return json.loads(path.read_text(encoding="utf-8"))
