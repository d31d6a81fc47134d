"""Integration tests run against the real local stack (`just up`); nothing here is mocked.

The session fixture brings the stack up if it is not (idempotent), so `pytest tests/integration`
works on its own too. Tests wait on conditions with deadlines, never on fixed sleeps.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import pq
from psycopg.rows import dict_row

from devstack import Stack
from devstack.layout import KAFKA_DIRECT_BOOTSTRAP, POSTGRES_DIRECT_DSN
from leasework.client import AsyncClient, Client
from leasework.store import operators
from leasework.tokens import auth_headers, default_token

API_URL = os.environ.get("LEASEWORK_API_URL", "http://127.0.0.1:8080")
# tests read Postgres directly (not through Toxiproxy) to check what the system wrote
DIRECT_DSN = POSTGRES_DIRECT_DSN


def auth(**headers: str) -> dict[str, str]:
    """``headers`` with the development token `just up` wrote (for raw httpx calls)."""
    return {**auth_headers(default_token()), **headers}


@pytest.fixture(scope="session")
def stack() -> Stack:
    stack = Stack.from_env()
    stack.up(apps=True)
    return stack


@pytest.fixture
def client(stack: Stack):
    with Client(API_URL) as c:
        yield c


@pytest.fixture
async def aclient(stack: Stack):
    async with AsyncClient(API_URL) as c:
        yield c


@pytest.fixture
def db(stack: Stack):
    with psycopg.connect(DIRECT_DSN, autocommit=True, row_factory=dict_row) as conn:
        yield conn


def free_port() -> int:
    """A loopback port nothing listens on now (for a process a test starts by hand)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2):
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` and the last
    value seen after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = predicate()
        except (httpx.TransportError, psycopg.OperationalError) as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}; last seen: {last!r}")
        time.sleep(interval)


def wait_status(client: Client, job_id: str, statuses: set[str], timeout: float = 60.0) -> dict:
    return wait_for(
        lambda: (job := client.get(job_id))["status"] in statuses and job,
        timeout,
        f"job {job_id} to reach {sorted(statuses)}",
    )


def readyz(port: int) -> tuple[int, dict]:
    response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    return response.status_code, response.json()


def insert_unchecked(db, job_type: str, payload: Any = None, **fields: Any) -> str:
    """A job written past every door's checks, through the store's internal insert: what a
    rolling deploy (an api of a newer app, an old worker) or a bug could leave in the table."""
    import json
    import uuid

    request = {"id": str(uuid.uuid4()), "type": job_type, "payload": payload or {}, **fields}
    row = db.execute(
        "SELECT id::text AS id FROM leasework_jobs_insert(%s::jsonb)", (json.dumps([request]),)
    ).fetchone()
    return row["id"]


def dlq_message(job_id: str, timeout: float = 60.0):
    """The jobs.dlq message of ``job_id``: (headers, value), read from the start of the
    topic by a consumer of its own (direct to the brokers, not through Toxiproxy)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP,
            "group.id": f"test-dlq-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["jobs.dlq"])
    try:
        found = wait_for(
            lambda: (
                (m := consumer.poll(1.0)) is not None
                and m.error() is None
                and dict(m.headers() or []).get("job_id", b"").decode() == job_id
                and m
            ),
            timeout,
            f"DLQ message for {job_id}",
            interval=0,
        )
        return dict((k, v.decode()) for k, v in found.headers()), json.loads(found.value())
    finally:
        consumer.close()


@pytest.fixture
def make_token(stack: Stack):
    """Creates tokens with the scopes (and rate) asked for: ``make("read", "cancel")`` is
    (its name, the token); revokes them afterwards."""
    made: list[str] = []

    def make(*scopes: str, rate: float | None = None, burst: int | None = None):
        name = f"test-{'-'.join(scopes)}-{uuid.uuid4().hex[:6]}"
        with psycopg.connect(DIRECT_DSN, row_factory=dict_row) as conn:
            token, _ = operators.token_create(
                conn,
                name=name,
                scopes=frozenset(scopes),
                rate=rate,
                burst=burst,
                created_by="tests/integration",
            )
        made.append(name)
        return name, token

    yield make
    with psycopg.connect(DIRECT_DSN, row_factory=dict_row) as conn:
        for name in made:
            operators.token_revoke(conn, name)


def delete_jobs(conn: psycopg.Connection, where: str, params: tuple = ()) -> None:
    """``DELETE FROM jobs WHERE <where>``, declared deliberate, so the auditor's
    jobs_vanished trigger (migration 0009) does not count a test's cleanup as a job lost."""
    with conn.transaction():
        conn.execute("SELECT set_config('leasework.deleting', 'deliberately', true)")
        conn.execute(f"DELETE FROM jobs WHERE {where}", params)


def client_messages(conn: psycopg.Connection, act: Callable[[], object]) -> list[str]:
    """The protocol messages the client sent while ``act()`` ran (libpq's trace)."""
    with tempfile.TemporaryFile("w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            act()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        return [line.split("\t")[2].strip() for line in trace if line.startswith("F\t")]
