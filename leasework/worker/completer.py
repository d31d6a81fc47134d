"""The completer: a worker's fenced terminal writes, batched.

Handlers hand their outcome to :meth:`Completer.complete` and wait. The completer writes a
batch of up to ``max_batch`` outcomes, paced (:mod:`leasework.pacing`): an outcome that finds
the completer idle is written at once; under load a batch starts ``max_wait`` seconds after
the last one started, with every outcome that arrived meanwhile, in one transaction
(:func:`leasework.store.jobs_finish_many`), every row still conditioned on its own fence
and ``running``; then it releases the batch's leases in one Redis call and answers each
waiter. A row that does not come back was rejected by the fence, for that job
alone. A write that fails (the database unreachable) is retried, the waiters keep waiting:
an outcome is never reported before it is durable.

:func:`record` is the rest of the stage: the metrics and the log line of each written (or
fence-rejected) outcome.

Two completers, as River has an inline and a batch one: :class:`Completer` (fenced) and
:class:`UnsafeCompleter`, the plain-TTL demonstration that writes whatever the fence says;
``if unsafe`` lives here and nowhere else.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass, field

import psycopg
import redis
import trio

from leasework import metrics, store
from leasework.db import Database
from leasework.job import Job
from leasework.lease import Claim, Leases
from leasework.outcomes import Completion, Outcome
from leasework.pacing import Pacer
from leasework.states import Status
from leasework.store import operators

log = logging.getLogger("leasework.worker.completer")

MAX_BATCH = 100
MAX_WAIT = 0.015  # seconds between the starts of two batches, at least (an upper bound on waiting)
RETRY_PAUSE = 1.0


@dataclass(frozen=True)
class Finished:
    """What the write of one outcome came to: the status written, or None when the fence
    rejected it (a newer claim holds the job; nothing of this attempt committed)."""

    job_id: uuid.UUID
    status: Status | None

    @property
    def rejected(self) -> bool:
        return self.status is None


@dataclass
class _Waiting:
    completion: Completion
    claim: Claim
    done: trio.Event = field(default_factory=trio.Event)
    finished: Finished | None = None


class Completer:
    def __init__(
        self,
        db: Database,
        leases: Leases,
        *,
        dlq_topic: str,
        ready_topic: str = "jobs.ready",
        worker: str = "worker",
        max_batch: int = MAX_BATCH,
        max_wait: float = MAX_WAIT,
    ) -> None:
        self.db = db
        self.leases = leases
        self.dlq_topic = dlq_topic
        self.ready_topic = ready_topic  # where a job a finish releases from a limit is woken
        self.worker = worker
        self.max_batch = max_batch
        self.pacer = Pacer(max_wait)
        self._send, self._receive = trio.open_memory_channel[_Waiting](math.inf)
        self.flushes = 0  # batches written, for tests and metrics

    async def complete(self, completion: Completion, claim: Claim) -> Finished:
        """Queue ``completion`` for the next batch and wait until it is durable."""
        waiting = _Waiting(completion, claim)
        metrics.completer_waiting.inc()
        try:
            self._send.send_nowait(waiting)
            await waiting.done.wait()
        finally:
            metrics.completer_waiting.dec()
        assert waiting.finished is not None
        return waiting.finished

    def write(self, conn: psycopg.Connection, batch: list[Completion], retrying: bool) -> dict:
        written = store.jobs_finish_many(
            conn, batch, dlq_topic=self.dlq_topic, ready_topic=self.ready_topic, retrying=retrying
        )
        # what the fence refused, kept for the console (same transaction: no write, no row)
        operators.fence_rejections_add(
            conn,
            [(c.job_id, c.fence, c.outcome.status.value) for c in batch if c.job_id not in written],
            self.worker,
        )
        return written

    async def flush(self, batch: list[_Waiting]) -> list[Finished]:
        """Write one batch (retrying while the database is unreachable), release its leases,
        answer its waiters. The run_once of the completer: a test drives it directly."""
        completions = [w.completion for w in batch]
        retrying = False
        while True:
            try:
                written = await self.db.run(self.write, completions, retrying)
                break
            except psycopg.Error as exc:
                # not durable yet: keep trying; the waiters, their offsets and leases wait
                log.warning(
                    "could not record a batch of outcomes; retrying",
                    extra={"jobs": len(batch), "error": str(exc)[:300]},
                )
                retrying = True  # it may have committed with its answer lost
                await trio.sleep(RETRY_PAUSE)
        self.flushes += 1
        metrics.completer_batch_size.observe(len(batch))
        results = []
        for waiting in batch:
            waiting.finished = Finished(
                waiting.completion.job_id, written.get(waiting.completion.job_id)
            )
            results.append(waiting.finished)
        await self._release([w.claim for w in batch])
        for waiting in batch:
            waiting.done.set()
        return results

    async def _release(self, claims: list[Claim]) -> None:
        try:
            await self.leases.release_many(claims)
        except redis.RedisError as exc:  # they expire by themselves within their TTL
            log.warning(
                "lease release failed", extra={"leases": len(claims), "error": str(exc)[:200]}
            )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Batch and write outcomes until cancelled. The worker cancels it only after every
        handler has its answer; a hard stop mid-batch leaves those outcomes unwritten, so
        their messages stay uncommitted and are delivered again."""
        task_status.started()
        while True:
            batch = [await self._receive.receive()]
            with trio.move_on_after(self.pacer.delay(trio.current_time())):
                while len(batch) < self.max_batch:
                    batch.append(await self._receive.receive())
            while len(batch) < self.max_batch:  # and whatever else is already waiting
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            self.pacer.started(trio.current_time())
            await self.flush(batch)

    def pending(self) -> int:
        return self._receive.statistics().current_buffer_used


class UnsafeCompleter(Completer):
    """The UNSAFE terminal write of a plain TTL lease: each job is first put back to
    ``running`` under the attempt's fence, whatever happened meanwhile, so the write always
    matches. Exists only so the fencing demonstration and the chaos harness can show what the
    fence prevents (``LEASEWORK_LEASE_MODE=unsafe-plain-ttl``)."""

    def write(self, conn: psycopg.Connection, batch: list[Completion], retrying: bool) -> dict:
        store.jobs_unfence_many(conn, [(c.job_id, c.fence) for c in batch])
        return super().write(conn, batch, retrying)


def record(job: Job, intended: Outcome, finished: Finished) -> None:
    """Metrics and the log line of one written (or fence-rejected) outcome."""
    if finished.rejected:
        metrics.fence_rejections.inc()
        log.warning(
            "fenced write rejected: a newer claim holds the job; nothing committed",
            extra={"job_id": str(job.id), "fence": job.fence},
        )
        return
    status = finished.status
    job_type = metrics.type_label(job.type)
    metrics.jobs_executed.labels(job_type, str(status)).inc()
    if status == Status.FAILED:
        metrics.retries.labels(job_type).inc()
    elif status == Status.DEAD:
        metrics.dead_letters.labels(job_type).inc()
    if status != Status.SUCCEEDED or log.isEnabledFor(logging.DEBUG):
        log.info(
            "job finished",
            extra={
                "job_id": str(job.id),
                "status": str(status),
                "attempt": job.attempt,
                "fence": job.fence,
                "error": intended.error if status == intended.status else "an effect raised",
            },
        )
