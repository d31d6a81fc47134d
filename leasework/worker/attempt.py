"""The execute stage: one attempt of a started job, the handler under its two scopes, turned
into the :class:`~leasework.outcomes.Completion` the completer writes.

The outer scope's deadline is the worker's own lower bound of lease validity (claim time +
TTL x 0.8, monotonic), moved forward by each heartbeat renewal; the inner one is the job's
``timeout_seconds``. While the handler runs, its :class:`RunningJob` is in
:attr:`Executor.running`, where the heartbeat renews (or cancels) it and the drain cancels it.
What the attempt came to is decided by :mod:`leasework.worker.outcome`.
"""

from __future__ import annotations

import math
import uuid

import trio

from leasework import metrics
from leasework.app import App, JobType
from leasework.context import JobContext
from leasework.job import Job
from leasework.outcomes import Completion, Outcome, RetryDefaults
from leasework.states import Status
from leasework.worker.claim import Started
from leasework.worker.execution import HandlerResult, Runner, call_handler
from leasework.worker.heartbeat import CancelReason, RunningJob, lease_deadline
from leasework.worker.lanes import Lanes, run_here
from leasework.worker.outcome import effect_failure, outcome_of


class Executor:
    def __init__(
        self,
        app: App,
        *,
        worker: str,
        ttl: float,
        defaults: RetryDefaults,
        bounded_by_lease: bool = True,
        lanes: Lanes | None = None,
    ) -> None:
        """``bounded_by_lease=False`` is the plain-TTL demonstration: no deadline scope.
        ``lanes`` run the handlers (None: :func:`run_here`, each lane without a worker's)."""
        self.app = app
        self.run_in_lane: Runner = lanes.run if lanes is not None else run_here
        self.worker = worker
        self.ttl = ttl
        self.defaults = defaults
        self.bounded_by_lease = bounded_by_lease
        self.running: dict[uuid.UUID, RunningJob] = {}

    async def execute(self, started: Started) -> Completion:
        """Run the handler under its two scopes (lease deadline, job timeout) and turn what
        happened into the completion the completer writes."""
        job = started.job
        metrics.scheduling_delay.observe(job.scheduling_delay)
        job_type = self.app.get(job.type)
        if job_type is None:
            return self.undefined(job)
        ctx = JobContext(
            job_id=job.id,
            type=job.type,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            fence=job.fence,
            worker=self.worker,
            payload=job.payload,
            timeout_seconds=job.timeout_seconds,
        )
        deadline = (
            lease_deadline(started.claimed_at, self.ttl) if self.bounded_by_lease else math.inf
        )
        running = RunningJob(
            started.claim,
            trio.CancelScope(deadline=deadline),
            lane=job_type.lane.value,
            timeout=job.timeout_seconds,
            type=job.type,
        )
        handled, timed_out = await self._call(job, job_type, ctx, running)
        outcome = outcome_of(
            job, handled, self.defaults, timed_out=timed_out, cancelled_by=running.reason
        )
        effects = tuple(ctx.effects) if outcome.status == Status.SUCCEEDED else ()

        def effect_failed(exc: Exception) -> Outcome:
            return effect_failure(job, exc, self.defaults, permanent=job_type.is_permanent(exc))

        return Completion(job.id, job.fence, outcome, effects, effect_failed)

    def loop_bound(self) -> float | None:
        """The longest timeout of the handlers running on the worker's own loop (None: none
        runs there): how long the loop guard lets a blocked loop hold the leases. Called from
        the guard's thread."""
        try:
            timeouts = [r.timeout for r in list(self.running.values()) if r.lane == "trio"]
        except RuntimeError:  # changed meanwhile: the loop runs
            return math.inf
        return max(timeouts) if timeouts else None

    def undefined(self, job: Job) -> Completion:
        """A job of a type the app does not define, started all the same: its message named
        another type (the claim trusts a message's type, :meth:`Claimer.claim`; only a writer
        to ``jobs.ready`` other than the relay could make one). The attempt fails, so the job
        retries with its backoff, and the retry's message names the row's own type."""
        why = (
            f"this worker's app ({self.app.name}) does not define type {job.type!r}; the "
            "message that delivered the job named another type"
        )
        outcome = outcome_of(
            job, HandlerResult(error=why), self.defaults, timed_out=False, cancelled_by=None
        )
        return Completion(job.id, job.fence, outcome)  # no handler ran: no effects to fail

    async def _call(
        self, job: Job, job_type: JobType, ctx: JobContext, running: RunningJob
    ) -> tuple[HandlerResult | None, bool]:
        """(the handler's result, None if a scope cut it short; whether it timed out)."""
        self.running[job.id] = running
        metrics.jobs_in_flight.inc()
        began = trio.current_time()
        handled: HandlerResult | None = None
        timed_out = False
        try:
            with running.scope:
                with trio.move_on_after(job.timeout_seconds) as timeout_scope:
                    handled = await call_handler(job_type, ctx, self.run_in_lane)
                timed_out = timeout_scope.cancelled_caught
        finally:
            running.completing = True
            metrics.jobs_in_flight.dec()
            self.running.pop(job.id, None)
        metrics.execution_seconds.labels(metrics.type_label(job.type)).observe(
            trio.current_time() - began
        )
        if handled is not None and handled.stale:
            metrics.stale_fence_refusals.inc()
        if running.scope.cancelled_caught and running.reason is None:
            running.reason = CancelReason.LEASE
            metrics.lease_loss_cancellations.inc()
        return handled, timed_out
