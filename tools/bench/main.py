"""``just bench``: the measurement we steer by, on the live stack, in one invocation.

Rows, in this order (``--rows`` picks some):

* ``floor``: a bare SKIP LOCKED psycopg queue with leasework's durability on the same
  Postgres (``tools.bench.floor``), two worker processes; every row's ratio is to it;
* ``floor-order``: the same queue fed the web-app pattern, the caller's own row and its job
  in one transaction, 16 connections: ``enqueue-one``'s peer on the same footing (its ratio
  to this row is reported beside its ratio to the floor; the goals read the floor);
* ``single``, ``batch``, ``enqueue``: leasework with its processes pointed straight at
  Postgres, Redis and Kafka, jobs submitted by ``POST /jobs`` (16 clients), ``POST
  /jobs/batch`` (100 per request) and ``enqueue_many`` (100 per transaction);
* ``single-client``: the ``single`` row with the shipped ``leasework.AsyncClient`` in place of
  the bench's lean client, the figure a user's own code gets;
* ``lone``: one job at a time through ``POST /jobs`` on an idle pipeline, insert to start and
  to finish (no throughput);
* ``enqueue-one``: the web-app pattern, a row of the caller's own and its job in one
  transaction (``leasework.enqueue``), 16 connections; ``enqueue-one-sqlalchemy`` and
  ``enqueue-one-asyncpg`` and ``enqueue-one-django`` (on request) the same through a
  SQLAlchemy ``Session`` (psycopg driver, 16 threads), through asyncpg (16 connections on one
  asyncio loop) and through Django's connection in ``transaction.atomic()`` (16 threads);
* ``proxied-batch`` (and ``proxied-single``, ``proxied-enqueue`` on request): the same with
  the stack's normal links, through Toxiproxy;
* ``unaudited-batch`` (and ``unaudited-single`` on request): ``batch`` with the relay's
  auditor off (``LEASEWORK_AUDIT_INTERVAL=never``), the auditor's cost by difference;
* ``audit`` (on request): one auditor pass's time on a jobs table of 100,000 and of
  1,000,000 finished jobs, and over limited jobs of a capped queue beside a backlog of 0 to
  400,000, in scratch schemas (``tools.bench.audit``);
* ``limits`` (on request): concurrency limits per key and per queue and a rate limit under a
  backlog, the running jobs sampled from Postgres and the starts read from effects
  (``tools.bench.limits``; about two minutes).
* ``lanes`` and ``blocking`` (on request): the same noop and fenced effect in each lane, and
  paced neighbours beside a handler blocking the worker's loop or the asyncio lane's
  (``tools.bench.lanes``; about two minutes);
* ``priorities`` and ``isolation`` (on request): the scheduling delays of paced
  high-priority jobs behind 20,000 low-priority ones, and of a queue's paced jobs while
  another queue holds 20,000 slow ones, beside the same unflooded (``tools.bench.queues``).

``--repeat N`` runs all of it N times and writes ``summary.md`` with each figure's median and
spread; ``--fresh`` stops and starts the whole stack before each run, then waits until the
machine is quiet (below 20% busy over 5 s, at most 2 minutes: right after a start the brokers'
JIT compilers alone keep a third of two cores busy); every run records how busy the machine
was, with the stack idle, just before it, and how big the ``jobs`` table was (the bench shares
the stack's database with the tests and CI; it neither empties nor fills it).

For each row: end-to-end jobs/s (first submit to last job finished), its ratio to the
floor, CPU ms per job per process and peak RSS per process over that window (``/proc``),
then scheduling delay p50/p99 with jobs paced, open loop, at half that row's rate. Then
``pgbench`` with the job+outbox insert for the Postgres commit ceiling. Writes
``reports/bench/<UTC time>/`` bench.json, bench.md and throughput.svg. It measures; it
asserts nothing about speed.

Run it alone on the machine (it is the load), under the stack's exclusive lock when others
share the stack. It leaves the four leasework processes restarted with their normal
environment and deletes its own jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from chaos.poll import poll
from devstack import Stack
from devstack.errors import StackError
from devstack.layout import (
    HOST,
    KAFKA_DIRECT_BOOTSTRAP,
    POSTGRES_DIRECT_DSN,
    REDIS_PORT,
    default_repo_root,
)
from tools.bench import doors, floor, report
from tools.bench import pgbench as bench_pgbench
from tools.bench import proc as procfs
from tools.bench.audit import audit_row
from tools.bench.lanes import blocking_row, lanes_row
from tools.bench.limits import limits_row
from tools.bench.queues import isolation_row, priorities_row
from tools.bench.speed import SpeedProbe
from tools.bench.tap import Published, ReadyTap

API_URL = "http://127.0.0.1:8080"
APPS = ("api", "relay", "worker-1", "worker-2")
REQUIRED = ("postgres", "redis", "toxiproxy", "kafka-1", "kafka-2", "kafka-3", *APPS)
DIRECT_ENV = {
    "LEASEWORK_POSTGRES_DSN": POSTGRES_DIRECT_DSN,
    "LEASEWORK_REDIS_ADDR": f"{HOST}:{REDIS_PORT}",
    "LEASEWORK_KAFKA_BROKERS": KAFKA_DIRECT_BOOTSTRAP,
}
ROWS = (
    "floor",
    "floor-order",
    "lone",
    "single",
    "single-client",
    "batch",
    "enqueue",
    "enqueue-one",
    *(door for door in doors.DOORS if door.startswith("enqueue-one-")),  # the other layers
    "proxied-single",
    "proxied-batch",
    "proxied-enqueue",
    "unaudited-batch",
    "unaudited-single",
    "audit",
    "limits",
    "priorities",
    "isolation",
    "lanes",
    "blocking",
)
DEFAULT_ROWS = (
    "floor,lone,single,single-client,batch,unaudited-batch,enqueue,floor-order,enqueue-one,"
    "proxied-batch"
)
UNAUDITED_ENV = {"LEASEWORK_AUDIT_INTERVAL": "never"}
POLL = 0.25
BUCKET = 0.5

# Jobs in a row's throughput phase, the floor's and leasework's alike: enough for several
# seconds of the fastest row (8,000 jobs of `batch` take 4-6 s here, of `single` 9-11 s).
# With 2,000 a batch row was over in about a second, so its figure carried its own start and
# drain and the machine's hiccups: its ratio to the floor spread 0.86-1.69x within one
# fresh set (docs/design-decisions.md, "A row's throughput phase lasts seconds").
ROW_JOBS = 8000
FLOOR_JOBS = 8000


class BenchError(RuntimeError):
    """A row could not be measured (jobs did not finish, a submit failed)."""


@dataclass
class Config:
    rows: list[str]
    jobs: int = ROW_JOBS
    floor_jobs: int = FLOOR_JOBS
    single_concurrency: int = 16
    lone_jobs: int = 40
    lone_gap: float = 0.3
    enqueue_one_concurrency: int = 16
    repeat: int = 1
    fresh: bool = False
    batch_size: int = 100
    batch_concurrency: int = 4
    enqueue_concurrency: int = 4
    floor_submitters: int = 16
    floor_workers: int = 2
    paced_fraction: float = 0.5
    paced_seconds: float = 15.0
    paced_stages: bool = False
    row_timeout: float = 600.0
    settle: float = 2.0
    idle_seconds: float = 5.0
    warmup_timeout: float = 120.0
    pgbench_seconds: int = 12
    pgbench_clients: int = 16
    # further environment for api, relay and the workers (``--app-env``: tuning to measure,
    # LEASEWORK_RDKAFKA_* say), recorded in the report
    app_env: dict[str, str] = field(default_factory=dict)
    out: Path = field(default_factory=lambda: default_repo_root() / "reports" / "bench")

    def door(self, row: str) -> doors.Door:
        kind = row.removeprefix("proxied-").removeprefix("unaudited-")
        if kind == "single":
            return doors.Door("single", 1, self.single_concurrency)
        if kind == "single-client":
            return doors.Door("single", 1, self.single_concurrency, doors.SHIPPED)
        if kind == "batch":
            return doors.Door("batch", self.batch_size, self.batch_concurrency)
        if kind.startswith("enqueue-one"):
            return doors.Door(kind, 1, self.enqueue_one_concurrency)
        return doors.Door("enqueue", self.batch_size, self.enqueue_concurrency)


def door_label(door: doors.Door) -> str:
    if door.name == "single":
        client = "lean client" if door.client == doors.LEAN else door.client
        return f"POST /jobs, {door.concurrency} clients ({client})"
    if door.name == "batch":
        return f"POST /jobs/batch {door.chunk}/req, {door.concurrency} in flight"
    if door.name == "enqueue-one":
        return f"an order row + enqueue, 1/tx, {door.concurrency} conns"
    if door.name.startswith("enqueue-one-"):
        layer = door.name.removeprefix("enqueue-one-")
        return f"an order row + enqueue through {layer}, 1/tx, {door.concurrency} conns"
    return f"enqueue_many {door.chunk}/tx, {door.concurrency} conns"


class Bench:
    def __init__(self, stack: Stack, cfg: Config) -> None:
        self.stack = stack
        self.cfg = cfg
        self.run_id = "bench-" + uuid.uuid4().hex[:8]
        self.since = time.time()
        self.db = psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True)
        self.links: str | None = None  # "direct" or "toxiproxy" once the apps are pointed
        self.probe: SpeedProbe | None = None  # the machine's speed, while the rows run

    # --- stack ---------------------------------------------------------------------------
    def roots(self) -> dict[str, int | None]:
        names = [p for p in report.PROCESSES if p != "client"]
        roots = {name: self.stack.pid(name) for name in names}
        roots["client"] = os.getpid()
        return roots

    def point_apps(self, links: str) -> None:
        """Restart api, relay and the workers with direct links or the stack's own, then warm
        up until jobs flow through both workers."""
        if self.links == links:
            return
        log(f"restarting {', '.join(APPS)} with {links} links")
        self.stack.stop_many(APPS)
        for name in APPS:
            env = dict(self.cfg.app_env)
            if links.startswith("direct"):
                env = {**DIRECT_ENV, **env}
            if links.endswith("unaudited"):
                env.update(UNAUDITED_ENV)
            self.stack.start(name, extra_env=env or None, timeout=90)
        self.links = links
        self.warm_up()

    def fresh_stack(self) -> float:
        """``just down`` and ``just up``: every process of the stack started afresh (brokers,
        Postgres and Redis included, their caches cold); the seconds it took."""
        t0 = time.monotonic()
        log("fresh: stopping and starting the whole stack")
        self.db.close()
        self.stack.down()
        self.stack.up(apps=True)
        self.db = psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True)
        self.links = "toxiproxy"
        return time.monotonic() - t0

    def machine_before(self, seconds: float = 5.0) -> float:
        """How busy the machine is before the run, with the stack idle (non-idle share of all
        CPUs over ``seconds``): a figure from a machine busy with something else is noise."""
        before = procfs.machine_ticks()
        time.sleep(seconds)
        return procfs.busy_fraction(before, procfs.machine_ticks())

    def jobs_table(self) -> dict[str, int]:
        """The size of ``jobs`` before the run (live rows, as Postgres's statistics count
        them, and megabytes with its indexes): the bench shares the stack's database with
        whatever ran before (the tests, CI), and a row's Postgres cost may depend on it."""
        rows, size = self.db.execute(
            "SELECT coalesce((SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = "
            "'jobs'::regclass), 0), pg_total_relation_size('jobs')"
        ).fetchone()
        return {"live_rows": int(rows), "mb": round(size / 1_048_576)}

    def settle_after_start(self, quiet: float = 0.2, patience: float = 120.0) -> float:
        """After a fresh start, wait until the machine is quiet (below ``quiet`` busy over 5 s:
        the brokers' JIT compilers and start-up work done), at most ``patience`` seconds, so
        the floor, measured first, is not measured against the start-up; the busy share of
        the last 5 s."""
        deadline = time.monotonic() + patience
        while True:
            busy = self.machine_before()
            if busy < quiet or time.monotonic() > deadline:
                log(f"settled: machine {busy * 100:.0f}% busy over the last 5 s")
                return busy

    def restore(self) -> None:
        log(f"restoring {', '.join(APPS)} to their normal environment")
        self.stack.stop_many(APPS)
        for name in APPS:
            self.stack.start(name, timeout=90)
        self.links = "toxiproxy"

    def warm_up(self) -> None:
        """Batches of 48 jobs until one finishes within 5 s on both workers (the consumer
        group has settled), so no row pays for a rebalance."""
        deadline = time.monotonic() + self.cfg.warmup_timeout
        door = doors.Door("batch", 48, 1)
        for round_ in range(1000):
            tag = f"{self.run_id}-warmup-{round_}"
            sub = doors.submit(door, url=API_URL, dsn=POSTGRES_DIRECT_DSN, tag=tag, jobs=48)
            self.wait_done(tag, 48, sub.first, timeout=max(1.0, deadline - time.monotonic()))
            took = self.last_finished(tag, sub.first) - sub.first
            workers = self.workers_of(tag, sub.first)
            if took < 5.0 and (workers is None or workers >= 2):
                return
            if time.monotonic() > deadline:
                raise BenchError(f"warm-up: jobs still slow after {self.cfg.warmup_timeout:.0f} s")

    def workers_of(self, tag: str, since: float) -> int | None:
        try:
            row = self.db.execute(
                "SELECT count(DISTINCT a.worker) FROM attempts a JOIN jobs j ON j.id = a.job_id "
                f"WHERE {doors.TAGGED.replace('created_at', 'j.created_at')}",
                {"since": since - 1.0, "tag": tag},
            ).fetchone()
        except psycopg.Error:
            return None  # no attempts table any more: rely on timing alone
        return int(row[0])

    # --- waiting -------------------------------------------------------------------------
    def wait_done(self, tag: str, jobs: int, since: float, timeout: float | None = None) -> None:
        timeout = self.cfg.row_timeout if timeout is None else timeout

        def ended(counts: dict[str, int]) -> dict[str, int]:
            return {s: n for s, n in counts.items() if s in ("dead", "cancelled")}

        counts = poll(
            lambda: doors.progress(self.db, tag, since),
            lambda counts: counts.get("succeeded", 0) >= jobs or ended(counts),
            patience=timeout,
            interval=POLL,
        ).value
        if counts.get("succeeded", 0) >= jobs:
            return
        seen = ", ".join(f"{s} {n}" for s, n in sorted(counts.items())) or "none"
        why = "some ended" if ended(counts) else f"not all succeeded within {timeout:.0f} s"
        raise BenchError(
            f"{tag}: {why} ({counts.get('succeeded', 0)}/{jobs} succeeded; by status: "
            f"{seen}); are relay and workers running? `just logs worker-1`, "
            "`just logs relay`"
        )

    def last_finished(self, tag: str, since: float) -> float:
        finished, _ = doors.timings(self.db, tag, since)
        return max(finished)

    def quiet(self) -> None:
        time.sleep(self.cfg.settle)

    def drop_jobs(self) -> None:
        deleted = doors.delete_tagged(self.db, self.run_id, self.since)
        try:
            self.db.execute("VACUUM (ANALYZE) jobs, outbox")
        except psycopg.Error as exc:
            log(f"vacuum skipped: {exc}")
        if deleted:
            log(f"deleted {deleted} bench jobs")

    # --- rows ----------------------------------------------------------------------------
    def leasework_row(self, row: str) -> dict[str, Any]:
        links = "toxiproxy" if row.startswith("proxied-") else "direct"
        audited = not row.startswith("unaudited-")
        self.point_apps(links if audited else f"{links}-unaudited")
        door = self.cfg.door(row)
        tag, jobs = f"{self.run_id}-{row}", self.cfg.jobs
        label = door_label(door) + ("" if audited else ", auditor off")
        log(f"{row}: {jobs} jobs, {label}, {links} links")
        window = procfs.Window(self.roots())
        sub = doors.submit(door, url=API_URL, dsn=POSTGRES_DIRECT_DSN, tag=tag, jobs=jobs)
        self.wait_done(tag, jobs, sub.first)
        measured = window.stop(jobs)
        finished, saturated = doors.timings(self.db, tag, sub.first)
        result = self._row(row, label, links, jobs, sub, finished, saturated, measured)
        self.quiet()
        rate = self.cfg.paced_fraction * result["e2e_per_s"]
        n, interval = doors.paced_plan(rate, self.cfg.paced_seconds, door.chunk)
        log(f"{row}: paced, {n} jobs at {rate:.0f} jobs/s")
        t0 = time.time() + 0.2
        ptag = f"{tag}-paced"
        with ReadyTap() if self.cfg.paced_stages else contextlib.nullcontext() as tap:
            psub = doors.submit(
                door,
                url=API_URL,
                dsn=POSTGRES_DIRECT_DSN,
                tag=ptag,
                jobs=n,
                due=lambda k: t0 + k * interval,
            )
            self.wait_done(ptag, n, psub.first)
            published = self.published(tap, ptag, psub.first) if tap is not None else None
        pfinished, delays = doors.timings(self.db, ptag, psub.first)
        result["paced"] = _paced(rate, n, interval, psub, pfinished, delays)
        if published is not None:
            result["paced"]["stages"] = _stages(
                doors.lone_timings(self.db, ptag, psub.first, published)
            )
        self.drop_jobs()
        self.quiet()
        return result

    def lanes(self, row: str) -> dict[str, Any]:
        """The lanes row or the blocking row (``tools.bench.lanes``)."""
        if row == "lanes":
            return lanes_row(
                self.db,
                POSTGRES_DIRECT_DSN,
                self.run_id,
                self.wait_done,
                lambda: procfs.Window(self.roots()),
                self.quiet,
            )
        return blocking_row(self.db, POSTGRES_DIRECT_DSN, self.run_id, self.wait_done, self.quiet)

    def lone_row(self) -> dict[str, Any]:
        """One job at a time on an idle pipeline: insert to start and to finish."""
        self.point_apps("direct")
        tag, jobs = f"{self.run_id}-lone", self.cfg.lone_jobs
        log(f"lone: {jobs} jobs one at a time, {self.cfg.lone_gap:g} s apart, direct links")
        with ReadyTap() as tap:
            sub = doors.lone(API_URL, POSTGRES_DIRECT_DSN, tag, jobs, self.cfg.lone_gap)
            published = self.published(tap, tag, sub.first)
        times = doors.lone_timings(self.db, tag, sub.first, published)
        result = {
            "name": "lone",
            "door": f"POST /jobs, one at a time, {self.cfg.lone_gap:g} s idle between",
            "links": "direct",
            "jobs": jobs,
            "insert_to_finish": report.delay_summary(times.insert_to_finish),
            **_stages(times),
        }
        self.drop_jobs()
        self.quiet()
        return result

    def published(self, tap: ReadyTap, tag: str, since: float) -> dict[str, Published]:
        """When each of ``tag``'s jobs was published, as far as ``tap`` saw it."""
        try:
            return tap.read(doors.tagged_ids(self.db, tag, since), timeout=20)
        except TimeoutError as exc:
            log(f"{tag}: publish times unknown ({exc})")
            return {}

    def floor_row(self, name: str = "floor") -> dict[str, Any]:
        """``floor``, or with ``name="floor-order"`` the same queue fed an order row and its
        job in each transaction (``enqueue-one``'s submit, on the bare queue)."""
        cfg, dsn = self.cfg, POSTGRES_DIRECT_DSN
        floor.prepare(dsn)
        tag, jobs = f"{self.run_id}-{name}", cfg.floor_jobs
        own_row = doors.ORDER_INSERT if name == "floor-order" else None
        submits = "an order row + job, 1/tx" if own_row else "SKIP LOCKED"
        label = f"{submits}, {cfg.floor_submitters} submitters, {cfg.floor_workers} workers"
        log(f"{name}: {jobs} jobs, {label}")
        workers = floor.Workers.start(dsn, cfg.floor_workers)
        try:
            window = procfs.Window(self.roots())
            first, last = floor.submit_threads(
                dsn, jobs, tag, cfg.floor_submitters, own_row=own_row
            )
            self._wait_floor(tag, jobs)
            measured = window.stop(jobs)
            finished, saturated = floor.timings(self.db, tag)
            sub = doors.Submitted(first, last, jobs)
            result = self._row(name, label, "direct", jobs, sub, finished, saturated, measured)
            self.quiet()
            rate = cfg.paced_fraction * result["e2e_per_s"]
            n = max(1, round(rate * cfg.paced_seconds))
            log(f"{name}: paced, {n} jobs at {rate:.0f} jobs/s")
            t0 = time.time() + 0.2
            ptag = f"{tag}-paced"
            pfirst, plast = floor.submit_threads(
                dsn, n, ptag, cfg.floor_submitters, due=lambda i: t0 + i / rate, own_row=own_row
            )
            self._wait_floor(ptag, n)
            pfinished, delays = floor.timings(self.db, ptag)
            psub = doors.Submitted(pfirst, plast, n)
            result["paced"] = _paced(rate, n, 1 / rate, psub, pfinished, delays)
        finally:
            result_workers = workers.stop()
            floor.drop_rows(dsn)
        result["floor_workers"] = result_workers
        self.quiet()
        return result

    def _wait_floor(self, tag: str, jobs: int) -> None:
        polled = poll(
            lambda: floor.progress(self.db, tag),
            lambda progress: progress[0] >= jobs,
            patience=self.cfg.row_timeout,
            interval=POLL,
        )
        if not polled.met:
            done, other = polled.value
            raise BenchError(f"{tag}: {done}/{jobs} floor jobs done ({other} not) in time")

    def _row(self, name, door, links, jobs, sub, finished, saturated, measured) -> dict[str, Any]:
        end = max(finished)
        return {
            "name": name,
            "door": door,
            "links": links,
            "jobs": jobs,
            "submit_s": sub.last - sub.first,
            "submit_per_s": jobs / (sub.last - sub.first) if sub.last > sub.first else None,
            "e2e_s": end - sub.first,
            "e2e_per_s": jobs / (end - sub.first),
            "saturated_delay": report.delay_summary(saturated),
            "throughput_buckets": report.buckets(finished, sub.first, BUCKET),
            **measured,
            "speed": self.probe.window(sub.first, end) if self.probe else None,
        }

    def idle(self) -> dict[str, Any]:
        log(f"idle: {self.cfg.idle_seconds:.0f} s")
        window = procfs.Window(self.roots())
        time.sleep(self.cfg.idle_seconds)
        measured = window.stop(1)
        per_s = {
            name: None if ms is None else ms / measured["window_s"]
            for name, ms in measured["cpu_ms_per_job"].items()
        }
        return {
            "seconds": measured["window_s"],
            "cpu_ms_per_s": per_s,
            "machine_busy": measured["machine_busy"],
            "accounted_of_busy": measured["accounted_of_busy"],
            "links": self.links,
        }

    def pgbench(self) -> dict[str, Any]:
        tag = f"{self.run_id}-pgbench"
        log(f"pgbench: {self.cfg.pgbench_clients} clients, {self.cfg.pgbench_seconds} s")
        # its jobs must be neither published nor woken (a worker claims a lone job when
        # Postgres says it is ready): the relay and the workers stop; restore() restarts them
        self.stack.stop_many([name for name in APPS if name != "api"])
        self.links = None
        machine = procfs.machine_ticks()
        try:
            result = bench_pgbench.run(
                tag,
                clients=self.cfg.pgbench_clients,
                threads=min(self.cfg.pgbench_clients, os.cpu_count() or 1),
                seconds=self.cfg.pgbench_seconds,
            )
        finally:
            self.drop_jobs()
        result["machine_busy"] = procfs.busy_fraction(machine, procfs.machine_ticks())
        return result


