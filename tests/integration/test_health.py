"""The readiness probe of Postgres against the real server, through a Toxiproxy link of the
test's own (the stack's processes keep theirs): it keeps one connection, says "not ready"
while that connection's path holds its bytes, and gets past it to a new connection while the
old one still hangs."""

from __future__ import annotations

import uuid

import psycopg
import pytest
import trio

from chaos.toxiproxy import RUNTIME_PREFIX, ToxiproxyClient
from devstack import layout
from leasework.health import Health
from leasework.pgprobe import PostgresProbe
from tests.integration.conftest import DIRECT_DSN, free_port

# runtime proxies of this prefix are the harness's to clean up, should a run leave them
HUNG = f"{RUNTIME_PREFIX}pgprobe-test-hung"
FRESH = f"{RUNTIME_PREFIX}pgprobe-test-fresh"


def backends(name: str) -> list[int]:
    with psycopg.connect(DIRECT_DSN, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
        ).fetchall()
    return [pid for (pid,) in rows]


async def settled(name: str, done) -> list[int]:
    """The backends of ``name`` once ``done(pids)`` holds (a closed connection's backend
    leaves ``pg_stat_activity`` a moment after the client has gone), within 10 s."""
    with trio.move_on_after(10):
        # polling another process's state: nothing here to wait on
        while not done(pids := await trio.to_thread.run_sync(backends, name)):  # noqa: ASYNC110
            await trio.sleep(0.1)
    return pids


async def checked(health: Health) -> str | None:
    await health.check_once()
    return health.problems.get("postgres")


@pytest.fixture
async def links(stack):
    """Two links of the test's own to Postgres: the probe's first connection goes through
    the first, every later one through the second (a path that hangs for one connection while
    a new one gets through: a proxy or balancer that lost its upstream but keeps the socket)."""
    ports = {name: free_port() for name in (HUNG, FRESH)}
    async with ToxiproxyClient() as toxiproxy:
        for name, port in ports.items():
            await toxiproxy.delete_proxy(name)
            await toxiproxy.create_proxy(
                name, f"127.0.0.1:{port}", f"127.0.0.1:{layout.POSTGRES_PORT}"
            )
        try:
            yield toxiproxy, ports
        finally:
            for name in ports:
                await toxiproxy.delete_proxy(name)


async def test_the_probe_keeps_one_connection_and_gets_past_a_hung_one(links):
    toxiproxy, ports = links
    name = f"pgprobe-test-{uuid.uuid4().hex[:8]}"
    paths = iter([ports[HUNG]])

    def connect() -> psycopg.Connection:
        port = next(paths, ports[FRESH])
        dsn = layout.POSTGRES_DIRECT_DSN.replace(f":{layout.POSTGRES_PORT}/", f":{port}/")
        return psycopg.connect(dsn, connect_timeout=2, autocommit=True, application_name=name)

    probe = PostgresProbe(connect)
    health = Health(timeout=1.0, probes={"postgres": probe})

    for _ in range(3):
        assert await checked(health) is None
    first = await trio.to_thread.run_sync(backends, name)
    assert len(first) == 1  # three probes, one connection
    assert await checked(health) is None
    assert await trio.to_thread.run_sync(backends, name) == first

    # the kept connection's path holds every byte (the connection stays open): its SELECT 1
    # is not answered while the toxic is there
    await toxiproxy.add_toxic(
        HUNG, {"name": "hold", "type": "timeout", "attributes": {"timeout": 0}}
    )
    try:
        assert await checked(health) == "no answer within 1s"
        # its read was shut down at the deadline, so the probe's slot is free and a new
        # connection answers (without that, every later probe queued behind the hung one
        # until the path healed)
        with trio.move_on_after(10):
            while await checked(health) is not None:  # noqa: ASYNC110 (each turn is a probe)
                await trio.sleep(0.2)
        assert health.problems.get("postgres") is None, health.problems
        now = await trio.to_thread.run_sync(backends, name)
        assert set(now) - set(first), (first, now)
    finally:
        await toxiproxy.remove_toxic(HUNG, "hold")

    assert await settled(name, lambda pids: len(pids) == 1 and pids[0] not in first)
    await trio.to_thread.run_sync(probe.close)
    assert await settled(name, lambda pids: not pids) == []
