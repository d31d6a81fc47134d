"""``python -m tools.soak``: the soak on the live stack (see :mod:`tools.soak`).

    python -m tools.soak                 # 30 minutes at half the latest bench's single-submit rate
    python -m tools.soak --minutes 3 --rate 50

It runs one generated chaos scenario through :func:`chaos.runner.run_scenario` (baseline,
load and faults, quiet, tables, checker, the chaos report) while sampling every process's
resources, then judges the goals and writes ``reports/soak/<UTC time>/``. It injects faults
into the shared stack for the whole soak: anyone else's tests on it will see them.

Exit status: 0 every goal met; 1 a goal missed or the checker's verdict invalid (each is
printed); 2 none missed, but one could not be judged; 3 the harness could not run it; 64 bad
arguments; 130 interrupted (faults healed, stack restored).
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

import trio

from chaos.__main__ import _interrupted
from chaos.history import fault_windows
from chaos.runner import run_scenario, stderr_say
from devstack import Stack
from devstack.layout import default_repo_root
from tools.soak import goals as g
from tools.soak.plan import OVERLAP, choose_rate, soak_scenario
from tools.soak.report import SoakRun, result_table, write_report
from tools.soak.sampler import ResourceSampler, Sample, readings_by_process, server_points

REPORTS = default_repo_root() / "reports"
DEFAULT_SEED = 16  # the number: a fixed default, so two soaks of a length match
SAMPLES_PER_WINDOW = 6


def default_interval(minutes: int) -> float:
    """A sample a minute; more often in a soak under 18 minutes, so that each window (a
    third of it) still holds six samples."""
    return min(60.0, minutes * 60.0 / 3 / SAMPLES_PER_WINDOW)


def _say_sample(sample: Sample) -> None:
    rss = sum(r.rss_kib or 0 for r in sample.readings.values()) / 1024
    down = [n for n, r in sample.readings.items() if r.pid is None]
    stderr_say(
        f"[soak sample] RSS {rss:.0f} MiB in all, server connections {sample.server_total}"
        + (f", not running: {', '.join(down)}" if down else "")
    )


async def soak(args: argparse.Namespace) -> int:
    stack = Stack.from_env()
    rate = choose_rate(args.rate, REPORTS / "bench")
    scenario = soak_scenario(args.minutes, rate.per_second, args.seed, overlap=args.overlap)
    out = args.out or REPORTS / "soak" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    interval = args.sample_every or default_interval(args.minutes)
    sampler = ResourceSampler(stack.names(), stack.layout.pidfile, interval)
    stderr_say(
        f"soak: {args.minutes} min at {rate.per_second:g} submits/s ({rate.source}), "
        f"{len(scenario.faults)} faults, seed {args.seed}, a sample every {interval:g}s; "
        f"report in {out}"
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sampler.run, _say_sample)
        result = await run_scenario(scenario, stack, out, seed=args.seed)
        nursery.cancel_scope.cancel()
    record = result.record
    if record is None or record.details is None or record.judgement is None:
        print(f"soak: the chaos run failed: {result.error}", file=sys.stderr)
        return 3
    run_started_at = record.details.run_started_at
    zero = run_started_at.timestamp()
    windows = g.Windows.of(scenario.workload.duration)
    readings = readings_by_process(sampler.samples, zero)
    server = server_points(sampler.samples, zero)
    faults = fault_windows(record.history)
    delays = g.job_delays(record.tables["jobs"], faults, run_started_at, settle=args.settle)
    verdict = record.verdict
    judged = g.judge(
        [g.process_goals(name, series, windows) for name, series in readings.items()],
        g.server_connections(server, windows),
        g.delay_goal(delays, settle=args.settle),
        g.Checked(
            verdict.valid,
            verdict.lost,
            verdict.doubled,
            record.judgement.passed,
            tuple(record.judgement.problems),
        ),
    )
    run = SoakRun(
        minutes=args.minutes,
        rate=rate,
        seed=args.seed,
        interval=interval,
        overlap=args.overlap,
        scenario=scenario.to_dict(),
        chaos_report=result.directory,
        windows=windows,
        goals=judged,
        readings=readings,
        server=server,
        samples=sampler.samples,
        fault_windows=faults,
        buckets=g.delay_buckets(delays, scenario.workload.duration),
        verdict=verdict.to_dict(),
        client_late=record.details.client.late_start,
    )
    write_report(out, run)
    print(result_table(run), end="")
    print(f"\nreport: {out / 'report.md'}")
    for goal in judged.missed:
        print(f"MISSED {goal.name}: {goal.detail}", file=sys.stderr)
    for goal in judged.unknown:
        print(f"unknown {goal.name}: {goal.detail}", file=sys.stderr)
    return g.exit_code(judged)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tools.soak",
        description="A long chaos run that watches every process's resources.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--minutes", type=int, default=30, help="minutes of load and faults")
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="submits per second (default: half the latest reports/bench/*/bench.json's "
        "proxied-single or single row, else 100)",
    )
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="faults' and workload's seed")
    p.add_argument(
        "--overlap",
        type=float,
        default=OVERLAP,
        help="chance that a minute's fault gets a second one overlapping it",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=g.SETTLE,
        help="seconds after a heal whose due jobs still count as the fault's for the delay goal",
    )
    p.add_argument(
        "--sample-every",
        type=float,
        default=None,
        help="seconds between resource samples (default: 60, less in a soak under 18 min)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="report directory (default reports/soak/<time>)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.minutes < 1 or (args.rate is not None and args.rate <= 0):
        print("soak: --minutes must be at least 1 and --rate positive", file=sys.stderr)
        return 64
    if not 0.0 <= args.overlap <= 1.0:
        print("soak: --overlap is a probability", file=sys.stderr)
        return 64
    try:
        return trio.run(soak, args)
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        print("soak: interrupted; the faults were healed and the stack restored", file=sys.stderr)
        return 130
