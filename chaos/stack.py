"""The harness's side of the development stack, through its narrow interface (start, stop,
kill, pause, resume, wait until ready).

:class:`StackCalls` runs the blocking :class:`devstack.Stack` calls in a worker thread, one at
a time. :func:`baseline` brings every service to its normal state before a run (and back
after it); :func:`interference` tells, after a run, a leasework process that died on its own
(a crash) from signs that something else drove the shared stack meanwhile.
:func:`start_extra_relay` and :func:`stop_extra_relays` run the relays a scenario asks for
beside the stack's (``relay-2``, ``relay-3``); the baseline stops any left running.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import trio

from devstack import Stack, procs
from devstack.procs import read_environ
from leasework.config import (
    UNSAFE_LEASE_MODE,
    UNSAFE_SCHEDULER_CONFIRMATION,
    UNSAFE_SCHEDULER_VARIABLE,
)

T = TypeVar("T")

# the workers' environment with fencing off (leasework.config refuses the mode without the
# second variable)
UNSAFE_ENV: dict[str, str] = {
    "LEASEWORK_LEASE_MODE": UNSAFE_LEASE_MODE,
    "LEASEWORK_I_ACCEPT_DUPLICATE_EFFECTS": "yes",
}
# variables the harness may change for a run; a process whose value differs from the
# stack's normal one is restarted by the baseline step
RUN_ENV_KEYS = (
    "LEASEWORK_LEASE_MODE",
    "LEASEWORK_I_ACCEPT_DUPLICATE_EFFECTS",
    "LEASEWORK_REDIS_ADDR",
    "LEASEWORK_POSTGRES_DSN",
    "LEASEWORK_KAFKA_BROKERS",
    "SHOP_MAIL_URL",
    "SHOP_MAIL_GUARD",
    "LEASEWORK_FAKE_CLOCK_OFFSET",
    UNSAFE_SCHEDULER_VARIABLE,
    UNSAFE_SCHEDULER_CONFIRMATION,
)
# what a worker needs to run the example shop's send_receipt; checked when a scenario uses it
SHOP_ENV_KEYS = ("LEASEWORK_APP",)
SETTLE_TIMEOUT = 90.0


class StackCalls:
    """Blocking :class:`Stack` calls in a worker thread, one at a time."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.limiter = trio.CapacityLimiter(1)

    async def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await trio.to_thread.run_sync(
            functools.partial(fn, *args, **kwargs), limiter=self.limiter
        )


def env_deviations(
    stack: Stack, name: str, pid: int, keys: Sequence[str] = RUN_ENV_KEYS
) -> list[str]:
    """``keys`` whose value in the running process differs from its normal one."""
    actual = read_environ(pid)
    if actual is None:
        return []
    normal = stack.app_env(name)
    return [k for k in keys if actual.get(k) != normal.get(k)]


def baseline(stack: Stack, *, shop: bool = False) -> list[str]:
    """Bring every service to its normal state (blocking; run in a thread). Returns what it
    had to do. ``shop``: the scenario places orders through the example shop, which must
    then run too, and the workers must load its job types."""
    done = [f"stopped {name}, left running" for name in stop_extra_relays(stack)]
    keys = (*RUN_ENV_KEYS, *SHOP_ENV_KEYS) if shop else RUN_ENV_KEYS
    for name in stack.names("infra"):
        if not stack.is_running(name):
            stack.start(name, timeout=SETTLE_TIMEOUT)
            done.append(f"started {name}")
    for name in stack.names("app"):
        pid = stack.pid(name)
        if pid is not None:
            stack.resume(name)  # harmless unless it was left paused
            deviations = env_deviations(stack, name, pid, keys)
            if deviations:
                stack.stop(name)
                pid = None
                done.append(f"restarted {name} with its normal {', '.join(deviations)}")
        if pid is None:
            stack.start(name, timeout=SETTLE_TIMEOUT)
            if not done or not done[-1].startswith(f"restarted {name}"):
                done.append(f"started {name}")
    examples = stack.names("example") if shop else []
    for name in examples:
        if not stack.is_running(name):
            stack.start(name, timeout=SETTLE_TIMEOUT)
            done.append(f"started {name}")
    for name in (*stack.names("app"), *examples):
        stack.wait_ready(name, timeout=SETTLE_TIMEOUT)
    stack.wait_kafka_cluster(120.0)
    return done


def start_extra_relay(stack: Stack, name: str, env: Mapping[str, str]) -> None:
    """Start a relay beside the stack's (``relay-2``) with ``env``, and wait until ready."""
    stack.start(name, extra_env=dict(env) or None, timeout=SETTLE_TIMEOUT)


def stop_extra_relays(stack: Stack) -> list[str]:
    """Stop every relay started beside the stack's (a paused one is resumed first);
    returns those that were running."""
    running = [name for name in stack.names("extra") if stack.pid(name) is not None]
    if running:
        stack.stop_many(running)
    return running


def app_pids(stack: Stack, extra: Sequence[str] = ()) -> dict[str, int | None]:
    """The pid of every leasework process of the stack, and of the ``extra`` relays."""
    return {name: stack.pid(name) for name in (*stack.names("app"), *extra)}


def exit_status(stack: Stack, name: str) -> str | None:
    """How a process this harness started (its parent is this process) ended, if it has:
    ``killed by SIGSEGV``, ``exit status 1``. Best effort: None when unknown (blocking)."""
    pid = procs.read_pidfile(stack.layout.pidfile(name))
    # the stack keeps the Popen of every child it spawned, to reap it
    child = procs._children.get(pid) if pid is not None else None
    if child is None:
        return None
    code = child.poll()
    if code is None:
        return None
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def interference(
    stack: Stack,
    before: Mapping[str, int | None],
    envs: Mapping[str, Mapping[str, str]],
    restarted_by_nemesis: set[str],
    extra: Sequence[str] = (),
) -> tuple[list[str], list[str]]:
    """After a run (blocking): leasework processes (the stack's, and the ``extra`` relays
    started for the run) that died on their own (not running, and no heal restarted them),
    and signs that something other than this run changed the processes meanwhile (another
    user of the shared stack): a restart no fault made, or a process running without the
    environment this run gave it."""
    pids = app_pids(stack, extra)
    exits = {name: exit_status(stack, name) for name in pids}
    crashed, meddled = [], []
    for name, pid in pids.items():
        if pid is None:
            how = f" ({exits[name]})" if exits.get(name) else ""
            last = [line for line in stack.logs(name, 40).splitlines() if line.strip()]
            hint = next((ln for ln in reversed(last) if not ln.lstrip().startswith("{")), "")
            crashed.append(
                f"{name} was not running at the end of the run: it exited{how} without a "
                f"fault killing it, and nothing restarted it"
                + (f" (last non-JSON log line: {hint.strip()[:200]})" if hint else "")
            )
            continue
        if pid != before.get(name) and name not in restarted_by_nemesis:
            meddled.append(f"{name} was restarted (pid {before.get(name)} -> {pid}) by no fault")
        wanted = envs.get(name, {})
        actual = read_environ(pid) if wanted else None
        if actual is not None:
            wrong = [k for k, v in wanted.items() if actual.get(k) != v]
            if wrong:
                meddled.append(f"{name} ran without this run's {', '.join(wrong)}")
    return crashed, meddled


def restart_with(stack: Stack, name: str, env: Mapping[str, str]) -> None:
    stack.stop(name)
    stack.start(name, extra_env=dict(env) or None, timeout=SETTLE_TIMEOUT)
