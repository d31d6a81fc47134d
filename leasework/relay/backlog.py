"""The backlog gauge: exports the outbox's size and the age of its oldest row (the outbox
holds only what Kafka has not acknowledged yet, so its size is the backlog). The api runs
this service too, so the backlog stays visible while every relay is down (the case the
backlog alert exists for). A database that cannot be asked costs a sample, quietly: the
gauges keep their last values."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from leasework import metrics, store
from leasework.db import Database
from leasework.relay.service import Backoff, Pass, run_passes


@dataclass(frozen=True)
class BacklogConfig:
    # seconds between samples
    interval: float = 2.0
    # after an unexpected failure (a bug; an unreachable database is a missed sample)
    backoff: Backoff = Backoff.from_interval(2.0)


@dataclass(frozen=True)
class Backlog(Pass):
    """One sample: rows waiting and the oldest one's age in seconds; None when Postgres could
    not be asked."""

    pending: int | None
    oldest_age: float | None


class BacklogGauge:
    def __init__(self, db: Database, config: BacklogConfig = BacklogConfig()) -> None:
        self.db = db
        self.config = config

    async def run_once(self) -> Backlog:
        """Take one sample and export it."""
        try:
            pending, age = await self.db.run(store.outbox_pending)
        except psycopg.Error:
            return Backlog(None, None)
        metrics.outbox_pending.set(pending)
        metrics.outbox_oldest_age.set(age)
        return Backlog(pending, age)

    async def run(self) -> None:
        await run_passes(
            "outbox gauge",
            self.run_once,
            interval=self.config.interval,
            backoff=self.config.backoff,
        )


async def outbox_gauge_loop(db: Database) -> None:
    """Export the outbox backlog for ever (the api's and the relay's)."""
    await BacklogGauge(db).run()
