"""Wake gates: a committing insert sends its NOTIFY only while a listener waits for it.

Postgres serialises every transaction that sends a NOTIFY, through its commit's WAL flush:
``PreCommit_Notify`` takes one cluster-wide lock that it holds until the transaction has
ended, so that notifications queue in commit order. A stream of small transactions that each
NOTIFY (one job per web request, ``leasework.enqueue``) therefore commits one at a time, one
flush each, instead of sharing flushes the way concurrent commits do (measured: 368-458
against 705-732 commits/s from 16 connections, the notifying trigger switched off for the
second figure). Yet the NOTIFY only matters to a listener that is waiting: a busy relay
passes again anyway, and a busy worker does not listen.

So each channel has a gate, an advisory lock class striped :data:`STRIPES` ways:

* a listener that waits (the relay between passes, a quiet worker) holds every stripe of
  its channel's gate **shared**, on its listening connection (:meth:`Listener.arm`);
* the outbox trigger (migration 0020) tries its connection's stripe **exclusively**, for the
  rest of the transaction: if that fails, a listener is waiting (or, rarely, another
  transaction of the same stripe holds it), and it sends the NOTIFY; if it succeeds, nobody
  waits, and it sends none.

Exclusive locks of different stripes do not conflict, so concurrent inserters never wait on
one another; a failed try never waits either. A transaction that skipped its NOTIFY keeps
its stripe until it has ended, when its rows are visible: a relay arms only once every stripe
is its own, and then looks at the outbox once more before it waits, so it finds what every
skipping transaction wrote. Missing a worker's wake-up costs latency only (Kafka delivers the
job), so a worker arms what it can and tries again at its next wait.
"""

from __future__ import annotations

# the advisory lock classes (the first key of the two-key form); leasework's others are
# 7305005 (a queue's pause) and 7305006 (concurrency limits)
RELAY_GATE = 7305007  # NOTIFY leasework_outbox: the relay waits for outbox rows
WORKER_GATE = 7305008  # NOTIFY leasework_ready: a quiet worker waits for a lone job
# how many ways each gate is striped: an inserter takes stripe pg_backend_pid() % STRIPES, so
# two concurrent inserters rarely share one (if they do, the second sends its NOTIFY: the
# cost of a wasted NOTIFY, never a lost one)
STRIPES = 32

# arm: try every stripe not yet held; the rows are the stripes still missing
ARM_SQL = (
    "SELECT s FROM unnest(%(stripes)s::int[]) AS s "
    "WHERE NOT pg_try_advisory_lock_shared(%(gate)s, s)"
)
# disarm: the listening connection holds no other advisory lock
DISARM_SQL = "SELECT pg_advisory_unlock_all()"


def all_stripes() -> frozenset[int]:
    return frozenset(range(STRIPES))
