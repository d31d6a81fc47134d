"""The three doors a bench row submits leasework jobs through, closed loop (as fast as the
door takes them) or paced (open loop at a given rate), and the ``jobs`` table queries that
time them.

* ``single``: ``POST /jobs``, one job per request, from the lean keep-alive client of
  :mod:`tools.bench.http` (or, for the ``single-client`` row, ``leasework.AsyncClient.submit``);
* ``batch``: ``POST /jobs/batch``, ``chunk`` jobs per request (``AsyncClient.submit_many``);
* ``enqueue``: ``leasework.enqueue_many`` in the caller's transaction, ``chunk`` jobs per
  transaction, on connections of the bench's own to the direct DSN.

Every job is the demo app's ``noop`` with payload ``{"bench": tag, "n": i}``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psycopg
import trio

import leasework
from leasework.client import AsyncClient
from tools.bench.floor import run_lanes
from tools.bench.http import Connection, HttpError
from tools.bench.tap import Published

DOORS = (
    "single",
    "batch",
    "enqueue",
    "enqueue-one",
    "enqueue-one-sqlalchemy",
    "enqueue-one-asyncpg",
    "enqueue-one-django",
)
LEAN, SHIPPED = "lean", "leasework.AsyncClient"  # the single door's clients
# the caller's own table for the web-app pattern (an order row and its job in one transaction)
ORDERS_TABLE = "bench_orders"
ORDER_INSERT = f"INSERT INTO {ORDERS_TABLE} (tag, n) VALUES (%s, %s)"
ORDER_INSERT_NAMED = f"INSERT INTO {ORDERS_TABLE} (tag, n) VALUES (:tag, :n)"
ORDER_INSERT_NUMBERED = f"INSERT INTO {ORDERS_TABLE} (tag, n) VALUES ($1, $2)"


@dataclass(frozen=True)
class Door:
    name: str
    chunk: int  # jobs per request / transaction
    concurrency: int  # requests or transactions in flight
    client: str = LEAN  # single: the lean HTTP client (tools.bench.http) or SHIPPED


@dataclass(frozen=True)
class Submitted:
    first: float  # time.time() just before the first send
    last: float  # time.time() when the last send returned
    jobs: int
    late: int = 0  # paced sends that went out more than 50 ms after their due time


def chunks(jobs: int, size: int) -> list[range]:
    """Job indices 0..jobs-1 cut into consecutive ranges of ``size`` (the last shorter)."""
    return [range(i, min(i + size, jobs)) for i in range(0, jobs, size)]


def paced_plan(rate: float, seconds: float, chunk: int) -> tuple[int, float]:
    """(jobs, interval between chunks) to submit ``rate`` jobs/s for ``seconds`` in chunks
    of ``chunk`` jobs: at least one chunk, whole chunks only."""
    if rate <= 0:
        raise ValueError("paced rate must be positive")
    count = max(1, math.ceil(rate * seconds / chunk))
    return count * chunk, chunk / rate


def _payload(tag: str, i: int) -> dict:
    return {"bench": tag, "n": i}


async def _lean_single(
    door: Door, url: str, tag: str, jobs: int, due: Callable[[int], float] | None
) -> Submitted:
    """The single door with :mod:`tools.bench.http`: one keep-alive connection per lane."""
    late = 0
    ends: list[float] = []

    async def lane(k: int) -> None:
        nonlocal late
        connection = Connection(url)
        await connection.open()
        try:
            for i in range(k, jobs, door.concurrency):
                if due is not None:
                    wait = due(i) - time.time()
                    if wait > 0:
                        await trio.sleep(wait)
                    elif wait < -0.05:
                        late += 1
                status = await connection.post(
                    "/jobs", {"type": "noop", "payload": _payload(tag, i)}
                )
                if status != 202:
                    raise HttpError(f"POST /jobs answered {status}")
        finally:
            await connection.aclose()
        ends.append(time.time())

    first = time.time()
    async with trio.open_nursery() as nursery:
        for k in range(min(door.concurrency, jobs)):
            nursery.start_soon(lane, k)
    return Submitted(first, max(ends, default=first), jobs, late)


async def _http(
    door: Door,
    url: str,
    tag: str,
    jobs: int,
    due: Callable[[int], float] | None,
) -> Submitted:
    parts = chunks(jobs, door.chunk)
    late = 0
    ends: list[float] = []
    async with AsyncClient(url, timeout=120) as client:

        async def send(part: range) -> None:
            if door.name == "single":
                (i,) = part
                await client.submit("noop", _payload(tag, i))
            else:
                await client.submit_many(
                    [{"type": "noop", "payload": _payload(tag, i)} for i in part]
                )

        async def lane(k: int) -> None:
            nonlocal late
            for index in range(k, len(parts), door.concurrency):
                if due is not None:
                    wait = due(index) - time.time()
                    if wait > 0:
                        await trio.sleep(wait)
                    elif wait < -0.05:
                        late += 1
                await send(parts[index])
            ends.append(time.time())

        first = time.time()
        async with trio.open_nursery() as nursery:
            for k in range(min(door.concurrency, len(parts))):
                nursery.start_soon(lane, k)
    return Submitted(first, max(ends, default=first), jobs, late)


def _enqueue(
    door: Door, dsn: str, tag: str, jobs: int, due: Callable[[int], float] | None
) -> Submitted:
    parts = chunks(jobs, door.chunk)
    lanes = min(door.concurrency, len(parts))
    conns = [psycopg.connect(dsn) for _ in range(lanes)]
    ends: list[float] = []
    late = [0]

    def lane(k: int, conn: psycopg.Connection) -> None:
        for index in range(k, len(parts), lanes):
            if due is not None:
                wait = due(index) - time.time()
                if wait > 0:
                    time.sleep(wait)
                elif wait < -0.05:
                    late[0] += 1
            with conn.transaction():
                if door.name == "enqueue-one":
                    # the web-app pattern: the caller's own row and its job, one transaction
                    (i,) = parts[index]
                    conn.execute(ORDER_INSERT, (tag, i))
                    leasework.enqueue(conn, "noop", _payload(tag, i))
                    continue
                leasework.enqueue_many(
                    conn, [leasework.job("noop", _payload(tag, i)) for i in parts[index]]
                )
        ends.append(time.time())

    first = time.time()
    run_lanes(lane, conns, "enqueue_many")
    return Submitted(first, max(ends, default=first), jobs, late[0])


def _pace(due: Callable[[int], float] | None, index: int, late: list[int]) -> float:
    """Seconds to wait before chunk ``index`` (counting it late past 50 ms)."""
    if due is None:
        return 0.0
    wait = due(index) - time.time()
    if wait < -0.05:
        late[0] += 1
    return max(0.0, wait)


def _enqueue_sqlalchemy(
    door: Door, dsn: str, tag: str, jobs: int, due: Callable[[int], float] | None
) -> Submitted:
    """``enqueue-one`` through SQLAlchemy: a ``Session`` per connection (psycopg driver), the
    caller's row and its job in one transaction."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    insert = text(ORDER_INSERT_NAMED)
    lanes = min(door.concurrency, jobs)
    engine = create_engine(
        "postgresql+psycopg://" + dsn.removeprefix("postgresql://"), pool_size=lanes
    )
    sessions = [Session(engine) for _ in range(lanes)]
    ends: list[float] = []
    late = [0]

    def lane(k: int, session: Session) -> None:
        for i in range(k, jobs, lanes):
            time.sleep(_pace(due, i, late))
            session.execute(insert, {"tag": tag, "n": i})
            leasework.enqueue(session, "noop", _payload(tag, i))
            session.commit()
        ends.append(time.time())

    first = time.time()
    try:
        run_lanes(lane, sessions, "enqueue through SQLAlchemy")  # type: ignore[arg-type]
    finally:
        engine.dispose()
    return Submitted(first, max(ends, default=first), jobs, late[0])


