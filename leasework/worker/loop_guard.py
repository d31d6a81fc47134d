"""The loop guard: a thread that keeps the worker's leases while its Trio loop is blocked, and
ends the worker when the loop (or a thread-lane handler) overruns every bound.

The heartbeat (:mod:`leasework.worker.heartbeat`) renews the leases from the loop, and each
handler's cancel scope has its lease bound as deadline. A ``trio``-lane handler that blocks
the loop (``time.sleep``, a blocking client, a long CPU loop in an ``async def``) stops both:
past the TTL every other job of the worker would lose its lease and its attempt. So:

- a task beats a pulse (a monotonic time) every :data:`PULSE` seconds;
- this thread, which never waits on the loop, sees the pulse go quiet for a third of the TTL
  and then renews every running lease itself, as the heartbeat would (Redis, then Postgres,
  from its own connections: :meth:`Database.run_blocking`), every third of the TTL;
- what each renewal found (renewed, lost, a cancel requested) waits in a mailbox, which a Trio
  instrument empties in ``after_io_wait``: the first thing the loop does when the blocking task
  yields, before it expires any deadline. A renewed handler's deadline moves forward from the
  instant the thread renewed it; a lost one is cancelled. No handler loses its lease to the
  blocked loop, and none keeps one it lost.

Bounds (a deadlocked handler must not hold its leases for ever): the loop may stay silent as
long as the longest ``timeout`` of the handlers running on it, or :data:`SILENCE_WITHOUT_JOB`
seconds when none runs there (a bug of the worker's own); a thread-lane handler may run
:data:`OVERRUN_GRACE` past its own timeout (it cannot be stopped: the lane abandoned it at its
timeout). Past either, the thread stops renewing, logs what it saw and ends the process with
status 70, as a frozen worker ends: its leases expire after the TTL and the reaper retries the
jobs. A C call that holds the GIL stops this thread too: only the process lane is safe from
it.

Blame: once the loop has been silent :data:`BLAME_AFTER` seconds, the thread looks at the
loop thread's stack (``sys._current_frames``) for a trio-lane handler's frame, and the
loop-lag warning (:func:`leasework.health.measure_event_loop_lag`) names its job type
(:meth:`LoopGuard.blocked_by`); a block too short to be seen names the trio-lane types that
were running instead.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import CodeType

import trio

from leasework import metrics, store
from leasework.app import App
from leasework.db import Database
from leasework.lanes import Lane
from leasework.lease import Leases
from leasework.worker.heartbeat import CancelReason, RunningJob, lease_deadline

log = logging.getLogger("leasework.worker.loop_guard")

PULSE = 0.25  # seconds between two beats of the loop's pulse
CHECK = 0.25  # seconds between two looks of the guard thread
SILENCE_WITHOUT_JOB = 60.0  # seconds a silent loop with no handler on it may hold its leases
OVERRUN_GRACE = 30.0  # seconds a thread-lane handler may run past its own timeout
EXIT_STATUS = 70  # EX_SOFTWARE: the worker ended itself
THAWED = 5.0  # seconds the guard's own sleep may overrun before it counts as a process freeze
BLAME_AFTER = 0.5  # seconds of silence after which the loop thread's stack is looked at


@dataclass(frozen=True)
class Verdict:
    """What one renewal from the guard found for one handler, and when it was sent."""

    job: RunningJob
    sent: float  # time.monotonic() when the renewal was sent
    reason: CancelReason | None  # None: renewed


@dataclass(frozen=True)
class Overrun:
    """A bound passed: why the worker ends."""

    what: str
    seconds: float


class LoopGuard(trio.abc.Instrument):
    def __init__(
        self,
        db: Database,
        leases: Leases,
        running: Callable[[], list[RunningJob]],
        *,
        ttl: float,
        loop_bound: Callable[[], float | None],
        overdue_threads: Callable[[float], list[str]],
        end_process: Callable[[int], None] = os._exit,
        handlers: Mapping[CodeType, str] | None = None,
    ) -> None:
        """``running()`` lists the handlers to renew (any thread may call it);
        ``loop_bound()`` is the longest timeout of the handlers running on the loop (None:
        none runs there); ``overdue_threads(now)`` names the thread-lane handlers running
        past their timeout plus :data:`OVERRUN_GRACE`; ``handlers`` maps the trio-lane
        handlers' code objects to their job types (whom to blame for a blocked loop)."""
        self.db = db
        self.leases = leases
        self.running = running
        self.ttl = ttl
        self.loop_bound = loop_bound
        self.overdue_threads = overdue_threads
        self.end_process = end_process
        self.pulse = time.monotonic()
        self.mailbox: deque[Verdict] = deque()
        self.renewed_at = 0.0  # monotonic: the guard's last renewal
        self._stop = threading.Event()
        self.handlers = dict(handlers or {})
        self.loop_thread: int | None = None
        self.blamed: str | None = None  # the job type seen blocking the loop, until read
        self._blamed_pulse = 0.0  # the silence (its last pulse) already looked at

    # ------------------------------------------------------------ the loop's side

    async def beat(self) -> None:
        """The pulse, for ever."""
        while True:
            self.pulse = time.monotonic()
            await trio.sleep(PULSE)

    def after_io_wait(self, timeout: float) -> None:
        if self.mailbox:
            self.apply()

    def apply(self) -> None:
        """Act on the guard's verdicts (in the loop, before any deadline expires)."""
        now_trio, now = trio.current_time(), time.monotonic()
        while self.mailbox:
            verdict = self.mailbox.popleft()
            job = verdict.job
            if job.completing:
                continue
            if verdict.reason is not None:
                job.cancel(verdict.reason)
                continue
            renewed = now_trio - (now - verdict.sent)  # the renewal's instant, on Trio's clock
            job.scope.deadline = max(job.scope.deadline, lease_deadline(renewed, self.ttl))

    # ------------------------------------------------------------ the thread's side

    def blocked_by(self) -> str | None:
        """Whom the loop-lag warning blames (call it on the loop, after a lag): the job type
        seen blocking the loop, or the trio-lane types running."""
        blamed, self.blamed = self.blamed, None
        if blamed is not None:
            return blamed
        candidates = on_the_loop(self.running())
        return f"one of {', '.join(candidates)}" if candidates else None

    def start(self) -> threading.Thread:
        """Start the thread (from the loop's thread, whose stack a blame looks at)."""
        self.loop_thread = threading.get_ident()
        self.pulse = time.monotonic()
        thread = threading.Thread(target=self.watch, name="leasework-loop-guard", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def watch(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(CHECK):
            now = time.monotonic()
            self.look(now, slept=now - last)
            last = now

    def look(self, now: float, slept: float = CHECK) -> None:
        """One look: end the worker past a bound; renew the leases while the loop is silent.
        ``slept``: how long this thread slept since its last look; far past its period, the
        whole process was frozen (SIGSTOP, a paused VM), not its loop blocked, so the loop
        gets a fresh pulse."""
        if slept > THAWED:
            self.pulse = max(self.pulse, now)
        if (overrun := self.overrun(now)) is not None:
            self.end(overrun)
            return
        silent = now - self.pulse
        if silent >= BLAME_AFTER and self._blamed_pulse != self.pulse:
            self._blamed_pulse = self.pulse
            self.blamed = self.blame() or self.blamed
        if silent >= self.ttl / 3 and now - self.renewed_at >= self.ttl / 3:
            self.renew(now, silent)

    def blame(self) -> str | None:
        """The job type of the innermost trio-lane handler on the loop thread's stack."""
        if self.loop_thread is None or not self.handlers:
            return None
        frame = sys._current_frames().get(self.loop_thread)
        while frame is not None:
            if (job_type := self.handlers.get(frame.f_code)) is not None:
                return job_type
            frame = frame.f_back
        return None

    def overrun(self, now: float) -> Overrun | None:
        silent = now - self.pulse
        bound = self.loop_bound()
        limit = SILENCE_WITHOUT_JOB if bound is None else bound
        if silent > limit:
            blame = (
                "no handler runs on it"
                if bound is None
                else f"the longest timeout of its handlers is {bound:g}s"
            )
            return Overrun(f"the event loop has been blocked for {silent:.1f}s ({blame})", silent)
        if overdue := self.overdue_threads(now):
            return Overrun(
                f"thread-lane handlers ran {OVERRUN_GRACE:g}s past their timeout: "
                + ", ".join(overdue),
                silent,
            )
        return None

    def end(self, overrun: Overrun) -> None:
        """Stop renewing and end the process, as a frozen worker would end."""
        self._stop.set()
        try:
            types = on_the_loop(self.running())
        except RuntimeError:
            types = []
        log.critical(
            "ending the worker: %s; its leases expire and the reaper retries its jobs",
            overrun.what,
            extra={"blocked_seconds": round(overrun.seconds, 1), "trio_lane_types": types},
        )
        metrics.loop_guard_exits.inc()
        for handler in logging.getLogger().handlers:
            handler.flush()
        self.end_process(EXIT_STATUS)

    def renew(self, now: float, silent: float) -> None:
        """Renew every running lease from this thread, as the heartbeat does from the loop."""
        try:
            jobs = [job for job in self.running() if not job.completing]
        except RuntimeError:  # the loop changed the set meanwhile: it is not blocked after all
            return
        self.renewed_at = now
        if not jobs:
            return
        log.warning(
            "event loop blocked: leases renewed from the loop guard; the loop is held by a "
            "task that does not yield, such as a handler of one of these trio-lane types "
            "(move blocking code to runs_in='thread' or 'process')",
            extra={
                "blocked_seconds": round(silent, 1),
                "jobs": len(jobs),
                "trio_lane_types": on_the_loop(jobs),
            },
        )
        try:
            held = self.leases.store.renew_many([j.claim for j in jobs], self.ttl)
            ours = self.db.run_blocking(
                store.jobs_heartbeat_many, [(j.job_id, j.claim.fence) for j in jobs], self.ttl
            )
        except Exception as exc:  # unreachable: the deadlines stay; the loop's own bound holds
            log.warning("loop guard: lease renewal failed", extra={"error": str(exc)[:200]})
            metrics.lease_renewals.labels("error").inc(len(jobs))
            return
        metrics.loop_guard_renewals.inc(len(jobs))
        for job, in_redis in zip(jobs, held, strict=True):
            if not (in_redis and job.job_id in ours):
                metrics.lease_renewals.labels("lost").inc()
                self.mailbox.append(Verdict(job, now, CancelReason.LEASE))
            elif ours[job.job_id]:
                self.mailbox.append(Verdict(job, now, CancelReason.REQUEST))
            else:
                metrics.lease_renewals.labels("ok").inc()
                self.mailbox.append(Verdict(job, now, None))


def on_the_loop(jobs: list[RunningJob]) -> list[str]:
    """The job types of the handlers running on the worker's own loop: the one that blocks
    it is among them."""
    return sorted({job.type for job in jobs if job.lane == "trio" and not job.completing})


def trio_handlers(app: App) -> dict[CodeType, str]:
    """The code objects of ``app``'s trio-lane handlers, to their job types."""
    return {
        job_type.handler.__code__: job_type.name
        for job_type in app
        if job_type.lane is Lane.TRIO and hasattr(job_type.handler, "__code__")
    }
