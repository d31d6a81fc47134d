"""``leasework ROLE [--app module:attr]`` runs a process (api, relay, worker, dev, migrate);
``leasework submit|get|list|cancel|retry|wait|smoke`` and ``leasework schedules ...`` talk
to the API (with ``$LEASEWORK_TOKEN`` or the token ``just up`` wrote); ``leasework token ...``
manages tokens."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from leasework import config
from leasework.audit import commands as audit_cli
from leasework.queues import commands as queue_cli
from leasework.schedules import commands as schedule_cli
from leasework.states import RETRYABLE
from leasework.tokens import commands as token_cli

if TYPE_CHECKING:  # the client (httpx) is imported only by the commands that talk to the api
    from leasework.client import ApiError, Client

ROLES = ("api", "relay", "worker", "dev", "migrate")


def role_arguments(role: str, args: list[str]) -> argparse.Namespace:
    """``--app module:attr`` (or ``--app=...``) after a role: the app to load, if given; and
    for a worker, ``--queues`` it serves."""
    parser = argparse.ArgumentParser(prog=f"leasework {role}")
    parser.add_argument(
        "--app",
        help="your job types, as module:attribute (several comma-separated); default "
        "$LEASEWORK_APP",
    )
    if role in ("worker", "dev"):
        parser.add_argument(
            "--queues",
            help="the queues this worker serves, comma-separated (e.g. emails,default); "
            "default $LEASEWORK_QUEUES, else default and every queue the app's types name",
        )
    return parser.parse_args(args)


def run_role(role: str, args: list[str] | None = None) -> int:
    import os

    given = role_arguments(role, args or [])
    app_spec = given.app
    if app_spec is not None:
        os.environ["LEASEWORK_APP"] = app_spec
    if getattr(given, "queues", None) is not None:
        os.environ["LEASEWORK_QUEUES"] = given.queues
    try:
        settings = config.load(role)
    except config.ConfigError as exc:
        print(f"leasework {role}: invalid configuration: {exc}", file=sys.stderr)
        return 2
    app = None
    if settings.app is not None:
        from leasework.app import load_app
        from leasework.errors import AppLoadError

        variable = "--app" if app_spec is not None else "LEASEWORK_APP"
        try:
            app = load_app(settings.app, variable)
        except AppLoadError as exc:
            print(f"leasework {role}: cannot load the app: {exc}", file=sys.stderr)
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

    from leasework.roles import LONG_RUNNING, prepare

    if (taken := address_taken(settings.ops_addr)) is not None:
        print(f"leasework {role}: {taken}", file=sys.stderr)
        return 2
    from leasework.preflight import Refused, failure_lines

    prepare(app)
    from leasework.heap import freeze_startup_heap

    freeze_startup_heap()
    try:
        trio.run(LONG_RUNNING[role], settings, app)
    except Refused as exc:
        for line in failure_lines(exc.checks):
            print(f"leasework {role}: {line}", file=sys.stderr)
        print(f"leasework {role}: {exc}", file=sys.stderr)
        return 1
    return 0


def address_taken(addr: tuple[str, int] | None) -> str | None:
    """Why ``addr`` cannot be listened on (another process holds it), or None."""
    import errno
    import socket

    if addr is None:
        return None
    with socket.socket(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(addr)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return None  # let the server say what is wrong
            return (
                f"{addr[0]}:{addr[1]} is already in use (the stack's api, if `just up` is "
                "running: `just up-infra` starts the dependencies alone for `just dev`); "
                "or set LEASEWORK_OPS_ADDR to another address"
            )
    return None


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


BATCH = 1000


def read_jobs_file(path: str) -> list[dict[str, Any]]:
    """Jobs from a JSON Lines file (``-``: standard input): one object per line with ``type``
    and the optional fields of a batch item. Raises ValueError naming the bad line."""
    handle = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    jobs = []
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
            if not isinstance(item, dict) or "type" not in item:
                raise ValueError(f"{path}:{number}: each line must be an object with a type")
            jobs.append((number, item))
    return jobs


def submit_file(client: Any, path: str) -> int:
    from leasework.client import ApiError

    try:
        numbered = read_jobs_file(path)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}; nothing was submitted", file=sys.stderr)
        return 2
    done = 0
    for start in range(0, len(numbered), BATCH):
        chunk = numbered[start : start + BATCH]
        try:
            accepted = client.submit_many(item for _, item in chunk)
        except ApiError as exc:
            print(f"error: lines {chunk[0][0]}-{chunk[-1][0]} refused: {exc}", file=sys.stderr)
            for error in exc.problem.get("errors") or []:
                field = str(error.get("field"))
                if field.startswith("jobs["):
                    index, _, rest = field[5:].partition("]")
                    field = f"line {chunk[int(index)][0]}{rest}"
                print(f"  {field}: {error.get('message')}", file=sys.stderr)
            print(
                f"{done} job(s) before line {chunk[0][0]} were accepted; fix the file and run "
                "it again (give each line an idempotency_key to make a re-run safe)",
                file=sys.stderr,
            )
            return 1
        for (number, _), job in zip(chunk, accepted, strict=True):
            print(json.dumps({"line": number, **job}))
        done += len(accepted)
    print(f"submitted {done} job(s) from {path}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leasework", description=__doc__)
    parser.add_argument(
        "--url",
        default=None,
        help="API base URL (default $LEASEWORK_API_URL or http://127.0.0.1:8080)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for role in ROLES:
        sub.add_parser(role, help=f"run the {role} process (--app module:attr)")
    p = sub.add_parser("submit", help="submit a job, or every job of a JSON Lines file")
    p.add_argument("type", nargs="?")
    p.add_argument("payload", nargs="?", default="{}", help="JSON payload")
    p.add_argument("--file", help="JSON Lines of jobs, 1,000 per request ('-': stdin)")
    p.add_argument("--delay", type=float, dest="delay_seconds")
    p.add_argument("--run-at", dest="run_at")
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--timeout", type=int, dest="timeout_seconds")
    p.add_argument("--ordering-key")
    p.add_argument("--idempotency-key")
    p = sub.add_parser("get", help="show a job")
    p.add_argument("job_id")
    p = sub.add_parser("wait", help="wait for a job to finish; print its result")
    p.add_argument("job_id")
    p.add_argument("--timeout", type=float, default=60.0)
    p = sub.add_parser("list", help="list jobs, newest first")
    p.add_argument("--status")
    p.add_argument("--type")
    p.add_argument("--limit", type=int)
    p.add_argument("--cursor")
    p = sub.add_parser("cancel", help="cancel a job")
    p.add_argument("job_id")
    p = sub.add_parser(
        "retry", help="retry a dead or cancelled job, or every one matching the filters"
    )
    p.add_argument("job_id", nargs="?")
    p.add_argument("--type")
    p.add_argument("--status", choices=sorted(RETRYABLE))
    p.add_argument("--since", dest="finished_after", help="finished at or after (RFC 3339)")
    p.add_argument("--until", dest="finished_before", help="finished before (RFC 3339)")
    p.add_argument("--limit", type=int)
    p = sub.add_parser("smoke", help="submit a noop job and wait for it to succeed")
    p.add_argument("--timeout", type=float, default=60.0)
    p = sub.add_parser("config", help="print the effective configuration of a role, secrets masked")
    p.add_argument("role", nargs="?", default="api", choices=ROLES)
    token_cli.add_parser(sub)
    schedule_cli.add_parser(sub)
    audit_cli.add_parser(sub)
    queue_cli.add_parser(sub)
    from leasework import doctor

    doctor.add_parser(sub)
    return parser


def print_config(role: str) -> int:
    """``leasework config ROLE``: every setting the role would run with, where it came from
    (a variable, the ``LEASEWORK_CONFIG`` file, or the default), secrets masked."""
    try:
        rows = config.effective(role)
    except config.ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        print(f"{name:<{width}} = {value!r:<40} # {source}")
    return 0


Command = Callable[["Client", argparse.Namespace, argparse.ArgumentParser], int]


def _submit(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.file is not None:
        return submit_file(client, args.file)
    if args.type is None:
        parser.error("submit needs a TYPE (or --file)")
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
    return 0


def _wait(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from leasework.errors import JobFailed, WaitTimeout

    try:
        _print(client.wait(args.job_id, args.timeout))
    except (JobFailed, WaitTimeout) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _retry(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    filters = (args.type, args.status, args.finished_after, args.finished_before)
    if args.job_id is not None:
        if any(f is not None for f in filters):
            parser.error("retry takes a JOB_ID or filters, not both")
        _print(client.retry(args.job_id))
        return 0
    count = client.retry_many(
        type=args.type,
        status=args.status,
        finished_after=args.finished_after,
        finished_before=args.finished_before,
        limit=args.limit,
    )
    _print({"retried": count})
    return 0


def _printing(call: Callable[[Client, argparse.Namespace], Any]) -> Command:
    def command(client: Client, args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
        _print(call(client, args))
        return 0

    return command


# the commands that talk to the api, by name
API_COMMANDS: dict[str, Command] = {
    "submit": _submit,
    "get": _printing(lambda client, args: client.get(args.job_id)),
    "wait": _wait,
    "list": _printing(
        lambda client, args: client.list(
            status=args.status, type=args.type, limit=args.limit, cursor=args.cursor
        )
    ),
    "cancel": _printing(lambda client, args: client.cancel(args.job_id)),
    "retry": _retry,
    "schedules": schedule_cli.run,
}


def _api_error(exc: ApiError) -> int:
    print(f"error: {exc}", file=sys.stderr)
    if exc.status == 401:
        print(
            "  send a token: set LEASEWORK_TOKEN (or LEASEWORK_TOKEN_FILE); `just up` writes "
            "a development one to $LEASEWORK_STATE_DIR/tokens/dev.token",
            file=sys.stderr,
        )
    if errors := exc.problem.get("errors"):
        for error in errors:
            print(f"  {error.get('field')}: {error.get('message')}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ROLES:
        return run_role(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "token":
        return token_cli.run(args)
    if args.command == "audit":
        return audit_cli.run(args)
    if args.command == "queues":
        return queue_cli.run(args)
    if args.command == "doctor":
        from leasework import doctor

        return doctor.run(args)
    if args.command == "config":
        return print_config(args.role)

    from leasework.client import DEFAULT_URL, ApiError, Client

    url = args.url or DEFAULT_URL
    if args.command == "smoke":
        return smoke(url, args.timeout)
    import httpx

    try:
        with Client(url) as client:
            return API_COMMANDS[args.command](client, args, parser)
    except ApiError as exc:
        return _api_error(exc)
    except httpx.TransportError as exc:
        print(f"error: cannot reach the API at {url}: {exc}; is it up (just up)?", file=sys.stderr)
        return 1