def _enqueue_asyncpg(
    door: Door, dsn: str, tag: str, jobs: int, due: Callable[[int], float] | None
) -> Submitted:
    """``enqueue-one`` through asyncpg: as many connections, on one asyncio loop."""
    import asyncio

    import asyncpg

    lanes = min(door.concurrency, jobs)
    ends: list[float] = []
    late = [0]

    async def lane(k: int, conn: asyncpg.Connection) -> None:
        for i in range(k, jobs, lanes):
            await asyncio.sleep(_pace(due, i, late))
            async with conn.transaction():
                await conn.execute(ORDER_INSERT_NUMBERED, tag, i)
                await leasework.enqueue_async(conn, "noop", _payload(tag, i))
        ends.append(time.time())

    async def main() -> float:
        conns = [await asyncpg.connect(dsn) for _ in range(lanes)]
        try:
            first = time.time()
            await asyncio.gather(*(lane(k, c) for k, c in enumerate(conns)))
            return first
        finally:
            for conn in conns:
                await conn.close()

    first = asyncio.run(main())
    return Submitted(first, max(ends, default=first), jobs, late[0])


class _ThreadsOwn:
    """A lane's stand-in for a connection it does not hold (Django's is per thread)."""

    def close(self) -> None:
        pass


def _django_configured(dsn: str) -> None:
    """Django set up in this process on ``dsn`` (once; nothing of a project: the door alone)."""
    import django
    from django.conf import settings
    from psycopg.conninfo import conninfo_to_dict

    if settings.configured:
        return
    params = conninfo_to_dict(dsn)
    settings.configure(
        USE_TZ=True,
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": params.get("dbname"),
                "USER": params.get("user", ""),
                "PASSWORD": params.get("password", ""),
                "HOST": params.get("host", ""),
                "PORT": params.get("port", ""),
            }
        },
    )
    django.setup()


