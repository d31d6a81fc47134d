"""``python -m chaos``: run chaos scenarios against the local stack.

    python -m chaos list                     # the scenarios, their faults and rough length
    python -m chaos run [NAME ...]           # all scenarios when no name is given
    python -m chaos run b-worker-sigstop --unsafe   # the same with fencing off: must FAIL
    python -m chaos summary reports/chaos/<timestamp>  # the table again, from the reports

A NAME is a scenario name or a unique prefix of one (``a`` for ``a-worker-sigkill``). Each
run writes ``reports/chaos/<timestamp>/<scenario>/`` and prints one summary table.

Exit status: 0 every expectation met; 1 an expectation violated (lost or doubled jobs, a
recovery bound, ...); 2 nothing violated but something could not be shown (an empty run, a
fault that did not inject); 3 the harness could not run a scenario; 64 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import trio

from chaos import runner
from chaos.loader import ScenarioError


def _list(args: argparse.Namespace) -> int:
    scenarios = runner.load(args.scenarios)
    width = max((len(s.name) for s in scenarios), default=8)
    for s in scenarios:
        faults = ", ".join(s.fault_names) or "none"
        mode = "" if s.fencing else "  [fencing OFF]"
        if s.schedules:
            relays = 1 + len(s.extra_relays)
            mode += f"  [{len(s.schedules)} schedule(s), {relays} relay(s)]"
        if any(r.unsafe_scheduler for r in s.relays):
            mode += "  [scheduler UNSAFE]"
        if s.unique is not None:
            mode += f"  [unique load, {s.unique.inserters} inserters]"
            mode += "  [unique UNSAFE]" if s.unique.unsafe else ""
        if s.mail_guard is not None:
            mode += f"  [mail guard: {s.mail_guard}]" + ("" if s.mail_fenced else " UNSAFE")
        print(
            f"{s.name:<{width}}  ~{runner.seconds_estimate(s):4.0f}s + quiet  "
            f"{len(s.faults):2d} fault(s): {faults}{mode}"
        )
        if args.verbose and s.description:
            print(f"{'':<{width}}  {' '.join(s.description.split())}")
    return 0


def _interrupted(exc: BaseException) -> bool:
    """Ctrl-C, possibly wrapped in Trio's exception groups."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_interrupted(e) for e in exc.exceptions)
    return False


def _run(args: argparse.Namespace) -> int:
    try:
        scenarios = runner.select(runner.load(args.scenarios), args.names)
    except (ScenarioError, ValueError) as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 64
    if args.unsafe:
        scenarios = [runner.make_unsafe(s) for s in scenarios]
    try:
        results = trio.run(lambda: runner.run_all(scenarios, out_dir=args.out, seed=args.seed))
    except BaseException as exc:
        if not _interrupted(exc):
            raise
        print(
            "chaos: interrupted; the faults were healed and the stack restored (see above)",
            file=sys.stderr,
        )
        return 130
    print(runner.summary(results, fmt="plain"), end="")
    if results:
        print(f"\nreports: {results[0].directory.parent}")
    code = runner.exit_code(results)
    if code:
        for r in results:
            if r.error is None and r.judgement is not None and r.judgement.passed is not True:
                print(f"\n{r.scenario.name}:", file=sys.stderr)
                for problem in r.judgement.problems[:10]:
                    print(f"  - {problem}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--scenarios", type=Path, default=runner.SCENARIOS_DIR, help="scenario directory"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="list the scenarios")
    p_list.add_argument("-v", "--verbose", action="store_true", help="with descriptions")
    p_sum = sub.add_parser("summary", help="the summary table of a report directory")
    p_sum.add_argument("directory", type=Path, help="reports/chaos/<timestamp>")
    p_sum.add_argument("--markdown", action="store_true")
    p_run = sub.add_parser("run", help="run scenarios (all when none is named)")
    p_run.add_argument("names", nargs="*", metavar="NAME")
    p_run.add_argument("--seed", type=int, default=None, help="workload seed (default: per name)")
    p_run.add_argument("--out", type=Path, default=None, help="report directory")
    p_run.add_argument(
        "--unsafe",
        action="store_true",
        help="run with the workers in the plain-TTL lease mode (fencing off), keeping the "
        "scenario's expectations: a scenario that stalls a worker must then FAIL",
    )
    args = parser.parse_args(argv)
    if args.command == "list":
        try:
            return _list(args)
        except ScenarioError as exc:
            print(f"chaos: {exc}", file=sys.stderr)
            return 64
    if args.command == "summary":
        text = runner.summary_of_directory(
            args.directory, fmt="markdown" if args.markdown else "plain"
        )
        if not text:
            print(f"chaos: no report.json under {args.directory}", file=sys.stderr)
            return 64
        print(text, end="")
        return 0
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
