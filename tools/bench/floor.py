"""The floor: a bare ``SELECT ... FOR UPDATE SKIP LOCKED`` queue in plain psycopg, with the
durability leasework has (logged tables, ``synchronous_commit`` left on), in tables of its
own on the same Postgres.

* submit: one autocommit INSERT per job, from ``submitters`` concurrent connections; or, for
  ``floor-order``, a transaction per job of the caller's own row and the job's (the web-app
  pattern of the ``enqueue-one`` row, on the bare queue);
* work: ``python -m tools.bench.floor worker`` processes, each looping over a claim
  transaction (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1, UPDATE to running, COMMIT) and a
  done transaction (UPDATE to done, COMMIT); an empty queue is polled every ``idle_sleep``.

Scheduling delay is ``started_at - run_at`` (run_at is the INSERT's time), as for leasework.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb

TABLE = "bench_floor_jobs"
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id          bigserial   PRIMARY KEY,
    payload     jsonb       NOT NULL,
    status      text        NOT NULL DEFAULT 'queued',
    run_at      timestamptz NOT NULL DEFAULT now(),
    started_at  timestamptz,
    finished_at timestamptz,
    worker      text
);
CREATE INDEX IF NOT EXISTS {TABLE}_queued_idx ON {TABLE} (id) WHERE status = 'queued';
"""
CLAIM = f"SELECT id FROM {TABLE} WHERE status = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
START = f"UPDATE {TABLE} SET status = 'running', started_at = now(), worker = %s WHERE id = %s"
DONE = f"UPDATE {TABLE} SET status = 'done', finished_at = now() WHERE id = %s"
INSERT = f"INSERT INTO {TABLE} (payload) VALUES (%s)"
IDLE_SLEEP = 0.005


def run_lanes(
    lane: Callable[[int, psycopg.Connection], None], conns: list[psycopg.Connection], what: str
) -> None:
    """Run ``lane(k, conn)`` for each connection in a thread of its own, wait for all, close
    the connections; the first error any lane raised is raised here, naming ``what``."""
    errors: list[BaseException] = []

    def guarded(k: int, conn: psycopg.Connection) -> None:
        try:
            lane(k, conn)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=guarded, args=(k, c), daemon=True) for k, c in enumerate(conns)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in conns:
            c.close()
    if errors:
        raise RuntimeError(f"{what} failed: {errors[0]!r}") from errors[0]


def prepare(dsn: str) -> None:
    """Create the floor's table if missing and empty it (a fresh, unbloated table per run)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute(f"TRUNCATE {TABLE} RESTART IDENTITY")


def drop_rows(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLE} RESTART IDENTITY")


# --- the worker process -------------------------------------------------------------------
def work(dsn: str, name: str, idle_sleep: float = IDLE_SLEEP) -> int:
    """Claim and finish jobs until SIGTERM; prints ``ready`` once connected, and on exit
    one JSON line with how many jobs it did."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    done = 0
    with psycopg.connect(dsn) as conn:
        print("ready", flush=True)
        while not stop.is_set():
            row = conn.execute(CLAIM).fetchone()
            if row is None:
                conn.commit()
                stop.wait(idle_sleep)
                continue
            conn.execute(START, (name, row[0]))
            conn.commit()
            conn.execute(DONE, (row[0],))
            conn.commit()
            done += 1
    print(json.dumps({"worker": name, "done": done}), flush=True)
    return 0


@dataclass
class Workers:
    procs: list[subprocess.Popen[str]]

    @classmethod
    def start(cls, dsn: str, count: int, idle_sleep: float = IDLE_SLEEP) -> Workers:
        procs = []
        for i in range(count):
            argv = [sys.executable, "-m", "tools.bench.floor", "worker", "--dsn", dsn]
            argv += ["--name", f"floor-{i + 1}", "--idle-sleep", str(idle_sleep)]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=os.getcwd()))
        workers = cls(procs)
        for p in procs:
            line = p.stdout.readline() if p.stdout else ""
            if line.strip() != "ready":
                workers.stop()
                raise RuntimeError(f"floor worker pid {p.pid} did not start (said {line!r})")
        return workers

    def stop(self) -> list[dict]:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        reports = []
        for p in self.procs:
            try:
                out, _ = p.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            for line in (out or "").splitlines():
                if line.startswith("{"):
                    reports.append(json.loads(line))
        return reports


# --- submitters ------------------------------------------------------------------------------
def submit_threads(
    dsn: str,
    jobs: int,
    tag: str,
    connections: int,
    due: Callable[[int], float] | None = None,
    own_row: str | None = None,
) -> tuple[float, float]:
    """Insert ``jobs`` rows with payload ``{"bench": tag, "n": i}``, one autocommit INSERT
    each, from ``connections`` threads; thread k sends jobs k, k+connections, ... . With
    ``due`` (job index -> time.time() when to send it) it is paced: open loop, each job at its
    time or at once when late. With ``own_row`` (an INSERT taking ``(tag, i)``) each job is a
    transaction of that row and the job's. Returns (first send, last commit) as
    time.time()."""
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(min(connections, jobs))]
    ends: list[float] = []
    start = time.time()

    def run(k: int, conn: psycopg.Connection) -> None:
        for i in range(k, jobs, len(conns)):
            if due is not None:
                wait = due(i) - time.time()
                if wait > 0:
                    time.sleep(wait)
            if own_row is None:
                conn.execute(INSERT, (Jsonb({"bench": tag, "n": i}),))
                continue
            with conn.transaction():
                conn.execute(own_row, (tag, i))
                conn.execute(INSERT, (Jsonb({"bench": tag, "n": i}),))
        ends.append(time.time())

    run_lanes(run, conns, "floor submit")
    return start, max(ends, default=start)


def progress(conn: psycopg.Connection, tag: str) -> tuple[int, int]:
    """(done, not done) among the floor's jobs of ``tag``."""
    row = conn.execute(
        f"SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status <> 'done')"
        f" FROM {TABLE} WHERE payload->>'bench' = %s",
        (tag,),
    ).fetchone()
    return int(row[0]), int(row[1])


def timings(conn: psycopg.Connection, tag: str) -> tuple[list[float], list[float]]:
    """(finished_at as epoch seconds, scheduling delays in seconds) of ``tag``'s jobs."""
    rows = conn.execute(
        f"SELECT extract(epoch FROM finished_at)::float8, "
        f"extract(epoch FROM started_at - run_at)::float8 FROM {TABLE} "
        f"WHERE payload->>'bench' = %s AND status = 'done'",
        (tag,),
    ).fetchall()
    return [r[0] for r in rows], [r[1] for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools.bench.floor")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="one floor worker process (the bench starts these)")
    w.add_argument("--dsn", required=True)
    w.add_argument("--name", default="floor")
    w.add_argument("--idle-sleep", type=float, default=IDLE_SLEEP)
    args = parser.parse_args(argv)
    return work(args.dsn, args.name, args.idle_sleep)


if __name__ == "__main__":
    sys.exit(main())
