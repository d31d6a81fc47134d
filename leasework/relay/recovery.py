"""The recovery service: a waiting job whose Kafka record is lost is published again.

Postgres is the truth and Kafka only delivery, so whatever Kafka forgets (records deleted,
retention by time or size, a topic deleted and made again, an unclean election, a group's
offsets reset past unconsumed records) must not strand a job Postgres holds as waiting. A
pass, once per reading of Kafka's positions (the lag probe's, :mod:`leasework.relay.lag`):

1. fills the marks it saw committed before the reading began with each partition's high
   watermark and the topic's id (:func:`leasework.delivery_marks.fill`);
2. judges every filled mark by the reading (:func:`leasework.delivery_marks.judge`): a mark
   whose records are all out of their group's way (consumed, deleted, truncated, or its
   topic recreated) republishes the jobs it watches that still wait unchanged, with a new
   outbox row each, in capped batches, and is retired with the rest (jobs that moved on);
3. watches the jobs that have waited published (queued, no outbox row) for more than
   ``after`` seconds and are not watched yet, under a new mark per topic.

A record that was only late is absorbed as any redelivery is: the second message finds its
job running or finished and is skipped, and a claim's fence keeps one attempt's effects.
Off (``LEASEWORK_RECOVERY_AFTER=never``), a lost record strands its job: the chaos harness's
unsafe twins run so.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

import psycopg
import trio

from leasework import metrics, store
from leasework.config import Settings
from leasework.db import Database
from leasework.delivery_marks import Mark, Reason, Snapshot, fill, judge
from leasework.relay.service import Backoff, Pass, run_passes

log = logging.getLogger("leasework.relay.recovery")


@dataclass(frozen=True)
class RecoveryConfig:
    # the ready topic's base name (LEASEWORK_TOPIC_READY): each band's topic derives from it
    topic: str
    # seconds a published job waits unstarted before it is watched (LEASEWORK_RECOVERY_AFTER)
    after: float = 10.0
    # seconds after which a mark whose group cannot be read is judged lost all the same
    # (LEASEWORK_RECOVERY_FALLBACK); kept under the auditor's stuck bound
    fallback: float = 600.0
    # jobs watched, or republished, per statement
    batch: int = 5000
    # statements of each kind one pass runs at most (the rest waits for the next reading)
    statements: int = 20
    # seconds between watch scans of every waiting job (between them, a scan starts where
    # the last one ended): a job whose transaction committed long after it began is found
    rescan: float = 60.0
    backoff: Backoff = Backoff.from_interval(1.0, 30.0)

    @classmethod
    def from_settings(cls, settings: Settings) -> RecoveryConfig | None:
        """The service's configuration, or None when recovery is off."""
        if settings.recovery_after is None:
            return None
        return cls(
            topic=settings.topic_ready,
            after=settings.recovery_after,
            fallback=settings.recovery_fallback,
        )


@dataclass(frozen=True)
class Recovered(Pass):
    """One pass: jobs newly watched, jobs published again, marks retired."""

    watched: int
    republished: int
    retired: int


class Readings:
    """The latest reading of Kafka's positions, for a service that waits for a newer one."""

    def __init__(self) -> None:
        self.latest: Snapshot | None = None
        self._arrived = trio.Event()

    def put(self, snapshot: Snapshot) -> None:
        self.latest = snapshot
        self._arrived.set()
        self._arrived = trio.Event()

    async def after(self, started: float) -> Snapshot:
        """The first reading that started after ``started`` (monotonic seconds)."""
        while self.latest is None or self.latest.started <= started:
            await self._arrived.wait()
        return self.latest