def _enqueue_django(
    door: Door, dsn: str, tag: str, jobs: int, due: Callable[[int], float] | None
) -> Submitted:
    """``enqueue-one`` through Django: each thread's own Django connection, the caller's row
    and its job in one ``transaction.atomic()``."""
    _django_configured(dsn)
    from django.db import connection, transaction

    lanes = min(door.concurrency, jobs)
    ends: list[float] = []
    late = [0]

    def lane(k: int, _: object) -> None:
        try:
            for i in range(k, jobs, lanes):
                time.sleep(_pace(due, i, late))
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(ORDER_INSERT, [tag, i])
                    leasework.enqueue(connection, "noop", _payload(tag, i))
            ends.append(time.time())
        finally:
            connection.close()  # this thread's

    first = time.time()
    # each lane's connection is its thread's own Django one, closed by the lane
    run_lanes(lane, [_ThreadsOwn() for _ in range(lanes)], "enqueue through Django")  # type: ignore[arg-type]
    return Submitted(first, max(ends, default=first), jobs, late[0])


def submit(
    door: Door,
    *,
    url: str,
    dsn: str,
    tag: str,
    jobs: int,
    due: Callable[[int], float] | None = None,
) -> Submitted:
    """Submit ``jobs`` noop jobs tagged ``tag`` through ``door``; ``due`` (chunk index ->
    time.time() to send it at) paces it, open loop."""
    if door.name in ("enqueue", "enqueue-one"):
        return _enqueue(door, dsn, tag, jobs, due)
    if door.name == "enqueue-one-sqlalchemy":
        return _enqueue_sqlalchemy(door, dsn, tag, jobs, due)
    if door.name == "enqueue-one-asyncpg":
        return _enqueue_asyncpg(door, dsn, tag, jobs, due)
    if door.name == "enqueue-one-django":
        return _enqueue_django(door, dsn, tag, jobs, due)
    if door.name in ("single", "batch"):
        if door.name == "single" and door.chunk != 1:
            door = Door(door.name, 1, door.concurrency, door.client)
        if door.name == "single" and door.client == LEAN:
            return trio.run(_lean_single, door, url, tag, jobs, due)
        return trio.run(_http, door, url, tag, jobs, due)
    raise ValueError(f"unknown door {door.name!r}; known: {', '.join(DOORS)}")


# --- the jobs table ------------------------------------------------------------------------
TAGGED = "created_at >= to_timestamp(%(since)s) AND payload->>'bench' = %(tag)s"


def progress(conn: psycopg.Connection, tag: str, since: float) -> dict[str, int]:
    """Job count per status among ``tag``'s jobs created since ``since`` (epoch seconds;
    the created_at index keeps this a short range scan)."""
    rows = conn.execute(
        f"SELECT status, count(*) FROM jobs WHERE {TAGGED} GROUP BY status",
        {"since": since - 1.0, "tag": tag},
    ).fetchall()
    return {status: int(n) for status, n in rows}


def timings(conn: psycopg.Connection, tag: str, since: float) -> tuple[list[float], list[float]]:
    """(finished_at as epoch seconds, started_at - run_at in seconds) of ``tag``'s succeeded
    jobs."""
    rows = conn.execute(
        "SELECT extract(epoch FROM finished_at)::float8, "
        f"extract(epoch FROM started_at - run_at)::float8 FROM jobs WHERE {TAGGED} "
        "AND status = 'succeeded'",
        {"since": since - 1.0, "tag": tag},
    ).fetchall()
    return [r[0] for r in rows], [r[1] for r in rows]


def prepare_orders(conn: psycopg.Connection) -> None:
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {ORDERS_TABLE} (id bigserial PRIMARY KEY, tag text NOT NULL, "
        "n int NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
    )


