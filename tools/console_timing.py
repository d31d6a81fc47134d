"""``python -m tools.console_timing --rows 1000000``: the console's and ``GET /jobs``'s
queries on a big jobs table.

It makes a database of its own on the stack's Postgres (``leasework_big``, never the stack's
``leasework``), migrates it, fills ``jobs`` with ``--rows`` rows in one ``INSERT ... SELECT
generate_series`` per chunk (a fixed mix of types and states: mostly succeeded over the last
week, some dead and cancelled, a few waiting and running in the last minutes, scheduled ones
due in the next day), then ``VACUUM (ANALYZE)`` as autovacuum would. Then it calls the real
store functions, each in a transaction of its own as :meth:`leasework.db.Database.run` does:
every query the overview runs, and the jobs page and ``GET /jobs`` under each filter they
offer (status, type, both, a created or finished window, a next page), one warm-up call and
``--runs`` timed calls each. For every statement a call ran it also asks Postgres for the
plan (``EXPLAIN (FORMAT JSON)`` with the same parameters) and names its top node and the
scans of ``jobs``. Prints a table, writes ``reports/console-timing/<UTC time>/report.md``,
and drops the database unless ``--keep`` (``--reuse`` measures a kept one again).

The exit status is 1 when a plan reads ``jobs`` with a sequential scan, else 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from devstack.layout import POSTGRES_DIRECT_DSN
from leasework import migrate, store
from leasework.db import CONNECT_KWARGS, configure
from leasework.store import console, operators
from leasework.store.console import JobFilter
from tools import console_pages
from tools.conformance import database_dsn, drop_database, recreate_database

DATABASE = "leasework_big"
CHUNK = 200_000  # rows per INSERT ... SELECT

# (type, share of the rows, share of its finished runs that end dead); the last two are
# types no app registers any more (what a rolling deploy leaves behind)
TYPES = (
    ("send_receipt", 0.30, 0.01),
    ("noop", 0.20, 0.0),
    ("echo", 0.14, 0.0),
    ("ledger", 0.14, 0.005),
    ("sleep", 0.10, 0.0),
    ("fail", 0.06, 0.4),
    ("report.nightly", 0.04, 0.02),
    ("legacy.import", 0.02, 0.05),
)
REGISTERED = [name for name, _, _ in TYPES[:-1]]
# states of the rows that are not finished, as shares of all rows
WAITING = (("queued", 0.02), ("running", 0.0002), ("failed", 0.004), ("scheduled", 0.03))
CANCELLED = 0.01  # share of the finished rows


def _type_case() -> str:
    """A CASE choosing the type from ``r_type`` (uniform in [0, 1)) by the shares above."""
    arms, edge = [], 0.0
    for name, share, _ in TYPES[:-1]:
        edge += share
        arms.append(f"WHEN r_type < {edge:.6f} THEN '{name}'")
    return f"CASE {' '.join(arms)} ELSE '{TYPES[-1][0]}' END"


def _status_case() -> str:
    """A CASE choosing the state from ``r_status`` and the type's dead share."""
    arms, edge = [], 0.0
    for status, share in WAITING:
        edge += share
        arms.append(f"WHEN r_status < {edge:.6f} THEN '{status}'")
    dead = " ".join(f"WHEN '{name}' THEN {share}" for name, _, share in TYPES)
    finished = f"(r_status - {edge:.6f}) / {1 - edge:.6f}"  # uniform again in [0, 1)
    arms.append(f"WHEN {finished} < {CANCELLED} THEN 'cancelled'")
    arms.append(f"WHEN {finished} < {CANCELLED} + (CASE type {dead} END) THEN 'dead'")
    return f"CASE {' '.join(arms)} ELSE 'succeeded' END"


