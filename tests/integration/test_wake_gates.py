"""Wake gates (leasework/wakegate.py, migration 0020): a committing insert sends its NOTIFY
only while a listener holds its channel's gate, and the relay finds the rows of a
transaction that sent none.

The stack's relay and workers hold the gates whenever they wait, so they are stopped for
this module (and started again after it: they then publish and run the jobs made here).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
import trio

import leasework
from devstack.layout import KAFKA_DIRECT_BOOTSTRAP, POSTGRES_DIRECT_DSN
from leasework import wakegate
from leasework.db import Database
from leasework.kafka import BlockingPublisher
from leasework.listen import Listener
from leasework.relay.outbox import NOTIFY_CHANNEL, OutboxConfig, OutboxRelay
from leasework.worker.wakeup import CHANNEL as READY_CHANNEL
from tests.integration.conftest import wait_for

GATED = ("relay", "worker-1", "worker-2")


@pytest.fixture(scope="module")
def no_gate_holders(stack) -> Iterator[None]:
    stack.stop_many(GATED)
    try:
        yield
    finally:
        for name in GATED:
            stack.start(name)


@pytest.fixture
async def database(no_gate_holders) -> AsyncIterator[Database]:
    db = Database(POSTGRES_DIRECT_DSN, max_size=2)
    await db.open()
    try:
        yield db
    finally:
        await db.close()


@pytest.fixture
def ears(no_gate_holders) -> Iterator[psycopg.Connection]:
    """A connection listening on both channels."""
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True) as conn:
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        conn.execute(f"LISTEN {READY_CHANNEL}")
        yield conn


def heard(ears: psycopg.Connection) -> list[tuple[str, str]]:
    """(channel, payload) of what ``ears`` heard before a sentinel NOTIFY sent now:
    notifications arrive in commit order, so whatever a transaction committed before this
    call sent comes first."""
    sentinel = f"sentinel-{uuid.uuid4()}"
    with psycopg.connect(POSTGRES_DIRECT_DSN, autocommit=True) as other:
        other.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, sentinel))
    got = []
    for n in ears.notifies(timeout=10.0):
        if n.payload == sentinel:
            return got
        got.append((n.channel, n.payload))
    raise AssertionError(f"the sentinel NOTIFY never came; heard {got}")


def enqueue_one(note: str) -> uuid.UUID:
    """One noop job committed in a transaction of its own (the web-app pattern)."""
    with psycopg.connect(POSTGRES_DIRECT_DSN) as conn, conn.transaction():
        return leasework.enqueue(conn, "noop", {"wake-gate": note}).id


async def test_an_insert_notifies_a_channel_only_while_a_listener_holds_its_gate(database, ears):
    relay = Listener(database, NOTIFY_CHANNEL, gate=wakegate.RELAY_GATE)
    worker = Listener(database, READY_CHANNEL, gate=wakegate.WORKER_GATE)
    try:
        heard(ears)  # whatever came before this test
        enqueue_one("nobody waits")
        assert heard(ears) == []

        assert await relay.arm()
        enqueue_one("the relay waits")
        assert heard(ears) == [(NOTIFY_CHANNEL, "")]

        assert await worker.arm()
        job_id = enqueue_one("both wait")
        got = heard(ears)
        assert (NOTIFY_CHANNEL, "") in got
        ready = [payload for channel, payload in got if channel == READY_CHANNEL]
        assert ready == [f'[["jobs.ready", "{job_id}", "noop"]]']

        await relay.disarm()
        await worker.unlisten()  # lets go of the gate too
        assert not relay.armed and not worker.armed
        enqueue_one("nobody waits again")
        assert heard(ears) == []
    finally:
        relay.close()
        worker.close()


async def test_a_transaction_that_sent_no_notify_keeps_its_stripe_until_it_ends(database):
    listener = Listener(database, NOTIFY_CHANNEL, gate=wakegate.RELAY_GATE)
    try:
        with psycopg.connect(POSTGRES_DIRECT_DSN) as open_tx:
            stripe = open_tx.info.backend_pid % wakegate.STRIPES
            leasework.enqueue(open_tx, "noop", {"wake-gate": "open"})
            assert not await listener.arm()
            assert listener.held == set(wakegate.all_stripes()) - {stripe}
            assert not await listener.arm()  # still open
            open_tx.commit()
            assert await listener.arm()
    finally:
        listener.close()


async def test_the_relay_publishes_the_rows_of_a_transaction_that_sent_no_notify_at_once(
    database,
):
    """No relay waited when the transaction inserted its job, so it sent no NOTIFY; the relay
    that starts meanwhile cannot arm until it commits, and then looks again: the job is
    published long before the relay's tick (30 s here)."""
    publisher = BlockingPublisher(KAFKA_DIRECT_BOOTSTRAP.split(","), "test-wake-gates")
    relay = OutboxRelay(database, publisher, OutboxConfig(tick=30.0), {})

    def in_outbox(job_id: uuid.UUID) -> bool:
        with psycopg.connect(POSTGRES_DIRECT_DSN) as conn:
            row = conn.execute("SELECT 1 FROM outbox WHERE job_id = %s", (job_id,)).fetchone()
            return row is not None

    async def published(job_id: uuid.UUID, what: str) -> None:
        """Its outbox row retired within 5 s: far sooner than the relay's tick."""
        await trio.to_thread.run_sync(
            lambda: wait_for(lambda: not in_outbox(job_id), 5, f"{what} to be published", 0.02)
        )

    try:
        with psycopg.connect(POSTGRES_DIRECT_DSN) as open_tx:
            job = leasework.enqueue(open_tx, "noop", {"wake-gate": "relay"})
            async with trio.open_nursery() as nursery:
                nursery.start_soon(relay.run)
                # the relay passed once, found nothing it could see, and tried to arm
                await trio.to_thread.run_sync(
                    lambda: wait_for(
                        lambda: len(relay.listener.held) == wakegate.STRIPES - 1,
                        10,
                        "the relay to hold every stripe but the open transaction's",
                    )
                )
                open_tx.commit()
                await published(job.id, "the job of the transaction that sent no NOTIFY")
                # having published, it disarmed; once a pass finds nothing it arms again
                await trio.to_thread.run_sync(
                    lambda: wait_for(lambda: relay.listener.armed, 5, "the relay to arm again")
                )
                # armed, it is woken by the next insert's NOTIFY
                second = await trio.to_thread.run_sync(enqueue_one, "after the relay armed")
                await published(second, "the job enqueued once the relay had armed")
                nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(publisher.close)
