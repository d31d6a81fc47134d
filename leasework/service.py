"""What every leasework process shares: JSON logs, the ops endpoints (``/healthz``,
``/readyz``, ``/metrics``), signal handling and a bounded graceful drain.

A role is an async function ``body(stopping)`` that runs until ``stopping`` is set (SIGTERM or
SIGINT), then finishes or hands back its work and returns. The drain is a cancel-scope
deadline: ``LEASEWORK_SHUTDOWN_TIMEOUT`` after the signal, whatever is still running is
cancelled.
"""

from __future__ import annotations

import functools
import logging
import math
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from quart import Response
from quart_trio import QuartTrio

from leasework.config import Settings
from leasework.health import Health, measure_event_loop_lag
from leasework.httpserver import ServerLimits, serve
from leasework.preflight import Preflight, Refused, refusal

log = logging.getLogger("leasework.service")

HTTP_DRAIN_SECONDS = 3.0  # after the role drained, how long open HTTP requests may finish


def add_ops_routes(app: QuartTrio, health: Health, process_name: str) -> None:
    """``/healthz``, ``/readyz`` (naming each unavailable dependency's error) and ``/metrics``:
    every process's ops listener, and the api's internal one (the api's public port serves its
    own, in :mod:`leasework.api.ops`)."""

    @app.get("/healthz")
    async def healthz():
        return {"status": "alive", "process": process_name}

    @app.get("/readyz")
    async def readyz():
        return health.readiness(process_name, detail=True)

    @app.get("/metrics")
    async def metrics_endpoint():
        return Response(generate_latest(), content_type=CONTENT_TYPE_LATEST)


def ops_app(health: Health, process_name: str) -> QuartTrio:
    app = QuartTrio(f"leasework-{process_name}", static_folder=None)
    add_ops_routes(app, health, process_name)
    return app


# The HTTP server's limits, chosen (docs/design-decisions.md): a request's line and headers
# must arrive within READ_TIMEOUT seconds (a new connection's first request too); an idle
# keep-alive connection is closed after KEEP_ALIVE seconds; request line plus headers may not
# pass MAX_HEAD bytes. The body's own cap and deadline are the guard's.
READ_TIMEOUT = 30
KEEP_ALIVE = 5
MAX_HEAD = 16 * 1024


def server_limits(graceful: float) -> ServerLimits:
    return ServerLimits(
        head_timeout=READ_TIMEOUT,
        keep_alive=KEEP_ALIVE,
        max_head=MAX_HEAD,
        drain=min(graceful, HTTP_DRAIN_SECONDS),
    )


class Stopping:
    """Set once, when the process was asked to stop; roles poll it or wait on it. ``deadline``
    is the shutdown's, on trio's clock: infinite until a stop names one."""

    def __init__(self) -> None:
        self._event = trio.Event()
        self.reason = ""
        self.deadline = math.inf
        self._finishing: set[trio.CancelScope] = set()

    def set(self, reason: str, deadline: float = math.inf) -> None:
        if not self._event.is_set():
            self.reason = reason
            self._event.set()
            self._move_deadline(deadline)

    def cut_short(self) -> None:
        """A second signal: whatever :meth:`finishing` still lets run is cancelled now."""
        self._move_deadline(-math.inf)

    def _move_deadline(self, deadline: float) -> None:
        self.deadline = deadline
        for scope in self._finishing:
            scope.deadline = deadline

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    @contextmanager
    def finishing(self) -> Iterator[trio.CancelScope]:
        """A block that a stop lets finish, until the shutdown's deadline and no longer: it is
        shielded from the cancel that ends its task at the stop (the relay cancels its services
        then), not from the deadline. A thread it waits on with ``abandon_on_cancel`` is
        abandoned at the deadline instead of being waited for (a publish that Kafka does not
        answer held a relay for the producer's 15 s message timeout)."""
        with trio.CancelScope(shield=True, deadline=self.deadline) as scope:
            self._finishing.add(scope)
            try:
                yield scope
            finally:
                self._finishing.discard(scope)


async def serve_http(
    app: QuartTrio,
    addr: tuple[str, int],
    limits: ServerLimits,
    stopped: trio.Event,
    done: trio.Event,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    try:
        await serve(app, addr, stopped, limits=limits, task_status=task_status)
    finally:
        done.set()


async def run_service(
    settings: Settings,
    health: Health,
    body: Callable[[Stopping], Awaitable[None]],
    app: QuartTrio | None = None,
    preflight: Preflight | None = None,
) -> None:
    """Serve ops endpoints, run ``body`` and drain on SIGTERM within the shutdown timeout.
    With ``app`` (the api's), the ops endpoints are its; ``LEASEWORK_INTERNAL_ADDR`` adds a
    second listener with the ops endpoints alone. ``preflight`` (the start-up checks, run
    already) checks the dependencies it could not reach at start once they answer; a failure
    then drains the process like a signal and raises :class:`~leasework.preflight.Refused`."""
    listeners: list[tuple[tuple[str, int], QuartTrio]] = []
    if settings.ops_addr is not None:
        listeners.append((settings.ops_addr, app or ops_app(health, settings.process_name)))
    if settings.internal_addr is not None and app is not None:
        listeners.append((settings.internal_addr, ops_app(health, settings.process_name)))
    stopping = Stopping()
    http_stopped = trio.Event()

    async with trio.open_nursery() as nursery:

        def drain(reason: str) -> None:
            log.info(
                "draining", extra={"signal": reason, "timeout_seconds": settings.shutdown_timeout}
            )
            health.conditions["shutdown"] = f"draining after {reason}"
            deadline = trio.current_time() + settings.shutdown_timeout
            stopping.set(reason, deadline)
            nursery.cancel_scope.deadline = deadline

        async def watch_signals() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if stopping.is_set():
                        log.warning("second signal: stopping now", extra={"signal": name})
                        stopping.cut_short()
                        nursery.cancel_scope.cancel()
                        return
                    drain(name)

        nursery.start_soon(watch_signals)
        if preflight is not None and preflight.pending:
            nursery.start_soon(preflight.run_deferred, drain)
        nursery.start_soon(functools.partial(measure_event_loop_lag, blame=health.blame))
        await nursery.start(health.run)
        serving: list[trio.Event] = []
        limits = server_limits(graceful=settings.shutdown_timeout)
        for addr, listener in listeners:
            done = trio.Event()
            serving.append(done)
            await nursery.start(serve_http, listener, addr, limits, http_stopped, done)
            log.info("serving", extra={"addr": f"{addr[0]}:{addr[1]}", "role": settings.role})
        await body(stopping)
        log.info("drained", extra={"reason": stopping.reason or "finished"})
        http_stopped.set()
        # in-flight requests finish; idle keep-alive connections (Prometheus keeps one) must
        # not hold the process for the whole shutdown timeout
        with trio.move_on_after(HTTP_DRAIN_SECONDS):
            for done in serving:
                await done.wait()
        nursery.cancel_scope.cancel()
    if preflight is not None and preflight.refused:
        raise Refused(refusal(preflight.refused), preflight.refused)
