"""``leasework ROLE`` runs a process; ``leasework submit|get|list|cancel|smoke`` talk to the API."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from leasework import config

ROLES = ("api", "relay", "worker", "migrate")


def run_role(role: str) -> int:
    try:
        settings = config.load(role)
    except config.ConfigError as exc:
        print(f"leasework {role}: invalid configuration: {exc}", file=sys.stderr)
        return 2
    from leasework import logs

    logs.configure(settings.process_name, settings.log_level)
    if role == "migrate":
        import psycopg

        from leasework.migrate import apply_all

        try:
            applied = apply_all(settings.postgres_dsn)
        except psycopg.OperationalError as exc:
            print(
                f"leasework migrate: cannot reach Postgres at LEASEWORK_POSTGRES_DSN: {exc}; "
                "is the stack up (just up)?",
                file=sys.stderr,
            )
            return 1
        print(json.dumps({"applied": applied}))
        return 0

    import trio

    from leasework.roles import LONG_RUNNING

    trio.run(LONG_RUNNING[role], settings)
    return 0


def _print(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True))


def smoke(url: str, timeout: float) -> int:
    from leasework.client import Client

    with Client(url) as client:
        job = client.submit("noop", {"smoke": True})
        print(f"submitted {job['id']} ({job['status']})", file=sys.stderr)
        deadline = time.monotonic() + timeout
        status = job["status"]
        while time.monotonic() < deadline:
            status = client.get(job["id"])["status"]
            if status == "succeeded":
                print(f"smoke: job {job['id']} succeeded")
                return 0
            time.sleep(0.2)
        print(
            f"smoke: job {job['id']} did not succeed within {timeout:g}s; last status {status!r}",
            file=sys.stderr,
        )
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ROLES:
        return run_role(argv[0])
    parser = argparse.ArgumentParser(prog="leasework", description=__doc__)
    parser.add_argument(
        "--url",
        default=None,
        help="API base URL (default $LEASEWORK_API_URL or http://127.0.0.1:8080)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for role in ROLES:
        sub.add_parser(role, help=f"run the {role} process")
    p = sub.add_parser("submit", help="submit a job")
    p.add_argument("type")
    p.add_argument("payload", nargs="?", default="{}", help="JSON payload")
    p.add_argument("--delay", type=float, dest="delay_seconds")
    p.add_argument("--run-at", dest="run_at")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--timeout", type=int, dest="timeout_seconds")
    p.add_argument("--ordering-key")
    p.add_argument("--idempotency-key")
    p = sub.add_parser("get", help="show a job")
    p.add_argument("job_id")
    p = sub.add_parser("list", help="list jobs, newest first")
    p.add_argument("--status")
    p.add_argument("--type")
    p.add_argument("--limit", type=int)
    p.add_argument("--cursor")
    p = sub.add_parser("cancel", help="cancel a job")
    p.add_argument("job_id")
    p = sub.add_parser("smoke", help="submit a noop job and wait for it to succeed")
    p.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)

    from leasework.client import DEFAULT_URL, ApiError, Client

    url = args.url or DEFAULT_URL
    if args.command == "smoke":
        return smoke(url, args.timeout)
    import httpx

    try:
        with Client(url) as client:
            if args.command == "submit":
                try:
                    payload = json.loads(args.payload)
                except ValueError as exc:
                    print(f"payload is not JSON: {exc}", file=sys.stderr)
                    return 2
                _print(
                    client.submit(
                        args.type,
                        payload,
                        idempotency_key=args.idempotency_key,
                        delay_seconds=args.delay_seconds,
                        run_at=args.run_at,
                        max_attempts=args.max_attempts,
                        timeout_seconds=args.timeout_seconds,
                        ordering_key=args.ordering_key,
                    )
                )
            elif args.command == "get":
                _print(client.get(args.job_id))
            elif args.command == "list":
                _print(
                    client.list(
                        status=args.status, type=args.type, limit=args.limit, cursor=args.cursor
                    )
                )
            elif args.command == "cancel":
                _print(client.cancel(args.job_id))
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if errors := exc.problem.get("errors"):
            for error in errors:
                print(f"  {error.get('field')}: {error.get('message')}", file=sys.stderr)
        return 1
    except httpx.TransportError as exc:
        print(f"error: cannot reach the API at {url}: {exc}; is it up (just up)?", file=sys.stderr)
        return 1
    return 0