FILL = f"""
WITH g AS (
    SELECT n, random() AS r_type, random() AS r_status, random() AS r_age, random() AS r_run
    FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n),
typed AS (SELECT g.*, {_type_case()} AS type FROM g),
rows AS (SELECT typed.*, {_status_case()} AS status FROM typed),
timed AS (
    SELECT rows.*,
           CASE WHEN status IN ('succeeded', 'dead', 'cancelled')
                THEN now() - r_age * interval '7 days'
                WHEN status = 'scheduled' THEN now() - r_age * interval '1 day'
                ELSE now() - r_age * interval '10 minutes' END AS created
    FROM rows)
INSERT INTO jobs (id, type, payload, status, run_at, attempt, max_attempts, attempt_budget,
                  timeout_seconds, fence, last_error, result, created_at, updated_at,
                  started_at, finished_at, lease_owner, lease_expires_at)
SELECT gen_random_uuid(), type,
       jsonb_build_object('order_id', n, 'email', 'customer' || n || '@example.com'),
       status,
       CASE WHEN status = 'scheduled' THEN now() + r_run * interval '1 day'
            ELSE created END,
       CASE status WHEN 'dead' THEN 5 WHEN 'scheduled' THEN 0 WHEN 'queued' THEN 0
                   WHEN 'cancelled' THEN 0 ELSE 1 END,
       5, 5, 300, n,
       CASE WHEN status IN ('dead', 'failed') THEN 'RuntimeError: boom' END,
       CASE WHEN status = 'succeeded' THEN jsonb_build_object('ok', true) END,
       created, created + r_run * interval '5 seconds',
       CASE WHEN status IN ('succeeded', 'dead', 'running', 'failed')
            THEN created + r_run * interval '1 second' END,
       CASE WHEN status IN ('succeeded', 'dead', 'cancelled')
            THEN created + r_run * interval '5 seconds' END,
       CASE WHEN status = 'running' THEN 'worker-' || (n %% 2 + 1) END,
       CASE WHEN status = 'running' THEN now() + interval '10 seconds' END
FROM timed
"""


def fill(dsn: str, rows: int) -> float:
    """Migrate and fill the database; returns the seconds the fill took."""
    migrate.apply_all(dsn)
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        conn.execute("SELECT setseed(0.16)")
        types = [{"name": name} for name in REGISTERED]
        store.job_types_register(conn, types, "console-timing")
        for first in range(1, rows + 1, CHUNK):
            last = min(rows, first + CHUNK - 1)
            conn.execute(FILL, {"first": first, "last": last})
            print(f"  {last:>10,} rows ({time.perf_counter() - started:.0f} s)", flush=True)
        conn.execute(
            "INSERT INTO workers (name, app, started_at, last_seen, running, capacity) "
            "VALUES ('worker-1', 'x', now(), now(), 3, 64), ('worker-2', 'x', now(), now(), 2, 64)"
        )
        conn.execute("VACUUM (ANALYZE) jobs")
        conn.execute("VACUUM (ANALYZE)")
    return time.perf_counter() - started


# ---------------------------------------------------------------- measuring


class Recording:
    """A connection that notes each statement a store function runs (to EXPLAIN it later)
    and passes everything through."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.statements: list[tuple[str, Any]] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> psycopg.Cursor:
        self.statements.append((query, params))
        return self.conn.execute(query, params, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


@dataclass
class Case:
    name: str
    call: Callable[[Any], Any]
    group: str = "jobs page"
    times_ms: list[float] = field(default_factory=list)
    rows: int = 0
    plans: list[dict[str, Any]] = field(default_factory=list)


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def jobs_scans(plan: dict[str, Any]) -> list[str]:
    """Each node of ``plan`` that reads the jobs table (or its indexes), in words (pure)."""
    found = []
    for node in _nodes(plan):
        if node.get("Relation Name") == "jobs" or str(node.get("Index Name", "")).startswith(
            "jobs_"
        ):
            index = node.get("Index Name")
            found.append(f"{node['Node Type']} using {index}" if index else node["Node Type"])
    return found


def discarded(plan: dict[str, Any]) -> int:
    """Rows of jobs that ``plan`` (an EXPLAIN ANALYZE) read and threw away: what its filters
    and bitmap rechecks removed, over every loop (pure). An index that serves the filter
    leaves next to none; walking another one, or the table, leaves many."""
    total = 0.0
    for node in _nodes(plan):
        if node.get("Relation Name") == "jobs":
            removed = node.get("Rows Removed by Filter", 0) + node.get(
                "Rows Removed by Index Recheck", 0
            )
            total += removed * node.get("Actual Loops", 1)
    return round(total)


def top_node(plan: dict[str, Any]) -> str:
    """The plan's top node, with its index when it has one (pure)."""
    index = plan.get("Index Name")
    return f"{plan['Node Type']} ({index})" if index else plan["Node Type"]


