"""The worker's lanes (:mod:`leasework.lanes` says what each is for): where a started job's
handler runs, each lane with its own bounded capacity, its own metrics and its start and stop
hooks run in the lane.

:class:`Lanes` is opened once per worker (:meth:`Lanes.open`: the asyncio loop's thread, the
process pool, each lane's start hooks) and runs a handler with :meth:`Lanes.run`, which
returns what the handler returned or raises what it raised, in every lane alike:

- trio: awaited here.
- thread: ``trio.to_thread.run_sync`` under the lane's limiter; cancelled, the thread is
  abandoned and ``ctx.cancelled`` set (it keeps its place in the lane until it returns).
- asyncio: the coroutine is handed to the lane's loop (``run_coroutine_threadsafe``) and its
  completion wakes this task (``TrioToken.run_sync_soon``): no thread waits per job;
  cancelled, its asyncio task is cancelled.
- process: ``trio_parallel`` runs :func:`run_in_child` in a child process under the lane's
  limiter; cancelled, the child is killed. The child sends back the value, the effects the
  handler queued (:meth:`JobContext.fenced`) and, for a failure, a :class:`ChildFailure`
  (type, message, whether permanent or a stale fence), never the exception object itself
  (which may not pickle). Children are recycled after ``max_jobs`` jobs or once their peak
  resident memory passes ``max_memory_mb`` (Celery's ``worker_max_tasks_per_child`` and
  ``worker_max_memory_per_child``).

A lane's capacity bounds how many of its handlers run at once in this worker; how many of
its jobs may wait for it, claimed and holding their queue slots, the gate in front of the
claim decides (:mod:`leasework.worker.lane_gate`).
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import pickle
import resource
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
import trio_parallel

from leasework import metrics
from leasework.app import App, JobType
from leasework.config import Settings
from leasework.context import JobContext
from leasework.errors import Permanent, Retry, StaleFence
from leasework.lanes import Lane

log = logging.getLogger("leasework.worker.lanes")

ERROR_CHARS = 2000
STOP_GRACE = 5.0  # seconds the process pool's children have to exit at the worker's stop


@dataclass(frozen=True)
class LaneConfig:
    """Each lane's capacity in one worker, and the process lane's children."""

    thread: int = 16
    asyncio: int = 100
    process: int = 2
    max_jobs_per_child: int | None = None  # None: never recycled for its job count
    max_memory_per_child_mb: int | None = None  # None: never recycled for its memory
    start_method: str = "spawn"  # or "forkserver"; never "fork" (threads, librdkafka)

    @classmethod
    def from_settings(cls, settings: Settings) -> LaneConfig:
        return cls(
            thread=settings.thread_lane_capacity,
            asyncio=settings.asyncio_lane_capacity,
            process=settings.process_lane_capacity,
            max_jobs_per_child=settings.process_lane_max_jobs or None,
            max_memory_per_child_mb=settings.process_lane_max_memory_mb or None,
            start_method=settings.process_lane_start,
        )

    def capacity(self, lane: Lane) -> float:
        return {
            Lane.TRIO: float("inf"),  # the queue's slots bound it
            Lane.THREAD: self.thread,
            Lane.ASYNCIO: self.asyncio,
            Lane.PROCESS: self.process,
        }[lane]


# ------------------------------------------------------------------ the child's side


class ChildFailure(Exception):
    """What a handler in a child process raised: its type, message, and whether the type's
    policy makes it permanent (or it was a stale fence). Every field is in ``args``, so it
    pickles whole."""

    def __init__(
        self,
        description: str,
        permanent: bool = False,
        stale: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(description, permanent, stale, retry_after)
        self.description = description
        self.permanent = permanent
        self.stale = stale
        self.retry_after = retry_after

    def __str__(self) -> str:
        return self.description


@dataclass(frozen=True)
class ChildReturn:
    value: Any = None
    effects: list[Any] = field(default_factory=list)
    failure: ChildFailure | None = None

    def unpack(self, ctx: JobContext) -> Any:
        """In the worker: the handler's value, its effects queued on ``ctx``; or raise its
        failure."""
        if self.failure is not None:
            raise self.failure
        ctx.effects[:] = self.effects
        return self.value


@dataclass(frozen=True)
class HandlerRef:
    """A process-lane handler by name: ``@app.job`` rebinds the function's name in its module
    to the :class:`JobType` it made, so pickle cannot send the function itself by reference;
    the child imports the module and takes the handler back from the name (a job type's, or
    the function's)."""

    module: str
    qualname: str

    @classmethod
    def of(cls, handler: Callable[..., Any]) -> HandlerRef:
        return cls(handler.__module__, handler.__qualname__)

    def resolve(self) -> Callable[..., Any]:
        found: Any = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            found = getattr(found, part)
        handler = getattr(found, "handler", found)  # a JobType's handler, or the function
        if not callable(handler):
            raise TypeError(f"{self.module}:{self.qualname} is not a handler")
        return handler


def run_in_child(
    ref: HandlerRef,
    args: tuple[Any, ...],
    permanent: tuple[type[BaseException], ...],
) -> ChildReturn:
    """In the child: call the handler, and send back what came of it as plain data."""
    ctx: JobContext = args[0]
    try:
        value = ref.resolve()(*args)
    except StaleFence as exc:
        return ChildReturn(failure=ChildFailure(_describe(exc), stale=True))
    except Retry as asked:
        return ChildReturn(failure=ChildFailure(str(asked), retry_after=asked.after))
    except Exception as exc:
        is_permanent = isinstance(exc, (Permanent, *permanent))
        return ChildReturn(failure=ChildFailure(_describe(exc), permanent=is_permanent))
    try:
        pickle.dumps(ctx.effects)
    except Exception as exc:
        return ChildReturn(
            failure=ChildFailure(
                "an effect queued with ctx.fenced() cannot go back to the worker from the "
                "process lane: queue a module-level function with its arguments, "
                f"ctx.fenced(fn, *args), not a lambda or a nested function ({_describe(exc)})",
                permanent=True,
            )
        )
    try:
        pickle.dumps(value)
    except Exception as exc:
        return ChildReturn(
            failure=ChildFailure(
                f"the handler's result cannot go back to the worker: {_describe(exc)}",
                permanent=True,
            )
        )
    return ChildReturn(value, list(ctx.effects))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]