def _paced(rate, n, interval, sub, finished, delays) -> dict[str, Any]:
    span = max(finished) - sub.first if finished else 0.0
    return {
        "target_per_s": rate,
        "jobs": n,
        "interval_s": interval,
        # n sends over n/chunk intervals: the last one's own interval counts too
        "achieved_per_s": n / (sub.last - sub.first + interval),
        "e2e_s": span,
        "late_sends": sub.late,
        "delay": report.delay_summary(delays),
    }


def _stages(times: doors.LoneTimes) -> dict[str, Any]:
    """Insert to start, and the two stages it splits into where the publish is known."""
    return {
        "insert_to_start": report.delay_summary(times.insert_to_start),
        "insert_to_publish": report.delay_summary(times.insert_to_publish),
        "publish_to_start": report.delay_summary(times.publish_to_start),
        "started_before_publish": times.woken,
    }


def log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def git_head() -> str:
    root = default_repo_root()
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def run(stack: Stack, cfg: Config, directory: Path | None = None) -> tuple[dict[str, Any], Path]:
    started = datetime.now(UTC)
    bench = Bench(stack, cfg)
    result: dict[str, Any] = {
        "started_utc": started.strftime("%Y-%m-%d %H:%M:%S UTC"),
        "git_head": git_head(),
        "nproc": os.cpu_count(),
        "clk_tck": procfs.CLK_TCK,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items()},
        "method": report.METHOD,
        "rows": [],
        "idle": None,
        "lone": None,
        "pgbench": None,
        "fresh_restarts_s": [],
        "errors": [],
    }
    directory = directory or cfg.out / started.strftime("%Y%m%dT%H%M%SZ")
    bench.probe = probe = SpeedProbe().start()
    try:
        if cfg.fresh:
            result["fresh_restarts_s"].append(bench.fresh_stack())
            bench.settle_after_start()
        result["machine_busy_before"] = bench.machine_before()
        log(f"machine busy before the run: {result['machine_busy_before'] * 100:.0f}%")
        result["jobs_table_before"] = bench.jobs_table()
        log(f"jobs table before the run: {report.jobs_table_text(result['jobs_table_before'])}")
        if any(r.startswith("enqueue-one") for r in cfg.rows) or "floor-order" in cfg.rows:
            doors.prepare_orders(bench.db)
        for row in cfg.rows:
            if row in ("floor", "floor-order"):
                result["rows"].append(bench.floor_row(row))
                continue
            if row == "lone":
                result["lone"] = bench.lone_row()
                continue
            if row == "limits":
                bench.point_apps("direct")
                result["limits"] = limits_row(
                    POSTGRES_DIRECT_DSN, f"{bench.run_id}-limits", cfg.row_timeout
                )
                bench.drop_jobs()
                continue
            if row in ("priorities", "isolation"):
                bench.point_apps("direct")
                measure = priorities_row if row == "priorities" else isolation_row
                result[row] = measure(POSTGRES_DIRECT_DSN, f"{bench.run_id}-{row}")
                bench.drop_jobs()
                continue
            if row in ("lanes", "blocking"):
                bench.point_apps("direct")
                result[row] = bench.lanes(row)
                bench.drop_jobs()
                continue
            if row == "audit":
                log("audit: one auditor pass on 100,000 and 1,000,000 finished jobs")
                result["audit"] = audit_row(POSTGRES_DIRECT_DSN)
                continue
            if result["idle"] is None and cfg.idle_seconds > 0 and not row.startswith("proxied-"):
                bench.point_apps("direct")
                bench.quiet()
                result["idle"] = bench.idle()
            result["rows"].append(bench.leasework_row(row))
        if cfg.pgbench_seconds > 0:
            result["pgbench"] = bench.pgbench()
    except (BenchError, StackError, psycopg.Error, RuntimeError) as exc:
        result["errors"].append(str(exc))
        log(f"FAILED: {exc}")
    except KeyboardInterrupt:
        result["errors"].append("interrupted")
        log("interrupted: cleaning up")
    finally:
        probe.stop()
        for step in (
            bench.drop_jobs,
            lambda: doors.drop_orders(bench.db),
            bench.restore,
            lambda: bench.db.close(),
        ):
            try:
                step()
            except (StackError, psycopg.Error) as exc:
                result["errors"].append(f"cleanup: {exc}")
                log(f"cleanup FAILED: {exc}")
        finish(result)
        write(result, directory)
    return result, directory


