"""The long-running roles (api, relay, worker) and the one-shot migrate, wired from settings."""

from __future__ import annotations

import logging

import redis
import trio
from confluent_kafka.admin import AdminClient

from leasework import api, relay
from leasework.config import Settings
from leasework.db import Database
from leasework.health import Health
from leasework.kafka import cluster_probe
from leasework.service import Stopping, run_service
from leasework.worker import Worker

log = logging.getLogger("leasework.roles")


def postgres_probe(db: Database):
    limiter = trio.CapacityLimiter(1)

    def check() -> None:
        with db.connect(connect_timeout=2) as conn:
            conn.execute("SELECT 1")

    async def probe() -> None:
        await trio.to_thread.run_sync(check, limiter=limiter, abandon_on_cancel=True)

    return probe


def redis_probe(settings: Settings):
    host, port = settings.redis_addr
    client = redis.Redis(host=host, port=port, socket_timeout=2, socket_connect_timeout=2)
    limiter = trio.CapacityLimiter(1)

    async def probe() -> None:
        await trio.to_thread.run_sync(client.ping, limiter=limiter, abandon_on_cancel=True)

    return probe


def kafka_probe(settings: Settings, topics: list[str]):
    admin = AdminClient(
        {
            "bootstrap.servers": ",".join(settings.kafka_brokers),
            "client.id": f"{settings.process_name}-probe",
            "socket.connection.setup.timeout.ms": 3000,
        }
    )
    limiter = trio.CapacityLimiter(1)

    async def probe() -> None:
        problem = await trio.to_thread.run_sync(
            cluster_probe, admin, topics, 2.5, limiter=limiter, abandon_on_cancel=True
        )
        if problem:
            raise ConnectionError(problem)

    return probe


async def run_api(settings: Settings) -> None:
    db = Database(settings.postgres_dsn, max_size=10, name="api")
    health = Health()
    health.add("postgres", postgres_probe(db))
    app = api.create_app(settings, db, health)
    await db.open()

    async def body(stopping: Stopping) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(relay.outbox_gauge_loop, db)
            await stopping.wait()
            nursery.cancel_scope.cancel()

    try:
        await run_service(settings, health, body, app=app)
    finally:
        await db.close()


async def run_relay(settings: Settings) -> None:
    db = Database(settings.postgres_dsn, max_size=6, name="relay")
    health = Health()
    health.add("postgres", postgres_probe(db))
    health.add("kafka", kafka_probe(settings, [settings.topic_ready, settings.topic_dlq]))
    await db.open()

    async def body(stopping: Stopping) -> None:
        await relay.run(settings, db, health.conditions, stopping)

    try:
        await run_service(settings, health, body)
    finally:
        await db.close()


async def run_worker(settings: Settings) -> None:
    db = Database(settings.postgres_dsn, max_size=settings.worker_concurrency + 4, name="worker")
    health = Health()
    health.add("postgres", postgres_probe(db))
    health.add("redis", redis_probe(settings))
    health.add("kafka", kafka_probe(settings, [settings.topic_ready]))
    await db.open()
    worker = Worker(settings, db)
    try:
        await run_service(settings, health, worker.run)
    finally:
        await db.close()


LONG_RUNNING = {"api": run_api, "relay": run_relay, "worker": run_worker}