_jobs_in_child = 0


def child_init(hooks: Sequence[Callable[[], Any]], stops: Sequence[Callable[[], Any]]) -> bool:
    """In each new child, before its first job: the process lane's start hooks (``django.
    setup()``), and its stop hooks to run when the child exits (retired, or idle)."""
    import multiprocessing.util

    for hook in hooks:
        hook()
    for index, stop in enumerate(stops):
        multiprocessing.util.Finalize(None, stop, exitpriority=100 - index)
    return True


def child_retire(max_jobs: int | None, max_memory_mb: int | None) -> bool:
    """In the child, after each job: whether it has done its share (then it exits and a new
    one takes its place)."""
    global _jobs_in_child
    _jobs_in_child += 1
    if max_jobs is not None and _jobs_in_child >= max_jobs:
        return True
    if max_memory_mb is not None:
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        if peak_kb > max_memory_mb * 1024:
            return True
    return False


# ------------------------------------------------------------------ the worker's side


class AsyncioLoop:
    """A real asyncio event loop run for ever in a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, name="leasework-asyncio-lane", daemon=True
        )

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and wait for its thread (blocking: call from a thread)."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()

    async def run(self, coroutine: Any, on_cancel: Callable[[], None]) -> Any:
        """Run ``coroutine`` on the loop; wait for it here without a thread."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        done = trio.Event()
        token = trio.lowlevel.current_trio_token()

        def wake(_: Any) -> None:
            try:
                token.run_sync_soon(done.set)
            except trio.RunFinishedError:  # the worker's loop is gone: nobody waits
                pass

        future.add_done_callback(wake)
        try:
            await done.wait()
        except trio.Cancelled:
            on_cancel()
            future.cancel()  # cancels the asyncio task (CancelledError at its next await)
            raise
        return future.result()