def finish(result: dict[str, Any]) -> None:
    """Every row's ratio to the floor; ``enqueue-one``'s also to ``floor-order``, its peer
    with the caller's own row in each transaction."""
    rate = {r["name"]: r["e2e_per_s"] for r in result["rows"]}
    result["floor_e2e_per_s"] = rate.get("floor")
    for r in result["rows"]:
        r["vs_floor"] = report.ratio(r["e2e_per_s"], rate.get("floor"))
        if r["name"].startswith("enqueue-one"):
            r["vs_floor_order"] = report.ratio(r["e2e_per_s"], rate.get("floor-order"))


def write(result: dict[str, Any], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "bench.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (directory / "bench.md").write_text(report.render_markdown(result))
    series = {r["name"]: r["throughput_buckets"] for r in result["rows"]}
    (directory / "throughput.svg").write_text(report.render_svg(series, width_s=BUCKET))


def check_stack(stack: Stack) -> list[str]:
    return [name for name in REQUIRED if not stack.is_ready(name)]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def parse_args(argv: list[str] | None) -> Config:
    p = argparse.ArgumentParser(
        prog="bench",
        description=__doc__.split("\n\nRun it alone")[0],
        formatter_class=HelpFormatter,
    )
    p.add_argument("--rows", default=DEFAULT_ROWS, help=f"comma list of: {', '.join(ROWS)}")
    p.add_argument("--jobs", type=int, default=ROW_JOBS, help="jobs per leasework row")
    p.add_argument("--floor-jobs", type=int, default=FLOOR_JOBS, help="jobs in the floor rows")
    p.add_argument("--single-concurrency", type=int, default=16, help="POST /jobs clients")
    p.add_argument("--lone-jobs", type=int, default=40, help="jobs of the lone row, one at a time")
    p.add_argument("--lone-gap", type=float, default=0.3, help="idle seconds between lone jobs")
    p.add_argument(
        "--enqueue-one-concurrency", type=int, default=16, help="enqueue-one connections"
    )
    p.add_argument(
        "--repeat", type=int, default=1, help="run every row N times; report median and spread"
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="stop and start the whole stack before each run (cold brokers, Postgres, Redis); "
        "not before each row: a restart takes a minute on two cores, 21 of them for 3 runs",
    )
    p.add_argument("--batch-size", type=int, default=100, help="jobs per batch request or tx")
    p.add_argument("--batch-concurrency", type=int, default=4, help="batch requests in flight")
    p.add_argument("--enqueue-concurrency", type=int, default=4, help="enqueue_many connections")
    p.add_argument("--floor-submitters", type=int, default=16, help="floor INSERT connections")
    p.add_argument("--floor-workers", type=int, default=2, help="floor worker processes")
    p.add_argument("--paced-fraction", type=float, default=0.5, help="of the row's e2e rate")
    p.add_argument("--paced-seconds", type=float, default=15.0, help="of paced submits per row")
    p.add_argument(
        "--paced-stages",
        action="store_true",
        help="read every paced job's jobs.ready message too, and split its delay into insert "
        "to publish and publish to start (a Kafka consumer in the bench while it runs: off in "
        "the figures we steer by)",
    )
    p.add_argument("--row-timeout", type=float, default=600.0, help="seconds per phase")
    p.add_argument("--idle-seconds", type=float, default=5.0, help="0: no idle baseline")
    p.add_argument("--pgbench-seconds", type=int, default=12, help="0: no pgbench")
    p.add_argument("--pgbench-clients", type=int, default=16)
    p.add_argument(
        "--app-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment for api, relay and the workers, e.g. "
        "LEASEWORK_RDKAFKA_FETCH_MIN_BYTES=1 (repeatable; in the report)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=default_repo_root() / "reports" / "bench",
        help="reports go to OUT/<UTC time>/",
    )
    a = p.parse_args(argv)
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown or not rows:
        p.error(f"--rows: unknown {', '.join(unknown) or '(none given)'}; use {', '.join(ROWS)}")
    if min(a.jobs, a.floor_jobs, a.batch_size, a.repeat, a.lone_jobs) < 1 or not (
        0 < a.paced_fraction <= 1
    ):
        p.error(
            "--jobs, --floor-jobs, --batch-size, --repeat, --lone-jobs must be >= 1; "
            "--paced-fraction in (0, 1]"
        )
    app_env = {}
    for item in a.app_env:
        name, equals, value = item.partition("=")
        if not equals or not name.startswith("LEASEWORK_"):
            p.error(f"--app-env {item!r}: expected LEASEWORK_NAME=VALUE")
        app_env[name] = value
    values = {k: v for k, v in vars(a).items() if k not in ("rows", "app_env")}
    return Config(rows=rows, app_env=app_env, **values)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    stack = Stack.from_env()
    if stack.layout.mode() == "secure":
        log("the stack runs secured (`just up --secure`); the bench measures the plain links: "
            "run `just up --plain` first")  # fmt: skip
        return 2
    missing = check_stack(stack)
    if missing:
        log(
            f"the stack is not up: {', '.join(missing)} not ready. Start it with `just up` "
            "(`just status` shows what runs)."
        )
        return 2
    if cfg.repeat == 1:
        result, directory = run(stack, cfg)
        print(report.render_markdown(result).split("\n## Throughput over time")[0])
        print(f"\nreport: {directory}/bench.md")
        return 1 if result["errors"] else 0
    top = cfg.out / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    results = []
    for k in range(cfg.repeat):
        log(f"run {k + 1} of {cfg.repeat}")
        result, _ = run(stack, cfg, top / f"run-{k + 1}")
        results.append(result)
    summary = report.aggregate(results)
    top.mkdir(parents=True, exist_ok=True)
    (top / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    text = report.render_summary(summary)
    (top / "summary.md").write_text(text)
    print(text)
    print(f"\nreport: {top}/summary.md (each run under {top}/run-N/)")
    return 1 if any(r["errors"] for r in results) else 0
