"""``just bench --rows lanes,blocking`` (on request): what each lane costs, and what a handler
that blocks its loop costs its neighbours (issue 55).

* lanes: the same ``noop`` and the same fenced effect (``ledger``: one row inserted through
  the fence) in each lane (the demo's ``noop``/``noop_thread``/``noop_asyncio``/
  ``noop_process`` and ``ledger``/``ledger_thread``/``ledger_asyncio``/``ledger_process``),
  :data:`LANE_JOBS` jobs each, enqueued at once (``enqueue_many``, 100 per transaction):
  jobs per second end to end (first enqueue to last finish) and CPU per job of every process
  (a process lane's children counted in their worker's tree), each against the trio lane's
  figure of the same kind in the same run.
* blocking: :data:`NEIGHBOURS` ``noop`` jobs paced at :data:`PACE` s apart, their time from
  due to finished (p50, p99, max): alone, while ``block_trio`` handlers block a worker's own
  loop for :data:`BLOCK_SECONDS` s (``time.sleep``; the loop guard keeps every lease), and
  while ``block_asyncio`` handlers block the asyncio lane's loop as long (then the asyncio
  lane's own neighbours, ``noop_asyncio`` paced alike, are measured too: they share that
  loop). A blocker starts every :data:`BLOCK_EVERY` s.

It measures; it asserts nothing.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

import leasework

LANES = ("trio", "thread", "asyncio", "process")
TYPES = {
    "noop": {
        "trio": "noop",
        "thread": "noop_thread",
        "asyncio": "noop_asyncio",
        "process": "noop_process",
    },
    "fenced": {
        "trio": "ledger",
        "thread": "ledger_thread",
        "asyncio": "ledger_asyncio",
        "process": "ledger_process",
    },
}
LANE_JOBS = 1000
CHUNK = 100
NEIGHBOURS, PACE = 150, 0.1  # 15 s of neighbours
BLOCK_SECONDS, BLOCK_EVERY = 3.0, 5.0
TAGGED = "created_at >= to_timestamp(%(since)s) AND payload->>'bench' = %(tag)s"


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def enqueue_tagged(dsn: str, job_type: str, tag: str, jobs: int) -> float:
    """Enqueue ``jobs`` of ``job_type`` tagged ``tag``, 100 per transaction; the first
    enqueue's time (epoch s)."""
    first = time.time()
    with psycopg.connect(dsn) as conn:
        for start in range(0, jobs, CHUNK):
            with conn.transaction():
                leasework.enqueue_many(
                    conn,
                    [
                        leasework.job(job_type, {"bench": tag, "n": i})
                        for i in range(start, min(jobs, start + CHUNK))
                    ],
                )
    return first


def finished_times(conn: psycopg.Connection, tag: str, since: float) -> list[tuple[float, float]]:
    """(run_at, finished_at) as epoch seconds of ``tag``'s succeeded jobs."""
    rows = conn.execute(
        "SELECT extract(epoch FROM run_at), extract(epoch FROM finished_at) FROM jobs "
        f"WHERE {TAGGED} AND status = 'succeeded'",
        {"since": since - 1.0, "tag": tag},
    ).fetchall()
    return [(float(r[0]), float(r[1])) for r in rows]