class Lanes:
    """The lanes of one worker (see the module's text)."""

    def __init__(self, app: App, config: LaneConfig) -> None:
        self.app = app
        self.config = config
        self.limiters = {
            lane: trio.CapacityLimiter(config.capacity(lane))
            for lane in (Lane.THREAD, Lane.ASYNCIO, Lane.PROCESS)
        }
        self._asyncio: AsyncioLoop | None = None
        self._processes: trio_parallel.WorkerContext | None = None
        self._threads: set[_ThreadState] = set()  # thread-lane handlers running now

    def overdue_threads(self, now: float, grace: float) -> list[str]:
        """The thread-lane handlers still running ``grace`` seconds past their own timeout
        (``now`` from time.monotonic()); any thread may ask."""
        return [
            f"{s.what} ({now - s.started:.0f}s, timeout {s.timeout:g}s)"
            for s in list(self._threads)
            if s.started is not None
            and s.timeout is not None
            and now - s.started > s.timeout + grace
        ]

    def used(self) -> set[Lane]:
        return {job_type.lane for job_type in self.app} | set(self.app.lane_hooks)

    @asynccontextmanager
    async def open(self) -> AsyncIterator[Lanes]:
        """Start the lanes the app uses (and their start hooks); stop them on the way out
        (their stop hooks, then the loop and the pool)."""
        used = self.used()
        hooks = self.app.lane_hooks
        async with trio_parallel_context(self.config, hooks, Lane.PROCESS in used) as pool:
            self._processes = pool
            if Lane.ASYNCIO in used:
                self._asyncio = AsyncioLoop()
                self._asyncio.start()
            try:
                await self._run_hooks("start", used)
                yield self
            finally:
                with trio.CancelScope(shield=True):
                    await self._run_hooks("stop", used)
                    if self._asyncio is not None:
                        await trio.to_thread.run_sync(self._asyncio.stop)

    async def _run_hooks(self, which: str, used: set[Lane]) -> None:
        for lane in (Lane.TRIO, Lane.THREAD, Lane.ASYNCIO):
            if lane not in used:
                continue
            for hook in self.app.lane_hooks.get(lane, {}).get(which, ()):
                try:
                    if lane is Lane.TRIO:
                        await hook()
                    elif lane is Lane.THREAD:
                        await trio.to_thread.run_sync(hook)
                    else:
                        assert self._asyncio is not None
                        await self._asyncio.run(hook(), lambda: None)
                except Exception:
                    if which == "start":
                        raise  # a lane that cannot start: the worker does not start
                    log.exception("a lane's stop hook failed", extra={"lane": lane.value})

    async def run(self, job_type: JobType, ctx: JobContext, args: tuple[Any, ...]) -> Any:
        """The handler's value, or what it raised (a process-lane failure as a
        :class:`ChildFailure`); cancelled with its caller's scope."""
        lane = job_type.lane
        if lane is Lane.TRIO:
            return await job_type.handler(*args)
        if lane is Lane.THREAD:
            return await self._in_thread(job_type, ctx, args)
        label = lane.value
        limiter = self.limiters[lane]
        metrics.lane_waiting.labels(label).inc()
        try:
            await limiter.acquire()
        finally:
            metrics.lane_waiting.labels(label).dec()
        metrics.lane_busy.labels(label).inc()
        began = trio.current_time()
        try:
            if lane is Lane.ASYNCIO:
                assert self._asyncio is not None, "the asyncio lane is not open"
                return await self._asyncio.run(job_type.handler(*args), ctx.cancel)
            return await self._in_process(job_type, ctx, args)
        finally:
            metrics.lane_busy.labels(label).dec()
            metrics.lane_seconds.labels(label).observe(trio.current_time() - began)
            limiter.release()

    async def _in_thread(self, job_type: JobType, ctx: JobContext, args: tuple[Any, ...]) -> Any:
        """The lane's limiter is trio's thread limiter here: trio holds a token for each
        thread until that thread returns, so an abandoned (cancelled) handler keeps its place
        in the lane, and the lane bounds the threads that really run."""
        waiting, busy, seconds = (
            metrics.lane_waiting.labels("thread"),
            metrics.lane_busy.labels("thread"),
            metrics.lane_seconds.labels("thread"),
        )
        state = _ThreadState(f"{job_type.name} {ctx.job_id}", ctx.timeout_seconds)

        def call() -> Any:
            with state.lock:
                if state.gone:  # abandoned before it began: nobody waits for it
                    return None
                state.started = began = time.monotonic()
            waiting.dec()
            busy.inc()
            self._threads.add(state)
            try:
                return job_type.handler(*args)
            finally:
                self._threads.discard(state)
                busy.dec()
                seconds.observe(time.monotonic() - began)

        waiting.inc()
        try:
            return await trio.to_thread.run_sync(
                call, abandon_on_cancel=True, limiter=self.limiters[Lane.THREAD]
            )
        except trio.Cancelled:
            ctx.cancel()
            with state.lock:
                state.gone = True
                if state.started is None:
                    waiting.dec()
            raise

    async def _in_process(self, job_type: JobType, ctx: JobContext, args: tuple[Any, ...]) -> Any:
        assert self._processes is not None, "the process lane is not open"
        try:
            returned: ChildReturn = await self._processes.run_sync(
                run_in_child,
                HandlerRef.of(job_type.handler),
                args,
                job_type.permanent,
                kill_on_cancel=True,
            )
        except trio.Cancelled:
            ctx.cancel()
            raise
        return returned.unpack(ctx)


