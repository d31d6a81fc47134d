"""The readiness probe of Postgres: ``SELECT 1`` over a connection it keeps.

A new connection for every probe (once a second, in every process) cost 3.6 ms of the
process's CPU and 5.1 ms of Postgres's (a backend forked, TLS, SCRAM): 35 ms a second for a
stack of four processes at rest, and a fork a second per process on a shared server. The kept
connection costs one round trip a probe. What a kept connection would no longer show, that a
new one can still be opened (a pool that grows needs that), it still shows once a minute: the
connection is replaced every ``reopen_after`` seconds, and a kept connection that fails is
replaced at once, in the same probe, so a Postgres restart costs no false "unreachable".

A link that swallows bytes (a hung proxy, a half-dead network path) would block the probe's
thread on its socket for good: TCP keepalives and ``tcp_user_timeout`` see a proxy's own
acknowledgements, and the server never saw the statement, so its ``statement_timeout`` never
starts. When the probe is cancelled (the health check's deadline) it shuts that socket down,
so the blocked read returns with an error, the thread ends, and the next probe opens a new
connection.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

import psycopg
import trio

log = logging.getLogger("leasework.pgprobe")

REOPEN_AFTER = 60.0


class PostgresProbe:
    """An awaitable probe for :class:`leasework.health.Health`: returns when Postgres answers
    ``SELECT 1``, raises when it does not. ``connect`` opens an autocommit connection
    (blocking; it is called in a thread) with a connect timeout of its own."""

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection],
        *,
        reopen_after: float = REOPEN_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
        self._reopen_after = reopen_after
        self._clock = clock
        self._conn: psycopg.Connection | None = None
        self._opened = 0.0
        self._limiter = trio.CapacityLimiter(1)
        # held while the connection is swapped, closed or its socket shut down: the Trio
        # thread's unblock never meets a connection the probe's thread is closing
        self._lock = threading.Lock()

    async def __call__(self) -> None:
        try:
            await trio.to_thread.run_sync(self.check, limiter=self._limiter, abandon_on_cancel=True)
        except trio.Cancelled:
            self.unblock()
            raise

    def check(self) -> None:
        """One probe, blocking: over the kept connection while it is young and works, else
        over a new one."""
        conn = self._conn
        if conn is not None and (conn.closed or self._clock() - self._opened >= self._reopen_after):
            self._discard()
            conn = None
        if conn is not None:
            try:
                conn.execute("SELECT 1")
                return
            except psycopg.Error as exc:
                # dropped by a restart or the network: a new connection decides, not this one
                log.debug("kept probe connection failed; opening a new one", exc_info=exc)
                self._discard()
        conn = self._connect()
        with self._lock:
            self._conn, self._opened = conn, self._clock()
        try:
            conn.execute("SELECT 1")
        except BaseException:
            self._discard()
            raise

    def unblock(self) -> None:
        """Shut the kept connection's socket down (from any thread), so a read blocked on it
        returns. The descriptor itself is left to its owner: closing it here could close
        another file that reused its number."""
        with self._lock:
            conn = self._conn
            if conn is None or conn.closed:
                return
            try:
                fd = conn.pgconn.socket
                with socket.socket(fileno=os.dup(fd)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
            except (OSError, psycopg.Error):
                pass  # already closed: nothing is blocked on it

    def close(self) -> None:
        """Close the kept connection, unless a probe's thread still uses it (one abandoned at
        its deadline: it was unblocked, and discards the connection when it returns)."""
        if self._limiter.borrowed_tokens == 0:
            self._discard()

    def _discard(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass
