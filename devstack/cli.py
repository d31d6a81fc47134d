"""``python -m devstack COMMAND``: a thin argparse layer over :class:`Stack`."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from .errors import StackError
from .progress import setup_logging
from .stack import Stack
from .status import format_table


def _signal(value: str) -> int:
    name = value.upper()
    if name.isdigit():
        return int(name)
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown signal {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m devstack",
        description="Local leasework stack on loopback (state: $LEASEWORK_STATE_DIR, "
        "default /var/tmp/leasework). Names: postgres redis toxiproxy kafka-1 kafka-2 "
        "kafka-3 alertmanager prometheus api relay worker-1 worker-2 shop.",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("provision", help="install/download/build what the stack needs")
    up = sub.add_parser("up", help="provision + start everything, wait until ready")
    modes = up.add_mutually_exclusive_group()
    modes.add_argument(
        "--secure",
        dest="mode",
        action="store_const",
        const="secure",
        help="leasework's processes use only the secured listeners (Kafka SASL_SSL with "
        "SCRAM, Redis TLS with an ACL user, Postgres verify-full); kept until --plain",
    )
    modes.add_argument(
        "--plain",
        dest="mode",
        action="store_const",
        const="plain",
        help="leasework's processes use the plain listeners (the default)",
    )
    sub.add_parser("up-infra", help="like up, without the leasework processes")
    sub.add_parser("down", help="stop everything started (by recorded pid)")
    st = sub.add_parser("status", help="table of services: pid, alive, ready, address")
    st.add_argument(
        "--check", action="store_true", help="exit 3 unless every service is alive and ready"
    )
    sub.add_parser("clean", help="down + delete the state dir")
    sub.add_parser("migrate", help="run `python -m leasework migrate` once")
    for cmd, text in (
        ("start", "start one service (if not running) and wait until ready"),
        ("stop", "stop one service: its stop signal, SIGKILL after 20s"),
        ("restart", "stop + start one service"),
        ("pause", "SIGSTOP every process of a service"),
        ("resume", "SIGCONT every process of a service"),
    ):
        sub.add_parser(cmd, help=text).add_argument("name")
    k = sub.add_parser("kill", help="send a signal to a service's main process")
    k.add_argument("name")
    k.add_argument("--signal", "-s", type=_signal, default=signal.SIGKILL)
    lg = sub.add_parser("logs", help="tail a service's log")
    lg.add_argument("name")
    lg.add_argument("-n", "--lines", type=int, default=50)
    return p


def run(args: argparse.Namespace, stack: Stack) -> int:
    cmd = args.cmd
    if cmd == "provision":
        stack.provision()
    elif cmd == "up":
        stack.up(apps=True, mode=args.mode)
    elif cmd == "up-infra":
        stack.up(apps=False)
    elif cmd == "down":
        stack.down()
    elif cmd == "clean":
        stack.clean()
    elif cmd == "migrate":
        stack.run_migrate()
    elif cmd == "status":
        rows = stack.status()
        print(format_table(rows))
        if args.check and not all(r.alive and r.ready for r in rows):
            return 3
    elif cmd == "start":
        stack.start(args.name)
    elif cmd == "stop":
        stack.stop(args.name)
    elif cmd == "restart":
        stack.restart(args.name)
    elif cmd == "kill":
        pid = stack.kill(args.name, args.signal)
        print(f"{args.name}: sent {signal.Signals(args.signal).name} to pid {pid}")
    elif cmd == "pause":
        stack.pause(args.name)
    elif cmd == "resume":
        stack.resume(args.name)
    elif cmd == "logs":
        print(stack.logs(args.name, args.lines))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    try:
        return run(args, Stack.from_env())
    except StackError as e:
        print(f"devstack {args.cmd}: ERROR: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"devstack {args.cmd}: interrupted", file=sys.stderr)
        return 130