def cases(now: datetime) -> list[Case]:
    """Every query the overview runs, and the jobs page (and GET /jobs) under each filter."""
    hour, day = now - timedelta(hours=1), now - timedelta(days=1)

    def page(**kwargs: Any) -> Callable[[Any], Any]:
        return lambda c: console.jobs_page(c, JobFilter(**kwargs), before=None, limit=51)

    def second_page(**kwargs: Any) -> Callable[[Any], Any]:
        def call(c: Any) -> Any:
            first = console.jobs_page(c, JobFilter(**kwargs), before=None, limit=51)
            last = first[49]
            return console.jobs_page(
                c, JobFilter(**kwargs), before=(last.created_at, last.id), limit=51
            )

        return call

    def listing(**kwargs: Any) -> Callable[[Any], Any]:
        return lambda c: store.job_list(c, after=None, limit=50, **kwargs)

    return [
        Case("job_counts (by type and status)", console.job_counts, "overview"),
        Case("outbox_pending", store.outbox_pending, "overview"),
        Case("workers_list", lambda c: operators.workers_list(c, seen_within=30), "overview"),
        Case("alerts_list (latest 5)", lambda c: operators.alerts_list(c, limit=5), "overview"),
        Case("job_type_names", console.job_type_names),
        Case("no filter", page()),
        Case("status=dead", page(status="dead")),
        Case("status=queued", page(status="queued")),
        Case("type=fail", page(job_type="fail")),
        Case("type=legacy.import", page(job_type="legacy.import")),
        Case("status=dead type=ledger", page(status="dead", job_type="ledger")),
        Case("created last hour", page(since=hour)),
        Case("type=echo created last hour", page(job_type="echo", since=hour)),
        Case(
            "status=succeeded type=noop created 2-1 days ago",
            page(status="succeeded", job_type="noop", since=day - timedelta(days=1), until=day),
        ),
        Case("finished last 24 h", page(since=day, time_field="finished_at")),
        Case(
            "type=fail finished last hour",
            page(job_type="fail", since=hour, time_field="finished_at"),
        ),
        Case(
            "status=dead finished 6-5 days ago",
            page(
                status="dead",
                since=now - timedelta(days=6),
                until=now - timedelta(days=5),
                time_field="finished_at",
            ),
        ),
        Case("type=sleep, next page (keyset)", second_page(job_type="sleep")),
        Case(
            "bulk retry count: status=dead type=fail",
            lambda c: console.jobs_count(c, JobFilter("dead", "fail"), up_to=10_001),
        ),
        Case("jobs_running", lambda c: console.jobs_running(c, limit=500), "workers"),
        Case("no filter", listing(status=None, job_type=None), "GET /jobs"),
        Case("status=dead", listing(status="dead", job_type=None), "GET /jobs"),
        Case("type=fail", listing(status=None, job_type="fail"), "GET /jobs"),
        Case(
            "status=succeeded type=echo",
            listing(status="succeeded", job_type="echo"),
            "GET /jobs",
        ),
    ]


def plans_of(conn: psycopg.Connection, call: Callable[[Any], Any]) -> tuple[Any, list[dict]]:
    """Call ``call`` on ``conn`` once, then ``EXPLAIN (ANALYZE)`` each query it ran, in the
    same transaction (a ``SET LOCAL`` it ran is run again first: part of how its query runs).
    Returns the call's result and the plans; the caller ends the transaction."""
    recording = Recording(conn)
    result = call(recording)
    plans = []
    for query, params in recording.statements:
        if not str(query).lstrip().upper().startswith(("SELECT", "WITH")):
            conn.execute(query, params)
            continue
        explained = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", params).fetchone()
        plans.append(explained["QUERY PLAN"][0]["Plan"])
    return result, plans


def measure(dsn: str, case: Case, runs: int) -> None:
    with psycopg.connect(dsn, **CONNECT_KWARGS) as conn:
        configure(conn)
        for run in range(runs + 1):  # the first is a warm-up
            started = time.perf_counter()
            case.call(conn)
            conn.commit()
            if run:
                case.times_ms.append((time.perf_counter() - started) * 1000.0)
        result, case.plans = plans_of(conn, case.call)
        conn.rollback()
        case.rows = len(result) if isinstance(result, list) else 1


