"""The long-running roles (api, relay, worker, and dev: all three in one process) and the
one-shot migrate, wired from settings and the loaded app."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import psycopg
import trio
from confluent_kafka.admin import AdminClient

from leasework import api, metrics, redisconn, relay, store
from leasework.api.auth import Authenticator, RateLimiter
from leasework.api.groupcommit import GroupCommit
from leasework.app import App
from leasework.config import Settings
from leasework.db import Database
from leasework.health import Health
from leasework.kafka import client_config, cluster_probe
from leasework.pgprobe import PostgresProbe
from leasework.preflight import Preflight
from leasework.service import Stopping, run_service
from leasework.store.schedules import schedules_reconcile
from leasework.worker.process import Worker

log = logging.getLogger("leasework.roles")


def postgres_probe(db: Database) -> PostgresProbe:
    return PostgresProbe(lambda: db.connect(connect_timeout=2, autocommit=True))


def redis_probe(settings: Settings):
    client = redisconn.connect(settings.redis, timeout=2)
    limiter = trio.CapacityLimiter(1)

    async def probe() -> None:
        await trio.to_thread.run_sync(client.ping, limiter=limiter, abandon_on_cancel=True)

    return probe


def kafka_probe(settings: Settings, topics: list[str]):
    admin = AdminClient(
        client_config(
            settings.kafka_brokers,
            f"{settings.process_name}-probe",
            settings.kafka_properties,
            socket_connection_setup_timeout_ms=3000,
        )
    )
    limiter = trio.CapacityLimiter(1)

    async def probe() -> None:
        problem = await trio.to_thread.run_sync(
            cluster_probe, admin, topics, 2.5, limiter=limiter, abandon_on_cancel=True
        )
        if problem:
            raise ConnectionError(problem)

    return probe


async def start_checks(settings: Settings, health: Health) -> Preflight:
    """The doctor's checks, once, before the role serves: raises
    :class:`~leasework.preflight.Refused` on a failure that breaks the promise and no
    override (what refuses, what is deferred: :mod:`leasework.preflight`)."""
    checks = Preflight(settings, health)
    await checks.start()
    return checks


async def register_types(db: Database, app: App, process_name: str) -> None:
    """Record the app's job types in ``job_types`` (the SQL door's registry), retrying until
    the database answers; the process serves meanwhile."""
    rows = app.registry_rows()
    delay = 0.5
    while True:
        try:
            await db.run(store.job_types_register, rows, process_name)
            log.info("job types registered", extra={"types": app.names, "app": app.name})
            if app.schedules:
                await reconcile_schedules(db, app, process_name)
            return
        except psycopg.Error as exc:
            log.warning("cannot register job types yet", extra={"error": str(exc)[:200]})
            await trio.sleep(delay)
            delay = min(10.0, delay * 2)


async def reconcile_schedules(db: Database, app: App, process_name: str) -> None:
    """Store the app's declared schedules (leasework.store.schedules.schedules_reconcile);
    warn of those an earlier deploy declared that this app no longer does."""
    now = datetime.now(UTC)
    left = await db.run(schedules_reconcile, app.schedules, process_name, now)
    log.info("schedules reconciled", extra={"schedules": [d.name for d in app.schedules]})
    if left:
        log.warning(
            "schedules declared by an earlier deploy are no longer in the app; they still "
            "fire: delete them (DELETE FROM schedules WHERE name = ...) if that is not wanted",
            extra={"schedules": left},
        )


class ApiParts:
    """The api's ASGI app and the loops it needs (group commit, token reload, rate limits,
    type registration), for the api and dev roles."""

    def __init__(self, settings: Settings, db: Database, health: Health, app: App) -> None:
        self.settings, self.db, self.app = settings, db, app
        self.group = GroupCommit(db, settings.topic_ready)
        self.auth = Authenticator(db)
        self.limiter = RateLimiter(settings.redis)
        self.asgi = api.create_app(
            settings, db, health, app, self.group, auth=self.auth, limiter=self.limiter
        )

    async def start(self, nursery: trio.Nursery) -> None:
        await nursery.start(self.group.run)
        nursery.start_soon(self.auth.run)
        nursery.start_soon(self.limiter.run)
        nursery.start_soon(register_types, self.db, self.app, self.settings.process_name)


async def run_api(settings: Settings, app: App) -> None:
    db = Database(
        settings.postgres_dsn,
        max_size=10,
        name="api",
        application_name=settings.process_name,
    )
    health = Health()
    checks = await start_checks(settings, health)
    health.add("postgres", postgres_probe(db))
    web = ApiParts(settings, db, health, app)
    await db.open()

    async def body(stopping: Stopping) -> None:
        async with trio.open_nursery() as nursery:
            await web.start(nursery)
            nursery.start_soon(relay.outbox_gauge_loop, db)
            await stopping.wait()
            nursery.cancel_scope.cancel()

    try:
        await run_service(settings, health, body, app=web.asgi, preflight=checks)
    finally:
        await db.close()


async def run_relay(settings: Settings, app: App | None = None) -> None:
    db = Database(
        settings.postgres_dsn,
        max_size=6,
        name="relay",
        application_name=settings.process_name,
    )
    health = Health()
    checks = await start_checks(settings, health)
    health.add("postgres", postgres_probe(db))
    health.add("kafka", kafka_probe(settings, [settings.topic_ready, settings.topic_dlq]))
    await db.open()

    async def body(stopping: Stopping) -> None:
        await relay.run(settings, db, health.conditions, stopping)

    try:
        await run_service(settings, health, body, preflight=checks)
    finally:
        await db.close()


async def run_worker(settings: Settings, app: App) -> None:
    # the claimer, the completer, the heartbeat and fenced effects: handlers hold none
    db = Database(
        settings.postgres_dsn,
        max_size=8,
        name="worker",
        application_name=settings.process_name,
    )
    health = Health()
    checks = await start_checks(settings, health)
    health.add("postgres", postgres_probe(db))
    health.add("redis", redis_probe(settings))
    health.add("kafka", kafka_probe(settings, [settings.topic_ready]))
    await db.open()
    worker = Worker(settings, db, app)
    health.blame = worker.blocked_by

    async def body(stopping: Stopping) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(register_types, db, app, settings.process_name)
            await worker.run(stopping)
            nursery.cancel_scope.cancel()

    try:
        await run_service(settings, health, body, preflight=checks)
    finally:
        await db.close()


async def run_dev(settings: Settings, app: App) -> None:
    """api, relay and worker in one Trio nursery, one process: for development against the
    running stack's Postgres, Redis and Kafka. Ctrl-C drains the worker, then stops all."""
    db = Database(
        settings.postgres_dsn,
        max_size=16,
        name="dev",
        application_name=settings.process_name,
    )
    health = Health()
    checks = await start_checks(settings, health)
    health.add("postgres", postgres_probe(db))
    health.add("redis", redis_probe(settings))
    health.add("kafka", kafka_probe(settings, [settings.topic_ready, settings.topic_dlq]))
    web = ApiParts(settings, db, health, app)
    await db.open()
    worker = Worker(settings, db, app)
    health.blame = worker.blocked_by

    async def body(stopping: Stopping) -> None:
        async with trio.open_nursery() as nursery:
            await web.start(nursery)
            nursery.start_soon(relay.run, settings, db, health.conditions, stopping)
            await worker.run(stopping)  # returns once drained after the signal
            nursery.cancel_scope.cancel()

    try:
        await run_service(settings, health, body, app=web.asgi, preflight=checks)
    finally:
        await db.close()


LONG_RUNNING = {"api": run_api, "relay": run_relay, "worker": run_worker, "dev": run_dev}


def prepare(app: App | None) -> None:
    """Process-wide state that follows from the app: the ``type`` metric label's values."""
    if app is not None:
        metrics.register_types(app.names)