@dataclass(eq=False)  # each one itself: kept in a set
class _ThreadState:
    what: str  # "<type> <job id>"
    timeout: float | None  # the attempt's own, seconds
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: float | None = None  # time.monotonic() when the handler began
    gone: bool = False


@asynccontextmanager
async def trio_parallel_context(
    config: LaneConfig, hooks: dict, wanted: bool
) -> AsyncIterator[trio_parallel.WorkerContext | None]:
    """The process lane's pool (None when no job type runs in it)."""
    if not wanted:
        yield None
        return
    process_hooks = hooks.get(Lane.PROCESS, {})
    worker_type = trio_parallel.WorkerType(config.start_method)
    if worker_type is trio_parallel.WorkerType.FORK:
        raise ValueError(
            "the process lane never forks (threads and librdkafka): spawn or forkserver"
        )
    async with trio_parallel.open_worker_context(
        init=functools.partial(
            child_init, tuple(process_hooks.get("start", ())), tuple(process_hooks.get("stop", ()))
        ),
        retire=functools.partial(
            child_retire, config.max_jobs_per_child, config.max_memory_per_child_mb
        ),
        worker_type=worker_type,
        grace_period=STOP_GRACE,
    ) as pool:
        yield pool


async def run_here(job_type: JobType, ctx: JobContext, args: tuple[Any, ...]) -> Any:
    """Each lane as :mod:`leasework.testing` runs a handler, without a worker: trio awaited,
    thread in a trio thread, asyncio on a fresh loop in a thread, process in a thread after
    the same pickle round trips a child makes (so what would not cross to a child fails the
    same way here). Cancelled (a timeout), a thread is abandoned and ``ctx.cancelled`` set,
    as in the worker."""
    lane = job_type.lane
    if lane is Lane.TRIO:
        return await job_type.handler(*args)
    try:
        # cancelled (its timeout), the thread is abandoned and told, as the worker's lanes do
        if lane is Lane.THREAD:
            return await trio.to_thread.run_sync(
                functools.partial(job_type.handler, *args), abandon_on_cancel=True
            )
        if lane is Lane.ASYNCIO:
            return await trio.to_thread.run_sync(
                asyncio.run, job_type.handler(*args), abandon_on_cancel=True
            )
        ref, sent, permanent = pickle.loads(
            pickle.dumps((HandlerRef.of(job_type.handler), args, job_type.permanent))
        )
        returned = await trio.to_thread.run_sync(
            run_in_child, ref, sent, permanent, abandon_on_cancel=True
        )
    except trio.Cancelled:
        ctx.cancel()
        raise
    return pickle.loads(pickle.dumps(returned)).unpack(ctx)
