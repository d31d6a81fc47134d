"""``just conformance`` (part of ``just test``): schemathesis against ``/openapi.json``.

Schemathesis sends every operation schema-valid and schema-violating requests, and reuses what
answers return (job ids, token names) in later requests: it cancels jobs, retries dead ones
and revokes tokens, the development token included. So it runs against an api of its own on a
database of its own, never the stack's: a fresh database ``leasework_conformance`` on the
stack's Postgres, migrated, with one admin token, and an api process on port 8095 loading the
stack's apps (Redis, for rate limits, is shared; nothing runs its jobs), with two schedules
the operations on one schedule are pointed at (``tools/schemathesis.toml``) and generators for
the formats a schema cannot spell (``tools/schemathesis_hooks.py``). Checks: all of them
(no 5xx, status codes, content types, headers and bodies as documented, schema-valid requests
accepted, schema-violating ones refused, 405 with ``Allow``). The whole output goes to
``reports/conformance/<UTC time>/schemathesis.txt``; the summary is printed; the exit status
is schemathesis's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg

from devstack.layout import POSTGRES_DIRECT_DSN, REDIS_PORT, STACK_APP

DATABASE = "leasework_conformance"
PORT = 8095
URL = f"http://127.0.0.1:{PORT}"


def database_dsn(base: str, name: str) -> str:
    """``base`` with its database name replaced (pure)."""
    head, _, _ = base.rpartition("/")
    return f"{head}/{name}"


def recreate_database(name: str) -> None:
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(name: str) -> None:
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def leasework(args: list[str], env: dict[str, str], log: Path) -> None:
    with log.open("ab") as out:
        subprocess.run(
            [sys.executable, "-m", "leasework", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
            timeout=120,
        )


def wait_ready(api: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if api.poll() is not None:
            raise SystemExit(f"conformance: the api exited with {api.returncode}; see {log}")
        try:
            if httpx.get(f"{URL}/readyz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"conformance: the api was not ready within {timeout:.0f} s; see {log}")


# the schedules the operations on one schedule name (tools/schemathesis.toml): yearly, so a
# backfill of any range since 2000 is under the bound; ten for DELETE to take from
SEED_SCHEDULES = ("zz-conformance-yearly", *(f"zz-delete-{n}" for n in range(10)))


def seed_schedules(token: str) -> None:
    for name in SEED_SCHEDULES:
        answer = httpx.post(
            f"{URL}/schedules",
            json={"name": name, "type": "noop", "cron": "0 0 1 1 *"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        if answer.status_code != 201:
            raise SystemExit(f"conformance: cannot create schedule {name}: {answer.text}")


def summary(output: str) -> list[str]:
    """The lines of schemathesis's output worth printing: failures, errors, test cases, the
    last line (pure)."""
    lines = output.splitlines()
    keep = [
        line
        for line in lines
        if line.strip().startswith(("❌", "🚫", "⚠️", "✅", "⏭"))
        or "generated" in line
        or line.startswith(("  Selected", "  Tested"))
    ]
    tail = [line for line in lines if line.startswith("====")][-1:]
    return keep + tail


def app_queues(spec: str) -> list[str]:
    """The queues the app's types name (their submit schemas offer them)."""
    from leasework.app import load_app

    return sorted({t.queue for t in load_app(spec, "LEASEWORK_APP") if t.queue is not None})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conformance", description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=50)
    parser.add_argument("--workers", default="2")
    parser.add_argument("--out", default="reports/conformance")
    args = parser.parse_args(argv)

    out = Path(args.out) / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    log = out / "api.log"
    dsn = database_dsn(POSTGRES_DIRECT_DSN, DATABASE)
    env = {
        **os.environ,
        "LEASEWORK_POSTGRES_DSN": dsn,
        "LEASEWORK_OPS_ADDR": f"127.0.0.1:{PORT}",
        "LEASEWORK_PROCESS_NAME": "conformance-api",
        "LEASEWORK_APP": os.environ.get("LEASEWORK_APP", STACK_APP),
        "LEASEWORK_REDIS_ADDR": f"127.0.0.1:{REDIS_PORT}",
    }
    token_file = out / "token"
    recreate_database(DATABASE)
    api = None
    try:
        leasework(["migrate"], env, log)
        leasework(
            ["token", "create", "--name", "conformance", "--scopes", "admin"]
            + ["--file", str(token_file)],
            env,
            log,
        )
        for queue in app_queues(env["LEASEWORK_APP"]):  # what the workers would have made
            leasework(["queues", "create", queue], env, log)
        api = subprocess.Popen(
            [sys.executable, "-m", "leasework", "api"],
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        wait_ready(api, log)
        token = token_file.read_text().strip()
        seed_schedules(token)
        command = [
            str(Path(sys.executable).with_name("schemathesis")),
            "--no-color",
            "--config-file",
            str(Path(__file__).with_name("schemathesis.toml")),
            "run",
            f"{URL}/openapi.json",
            "--header",
            f"Authorization: Bearer {token}",
            "--checks",
            "all",
            "--max-examples",
            str(args.max_examples),
            "--workers",
            args.workers,
            "--seed",
            "20261201",
        ]
        started = time.monotonic()
        hooks = {"SCHEMATHESIS_HOOKS": str(Path(__file__).with_name("schemathesis_hooks.py"))}
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=900, env={**os.environ, **hooks}
        )
        took = time.monotonic() - started
    finally:
        if api is not None:
            api.terminate()
            try:
                api.wait(timeout=20)
            except subprocess.TimeoutExpired:
                api.kill()
        token_file.unlink(missing_ok=True)
        drop_database(DATABASE)
    output = result.stdout + result.stderr
    (out / "schemathesis.txt").write_text(output)
    for line in summary(output):
        print(f"conformance: {line}")
    print(
        f"conformance: {took:.0f} s, exit {result.returncode}; full output {out}/schemathesis.txt"
    )
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
