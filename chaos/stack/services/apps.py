"""The leasework processes: ``python -m leasework ROLE`` (api, relay, worker-1, worker-2),
after the one-shot ``migrate``.

Environment, lowest to highest precedence: the caller's environment; the stack's
defaults (DSN, redis, brokers) for any ``LEASEWORK_*`` the caller did not set; the
per-process identity (``LEASEWORK_PROCESS_NAME``, ``LEASEWORK_OPS_ADDR``); ``extra_env``
given to :meth:`Stack.start` (e.g. an unsafe-mode flag from the chaos harness).

worker-1 and worker-2 have the same command line, so identity also checks
``LEASEWORK_PROCESS_NAME`` in /proc/PID/environ.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from ..errors import StackError
from ..layout import (
    APPS,
    KAFKA_BROKERS,
    POSTGRES_DSN,
    REDIS_ADDR,
    Layout,
    addr,
)
from ..procs import ProcInfo, read_environ
from ..readiness import http_ok
from .base import Service

STACK_ENV: dict[str, str] = {
    "LEASEWORK_POSTGRES_DSN": POSTGRES_DSN,
    "LEASEWORK_REDIS_ADDR": REDIS_ADDR,
    "LEASEWORK_KAFKA_BROKERS": KAFKA_BROKERS,
}


def app_env(
    name: str,
    ops_addr: str | None,
    base_env: Mapping[str, str],
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment of one leasework process (pure; unit-tested)."""
    env = dict(base_env)
    for key, value in STACK_ENV.items():
        env.setdefault(key, value)
    env["LEASEWORK_PROCESS_NAME"] = name
    if ops_addr is not None:
        env["LEASEWORK_OPS_ADDR"] = ops_addr
    else:
        env.pop("LEASEWORK_OPS_ADDR", None)
    env.update(extra_env or {})
    return env


def app_command(role: str) -> list[str]:
    return [sys.executable, "-m", "leasework", role]


class LeaseworkApp(Service):
    kind = "app"
    ready_timeout = 60.0

    def __init__(self, layout: Layout, name: str) -> None:
        super().__init__(layout)
        self.name = name
        self.role, self.port = APPS[name]

    def ports(self) -> tuple[int, ...]:
        return (self.port,)

    def address(self) -> str:
        return addr(self.port)

    def markers(self) -> tuple[str, ...]:
        return ("-m leasework " + self.role,)

    def owns(self, info: ProcInfo) -> bool:
        if not super().owns(info):
            return False
        env = read_environ(info.pid)
        return env is None or env.get("LEASEWORK_PROCESS_NAME") == self.name

    def env(self, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
        import os

        return app_env(self.name, addr(self.port), os.environ, extra_env)

    def command(self) -> list[str]:
        return app_command(self.role)

    def cwd(self) -> Path:
        return self.layout.repo_root

    def probe(self) -> bool:
        return http_ok(f"http://{addr(self.port)}/readyz")


def run_migrate(
    layout: Layout, extra_env: Mapping[str, str] | None = None, timeout: float = 300.0
) -> None:
    """Run ``python -m leasework migrate`` to completion; StackError with its log tail
    on a non-zero exit."""
    import os

    log = layout.log("migrate")
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = app_command("migrate")
    with log.open("ab") as out:
        out.write(f"\n=== chaos.stack run: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            rc = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=app_env("migrate", None, os.environ, extra_env),
                cwd=layout.repo_root,
                timeout=timeout,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            raise StackError(f"migrate: did not finish within {timeout:.0f}s", log) from None
    if rc != 0:
        raise StackError(f"migrate: exited with {rc}; `up` aborted", log)
