"""What every supervised service provides; the Stack drives these hooks."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path

from ..layout import Layout
from ..procs import ProcInfo, cmdline_matches


class Service:
    """One long-running process of the stack.

    Subclasses set ``name`` and implement :meth:`command`, :meth:`markers` and
    :meth:`probe`; the rest has sensible defaults.
    """

    name: str = ""
    kind: str = "infra"  # "infra" or "app"
    stop_signal: int = signal.SIGTERM
    stop_timeout: float = 20.0
    ready_timeout: float = 60.0
    init_script: str | None = None  # Debian init script that may run a foreign copy

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    # --- identity -------------------------------------------------------------------
    def ports(self) -> tuple[int, ...]:
        """Ports this process itself listens on (for spotting a foreign owner)."""
        return ()

    def address(self) -> str:
        return ""

    def markers(self) -> tuple[str, ...]:
        """Substrings that must all occur in /proc/PID/cmdline of this service."""
        raise NotImplementedError

    def owns(self, info: ProcInfo) -> bool:
        """Is the live process ``info`` this service (not a recycled pid)?"""
        return info.alive and cmdline_matches(info.cmdline, self.markers())

    def strays(self) -> list[int]:
        """Processes of this service that escaped its session (killed on stop/restart)."""
        return []

    # --- lifecycle ------------------------------------------------------------------
    def prepare(self) -> None:
        """Write configs / initialise data dirs. Idempotent; runs before every start."""

    def command(self) -> list[str]:
        raise NotImplementedError

    def cwd(self) -> Path:
        """Working directory of the process (must be reachable by :meth:`run_as`)."""
        return self.layout.state_dir

    def run_as(self) -> str | None:
        """Unprivileged user to run as, or None for the current user."""
        return None

    def env(self, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update(extra_env or {})
        return env

    def probe(self) -> bool:
        """One quick readiness check (must return within a couple of seconds)."""
        raise NotImplementedError

    def after_ready(self, fresh: bool) -> None:
        """Reconcile once ready: ``fresh`` is False when it was already running."""

    def stale(self, pid: int) -> list[str]:
        """What the running process ``pid`` was started with that a start now would give
        it differently (config file, environment variables); empty when up to date.
        ``Stack.up`` restarts a stale service."""
        return []

    def restart_env(self, pid: int) -> dict[str, str]:
        """The ``extra_env`` that restarting the running process ``pid`` keeps."""
        return {}
