"""``leasework queues``: list the queues with their depth, running jobs, oldest waiting job,
throughput and pause; ``leasework queues create NAME`` makes one (its Kafka topic, then its
row); ``pause NAME`` and ``resume NAME`` stop and restart it on every worker (audited, as
the operating-system user, via ``cli``)."""

from __future__ import annotations

import argparse
import getpass
import json
import sys

import psycopg
from confluent_kafka import KafkaException

from leasework import config
from leasework.operations import Actor
from leasework.queues.operations import (
    QueueError,
    QueueState,
    ensure_queues,
    queues_list,
    set_concurrency,
    set_paused,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "queues",
        help="list the queues (waiting, running, oldest waiting, throughput, paused, limit); "
        "`queues create|pause|resume NAME`, `queues limit NAME N|none`",
    )
    p.add_argument(
        "action",
        nargs="?",
        choices=("list", "create", "pause", "resume", "limit"),
        default="list",
    )
    p.add_argument("name", nargs="?", help="the queue to create, pause, resume or limit")
    p.add_argument(
        "value",
        nargs="?",
        help="limit: at most this many of its jobs run at once across all workers (none: no cap)",
    )
    p.add_argument("--json", action="store_true", help="print the list as JSON")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def table(states: list[QueueState]) -> str:
    """The list as the CLI prints it."""
    lines = [
        f"{'queue':<24} {'waiting':>8} {'by priority 0/1/2/3':>20} {'running':>8} "
        f"{'oldest waiting':>15} {'jobs/s':>8}  state"
    ]
    for s in states:
        state = "active" if s.paused_at is None else f"paused by {s.paused_by}, {s.held} held"
        if s.concurrency is not None:
            state += f", at most {s.concurrency} running"
        if s.limited:
            state += f", {s.limited} held by limits"
        bands = "/".join(str(n) for n in s.waiting_by_priority)
        lines.append(
            f"{s.name:<24} {s.waiting:>8} {bands:>20} {s.running:>8} "
            f"{_age(s.oldest_waiting_seconds):>15} {s.throughput:>8.2f}  {state}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.action != "list" and not args.name:
        print(f"leasework queues {args.action}: name the queue, e.g. emails", file=sys.stderr)
        return 2
    try:
        settings = config.load("cli")
    except config.ConfigError as exc:
        print(f"leasework queues: invalid configuration: {exc}", file=sys.stderr)
        return 2
    try:
        with psycopg.connect(settings.postgres_dsn, connect_timeout=5) as conn:
            if args.action == "create":
                made = ensure_queues(
                    conn,
                    settings.kafka_brokers,
                    "leasework-cli",
                    settings.topic_ready,
                    [args.name],
                    created_by="leasework queues create",
                    extra=settings.kafka_properties,
                )
                print(f"queue {args.name}: {'created' if made else 'exists already'}")
                return 0
            if args.action in ("pause", "resume"):
                return toggle(conn, args.name, args.action == "pause")
            if args.action == "limit":
                return limit(conn, args.name, args.value)
            states = queues_list(conn)
    except (QueueError, KafkaException) as exc:
        print(f"leasework queues: {exc}", file=sys.stderr)
        return 1
    except psycopg.OperationalError as exc:
        print(
            f"leasework queues: cannot reach the database ({str(exc).strip()[:200]}); is the "
            "stack up (`just up`), is LEASEWORK_POSTGRES_DSN right?",
            file=sys.stderr,
        )
        return 1
    except psycopg.errors.UndefinedTable:
        print("leasework queues: no queues table yet; run `leasework migrate`", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([s.to_dict() for s in states], indent=2))
    else:
        print(table(states))
    return 0


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name: the audit says so
        return "unknown-user"


def toggle(conn: psycopg.Connection, name: str, paused: bool) -> int:
    """``pause NAME`` / ``resume NAME``: 1 when there is no such queue."""
    with conn.transaction():
        done = set_paused(conn, name, paused, Actor(_user(), "cli"))
    if done.queue is None:
        return no_such_queue(name)
    if not done.changed:
        print(f"queue {name}: {'paused' if paused else 'not paused'} already")
    elif paused:
        print(f"queue {name}: paused; no job of it starts until `leasework queues resume {name}`")
    else:
        print(f"queue {name}: resumed; {done.released} held job(s) due now")
    return 0


def limit(conn: psycopg.Connection, name: str, value: str | None) -> int:
    """``limit NAME N|none``: 2 for a value that is no cap, 1 when there is no such queue."""
    try:
        cap = None if value is not None and value.lower() == "none" else int(value or "")
        if cap is not None and cap < 1:
            raise ValueError
    except ValueError:
        print(
            f"leasework queues limit: give a whole number of at least 1 or none, e.g. "
            f"`leasework queues limit {name} 5` (got {value!r})",
            file=sys.stderr,
        )
        return 2
    with conn.transaction():
        done = set_concurrency(conn, name, cap, Actor(_user(), "cli"))
    if done.queue is None:
        return no_such_queue(name)
    said = "no cap" if cap is None else f"at most {cap} of its jobs running at once"
    print(f"queue {name}: {said}" + ("" if done.changed else " already"))
    return 0


def no_such_queue(name: str) -> int:
    print(
        f"leasework queues: no queue is named {name!r}; `leasework queues` lists them",
        file=sys.stderr,
    )
    return 1