class Recovery:
    def __init__(self, db: Database, readings: Readings, config: RecoveryConfig) -> None:
        self.db = db
        self.readings = readings
        self.config = config
        self.used = -math.inf  # when the last reading used began (monotonic)
        # marks not filled yet: when this relay first knew them committed (monotonic)
        self.seen: dict[int, float] = {}
        self.since: datetime | None = None  # where the next watch scan starts (None: all)
        self.rescanned = -math.inf  # when the last scan of every waiting job began
        for reason in Reason:  # every series from zero, so a first loss shows as an increase
            metrics.lost_republished.labels(str(reason))
            metrics.lost_marks_retired.labels(str(reason))

    async def run_once(self) -> Recovered:
        now = await self.readings.after(self.used)
        self.used = now.started
        marks = await self.db.run(store.delivery_marks)
        seen_at = time.monotonic()
        marks = await self._fill(marks, now)
        for mark in marks:
            if not mark.filled:
                self.seen.setdefault(mark.id, seen_at)
        alive = {m.id for m in marks}
        self.seen = {m: t for m, t in self.seen.items() if m in alive}
        republished = retired = 0
        for mark in marks:
            if (reason := judge(mark, now, self.config.fallback)) is not None:
                again, done = await self._republish(mark, reason)
                republished += again
                retired += done
        watched = await self._watch()
        metrics.lost_watched.set(await self.db.run(store.delivery_watched))
        return Recovered(watched, republished, retired)

    async def _fill(self, marks: list[Mark], now: Snapshot) -> list[Mark]:
        """Fill the marks this relay knew committed before ``now`` began; ``marks`` with those
        filled. A mark whose topic the reading lacks stays as it is."""
        by_topic: dict[str, list[int]] = defaultdict(list)
        for mark in marks:
            if not mark.filled and self.seen.get(mark.id, math.inf) < now.started:
                by_topic[mark.topic].append(mark.id)
        fills = {t: f for t in by_topic if (f := fill(now.topics.get(t))) is not None}
        if not fills:
            return marks

        def fill_all(conn: psycopg.Connection) -> None:
            for topic, (topic_id, high) in fills.items():
                store.delivery_marks_fill(conn, by_topic[topic], topic_id, high)

        await self.db.run(fill_all)
        filled = {m for t in fills for m in by_topic[t]}
        return [
            Mark(
                m.id,
                m.topic,
                m.age,
                fills[m.topic][0],
                {int(p): h for p, h in fills[m.topic][1].items()},
            )
            if m.id in filled
            else m
            for m in marks
        ]

    async def _republish(self, mark: Mark, reason: Reason) -> tuple[int, int]:
        """Publish again the jobs ``mark`` watches that still wait, in batches, then retire
        it; (jobs published again, marks retired: 0 when the pass's statements ran out)."""
        total = 0
        for _ in range(self.config.statements):
            n = await self.db.run(
                store.jobs_republish_lost, mark.id, self.config.batch, self.config.topic
            )
            total += n
            if n:
                metrics.lost_republished.labels(str(reason)).inc(n)
                log.warning(
                    "kafka lost the records of waiting jobs; published again",
                    extra={"jobs": n, "topic": mark.topic, "reason": str(reason), "mark": mark.id},
                )
            if n < self.config.batch:
                break
        else:
            return total, 0
        moved_on = await self.db.run(store.delivery_mark_retire, mark.id)
        metrics.lost_marks_retired.labels(str(reason)).inc()
        if reason is Reason.TIMED_OUT:
            log.warning(
                "a mark was judged by its age alone: its group's offsets could not be read",
                extra={"topic": mark.topic, "mark": mark.id, "age_s": round(mark.age, 1)},
            )
        log.debug(
            "mark retired",
            extra={
                "mark": mark.id,
                "reason": str(reason),
                "republished": total,
                "moved_on": moved_on,
            },
        )
        return total, 1

    async def _watch(self) -> int:
        """Watch the jobs that have waited published for longer than the bound, in batches,
        from where the last scan ended (from the oldest, every ``rescan`` seconds)."""
        config = self.config
        if time.monotonic() - self.rescanned >= config.rescan:
            self.rescanned, self.since = time.monotonic(), None
        watched = 0
        for _ in range(config.statements):
            watch = functools.partial(
                store.delivery_watch,
                after=config.after,
                since=self.since,
                limit=config.batch,
                topic=config.topic,
            )
            done = await self.db.run(watch)
            committed = time.monotonic()
            for mark in done.marks:
                self.seen[mark] = committed
            watched += done.watched
            if not done.full(config.batch):
                self.since = done.upto
                break
            self.since = done.last
        return watched

    async def run(self) -> None:
        await run_passes("recovery", self.run_once, interval=0.0, backoff=self.config.backoff)