def seq_scans(case: Case) -> list[str]:
    return [s for plan in case.plans for s in jobs_scans(plan) if s.startswith("Seq Scan")]


# ---------------------------------------------------------------- reporting


def table(measured: list[Case]) -> list[str]:
    lines = [
        "| query | rows | median ms | min ms | max ms | discarded | plan's top node "
        "| scans of jobs |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for case in measured:
        scans = sorted({s for plan in case.plans for s in jobs_scans(plan)})
        lines.append(
            f"| {case.group}: {case.name} | {case.rows} | "
            f"{statistics.median(case.times_ms):.2f} | {min(case.times_ms):.2f} | "
            f"{max(case.times_ms):.2f} | {sum(discarded(p) for p in case.plans)} | "
            f"{'; '.join(top_node(p) for p in case.plans)} | {'; '.join(scans) or 'none'} |"
        )
    return lines


def report(
    out: Path,
    rows: int,
    runs: int,
    fill_s: float | None,
    measured: list[Case],
    pages: list[console_pages.PageTiming] | None = None,
) -> str:
    facts = []
    with psycopg.connect(database_dsn(POSTGRES_DIRECT_DSN, DATABASE)) as conn:
        facts.append(conn.execute("SELECT version()").fetchone()[0])
        size = conn.execute(
            "SELECT pg_size_pretty(pg_table_size('jobs')), pg_size_pretty(pg_indexes_size('jobs'))"
        ).fetchone()
        mix = conn.execute(
            "SELECT status, count(*) FROM jobs GROUP BY status ORDER BY count(*) DESC"
        ).fetchall()
    lines = [
        "# Console queries on a big jobs table",
        "",
        f"`python -m tools.console_timing --rows {rows} --runs {runs}`, "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, database `{DATABASE}` on the stack's "
        f"Postgres ({facts[0].split(' on ')[0]}).",
        "",
        f"- {rows:,} job rows; table {size[0]}, its indexes {size[1]}; by state: "
        + ", ".join(f"{s} {n:,}" for s, n in mix),
        f"- fill and VACUUM (ANALYZE): {fill_s:.0f} s" if fill_s is not None else "- reused",
        f"- each query: one warm-up call, then {runs} timed calls of the real store function "
        "in a transaction of its own (fetch and Job records included); median, min, max",
        "- plans: `EXPLAIN (ANALYZE, FORMAT JSON)` of each statement the call ran, same "
        "parameters; discarded: rows of jobs its filters and rechecks read and threw away",
        "",
        *table(measured),
        "",
    ]
    if pages is not None:
        lines += [
            "## The pages end to end",
            "",
            f"An api of its own on `{DATABASE}`, a console session logged in through the form "
            f"(an admin token), each page fetched over HTTP {runs} times after one warm-up: "
            "rendering, the overview's Prometheus queries, the guard and the rate limit "
            "included.",
            "",
            *console_pages.table(pages),
            "",
        ]
    text = "\n".join(lines)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="console_timing", description=__doc__.split("\n\n")[0].strip("`")
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help=f"keep {DATABASE} afterwards")
    parser.add_argument("--reuse", action="store_true", help=f"measure a kept {DATABASE}")
    parser.add_argument(
        "--pages", action="store_true", help="also time the console's pages over HTTP"
    )
    parser.add_argument("--out", default="reports/console-timing")
    args = parser.parse_args(argv)

    dsn = database_dsn(POSTGRES_DIRECT_DSN, DATABASE)
    out = Path(args.out) / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    fill_s = None
    try:
        if not args.reuse:
            print(f"console_timing: filling {DATABASE} with {args.rows:,} jobs", flush=True)
            recreate_database(DATABASE)
            fill_s = fill(dsn, args.rows)
        measured = cases(datetime.now(UTC))
        for case in measured:
            measure(dsn, case, args.runs)
        pages = None
        if args.pages:
            out.mkdir(parents=True, exist_ok=True)
            pages = console_pages.time_pages(dsn, args.runs, out / "api.log")
        text = report(out, args.rows, args.runs, fill_s, measured, pages)
    finally:
        if not args.keep:
            drop_database(DATABASE)
    print(text)
    print(f"console_timing: {out / 'report.md'}")
    bad = [case.name for case in measured if seq_scans(case)]
    if bad:
        print(f"console_timing: a sequential scan of jobs in: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
