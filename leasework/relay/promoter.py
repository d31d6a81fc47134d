"""The promoter: due ``scheduled`` and ``failed`` jobs become ``queued``, each with the outbox
row that wakes a worker, a batch a statement, claimed with ``FOR UPDATE SKIP LOCKED`` so
several relays promote side by side. A full batch means more are due: the next pass runs at
once."""

from __future__ import annotations

from dataclasses import dataclass

from leasework import metrics, store
from leasework.config import Settings
from leasework.db import Database
from leasework.relay.service import Backoff, Pass, run_passes


@dataclass(frozen=True)
class PromoterConfig:
    # where the wake-up messages go (LEASEWORK_TOPIC_READY's jobs.ready)
    topic: str
    # jobs queued per statement
    batch: int = 500
    # seconds between passes while nothing more is due (LEASEWORK_RELAY_TICK)
    interval: float = 0.5
    # after a failed pass: the interval, doubling up to MAX_BACKOFF
    backoff: Backoff = Backoff.from_interval(0.5)

    @classmethod
    def from_settings(cls, settings: Settings) -> PromoterConfig:
        return cls(
            topic=settings.topic_ready,
            interval=settings.relay_tick,
            backoff=Backoff.from_interval(settings.relay_tick),
        )


@dataclass(frozen=True)
class Promoted(Pass):
    queued: int
    batch: int

    @property
    def more_waiting(self) -> bool:
        return self.queued >= self.batch


class Promoter:
    def __init__(self, db: Database, config: PromoterConfig) -> None:
        self.db = db
        self.config = config

    async def run_once(self) -> Promoted:
        """Queue one batch of due jobs, and the jobs held by concurrency limits that have
        room now; returns how many."""
        queued = await self.db.run(store.jobs_promote_due, self.config.batch, self.config.topic)
        metrics.promoted.inc(queued)
        released = await self.db.run(
            store.jobs_release_limited, self.config.batch, self.config.topic
        )
        metrics.limit_released.inc(released)
        return Promoted(queued, self.config.batch)

    async def run(self) -> None:
        await run_passes(
            "promoter", self.run_once, interval=self.config.interval, backoff=self.config.backoff
        )
