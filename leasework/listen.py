"""Postgres ``LISTEN``, kept off the Trio event loop.

The listening connection lives in a worker thread (its limiter admits one call at a time);
losing it only costs immediacy, never work: every listener here has a fallback (the relay's
tick, Kafka's delivery), and the connection is made again on the next wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
import trio

from leasework.db import Database

T = TypeVar("T")


class Listener:
    """Waits for ``NOTIFY channel``, at most ``timeout`` seconds a wait."""

    def __init__(self, db: Database, channel: str) -> None:
        self.db = db
        self.channel = channel
        self.conn: psycopg.Connection | None = None
        self.limiter = trio.CapacityLimiter(1)
        self.session = 0  # counts the connections made: session-level state dies with one

    def _connected(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed:
            self.conn = self.db.connect(autocommit=True)
            self.session += 1
            self.conn.execute(f"LISTEN {self.channel}")
        return self.conn

    def _call(self, fn: Callable[[psycopg.Connection], T]) -> T:
        try:
            return fn(self._connected())
        except psycopg.Error:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            raise

    async def call(self, fn: Callable[[psycopg.Connection], T]) -> T:
        """``fn(conn)`` on the listening connection (made, and listening, first if need be),
        in its thread: for session-level state that must live and die with the listening
        (an advisory lock). A psycopg error closes the connection and propagates."""
        return await trio.to_thread.run_sync(self._call, fn, limiter=self.limiter)

    def _wait(self, timeout: float) -> list[str]:
        try:
            conn = self._connected()
            payloads = [n.payload for n in conn.notifies(timeout=timeout, stop_after=1)]
            if payloads:
                # whatever else has arrived already comes along (a deadline of zero reads
                # what is buffered and stops)
                payloads += [n.payload for n in conn.notifies(timeout=0.0)]
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

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
