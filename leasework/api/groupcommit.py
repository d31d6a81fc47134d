"""Group commit for the api: concurrent single submits share one transaction and one fsync.

Each request hands its job to :meth:`GroupCommit.insert` and waits. A flusher takes every job
waiting (up to ``max_rows``) and inserts them in one statement of one transaction; each
request is answered only after that commit, with its own row's result (an idempotency-key
conflict is that request's 409 alone: a conflicting row writes nothing). While one group is
being committed the next one gathers, so under load the groups grow by themselves and at low
load a request waits for nobody. If a group fails for anything but an unreachable store, its
jobs are inserted again one by one, so one bad row cannot fail its neighbours.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import psycopg
import trio

from leasework import store
from leasework.db import Database

log = logging.getLogger("leasework.api.groupcommit")

MAX_ROWS = 500
FLUSHERS = 2  # groups in flight at once: one commits while the next gathers


@dataclass
class _Pending:
    row: dict[str, Any]
    done: trio.Event = field(default_factory=trio.Event)
    result: store.Inserted | None = None
    error: BaseException | None = None


class GroupCommit:
    def __init__(
        self, db: Database, topic: str, *, max_rows: int = MAX_ROWS, flushers: int = FLUSHERS
    ) -> None:
        self.db = db
        self.topic = topic
        self.max_rows = max_rows
        self.flushers = flushers
        self._send, self._receive = trio.open_memory_channel[_Pending](math.inf)
        self.groups = 0  # transactions committed, for tests

    async def insert(self, row: dict[str, Any]) -> store.Inserted:
        """Insert one job (a row of :func:`leasework.submission.insert_row`) in the next
        group; returns once it is committed. Raises what the store raised for it."""
        pending = _Pending(row)
        self._send.send_nowait(pending)
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return pending.result

    async def flush(self, group: list[_Pending]) -> None:
        """Commit one group and answer its requests (the run_once a test drives)."""
        try:
            inserted = await self.db.run_begun(
                store.jobs_insert_begun, [p.row for p in group], self.topic
            )
            for pending, result in zip(group, inserted, strict=True):
                pending.result = result
            self.groups += 1
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            for pending in group:  # the store is unreachable: every request says so
                pending.error = exc
        except psycopg.Error as exc:
            if len(group) == 1:
                group[0].error = exc  # its request answers for it (a 422, say)
            else:
                log.warning("a group commit failed; inserting its jobs one by one")
                for pending in group:
                    await self._alone(pending)
        finally:
            for pending in group:
                pending.done.set()

    async def _alone(self, pending: _Pending) -> None:
        try:
            (pending.result,) = await self.db.run_begun(
                store.jobs_insert_begun, [pending.row], self.topic
            )
        except psycopg.Error as exc:
            pending.error = exc

    async def _flusher(self) -> None:
        while True:
            group = [await self._receive.receive()]
            while len(group) < self.max_rows:
                try:
                    group.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            await self.flush(group)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(self.flushers):
                nursery.start_soon(self._flusher)
            task_status.started()
