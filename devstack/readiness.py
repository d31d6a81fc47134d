"""Polling, never fixed sleeps: wait until a probe says yes, the process dies, or time runs out."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx

from .errors import StackError


def wait_until(
    what: str,
    probe: Callable[[], bool],
    timeout: float,
    alive: Callable[[], bool] | None = None,
    log: Path | None = None,
    interval: float = 0.25,
    max_interval: float = 1.0,
) -> float:
    """Call ``probe`` until it returns True; returns the seconds it took.

    Raises :class:`StackError` (with the log tail) if ``alive`` reports the process
    gone or ``timeout`` passes. A probe that raises counts as "not yet".
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    last_error: BaseException | None = None
    while True:
        try:
            if probe():
                return time.monotonic() - t0
        except Exception as e:  # noqa: BLE001 - a failing probe is just "not ready"
            last_error = e
        if alive is not None and not alive():
            raise StackError(f"{what}: process exited while waiting for readiness", log)
        if time.monotonic() >= deadline:
            detail = f" (last probe error: {last_error!r})" if last_error else ""
            raise StackError(f"{what}: not ready after {timeout:.0f}s{detail}", log)
        time.sleep(interval)
        interval = min(max_interval, interval * 1.5)


def http_ok(url: str, timeout: float = 1.0, method: str = "GET") -> bool:
    """True when ``url`` answers 2xx."""
    try:
        r = httpx.request(method, url, timeout=timeout)
    except httpx.HTTPError:
        return False
    return r.is_success
