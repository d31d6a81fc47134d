"""Postgres ``LISTEN``, kept off the Trio event loop.

The listening connection lives in a worker thread (its limiter admits one call at a time);
losing it only costs immediacy, never work: every listener here has a fallback (the relay's
tick, Kafka's delivery), and the connection is made again on the next wait.
"""

from __future__ import annotations

import time

import psycopg
import trio

from leasework.db import Database


class Listener:
    """Waits for ``NOTIFY channel``, at most ``timeout`` seconds a wait."""

    def __init__(self, db: Database, channel: str) -> None:
        self.db = db
        self.channel = channel
        self.conn: psycopg.Connection | None = None
        self.limiter = trio.CapacityLimiter(1)
        self.listening = False  # LISTEN is in effect on ``conn``

    def _wait(self, timeout: float) -> list[str]:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = self.db.connect(autocommit=True)
                self.listening = False
            if not self.listening:
                self.conn.execute(f"LISTEN {self.channel}")
                self.listening = True
            payloads = [n.payload for n in self.conn.notifies(timeout=timeout, stop_after=1)]
            if payloads:
                # whatever else has arrived already comes along (a deadline of zero reads
                # what is buffered and stops)
                payloads += [n.payload for n in self.conn.notifies(timeout=0.0)]
            return payloads
        except psycopg.Error:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            time.sleep(timeout)
            return []

    async def wait(self, at_most: float) -> list[str]:
        """The payloads of the NOTIFYs that came within ``at_most`` seconds (empty: none)."""
        return await trio.to_thread.run_sync(self._wait, at_most, limiter=self.limiter)

    def _unlisten(self) -> None:
        if self.conn is not None and not self.conn.closed and self.listening:
            try:
                self.conn.execute(f"UNLISTEN {self.channel}")
            except psycopg.Error:
                self.conn.close()
                self.conn = None
        self.listening = False

    async def unlisten(self) -> None:
        """Stop hearing the channel (Postgres stops waking this connection for each NOTIFY)
        until the next :meth:`wait` listens again."""
        await trio.to_thread.run_sync(self._unlisten, limiter=self.limiter)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
