"""``leasework queues``: list the queues with their depth, running jobs, oldest waiting job
and throughput; ``leasework queues create NAME`` makes one (its Kafka topic, then its row)."""

from __future__ import annotations

import argparse
import json
import sys

import psycopg
from confluent_kafka import KafkaException

from leasework import config
from leasework.queue_ops import QueueError, QueueState, ensure_queues, queues_list


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "queues",
        help="list the queues (waiting, running, oldest waiting, throughput); "
        "`queues create NAME` makes one",
    )
    p.add_argument("action", nargs="?", choices=("list", "create"), default="list")
    p.add_argument("name", nargs="?", help="the queue to create")
    p.add_argument("--json", action="store_true", help="print the list as JSON")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 120 else f"{seconds / 60:.1f}m"


def table(states: list[QueueState]) -> str:
    """The list as the CLI prints it."""
    lines = [f"{'queue':<24} {'waiting':>8} {'running':>8} {'oldest waiting':>15} {'jobs/s':>8}"]
    for s in states:
        lines.append(
            f"{s.name:<24} {s.waiting:>8} {s.running:>8} "
            f"{_age(s.oldest_waiting_seconds):>15} {s.throughput:>8.2f}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.action == "create" and not args.name:
        print("leasework queues create: name the queue, e.g. emails", file=sys.stderr)
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
