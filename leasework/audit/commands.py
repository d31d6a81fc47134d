"""``leasework audit [--since T] [--until T]``: the auditor's full check over a window, straight
in the database (``$LEASEWORK_POSTGRES_DSN``, read only), printed the way the chaos checker
prints a run. Every job that finished in the window (all of them, page by page, whatever the
auditor's watermark says), and the running and waiting jobs as they are now. Exit 0 when
nothing was found, 1 when something was (or the database could not be asked), 2 for bad
arguments."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg.rows import dict_row

from leasework import config
from leasework.audit import AuditReport, Violation
from leasework.store import audit as store_audit

PAGE = 5000


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit",
        help="check the promise over a window of finished jobs (effects, outcomes, attempts) "
        "and the running and waiting jobs now; exit 1 on any violation",
    )
    p.add_argument("--since", help="finished at or after: RFC 3339, or an age such as 2h (24h)")
    p.add_argument("--until", help="finished at or before: RFC 3339 or an age (now)")
    p.add_argument("--lease-grace", type=float, default=60.0, help="seconds past a lease (60)")
    p.add_argument(
        "--stuck-after", type=float, default=900.0, help="seconds due, published, unstarted"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def parse_moment(text: str, now: datetime) -> datetime:
    """An RFC 3339 time (naive means UTC), or an age before ``now``: ``90s``, ``15m``,
    ``2h``, ``7d``. Raises ValueError saying which forms it takes."""
    text = text.strip()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[-1:] in units and text[:-1].replace(".", "", 1).isdigit():
        return now - timedelta(seconds=float(text[:-1]) * units[text[-1]])
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an RFC 3339 time (2026-12-04T08:00:00Z) nor an age (15m, 2h)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def audit_window(
    conn: psycopg.Connection,
    since: datetime | None,
    until: datetime | None,
    *,
    lease_grace: float = 60.0,
    stuck_after: float = 900.0,
) -> AuditReport:
    """Check every job finished in ``since``..``until`` (page by page) and the running and
    waiting jobs now (``conn`` gives rows as dicts; nothing is written)."""
    after = store_audit.Watermark(since - timedelta(microseconds=1) if since else None)
    found: list[Violation]
    checked, found = 0, []
    while True:
        jobs, attempts = store_audit.finished_since(conn, after, until=until, limit=PAGE)
        checked += len(jobs)
        found += store_audit.finished_violations(conn, jobs, attempts)
        if len(jobs) < PAGE:
            break
        after = store_audit.Watermark(jobs[-1].finished_at, jobs[-1].id)
    found += store_audit.waiting_violations(
        conn, lease_grace=lease_grace, stuck_after=stuck_after, limit=PAGE
    )
    found += store_audit.vanished_between(conn, since, until)
    # (a tick's or a key's double is found from each of its jobs in the window: once each)
    unique = {(v.kind, v.job_id): v for v in found}
    return AuditReport(checked, since, until, tuple(unique.values()))


def _as_json(report: AuditReport) -> str:
    return json.dumps(
        {
            "jobs_checked": report.jobs_checked,
            "since": report.since.isoformat() if report.since else None,
            "until": report.through.isoformat() if report.through else None,
            "by_kind": report.by_kind(),
            "violations": [v.to_dict() for v in report.violations],
            "valid": report.valid,
        },
        indent=2,
    )


def run(args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    try:
        since = parse_moment(args.since or "24h", now)
        until = parse_moment(args.until, now) if args.until else None
    except ValueError as exc:
        print(f"leasework audit: {exc}", file=sys.stderr)
        return 2
    if until is not None and until < since:
        print("leasework audit: --until is before --since", file=sys.stderr)
        return 2
    try:
        settings = config.load("cli")
    except config.ConfigError as exc:
        print(f"leasework audit: invalid configuration: {exc}", file=sys.stderr)
        return 2
    try:
        with psycopg.connect(
            settings.postgres_dsn, row_factory=dict_row, connect_timeout=5
        ) as conn:
            conn.read_only = True
            report = audit_window(
                conn,
                since,
                until,
                lease_grace=args.lease_grace,
                stuck_after=args.stuck_after,
            )
    except psycopg.OperationalError as exc:
        print(
            f"leasework audit: cannot reach the database ({str(exc).strip()[:200]}); is the "
            "stack up (`just up`), is LEASEWORK_POSTGRES_DSN right?",
            file=sys.stderr,
        )
        return 1
    except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
        # (migration 0008's tables, or 0025's columns: what each attempt's claim applied)
        print(
            "leasework audit: the database's schema is older than this leasework "
            f"({str(exc).splitlines()[0]}); run `leasework migrate`",
            file=sys.stderr,
        )
        return 1
    print(_as_json(report) if args.json else report.text())
    return 0 if report.valid else 1
