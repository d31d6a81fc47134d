"""The leasework processes: ``python -m leasework ROLE`` (api, relay, worker-1, worker-2,
and the relays a chaos scenario may add, relay-2 and relay-3), after the one-shot ``migrate``.

Environment, lowest to highest precedence: the caller's environment; the stack's
defaults (DSN, redis, brokers) for any ``LEASEWORK_*`` the caller did not set; the
per-process identity (``LEASEWORK_PROCESS_NAME``, ``LEASEWORK_OPS_ADDR``); ``extra_env``
given to :meth:`Stack.start` (e.g. an unsafe-mode flag from the chaos harness).

The default Kafka brokers depend on the process: each worker gets proxies of its own
(``kafka-N-worker-1`` on N9097, ``kafka-N-worker-2`` on N9099), everything else the
``kafka-N`` proxies (N9092), so one worker's Kafka link can be cut on its own. A running
process still holding a stack default that is no longer its own (started before the
defaults changed) is found by :func:`stale_stack_env`; ``Stack.up`` restarts it.

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
    EXTRA_RELAYS,
    KAFKA_BROKERS,
    KAFKA_WORKER_BROKERS,
    POSTGRES_DSN,
    REDIS_ADDR,
    SHOP_MAIL_PORT,
    SHOP_MAIL_URL,
    SHOP_PORT,
    STACK_APP,
    Layout,
    addr,
)
from ..procs import ProcInfo, read_environ
from ..readiness import http_ok
from ..tls import secure_env
from .base import Service

MODES = ("plain", "secure")
# where the default layout keeps the CA (the defaults' values are computed for it)
TLS_DIR = Layout.from_env().tls_dir


def stack_env(name: str, mode: str = "plain", tls_dir: Path = TLS_DIR) -> dict[str, str]:
    """The stack's defaults for the process ``name`` (``worker-2``, ``relay``, ``migrate``)
    in ``mode``: the plain listeners, or (``secure``) only the secured ones, every process
    on the same Kafka proxies (:func:`devstack.tls.secure_env`)."""
    env = {
        "LEASEWORK_POSTGRES_DSN": POSTGRES_DSN,
        "LEASEWORK_REDIS_ADDR": REDIS_ADDR,
        "LEASEWORK_KAFKA_BROKERS": KAFKA_WORKER_BROKERS.get(name, KAFKA_BROKERS),
        "LEASEWORK_APP": STACK_APP,
        "SHOP_MAIL_URL": SHOP_MAIL_URL,
    }
    if mode == "secure":
        del env["LEASEWORK_REDIS_ADDR"]
        env.update(secure_env(tls_dir))
    return env


# variables a running process must hold exactly as `up` would give them now: `just up` makes
# the stack run the app you name (LEASEWORK_APP) or the stack's, never a leftover
EXACT_ENV = ("LEASEWORK_APP",)


# every value the stack hands out as a default, per variable (over all processes). worker-1's
# brokers are the ones both workers shared before each had its own, so a worker-2 still
# running on them counts as stale.
_STACK_DEFAULTS: dict[str, frozenset[str]] = {
    key: frozenset(
        stack_env(name, mode)[key]
        for name in (*APPS, "migrate")
        for mode in MODES
        if key in stack_env(name, mode)
    )
    for key in {**stack_env("api"), **stack_env("api", "secure")}
}


def app_env(
    name: str,
    ops_addr: str | None,
    base_env: Mapping[str, str],
    extra_env: Mapping[str, str] | None = None,
    mode: str = "plain",
    tls_dir: Path = TLS_DIR,
) -> dict[str, str]:
    """Environment of one leasework process (pure; unit-tested)."""
    env = dict(base_env)
    for key, value in stack_env(name, mode, tls_dir).items():
        env.setdefault(key, value)
    env["LEASEWORK_PROCESS_NAME"] = name
    if ops_addr is not None:
        env["LEASEWORK_OPS_ADDR"] = ops_addr
    else:
        env.pop("LEASEWORK_OPS_ADDR", None)
    env.update(extra_env or {})
    return env


def stale_stack_env(running: Mapping[str, str], expected: Mapping[str, str]) -> list[str]:
    """Stack variables whose value in a running process is *a* stack default but not the
    one it would get now (pure). Deliberate overrides (any other value) are not stale."""
    return sorted(
        key
        for key, defaults in _STACK_DEFAULTS.items()
        if running.get(key) != expected.get(key)
        and (running.get(key) in defaults or key in EXACT_ENV)
    )


def carried_over_env(
    running: Mapping[str, str], expected: Mapping[str, str], stale: list[str]
) -> dict[str, str]:
    """The ``LEASEWORK_*`` values a running process was deliberately given (they differ
    from what it would get now and are not stale defaults): a restart that brings its
    stale defaults up to date keeps these (pure)."""
    return {
        key: value
        for key, value in running.items()
        if key.startswith("LEASEWORK_") and key not in stale and expected.get(key) != value
    }


def app_command(role: str) -> list[str]:
    return [sys.executable, "-m", "leasework", role]


class ExampleShop(Service):
    """The example shop: its order endpoint and mail service (``python -m examples.shop``).
    Not a leasework process, but the stack runs it so the README's example, the tests and the
    shop chaos scenario have it live."""

    kind = "example"
    name = "shop"
    ready_timeout = 60.0

    def ports(self) -> tuple[int, ...]:
        return (SHOP_PORT, SHOP_MAIL_PORT)

    def address(self) -> str:
        return addr(SHOP_PORT)

    def markers(self) -> tuple[str, ...]:
        return ("-m examples.shop",)

    def env(self, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
        import os

        env = dict(os.environ)
        dsn = stack_env("shop", self.layout.mode(), self.layout.tls_dir)["LEASEWORK_POSTGRES_DSN"]
        env.setdefault("LEASEWORK_POSTGRES_DSN", dsn)
        env["SHOP_ADDR"] = addr(SHOP_PORT)
        env["SHOP_MAIL_ADDR"] = addr(SHOP_MAIL_PORT)
        env.update(extra_env or {})
        return env

    def stale(self, pid: int) -> list[str]:
        """A shop still on the other mode's database address (it enqueues in its own
        transaction, so it follows the stack's mode like leasework's processes)."""
        running = read_environ(pid)
        key = "LEASEWORK_POSTGRES_DSN"
        if running is None or running.get(key) == self.env().get(key):
            return []
        return [key] if running.get(key) in _STACK_DEFAULTS[key] else []

    def command(self) -> list[str]:
        return [sys.executable, "-m", "examples.shop"]

    def cwd(self) -> Path:
        return self.layout.repo_root

    def probe(self) -> bool:
        return http_ok(f"http://{addr(SHOP_PORT)}/healthz") and http_ok(
            f"http://{addr(SHOP_MAIL_PORT)}/healthz"
        )


class LeaseworkApp(Service):
    """A leasework process of the stack (kind ``app``), or one of the relays a chaos
    scenario may start beside it (kind ``extra``, :data:`~devstack.layout.EXTRA_RELAYS`):
    `up`, `status` and the harness's baseline leave those alone unless they run."""

    kind = "app"
    ready_timeout = 60.0

    def __init__(self, layout: Layout, name: str) -> None:
        super().__init__(layout)
        self.name = name
        if name in EXTRA_RELAYS:
            self.kind = "extra"
            self.role, self.port = EXTRA_RELAYS[name]
        else:
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

        layout = self.layout
        return app_env(
            self.name, addr(self.port), os.environ, extra_env, layout.mode(), layout.tls_dir
        )

    def stale(self, pid: int) -> list[str]:
        running = read_environ(pid)
        return [] if running is None else stale_stack_env(running, self.env())

    def restart_env(self, pid: int) -> dict[str, str]:
        running = read_environ(pid)
        if running is None:
            return {}
        expected = self.env()
        return carried_over_env(running, expected, stale_stack_env(running, expected))

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
    run_to_completion(layout, ["migrate"], "migrate", extra_env, timeout)


