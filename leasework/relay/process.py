"""The relay process: its maintenance services in one nursery, each with its own loop
(:func:`leasework.relay.service.run_passes`): the outbox relay (:mod:`.outbox`), the
promoter (:mod:`.promoter`), the scheduler (:mod:`.scheduler`), the reaper (:mod:`.reaper`),
the pruner (:mod:`.pruner`), the auditor (:mod:`.auditor`), the backlog gauge
(:mod:`.backlog`), the consumer-lag service (:mod:`.lag`) and the recovery of lost Kafka
records (:mod:`.recovery`), which judges by the lag probe's readings.

Each service claims its rows with ``FOR UPDATE SKIP LOCKED``, so any number of relays may
run side by side.
"""

from __future__ import annotations

import trio

from leasework.config import Settings
from leasework.db import Database
from leasework.kafka import BlockingPublisher
from leasework.relay.auditor import Auditor, AuditorConfig
from leasework.relay.backlog import BacklogGauge
from leasework.relay.lag import ConsumerLag, LagConfig
from leasework.relay.outbox import OutboxConfig, OutboxRelay
from leasework.relay.promoter import Promoter, PromoterConfig
from leasework.relay.pruner import Pruner, PrunerConfig
from leasework.relay.reaper import Reaper, ReaperConfig
from leasework.relay.recovery import Readings, Recovery, RecoveryConfig
from leasework.relay.scheduler import Scheduler, SchedulerConfig
from leasework.relay.service import Service
from leasework.service import Stopping


def services(
    settings: Settings,
    db: Database,
    publisher: BlockingPublisher,
    health_conditions: dict[str, str],
    stopping: Stopping | None = None,
) -> list[Service]:
    """Every service of one relay, configured from ``settings``; the outbox relay's pass runs
    on after ``stopping`` until its deadline. The recovery service (off when the settings say
    so) judges lost records by the consumer-lag probe's readings."""
    readings = Readings()
    recovery = RecoveryConfig.from_settings(settings)
    return [
        OutboxRelay(
            db, publisher, OutboxConfig.from_settings(settings), health_conditions, stopping
        ),
        Promoter(db, PromoterConfig.from_settings(settings)),
        Scheduler(db, SchedulerConfig.from_settings(settings)),
        Reaper(db, ReaperConfig.from_settings(settings)),
        Pruner(db, PrunerConfig.from_settings(settings)),
        Auditor(db, AuditorConfig.from_settings(settings)),
        BacklogGauge(db),
        ConsumerLag(LagConfig.from_settings(settings), readings.put),
    ] + ([Recovery(db, readings, recovery)] if recovery is not None else [])


async def run(
    settings: Settings, db: Database, conditions: dict[str, str], stopping: Stopping
) -> None:
    """Run every service until ``stopping``; ``conditions`` are the process's health
    conditions (the outbox relay's says when Kafka does not acknowledge)."""
    publisher = BlockingPublisher(
        settings.kafka_brokers,
        settings.process_name,
        settings.kafka_properties,
        topic_check_every=settings.topic_check_every,
    )
    async with trio.open_nursery() as nursery:
        for service in services(settings, db, publisher, conditions, stopping):
            nursery.start_soon(service.run)
        await stopping.wait()
        # threads finish the batch they hold (a to_thread call is not abandoned; the outbox
        # relay's, whose publish waits on Kafka, is at the shutdown's deadline), then stop
        nursery.cancel_scope.cancel()
    # what is still in flight gets up to 5 s, within the shutdown's deadline (rows Kafka did
    # not acknowledge stay in the outbox for the next relay)
    await trio.to_thread.run_sync(publisher.close, abandon_on_cancel=True)
