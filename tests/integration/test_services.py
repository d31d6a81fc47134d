"""The worker's services driven one batch at a time against the real Postgres and Redis, no
Kafka: the claimer's claim, the completer's flush, the heartbeat's tick. Jobs are made
``queued`` without an outbox row, so no worker of the stack ever hears of them, and with a
long lease, so the stack's reaper leaves them alone."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
import trio
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from devstack.layout import POSTGRES_DIRECT_DSN, REDIS_PORT
from leasework import db as db_module
from leasework import store
from leasework.db import Database
from leasework.demo import app as demo_app
from leasework.lease import Leases, lease_key
from leasework.operations import Actor
from leasework.outcomes import Completion, Outcome
from leasework.queues import HELD_UNTIL
from leasework.queues.operations import set_paused
from leasework.redisconn import RedisTarget
from leasework.states import Status
from leasework.worker.claim import Claimer, Skip
from leasework.worker.completer import Completer
from leasework.worker.heartbeat import CancelReason, Heartbeat, RunningJob
from tests.integration.conftest import client_messages, delete_jobs, dlq_message

TTL = 60.0


# the jobs make_jobs made in the running test: deleted at its end, so none is left queued
# with no outbox row for the stack's auditor to find stuck (it would page 15 minutes later)
_made: list[uuid.UUID] = []


@pytest.fixture
async def db(stack) -> AsyncIterator[Database]:
    database = Database(POSTGRES_DIRECT_DSN, max_size=4)
    await database.open()
    try:
        yield database
    finally:
        made, _made[:] = list(_made), []
        await database.run(lambda conn: delete_jobs(conn, "id = ANY(%s)", (made,)))
        await database.close()


@pytest.fixture
def leases(stack) -> Leases:
    return Leases(RedisTarget(f"redis://127.0.0.1:{REDIS_PORT}/0"))


@pytest.fixture
def claimer(db: Database, leases: Leases) -> Claimer:
    return Claimer(
        db, leases, demo_app, name="test-claimer", ttl=TTL, retry_base=1.0, retry_cap=10.0
    )


async def make_jobs(db: Database, job_type: str = "ledger", count: int = 1, **fields) -> list:
    """``count`` jobs, queued, with no outbox row (invisible to the stack's workers)."""
    requests = [
        {"id": str(uuid.uuid4()), "type": job_type, "payload": {}, "delay_seconds": 3600}
        for _ in range(count)
    ]

    def write(conn) -> list[uuid.UUID]:
        rows = conn.execute(
            "SELECT id FROM leasework_jobs_insert(%s::jsonb)", (json.dumps(requests),)
        ).fetchall()
        ids = [r["id"] for r in rows]
        sets = ", ".join(f"{k} = %({k})s" for k in fields)
        conn.execute(
            f"UPDATE jobs SET status = 'queued', run_at = now(){', ' + sets if sets else ''} "
            "WHERE id = ANY(%(ids)s)",
            {"ids": ids, **fields},
        )
        return ids

    ids = await db.run(write)
    _made.extend(ids)
    return ids


async def job(db: Database, job_id: uuid.UUID):
    (found,) = await db.run(store.jobs_get_many, [job_id])
    return found


# ---------------------------------------------------------------- the claimer


async def test_one_claim_starts_what_it_can_and_says_why_for_the_rest(db, leases, claimer):
    runnable = await make_jobs(db, count=3)
    (finished,) = await make_jobs(db)
    await db.run(
        lambda c: c.execute("UPDATE jobs SET status = 'succeeded' WHERE id = %s", (finished,))
    )
    (unknown,) = await make_jobs(db, job_type="type-no-app-defines")
    (held,) = await make_jobs(db)
    other = (await leases.claim_many([held], "another-worker", TTL))[0]
    missing = uuid.uuid4()

    claimed = await claimer.claim([*runnable, finished, unknown, held, missing])

    assert sorted(s.job.id for s in claimed.started) == sorted(runnable)
    fences = [s.claim.fence for s in claimed.started]
    assert len(set(fences)) == 3
    for started in claimed.started:
        assert started.job.status == Status.RUNNING and started.job.fence == started.claim.fence
        assert started.job.attempt == 1
    assert claimed.skipped == {
        finished: Skip.NOT_QUEUED,
        unknown: Skip.DEFERRED,
        missing: Skip.MISSING,
    }
    assert claimed.retry == [held]  # another worker holds it: the slow path waits for it
    deferred = await job(db, unknown)
    assert deferred.status == Status.SCHEDULED and deferred.deferrals == 1
    assert deferred.attempt == 0 and "does not define type" in deferred.last_error
    await leases.release_many([other, *(s.claim for s in claimed.started)])


async def test_jobs_whose_messages_name_a_plain_type_go_straight_to_the_stamp(
    db, leases, claimer, monkeypatch
):
    runnable = await make_jobs(db, count=2)
    (finished,) = await make_jobs(db)
    await db.run(
        lambda c: c.execute("UPDATE jobs SET status = 'succeeded' WHERE id = %s", (finished,))
    )
    (held,) = await make_jobs(db)
    other = (await leases.claim_many([held], "another-worker", TTL))[0]
    (unknown,) = await make_jobs(db, job_type="type-no-app-defines")
    missing = uuid.uuid4()
    reads: list[list[uuid.UUID]] = []
    jobs_get_many = store.jobs_get_many

    def counted(conn, job_ids):
        reads.append(list(job_ids))
        return jobs_get_many(conn, job_ids)

    monkeypatch.setattr(store, "jobs_get_many", counted)
    named = dict.fromkeys([*runnable, finished, held, missing], "ledger")
    named[unknown] = "type-no-app-defines"

    claimed = await claimer.claim([*runnable, finished, held, unknown, missing], types=named)

    assert sorted(s.job.id for s in claimed.started) == sorted(runnable)
    assert claimed.skipped == {
        unknown: Skip.DEFERRED,  # a type the app does not define: read and deferred
        finished: Skip.NOT_QUEUED,  # the stamp refused it, then it was read
        missing: Skip.MISSING,
    }
    assert claimed.retry == [held]
    # the rows read: the unknown type's before the claim, then the two the stamp refused
    assert reads[0] == [unknown] and sorted(reads[1]) == sorted([finished, missing])
    assert len(reads) == 2
    for refused in (finished, missing):  # their leases were given back
        assert not await trio.to_thread.run_sync(leases.client.exists, lease_key(refused))
    assert (await job(db, finished)).status == Status.SUCCEEDED
    await leases.release_many([other, *(s.claim for s in claimed.started)])


async def test_a_stale_fence_is_refused_by_postgres_and_the_counter_reseeded(db, leases, claimer):
    counter = int(await trio.to_thread.run_sync(leases.client.get, "leasework:fence") or 0)
    (job_id,) = await make_jobs(db, fence=counter + 1000)  # Postgres has seen a larger fence
    first = await claimer.claim([job_id])
    assert first.started == [] and first.retry == [job_id] and first.reseeded
    assert not await trio.to_thread.run_sync(leases.client.exists, lease_key(job_id))
    second = await claimer.claim([job_id])
    (started,) = second.started
    assert started.claim.fence > counter + 1000
    await leases.release_many([started.claim])


# ---------------------------------------------------------------- the completer


def effect_row(job_id: uuid.UUID, fence: int):
    def write(conn) -> None:
        conn.execute(
            "INSERT INTO effects (job_id, fence, kind) VALUES (%s, %s, 'service-test')",
            (job_id, fence),
        )

    return write


def broken_effect(conn) -> None:
    conn.execute("INSERT INTO effects (job_id, fence, kind) VALUES (NULL, 0, 'broken')")


async def effects_of(db: Database, job_id: uuid.UUID) -> int:
    row = await db.run(
        lambda c: c.execute(
            "SELECT count(*) AS n FROM effects WHERE job_id = %s", (job_id,)
        ).fetchone()
    )
    return row["n"]


async def test_one_flush_fences_each_row_on_its_own(db, leases, claimer):
    ids = await make_jobs(db, count=4)
    claimed = await claimer.claim(ids)
    by_id = {s.job.id: s for s in claimed.started}
    ok, broken, stale, doomed = ids
    # a newer claim took `stale` meanwhile: its fence moved on
    await db.run(lambda c: c.execute("UPDATE jobs SET fence = fence + 1 WHERE id = %s", (stale,)))

    def completion(job_id, outcome, effects=()):
        return Completion(job_id, by_id[job_id].claim.fence, outcome, tuple(effects))

    succeeded = Outcome(Status.SUCCEEDED, result={"ok": True})
    completer = Completer(db, leases, dlq_topic="jobs.dlq")
    results = {}

    async def complete(c: Completion) -> None:
        results[c.job_id] = await completer.complete(c, by_id[c.job_id].claim)

    async with trio.open_nursery() as background:
        await background.start(completer.run)
        with trio.fail_after(10):
            async with trio.open_nursery() as waiters:
                for c in (
                    completion(ok, succeeded, [effect_row(ok, by_id[ok].claim.fence)]),
                    completion(broken, succeeded, [effect_row(broken, 0), broken_effect]),
                    completion(stale, succeeded, [effect_row(stale, 0)]),
                    completion(doomed, Outcome(Status.DEAD, "gave up")),
                ):
                    waiters.start_soon(complete, c)
        background.cancel_scope.cancel()
    # the batch's leases were released in one call (read at once: `broken` is due again for
    # its retry within a second, and the stack's workers may claim it and lease it anew)
    leased = [
        job_id
        for job_id in ids
        if await trio.to_thread.run_sync(leases.client.exists, lease_key(job_id))
    ]
    assert leased == []
    assert completer.flushes == 1  # one transaction for the four of them
    assert results[ok].status == Status.SUCCEEDED and await effects_of(db, ok) == 1
    # the failing effect undid its job's effects, made its attempt fail, and only its own
    assert results[broken].status == Status.FAILED and await effects_of(db, broken) == 0
    assert "a fenced effect raised" in (await job(db, broken)).last_error
    # the stale fence: rejected, its effect never ran
    assert results[stale].rejected and await effects_of(db, stale) == 0
    assert (await job(db, stale)).status == Status.RUNNING
    assert results[doomed].status == Status.DEAD
    # its dead letter went to the outbox and on to jobs.dlq (the relay retires the row)
    headers, value = await trio.to_thread.run_sync(dlq_message, str(doomed))
    assert headers["last_error"] == "gave up" and value["job_id"] == str(doomed)
    assert (await job(db, ok)).result == {"ok": True}


# ---------------------------------------------------------------- the heartbeat


async def test_one_tick_renews_moves_deadlines_and_cancels_only_whom_it_must(db, leases, claimer):
    ids = await make_jobs(db, count=3)
    claimed = await claimer.claim(ids)
    by_id = {s.job.id: s for s in claimed.started}
    kept, lost, cancelled = ids
    await trio.to_thread.run_sync(leases.client.delete, lease_key(lost))
    await leases.claim_many([lost], "thief", TTL)
    await db.run(
        lambda c: c.execute("UPDATE jobs SET cancel_requested = true WHERE id = %s", (cancelled,))
    )
    running = {
        job_id: RunningJob(by_id[job_id].claim, trio.CancelScope(deadline=trio.current_time() + 1))
        for job_id in ids
    }
    beat = Heartbeat(db, leases, lambda: list(running.values()), ttl=TTL)
    before = trio.current_time()
    tick = await beat.run_once()
    assert (tick.renewed, tick.lost, tick.cancel_requested) == (1, 1, 1)
    assert running[kept].scope.deadline > before + TTL / 2 and not running[kept].scope.cancel_called
    assert running[lost].reason == CancelReason.LEASE and running[lost].scope.cancel_called
    assert running[cancelled].reason == CancelReason.REQUEST
    kept_job = await job(db, kept)
    assert (kept_job.lease_expires_at - kept_job.updated_at).total_seconds() > TTL / 2
    await leases.release_many([by_id[kept].claim, by_id[cancelled].claim])
    await trio.to_thread.run_sync(leases.client.delete, lease_key(lost))


async def test_a_read_runs_outside_a_transaction_block_and_hands_the_connection_back_as_it_was(
    db,
):
    """Database.read: the claim's read of the job rows is one round trip, no BEGIN and no
    COMMIT, and the pooled connection goes back to transactions for the next caller."""

    def status_after_a_select(conn):
        conn.execute("SELECT 1").fetchone()
        return conn.info.transaction_status

    assert await db.read(status_after_a_select) == TransactionStatus.IDLE
    for _ in range(4):  # every connection of the pool, whichever the next caller gets
        assert await db.run(status_after_a_select) == TransactionStatus.INTRANS


async def test_a_transacted_stamp_is_one_round_trip_and_hands_the_connection_back_as_it_was(
    db,
):
    """Database.transact: the stamp's BEGIN, statements and COMMIT leave in one pipeline, so
    the thread waits for one answer (Database.run's would be BEGIN's, a fetch's and COMMIT's:
    the trace, taken inside the call, would end before the COMMIT); the job is committed
    running, and the pooled connection goes back to transactions for the next caller."""
    (job_id,) = await make_jobs(db)

    def stamp(conn) -> list[str]:
        return client_messages(
            conn, lambda: store.jobs_start_many(conn, [(job_id, 10**15)], worker="w", ttl=TTL)
        )

    sent = await db.transact(stamp)
    assert sent.count("Sync") == 1 and "Query" not in sent, sent
    assert "Flush" not in sent[: sent.index("Sync")], sent
    assert (await job(db, job_id)).status == Status.RUNNING

    def status_after_a_select(conn):
        conn.execute("SELECT 1").fetchone()
        return conn.info.transaction_status

    for _ in range(4):  # every connection of the pool, whichever the next caller gets
        assert await db.run(status_after_a_select) == TransactionStatus.INTRANS


async def test_a_transaction_that_fails_in_its_round_trip_is_rolled_back_and_not_retried(db):
    (job_id,) = await make_jobs(db)
    calls = []

    def fail_midway(conn) -> None:
        calls.append(conn.autocommit)
        with store.common.one_round_trip(conn):
            conn.execute("UPDATE jobs SET max_attempts = 9 WHERE id = %s", (job_id,))
            conn.execute("SELECT 1 / 0")

    with pytest.raises(psycopg.errors.DivisionByZero):
        await db.transact(fail_midway)
    assert calls == [True]
    assert (await job(db, job_id)).max_attempts != 9
    for _ in range(4):
        assert await db.run(lambda conn: conn.autocommit) is False


async def test_a_connection_back_from_a_call_goes_out_unchecked_and_one_left_idle_is_checked(
    db, monkeypatch
):
    """The pool's idle check (db.check_if_idle) costs a round trip only for a connection that
    sat unused past IDLE_CHECK_SECONDS: each call marks its connection as it hands it back (in
    its own thread, not through a task on the pool's worker thread), so a busy pool lends its
    connections unchecked."""
    checked: list[int] = []
    check = ConnectionPool.check_connection

    def counted(conn):
        checked.append(conn.info.backend_pid)
        check(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))

    async def call_on_every_connection() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(4):  # the pool's max_size: each connection is lent at least once
                nursery.start_soon(db.read, lambda conn: conn.execute("SELECT pg_sleep(0.05)"))

    # the pool grows one connection at a time while callers wait: until it has all four,
    # then one more round lends each of them (a connection not lent before is checked, once)
    for _ in range(50):
        await call_on_every_connection()
        if db.pool.get_stats().get("pool_size") == 4:
            break
    await call_on_every_connection()
    checked.clear()
    for _ in range(3):
        await call_on_every_connection()
        for _ in range(5):
            await db.read(lambda conn: conn.execute("SELECT 1"))
    assert checked == []
    monkeypatch.setattr(db_module, "IDLE_CHECK_SECONDS", 0.2)
    await trio.sleep(0.3)
    await db.read(lambda conn: conn.execute("SELECT 1"))
    assert len(checked) == 1


