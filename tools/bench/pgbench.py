"""The Postgres commit ceiling for the job insert: ``pgbench`` with one
``leasework_jobs_insert`` of a due noop job (a jobs row, an outbox row and the outbox NOTIFY)
per transaction, on the direct port."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from devstack.layout import HOST, PG_DATABASE, PG_PASSWORD, PG_USER, POSTGRES_PORT

SCRIPT = (
    "SELECT * FROM leasework_jobs_insert(jsonb_build_array(jsonb_build_object("
    "'id', gen_random_uuid()::text, 'type', 'noop', "
    "'payload', jsonb_build_object('bench', '{tag}'))));\n"
)
TPS = re.compile(r"^tps = ([\d.]+) \(without initial connection time\)", re.M)
LATENCY = re.compile(r"^latency average = ([\d.]+) ms", re.M)
FAILED = re.compile(r"^number of failed transactions: (\d+)", re.M)


def find_pgbench() -> str | None:
    """The newest ``/usr/lib/postgresql/*/bin/pgbench``, else one on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), key=_version)
    return found[-1] if found else shutil.which("pgbench")


def _version(path: str) -> int:
    match = re.search(r"/postgresql/(\d+)/", path)
    return int(match.group(1)) if match else 0


def parse_output(text: str) -> dict[str, Any]:
    """tps, average latency and failed transactions from pgbench's summary."""
    tps = TPS.search(text)
    latency = LATENCY.search(text)
    failed = FAILED.search(text)
    return {
        "tps": float(tps.group(1)) if tps else None,
        "latency_ms": float(latency.group(1)) if latency else None,
        "failed": int(failed.group(1)) if failed else None,
    }


def run(tag: str, *, clients: int, threads: int, seconds: int) -> dict[str, Any]:
    """Run pgbench; the jobs it inserts carry payload ``{"bench": tag}`` (the caller deletes
    them, with the relay stopped so that none is published)."""
    binary = find_pgbench()
    info: dict[str, Any] = {
        "clients": clients,
        "threads": threads,
        "seconds": seconds,
        "protocol": "prepared",
        "binary": binary,
        "script": SCRIPT.format(tag=tag).strip(),
    }
    if binary is None:
        return {**info, "tps": None, "error": "pgbench not found (postgresql server package)"}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "insert.sql"
        script.write_text(SCRIPT.format(tag=tag))
        argv = [binary, "-n", "-M", "prepared", "-c", str(clients), "-j", str(threads)]
        argv += ["-T", str(seconds), "-f", str(script), "-h", HOST, "-p", str(POSTGRES_PORT)]
        argv += ["-U", PG_USER, PG_DATABASE]
        env = {**os.environ, "PGPASSWORD": PG_PASSWORD}
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=seconds + 120, check=False
        )
    info["argv"] = " ".join(argv)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {
            **info,
            "tps": None,
            "error": f"pgbench exited {proc.returncode}: {' | '.join(tail)}",
        }
    return {**info, **parse_output(proc.stdout)}