def lanes_row(
    conn: psycopg.Connection,
    dsn: str,
    run_id: str,
    wait_done: Callable[[str, int, float], None],
    window: Callable[[], Any],
    settle: Callable[[], None],
) -> dict[str, Any]:
    """Each lane's noop and fenced effect; ``window()`` starts a CPU window (its
    ``stop(jobs)`` the figures), ``wait_done(tag, jobs, since)`` waits for them all."""
    cells: list[dict[str, Any]] = []
    for kind, types in TYPES.items():
        for lane in LANES:
            tag = f"{run_id}-lanes-{kind}-{lane}"
            log(f"lanes: {LANE_JOBS} {types[lane]} ({kind}, {lane} lane)")
            measuring = window()
            first = enqueue_tagged(dsn, types[lane], tag, LANE_JOBS)
            wait_done(tag, LANE_JOBS, first)
            measured = measuring.stop(LANE_JOBS)
            end = max(f for _, f in finished_times(conn, tag, first))
            cpu = measured["cpu_ms_per_job"]
            cells.append(
                {
                    "kind": kind,
                    "lane": lane,
                    "type": types[lane],
                    "jobs": LANE_JOBS,
                    "e2e_per_s": LANE_JOBS / (end - first),
                    "cpu_ms_per_job": cpu,
                    "cpu_ms_per_job_total": cpu.get("total")
                    or sum(v for v in cpu.values() if v is not None),
                }
            )
            settle()
    for cell in cells:
        trio_cell = next(c for c in cells if c["kind"] == cell["kind"] and c["lane"] == "trio")
        cell["rate_vs_trio"] = cell["e2e_per_s"] / trio_cell["e2e_per_s"]
        cell["cpu_vs_trio"] = cell["cpu_ms_per_job_total"] / trio_cell["cpu_ms_per_job_total"]
    return {"jobs": LANE_JOBS, "cells": cells}


def _pace(dsn: str, job_type: str, tag: str, count: int, pace: float, began: float) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(count):
            time.sleep(max(0.0, began + i * pace - time.time()))
            leasework.enqueue(conn, job_type, {"bench": tag, "n": i})


def _summary(times: list[tuple[float, float]]) -> dict[str, Any]:
    waits = sorted(f - r for r, f in times)
    if not waits:
        return {"jobs": 0}
    p99 = waits[min(len(waits) - 1, int(0.99 * len(waits)))]
    return {
        "jobs": len(waits),
        "p50_s": statistics.median(waits),
        "p99_s": p99,
        "max_s": waits[-1],
    }


def blocking_row(
    conn: psycopg.Connection,
    dsn: str,
    run_id: str,
    wait_done: Callable[[str, int, float], None],
    settle: Callable[[], None],
) -> dict[str, Any]:
    """The paced neighbours' waits alone, beside blocked trio loops, beside a blocked
    asyncio lane loop."""
    cases: dict[str, dict[str, Any]] = {}
    for case, blocker, neighbour_types in (
        ("alone", None, ("noop",)),
        ("trio-loop-blocked", "block_trio", ("noop",)),
        ("asyncio-loop-blocked", "block_asyncio", ("noop", "noop_asyncio")),
    ):
        log(f"blocking: {case}, {NEIGHBOURS} paced neighbours of each of {neighbour_types}")
        began = time.time() + 0.5
        pacers = [
            threading.Thread(
                target=_pace,
                args=(dsn, t, f"{run_id}-blocking-{case}-{t}", NEIGHBOURS, PACE, began),
            )
            for t in neighbour_types
        ]
        for thread in pacers:
            thread.start()
        blockers = 0
        if blocker is not None:
            with psycopg.connect(dsn, autocommit=True) as bconn:
                at = began + 1.0
                while at + BLOCK_SECONDS < began + NEIGHBOURS * PACE:
                    time.sleep(max(0.0, at - time.time()))
                    leasework.enqueue(
                        bconn,
                        blocker,
                        {"how": "sleep", "seconds": BLOCK_SECONDS},
                    )
                    blockers += 1
                    at += BLOCK_EVERY
        for thread in pacers:
            thread.join()
        result: dict[str, Any] = {"blocker": blocker, "blockers": blockers}
        for t in neighbour_types:
            tag = f"{run_id}-blocking-{case}-{t}"
            wait_done(tag, NEIGHBOURS, began)
            result[t] = _summary(finished_times(conn, tag, began))
        cases[case] = result
        settle()
        if blocker is not None:  # the blockers end before the next case
            time.sleep(BLOCK_SECONDS)
    return {
        "neighbours": NEIGHBOURS,
        "pace_s": PACE,
        "block_s": BLOCK_SECONDS,
        "block_every_s": BLOCK_EVERY,
        "cases": cases,
    }