def later_job() -> dict:
    """A row for leasework_jobs_insert: due in an hour (no outbox row, invisible to workers)."""
    return {"id": str(uuid.uuid4()), "type": "ledger", "payload": {}, "delay_seconds": 3600}


async def test_a_begun_insert_sends_begin_with_its_statement_and_commits_after(db):
    """Database.run_begun (the api's inserts): BEGIN and the insert leave together, one wait
    for an answer inside ``fn``; the COMMIT follows once ``fn`` has returned."""
    row = later_job()
    _made.append(uuid.UUID(row["id"]))

    def insert(conn) -> list[str]:
        sent = client_messages(conn, lambda: store.jobs_insert_begun(conn, [row], "t"))
        assert conn.info.transaction_status == TransactionStatus.INTRANS  # not committed yet
        return sent

    sent = await db.run_begun(insert)
    assert sent.count("Sync") == 1 and "Query" not in sent, sent
    assert "Flush" not in sent[: sent.index("Sync")], sent
    assert (await job(db, uuid.UUID(row["id"]))).status == Status.SCHEDULED  # committed


async def test_a_begun_insert_whose_connection_died_before_its_commit_is_retried_once(db):
    """Nothing is committed before run_begun's COMMIT, so a connection that died while ``fn``
    ran is retried on another, as Database.run does: the job is inserted once."""
    row = later_job()
    _made.append(uuid.UUID(row["id"]))
    backends = []

    def insert(conn):
        backends.append(conn.info.backend_pid)
        if len(backends) == 1:
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return store.jobs_insert_begun(conn, [row], "t")

    (inserted,) = await db.run_begun(insert)
    assert len(backends) == 2 and backends[0] != backends[1]
    assert str(inserted.id) == row["id"]
    count = await db.read(
        lambda conn: conn.execute(
            "SELECT count(*) AS n FROM jobs WHERE id = %s", (row["id"],)
        ).fetchone()["n"]
    )
    assert count == 1


async def test_a_claim_holds_a_paused_queues_job_without_spending_an_attempt(db, claimer):
    held, also = await make_jobs(db, job_type="notify", count=2, queue="emails")
    actor = Actor("test", "cli")
    await db.run(lambda conn: set_paused(conn, "emails", True, actor))
    try:
        claimed = await claimer.claim([held, also])
        assert claimed.started == [] and claimed.retry == []
        assert claimed.skipped == {held: Skip.PAUSED, also: Skip.PAUSED}
        for job_id in (held, also):
            found = await job(db, job_id)
            assert found.status == Status.SCHEDULED and found.attempt == 0
            assert found.run_at == HELD_UNTIL and "paused" in found.last_error

        def resume(conn):
            done = set_paused(conn, "emails", False, actor)
            due = conn.execute(
                "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s) AND run_at <= now()",
                ([held, also],),
            ).fetchone()["n"]
            # (not for the stack's promoter: this test's jobs have no outbox row to wake)
            conn.execute(
                "UPDATE jobs SET run_at = now() + interval '1 hour' WHERE id = ANY(%s)",
                ([held, also],),
            )
            return done, due

        done, due = await db.run(resume)
        assert done.changed and done.released >= 2 and due == 2
    finally:
        await db.run(lambda conn: set_paused(conn, "emails", False, actor))
