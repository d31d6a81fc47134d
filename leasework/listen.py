"""Postgres ``LISTEN``, kept off the Trio event loop.

The listening connection lives in a worker thread (its limiter admits one call at a time);
losing it only costs immediacy, never work: every listener here has a fallback (the relay's
tick, Kafka's delivery), and the connection is made again on the next wait.

A listener with a gate (:mod:`leasework.wakegate`) arms it on the same connection: while it
holds every stripe, inserters send their NOTIFY; while it holds none, they send none. The
locks live and die with the connection, so a connection made again starts disarmed.
"""

from __future__ import annotations

import time

import psycopg
import trio
from psycopg.rows import tuple_row

from leasework import wakegate
from leasework.db import Database


class Listener:
    """Waits for ``NOTIFY channel``, at most ``timeout`` seconds a wait; with a ``gate``, arms
    and disarms it (:mod:`leasework.wakegate`)."""

    def __init__(self, db: Database, channel: str, gate: int | None = None) -> None:
        self.db = db
        self.channel = channel
        self.gate = gate
        self.conn: psycopg.Connection | None = None
        self.limiter = trio.CapacityLimiter(1)
        self.listening = False  # LISTEN is in effect on ``conn``
        self.held: set[int] = set()  # the gate's stripes ``conn`` holds shared

    @property
    def armed(self) -> bool:
        """Every stripe of the gate is held: every inserter sends its NOTIFY."""
        return self.gate is not None and len(self.held) == wakegate.STRIPES

    def _listen(self) -> psycopg.Connection:
        if self.conn is None or self.conn.closed:
            self.conn = self.db.connect(autocommit=True)
            self.listening = False
            self.held.clear()  # a new backend holds no lock
        if not self.listening:
            self.conn.execute(f"LISTEN {self.channel}")
            self.listening = True
        return self.conn

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None
        self.listening = False
        self.held.clear()  # the backend's locks went with it

    def _wait(self, timeout: float) -> list[str]:
        try:
            conn = self._listen()
            payloads = [n.payload for n in conn.notifies(timeout=timeout, stop_after=1)]
            if payloads:
                # whatever else has arrived already comes along (a deadline of zero reads
                # what is buffered and stops)
                payloads += [n.payload for n in conn.notifies(timeout=0.0)]
            return payloads
        except psycopg.Error:
            self._drop()
            time.sleep(timeout)
            return []

    async def wait(self, at_most: float) -> list[str]:
        """The payloads of the NOTIFYs that came within ``at_most`` seconds (empty: none)."""
        return await trio.to_thread.run_sync(self._wait, at_most, limiter=self.limiter)

    def _arm(self) -> bool:
        if self.gate is None:
            raise ValueError(f"the listener of {self.channel} has no gate to arm")
        try:
            conn = self._listen()  # listening first: a NOTIFY sent once a stripe is held is heard
            missing = sorted(wakegate.all_stripes() - self.held)
            if missing:
                params = {"stripes": missing, "gate": self.gate}
                cur = conn.cursor(row_factory=tuple_row)
                still = {row[0] for row in cur.execute(wakegate.ARM_SQL, params)}
                self.held.update(set(missing) - still)
        except psycopg.Error:
            self._drop()
        return self.armed

    async def arm(self) -> bool:
        """Hold every stripe of the gate that is free (listening first); whether all are
        held now. A stripe stays missing while a transaction that skipped its NOTIFY is
        open; the next call tries it again."""
        return await trio.to_thread.run_sync(self._arm, limiter=self.limiter)

    def _disarm(self) -> None:
        if not self.held or self.conn is None:
            return
        try:
            self.conn.execute(wakegate.DISARM_SQL)
            self.held.clear()
        except psycopg.Error:
            self._drop()

    async def disarm(self) -> None:
        """Let go of the gate: inserters stop sending their NOTIFY (no call when none is
        held)."""
        if self.held:
            await trio.to_thread.run_sync(self._disarm, limiter=self.limiter)

    def _unlisten(self) -> None:
        self._disarm()
        if self.conn is not None and not self.conn.closed and self.listening:
            try:
                self.conn.execute(f"UNLISTEN {self.channel}")
            except psycopg.Error:
                self._drop()
        self.listening = False

    async def unlisten(self) -> None:
        """Stop hearing the channel (Postgres stops waking this connection for each NOTIFY)
        until the next :meth:`wait` listens again; disarm the gate first."""
        await trio.to_thread.run_sync(self._unlisten, limiter=self.limiter)

    def close(self) -> None:
        self._drop()

    async def aclose(self) -> None:
        """Close the listening connection, its gate's locks with it, even while the caller is
        being cancelled (shielded: a cancelled relay or worker still lets its stripes go at
        once instead of leaving them to the backend's end). No call when it is closed."""
        if self.conn is None:
            return
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.close, limiter=self.limiter)