# (name, scopes, the Layout property naming its file): the tokens `up` keeps live
# name, scopes, the layout's file for it, its rate limit (requests/s, burst; None: unlimited):
# Alertmanager's webhook token is metered like any caller's, high above what it sends
STACK_TOKENS: tuple[tuple[str, str, str, tuple[float, int] | None], ...] = (
    ("dev", "admin", "dev_token_file", None),
    ("alertmanager", "alerts", "alertmanager_token_file", (20.0, 200)),
)


def ensure_tokens(layout: Layout, extra_env: Mapping[str, str] | None = None) -> None:
    """Keep each of :data:`STACK_TOKENS` live, its plaintext in its file (mode 0600):
    ``leasework token ensure`` creates it when the file is missing or its token is no longer
    live (a fresh database), and leaves it alone otherwise."""
    for name, scopes, attribute, rate in STACK_TOKENS:
        path = getattr(layout, attribute)
        args = ["token", "ensure", "--name", name, "--scopes", scopes, "--file", str(path)]
        if rate is not None:
            args += ["--rate", str(rate[0]), "--burst", str(rate[1])]
        run_to_completion(layout, args, "migrate", extra_env, 60.0)


def run_to_completion(
    layout: Layout,
    args: list[str],
    log_name: str,
    extra_env: Mapping[str, str] | None,
    timeout: float,
) -> None:
    """``python -m leasework ARGS`` to completion, its output appended to ``log_name``'s
    log; StackError with the log's tail on a non-zero exit."""
    import os

    log = layout.log(log_name)
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [*app_command(args[0]), *args[1:]]
    what = " ".join(args[:2])
    with log.open("ab") as out:
        out.write(f"\n=== devstack run: {' '.join(argv)}\n".encode())
        out.flush()
        try:
            rc = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=app_env("migrate", None, os.environ, extra_env, layout.mode(), layout.tls_dir),
                cwd=layout.repo_root,
                timeout=timeout,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            raise StackError(f"{what}: did not finish within {timeout:.0f}s", log) from None
    if rc != 0:
        raise StackError(f"{what}: exited with {rc}; `up` aborted", log)