def lanes_markdown(lanes: dict[str, Any]) -> list[str]:
    out = [
        "",
        f"## Lanes: the same job in each lane ({lanes['jobs']} jobs each, enqueue_many)",
        "",
        "| job | lane | jobs/s | vs trio | CPU ms/job (all processes) | vs trio |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for c in lanes["cells"]:
        out.append(
            f"| {c['kind']} ({c['type']}) | {c['lane']} | {c['e2e_per_s']:.0f} | "
            f"{c['rate_vs_trio']:.2f}x | {c['cpu_ms_per_job_total']:.2f} | "
            f"{c['cpu_vs_trio']:.2f}x |"
        )
    return out


def blocking_markdown(blocking: dict[str, Any]) -> list[str]:
    out = [
        "",
        f"## A handler blocking its loop: the neighbours' time from due to finished "
        f"({blocking['neighbours']} paced {blocking['pace_s']} s apart; a blocker of "
        f"{blocking['block_s']} s every {blocking['block_every_s']} s)",
        "",
        "| case | neighbours | p50 s | p99 s | max s |",
        "|---|---|---:|---:|---:|",
    ]
    for case, result in blocking["cases"].items():
        for t, s in result.items():
            if not isinstance(s, dict) or not s.get("jobs"):
                continue
            out.append(f"| {case} | {t} | {s['p50_s']:.3f} | {s['p99_s']:.3f} | {s['max_s']:.3f} |")
    return out


def _spread(values: list[float | None]) -> dict[str, float | None]:
    got = sorted(v for v in values if v is not None)
    if not got:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(got), "min": got[0], "max": got[-1]}


def aggregate(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and spread over the runs of each lane cell and each blocking figure."""
    out: dict[str, Any] = {}
    lanes = [r["lanes"] for r in results if r.get("lanes")]
    if lanes:
        cells = {}
        for cell in lanes[0]["cells"]:
            key = (cell["kind"], cell["lane"])
            same = [next(c for c in run["cells"] if (c["kind"], c["lane"]) == key) for run in lanes]
            cells[f"{cell['kind']} ({cell['type']}) | {cell['lane']}"] = {
                figure: _spread([c[figure] for c in same])
                for figure in ("e2e_per_s", "rate_vs_trio", "cpu_ms_per_job_total", "cpu_vs_trio")
            }
        out["lanes"] = cells
    blocking = [r["blocking"] for r in results if r.get("blocking")]
    if blocking:
        figures = {}
        for case, result in blocking[0]["cases"].items():
            for t, s in result.items():
                if isinstance(s, dict) and s.get("jobs"):
                    figures[f"{case} | {t}"] = {
                        f: _spread([run["cases"][case][t].get(f) for run in blocking])
                        for f in ("p50_s", "p99_s", "max_s")
                    }
        out["blocking"] = figures
    return out


def _cell(s: dict[str, float | None], digits: int, suffix: str = "") -> str:
    if s["median"] is None:
        return "–"
    return f"{s['median']:.{digits}f}{suffix} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def summary_markdown(summary: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if summary.get("lanes"):
        out += [
            "## Lanes: the same job in each lane, median (lowest–highest)",
            "",
            "| job | lane | jobs/s | vs trio | CPU ms/job (all processes) | vs trio |",
            "|---|---|---:|---:|---:|---:|",
            *(
                f"| {name} | {_cell(f['e2e_per_s'], 0)} | {_cell(f['rate_vs_trio'], 2, 'x')} | "
                f"{_cell(f['cpu_ms_per_job_total'], 2)} | {_cell(f['cpu_vs_trio'], 2, 'x')} |"
                for name, f in summary["lanes"].items()
            ),
            "",
        ]
    if summary.get("blocking"):
        out += [
            "## A handler blocking its loop: neighbours' due-to-finished, median (lowest–highest)",
            "",
            "| case | neighbours | p50 s | p99 s | max s |",
            "|---|---|---:|---:|---:|",
            *(
                f"| {name} | {_cell(f['p50_s'], 3)} | {_cell(f['p99_s'], 3)} | "
                f"{_cell(f['max_s'], 3)} |"
                for name, f in summary["blocking"].items()
            ),
            "",
        ]
    return out