def drop_orders(conn: psycopg.Connection) -> None:
    conn.execute(f"DROP TABLE IF EXISTS {ORDERS_TABLE}")


def delete_tagged(conn: psycopg.Connection, prefix: str, since: float) -> int:
    """Delete the jobs whose tag starts with ``prefix`` (their outbox rows, attempts and
    effects go with them: ON DELETE CASCADE)."""
    # declared, for the auditor's jobs_vanished trigger: the bench deletes its jobs on purpose
    conn.execute("SELECT set_config('leasework.deleting', 'deliberately', false)")
    cur = conn.execute(
        "DELETE FROM jobs WHERE created_at >= to_timestamp(%s) AND payload->>'bench' LIKE %s",
        (since - 1.0, prefix.replace("%", r"\%").replace("_", r"\_") + "%"),
    )
    return cur.rowcount


async def _lone(url: str, dsn: str, tag: str, jobs: int, gap: float) -> Submitted:
    """One job at a time on an otherwise idle pipeline: submit, wait until it has finished
    (polling its row every 20 ms: the times are the row's own, and a tighter poll loads the
    two cores the pipeline runs on), wait ``gap`` seconds so every batching window has closed,
    then the next."""
    connection = Connection(url)
    await connection.open()
    conn = await trio.to_thread.run_sync(lambda: psycopg.connect(dsn, autocommit=True))
    first = time.time()

    def finished(i: int) -> bool:
        row = conn.execute(
            "SELECT 1 FROM jobs WHERE payload->>'bench' = %s AND (payload->>'n')::int = %s "
            "AND status = 'succeeded' AND created_at >= to_timestamp(%s)",
            (tag, i, first - 1.0),
        ).fetchone()
        return row is not None

    try:
        for i in range(jobs):
            status = await connection.post("/jobs", {"type": "noop", "payload": _payload(tag, i)})
            if status != 202:
                raise HttpError(f"POST /jobs answered {status}")
            deadline = time.monotonic() + 30
            while not await trio.to_thread.run_sync(finished, i):
                if time.monotonic() > deadline:
                    raise HttpError(f"lone job {i} did not finish within 30 s")
                await trio.sleep(0.02)
            await trio.sleep(gap)
    finally:
        await connection.aclose()
        conn.close()
    return Submitted(first, time.time(), jobs)


def lone(url: str, dsn: str, tag: str, jobs: int, gap: float = 0.3) -> Submitted:
    return trio.run(_lone, url, dsn, tag, jobs, gap)


@dataclass(frozen=True)
class LoneTimes:
    """Seconds from each lone job's ``created_at`` (the submitting transaction's time) to its
    start and finish; and where the ``jobs.ready`` message's timestamp is known, from the
    insert to the publish and, for the jobs Kafka delivered, from the publish to the start.
    ``woken`` counts the jobs that started before their message was published: a worker
    claimed them on their Postgres wake-up (:mod:`leasework.worker.wakeup`)."""

    insert_to_start: list[float]
    insert_to_finish: list[float]
    insert_to_publish: list[float]
    publish_to_start: list[float]
    woken: int = 0


def lone_timings(
    conn: psycopg.Connection, tag: str, since: float, published: Mapping[str, Published]
) -> LoneTimes:
    """The :class:`LoneTimes` of ``tag``'s succeeded jobs; ``published`` by job id (from
    :class:`tools.bench.tap.ReadyTap`)."""
    rows = conn.execute(
        "SELECT id::text, extract(epoch FROM created_at)::float8, "
        "extract(epoch FROM started_at)::float8, extract(epoch FROM finished_at)::float8 "
        f"FROM jobs WHERE {TAGGED} AND status = 'succeeded'",
        {"since": since - 1.0, "tag": tag},
    ).fetchall()
    seen = [(r, published[r[0]].produced_at) for r in rows if r[0] in published]
    return LoneTimes(
        [started - created for _, created, started, _ in rows],
        [finished - created for _, created, _, finished in rows],
        [at - r[1] for r, at in seen],
        [r[2] - at for r, at in seen if r[2] >= at],
        sum(1 for r, at in seen if r[2] < at),
    )


def tagged_ids(conn: psycopg.Connection, tag: str, since: float) -> set[str]:
    rows = conn.execute(
        f"SELECT id::text FROM jobs WHERE {TAGGED}", {"since": since - 1.0, "tag": tag}
    ).fetchall()
    return {r[0] for r in rows}
