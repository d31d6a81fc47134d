"""The idle fast path: a lone job woken by Postgres, claimed before Kafka delivers it.

Kafka's ``acks=all`` costs a lone job most of its time to start on a small machine (the
leader waits for both followers' fetches before the message is acknowledged or readable:
5-9 ms here, twice the relay's own share). So the outbox trigger (migration 0012) also
sends ``NOTIFY leasework_ready`` at the inserting transaction's commit, naming the jobs of a
small statement: ``[[topic, job id, type], ...]``. :func:`listen` hears it on a dedicated
connection, and a queue of this worker with nothing in flight claims the job at once
(:meth:`leasework.worker.claim.ClaimStage.wake`), under the same fenced lease and stamp as a
Kafka delivery. Nothing else changes: the relay still publishes the job, and its message,
finding the job running or finished, is settled like any second delivery. A wake-up that is
lost, ignored (the queue is busy, or another worker won the lease) or fails only leaves the
job to Kafka, so it costs latency, never a job; a worker that dies after such a claim is the
worker loop's "dies during the handler" row (the reaper).
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass

import trio

from leasework import metrics, wakegate
from leasework.db import Database
from leasework.listen import Listener
from leasework.service import Stopping

log = logging.getLogger("leasework.worker.wakeup")

CHANNEL = "leasework_ready"
WAIT = 0.5  # seconds a listen waits before it looks at ``stopping`` again
# a worker none of whose queues has been quiet for this long stops listening (each NOTIFY
# wakes every listening connection's backend, and a busy worker ignores wake-ups anyway),
# and looks every LOOK seconds whether one is quiet again, to listen again
BUSY_BEFORE_UNLISTEN = 1.0
LOOK = 0.05
# a worker that hears this many wake-ups within STREAM_WINDOW s is on a stream of small
# commits (one job per web request): stop listening for DEAF_FOR s. A queue acts on at most
# one wake-up per IDLE_BEFORE_WAKE (0.1 s) anyway; the rest cost this process and its
# Postgres backend a wake-up each for nothing, and Kafka delivers a stream in batches
STREAM = 20
STREAM_WINDOW = 1.0
DEAF_FOR = 2.0


@dataclass
class StreamGauge:
    """Counts the wake-ups heard over the last :data:`STREAM_WINDOW` s (pure: the caller
    passes the time)."""

    heard: list[float]

    def __init__(self) -> None:
        self.heard = []

    def add(self, now: float, count: int) -> bool:
        """Record ``count`` wake-ups heard at ``now``; whether they make a stream."""
        self.heard.extend([now] * count)
        cut = now - STREAM_WINDOW
        while self.heard and self.heard[0] <= cut:
            self.heard.pop(0)
        if len(self.heard) >= STREAM:
            self.heard.clear()
            return True
        return False


@dataclass(frozen=True)
class Wakeup:
    """A job made ready by a committed insert: its queue's topic, its id, its type."""

    topic: str
    job_id: uuid.UUID
    type: str


def parse(payload: str) -> list[Wakeup]:
    """The wake-ups of one NOTIFY payload; what is not ``[topic, job id, type]`` is left out
    (Kafka delivers the job anyway)."""
    try:
        items = json.loads(payload)
    except (ValueError, RecursionError):
        return []
    if not isinstance(items, list):
        return []
    woken = []
    for item in items:
        if not (isinstance(item, list) and len(item) == 3):
            continue
        topic, job_id, job_type = item
        if not (isinstance(topic, str) and isinstance(job_id, str) and isinstance(job_type, str)):
            continue
        try:
            woken.append(Wakeup(topic, uuid.UUID(job_id), job_type))
        except ValueError:
            continue
    return woken


def addressed(
    payloads: Iterable[str], queue_of_topic: Mapping[str, str], types: Container[str]
) -> list[tuple[str, uuid.UUID]]:
    """(queue, job id) of each wake-up this worker can act on: a topic of a queue it serves,
    a type its app defines (a job of another type is a newer worker's, not to be deferred),
    each job once."""
    seen: dict[uuid.UUID, str] = {}
    for payload in payloads:
        for woken in parse(payload):
            queue = queue_of_topic.get(woken.topic)
            if queue is not None and woken.type in types and woken.job_id not in seen:
                seen[woken.job_id] = queue
    return [(queue, job_id) for job_id, queue in seen.items()]


async def listen(
    db: Database,
    queue_of_topic: Mapping[str, str],
    types: Container[str],
    wake: Callable[[str, uuid.UUID], bool],
    stopping: Stopping,
    quiet: Callable[[], bool] = lambda: True,
) -> None:
    """Hear wake-ups until ``stopping``; ``wake(queue, job_id)`` claims one if its queue is
    quiet and says whether it did. While ``quiet()`` (some queue of the worker is) stays
    false for :data:`BUSY_BEFORE_UNLISTEN` s, stop listening until it is true again: under
    load a NOTIFY per committed job would cost every worker's connection a wake-up for
    nothing (measured: the bench's ``enqueue-one`` row). Likewise for :data:`DEAF_FOR` s
    after hearing a stream (:class:`StreamGauge`): at a steady hundred small commits a
    second every queue may look quiet between jobs while nearly every wake-up is ignored.
    Listening, it holds the worker gate (:mod:`leasework.wakegate`), so that inserters send
    their wake-ups; unlistening lets go of it, and they send none."""
    listener = Listener(db, CHANNEL, gate=wakegate.WORKER_GATE)
    busy_since: float | None = None
    gauge = StreamGauge()
    deaf_until = -math.inf
    try:
        while not stopping.is_set():
            if trio.current_time() < deaf_until:
                await trio.sleep(min(LOOK, deaf_until - trio.current_time()))
                continue
            if not quiet():
                now = trio.current_time()
                busy_since = now if busy_since is None else busy_since
                if listener.listening and now - busy_since >= BUSY_BEFORE_UNLISTEN:
                    await listener.unlisten()
                if not listener.listening:
                    await trio.sleep(LOOK)
                    continue
            else:
                busy_since = None
            if not listener.armed:
                # inserters send the wake-up only while a worker holds the gate; a stripe an
                # open transaction holds is tried again at the next wait (a wake-up missed
                # costs latency: Kafka delivers the job)
                await listener.arm()
            payloads = await listener.wait(WAIT)
            woken = addressed(payloads, queue_of_topic, types)
            for queue, job_id in woken:
                if not wake(queue, job_id):
                    metrics.wakeups.labels("busy").inc()
            if woken and gauge.add(trio.current_time(), len(woken)):
                await listener.unlisten()
                deaf_until = trio.current_time() + DEAF_FOR
    finally:
        await listener.aclose()
