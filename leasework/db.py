"""Postgres access for Trio code: psycopg's synchronous pool, driven from worker threads.

psycopg's async API is asyncio-only, so every database call runs in a thread under a
:class:`trio.CapacityLimiter` no larger than the pool. Callers pass a plain function of a
connection (the store's functions); it runs in one transaction, committed when it returns
and rolled back when it raises.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from enum import Enum
from typing import ParamSpec, TypeVar

import psycopg
import trio
from psycopg.rows import dict_row
from psycopg.types.json import set_json_loads
from psycopg_pool import ConnectionPool

from leasework.jsonlimits import parse_json

P = ParamSpec("P")
T = TypeVar("T")

# libpq options that bound every wait on a dead or silent server
CONNECT_KWARGS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
    "options": "-c statement_timeout=15000 -c idle_in_transaction_session_timeout=60000",
    "row_factory": dict_row,
}


def configure(conn: psycopg.Connection) -> None:
    """jsonb is read with leasework's own parser: a value Python's json would refuse (an
    integer of 5,000 digits stored through some other door) becomes a marker the worker
    reports as an unreadable payload, instead of an exception in the middle of a claim."""
    set_json_loads(parse_json, context=conn)


log = logging.getLogger("leasework.db")


class _DeadConnection(Exception):
    """``fn`` met a dead connection before its transaction could commit."""


class _Mode(Enum):
    """How :meth:`Database._once` runs ``fn``."""

    TRANSACTION = "psycopg's transaction, committed after fn (run)"
    READ = "autocommit, one statement that writes nothing (read)"
    BEGUN = "autocommit, fn sends BEGIN, COMMIT after fn (run_begun)"
    TRANSACT = "autocommit, fn sends its whole transaction; never retried (transact)"


IDLE_CHECK_SECONDS = 1.0  # a pooled connection idle longer than this is checked before use
_returned: weakref.WeakKeyDictionary[psycopg.Connection, float] = weakref.WeakKeyDictionary()


def mark_returned(conn: psycopg.Connection) -> None:
    """Note when ``conn`` goes back to the pool (:meth:`Database._once` calls it as it hands
    the connection back). Not the pool's ``reset`` callback: with one, psycopg_pool returns
    every connection through a task on its own worker thread (a queue put, a thread wake-up
    and a GIL hand-off per database call, a tenth of a worker's Python CPU under load), and
    the connection is lent again only once that thread got to it."""
    _returned[conn] = time.monotonic()


def check_if_idle(conn: psycopg.Connection) -> None:
    """The pool's ``check`` callback: a connection that sat idle for more than
    :data:`IDLE_CHECK_SECONDS` (through a Postgres restart, say) answers an empty query before
    it is handed out, and the pool replaces it if it cannot; a busy connection goes out
    unchecked (no round trip per call under load)."""
    returned = _returned.get(conn)
    if returned is None or time.monotonic() - returned > IDLE_CHECK_SECONDS:
        ConnectionPool.check_connection(conn)


def _close_transaction(conn: psycopg.Connection) -> None:
    """Hand an autocommit connection back as the pool lends it: a transaction ``fn`` left
    open (a statement failed, or the caller raised before ``COMMIT``) rolled back, and
    autocommit off."""
    if conn.broken:
        return
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.execute("ROLLBACK")
    conn.autocommit = False


class Database:
    def __init__(
        self,
        dsn: str,
        *,
        max_size: int = 8,
        name: str = "leasework",
        application_name: str | None = None,
    ) -> None:
        """``application_name``: what ``pg_stat_activity`` shows for these connections (the
        process's name, so an operator sees which process holds which connection)."""
        self.dsn = dsn
        kwargs = dict(CONNECT_KWARGS)
        if application_name:
            kwargs["application_name"] = application_name
        self.application_name = application_name
        self.pool = ConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            open=False,
            configure=configure,
            kwargs=kwargs,
            timeout=10.0,
            # keep reconnecting (with psycopg_pool's backoff, from 1 s) for an hour, not once:
            # 0 gives up after one immediate try, so a 1 s network blip left every waiting
            # caller to sit out the whole pool timeout (found by chaos scenario n)
            reconnect_timeout=3600.0,
            # a connection idle for over a second is checked before use (a stale one left by a
            # Postgres restart is replaced, not handed to the next caller); a busy one is not
            # (no round trip per call under load)
            check=check_if_idle,
            name=name,
        )
        self.limiter = trio.CapacityLimiter(max_size)

    async def open(self) -> None:
        await trio.to_thread.run_sync(lambda: self.pool.open(wait=False))

    async def close(self) -> None:
        await trio.to_thread.run_sync(lambda: self.pool.close(timeout=5.0))

    async def run(self, fn: Callable[..., T], *args: object, abandon_on_cancel: bool = False) -> T:
        """Run ``fn(conn, *args)`` in one transaction on a pooled connection, in a thread.

        A connection that turns out dead while ``fn`` runs (Postgres restarted under a busy
        pool, whose connections the idle check let through) cannot have committed anything:
        the pool's connections are checked and ``fn`` runs once more on a working one. A
        failure of the COMMIT itself is never retried (its outcome is unknown).

        A cancel waits for the thread, unless ``abandon_on_cancel``: then the caller goes on
        and the thread finishes (or commits) on its own, for a process that is about to exit
        (see :meth:`leasework.service.Stopping.finishing`)."""
        return await self._in_thread(fn, args, _Mode.TRANSACTION, abandon_on_cancel)

    async def read(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(conn, *args)``, a read of one statement, outside a transaction block
        (autocommit): one round trip instead of three (``BEGIN``, the query, ``COMMIT``), for
        the reads on the path from submit to start. A statement is its own snapshot, so a
        read of one statement sees what it would have seen inside a transaction; ``fn`` must
        not write (nothing would hold its writes together). Retried once on a dead
        connection, as :meth:`run` is."""
        return await self._in_thread(fn, args, _Mode.READ)

    async def run_begun(self, fn: Callable[..., T], *args: object) -> T:
        """:meth:`run` for an ``fn`` that sends ``BEGIN`` itself, in one round trip with its
        first statements (:func:`leasework.store.common.one_round_trip` with ``commit=False``,
        on the autocommit connection it is handed), where psycopg's own ``BEGIN`` costs a
        round trip of its own; ``COMMIT`` follows when ``fn`` returns. The same guarantees as
        :meth:`run`: nothing is committed before that ``COMMIT``, so a connection found dead
        while ``fn`` runs is retried once on a working one, and a failure of the ``COMMIT``
        itself is never retried (its outcome is unknown)."""
        return await self._in_thread(fn, args, _Mode.BEGUN)

    async def transact(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(conn, *args)`` on a pooled connection in autocommit, in a thread, where
        ``fn`` sends its whole transaction at once (:func:`leasework.store.common.one_round_trip`:
        ``BEGIN``, its statements and ``COMMIT`` in one pipeline) or is one statement: one round
        trip, where :meth:`run` costs three or more. For the statements on the path from submit
        to start, where each round trip is a wait of the lone job.

        Never retried: once the pipeline is sent its ``COMMIT`` may have happened, so a
        connection lost meanwhile leaves the outcome unknown, and the error propagates for the
        caller to settle (a connection that sat idle is still checked before it is handed out).
        A transaction left open by a failed statement is rolled back."""
        return await self._in_thread(fn, args, _Mode.TRANSACT)

    def run_blocking(self, fn: Callable[..., T], *args: object) -> T:
        """:meth:`run` for a thread that is not Trio's (the worker's loop guard, which must
        reach Postgres while the loop is blocked): blocking, not bounded by the limiter."""
        return self._call(fn, args, _Mode.TRANSACTION)

    def _call(self, fn: Callable[..., T], args: tuple[object, ...], mode: _Mode) -> T:
        try:
            return self._once(fn, args, mode)
        except _DeadConnection:
            log.warning("a pooled connection was dead; checking the pool, trying once more")
            self.pool.check()
            try:
                return self._once(fn, args, mode)
            except _DeadConnection as again:
                raise again.__cause__ from None  # type: ignore[misc]

    async def _in_thread(
        self,
        fn: Callable[..., T],
        args: tuple[object, ...],
        mode: _Mode,
        abandon_on_cancel: bool = False,
    ) -> T:
        return await trio.to_thread.run_sync(
            self._call, fn, args, mode, limiter=self.limiter, abandon_on_cancel=abandon_on_cancel
        )

    def _once(self, fn: Callable[..., T], args: tuple[object, ...], mode: _Mode) -> T:
        """``fn`` on a pooled connection as ``mode`` says; raises :class:`_DeadConnection`
        (the caller retries once) only where nothing can have been committed yet."""
        with self.pool.connection() as conn:
            if mode is not _Mode.TRANSACTION:
                conn.autocommit = True  # a client-side switch: no round trip
            try:
                try:
                    result = fn(conn, *args)
                except psycopg.OperationalError as exc:
                    if conn.broken and mode is not _Mode.TRANSACT:
                        raise _DeadConnection from exc
                    raise
                if mode is _Mode.BEGUN:
                    conn.execute("COMMIT")  # outside the retry: its outcome may be unknown
                return result
            finally:
                if mode is not _Mode.TRANSACTION:
                    _close_transaction(conn)
                mark_returned(conn)

    def connect(self, **overrides: object) -> psycopg.Connection:
        """A dedicated connection outside the pool (LISTEN, probes), named as the pool's are;
        blocking: call in a thread."""
        kwargs = dict(CONNECT_KWARGS)
        if self.application_name:
            kwargs["application_name"] = self.application_name
        kwargs.update(overrides)
        return psycopg.connect(self.dsn, **kwargs)


@contextmanager
def savepoint(conn: psycopg.Connection, name: str = "leasework") -> Iterator[None]:
    """A nested transaction on ``conn`` that never commits the caller's transaction: a
    ``SAVEPOINT`` (which opens the caller's transaction if none is open yet), rolled back to
    when the block raises. On an autocommit connection, a transaction of its own.

    psycopg's ``conn.transaction()`` would *commit* when no transaction was open yet, which
    is not "inside the caller's transaction"; hence the explicit statements.
    """
    if conn.autocommit:
        with conn.transaction():
            yield
        return
    conn.execute(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        if not conn.broken:
            conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
            conn.execute(f"RELEASE SAVEPOINT {name}")
        raise
    conn.execute(f"RELEASE SAVEPOINT {name}")


@asynccontextmanager
async def savepoint_async(
    conn: psycopg.AsyncConnection, name: str = "leasework"
) -> AsyncIterator[None]:
    """:func:`savepoint` on psycopg's ``AsyncConnection``."""
    if conn.autocommit:
        async with conn.transaction():
            yield
        return
    await conn.execute(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        if not conn.broken:
            await conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
            await conn.execute(f"RELEASE SAVEPOINT {name}")
        raise
    await conn.execute(f"RELEASE SAVEPOINT {name}")
