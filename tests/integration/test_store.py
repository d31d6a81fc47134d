"""The store's statements on the real Postgres, River-style: each test runs in a transaction
that is rolled back at the end, so nothing it writes is ever seen by the stack's processes,
and a small factory makes jobs in any state. The fenced finish, the reaper, the promoter, the
pruner, deferral, cancel and retry are each driven once; the reaper's and the pruner's passes
run through their services on the test's connection (InTransaction)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import pq
from psycopg.rows import dict_row

import leasework
from leasework import config, metrics, store
from leasework.job import Job
from leasework.outcomes import Completion, Outcome
from leasework.queues import LIMIT_LOCK
from leasework.relay.pruner import Pruner, PrunerConfig, Retention
from leasework.relay.reaper import Reaper, ReaperConfig, expired_outcomes
from leasework.states import IllegalTransition, Status
from leasework.store import console
from leasework.store import relay as store_relay
from tests.integration.conftest import DIRECT_DSN, client_messages, delete_jobs
from tools import console_timing


@pytest.fixture
def conn(stack) -> Iterator[psycopg.Connection]:
    """A connection inside a transaction that is rolled back after the test."""
    with psycopg.connect(DIRECT_DSN, row_factory=dict_row) as connection:
        yield connection
        connection.rollback()


def make_job(conn: psycopg.Connection, status: Status = Status.QUEUED, **fields: Any) -> Job:
    """A job in ``status`` with ``fields`` set (SQL expressions as ``sql_<column>``)."""
    row = {
        "id": uuid.uuid4(),
        "type": "noop",
        "payload": "{}",
        "status": str(status),
        "max_attempts": 3,
        "attempt_budget": 3,
        "timeout_seconds": 60,
        **{k: v for k, v in fields.items() if not k.startswith("sql_")},
    }
    expressions = {k.removeprefix("sql_"): v for k, v in fields.items() if k.startswith("sql_")}
    columns = [*row, *expressions]
    values = [f"%({k})s" for k in row] + list(expressions.values())
    if "run_at" not in columns:
        columns.append("run_at")
        values.append("now()")
    found = conn.execute(
        f"INSERT INTO jobs ({', '.join(columns)}) VALUES ({', '.join(values)}) "
        f"RETURNING {store.JOB_COLUMNS}",
        row,
    ).fetchone()
    return Job.from_row(found)


def reread(conn: psycopg.Connection, job: Job) -> Job:
    return store.jobs_get_many(conn, [job.id])[0]


def running(conn: psycopg.Connection, **fields: Any) -> Job:
    job = make_job(conn, Status.RUNNING, **{"fence": 7, "attempt": 1, "lease_owner": "w", **fields})
    conn.execute(
        "INSERT INTO attempts (job_id, attempt, worker, fence) VALUES (%s, %s, 'w', %s)",
        (job.id, job.attempt, job.fence),
    )
    return job


def outbox_of(conn: psycopg.Connection, job: Job) -> list[dict]:
    return conn.execute(
        "SELECT topic, key, value, headers FROM outbox WHERE job_id = %s ORDER BY id", (job.id,)
    ).fetchall()


class InTransaction:
    """A :class:`leasework.db.Database` whose every call runs on the test's connection, in
    its rolled-back transaction."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    async def run(self, fn, *args):
        return fn(self.conn, *args)


def test_the_fenced_finish_writes_only_the_rows_whose_fence_holds(conn):
    current, stale, waiting = running(conn), running(conn), make_job(conn)
    done = store.jobs_finish_many(
        conn,
        [
            Completion(current.id, 7, Outcome(Status.SUCCEEDED, result=[1, 2])),
            Completion(stale.id, 6, Outcome(Status.SUCCEEDED)),  # an older claim
            Completion(waiting.id, 0, Outcome(Status.SUCCEEDED)),  # not running
        ],
        dlq_topic="jobs.dlq",
    )
    assert done == {current.id: Status.SUCCEEDED}
    finished = reread(conn, current)
    assert finished.status == Status.SUCCEEDED and finished.result == [1, 2]
    assert finished.finished_at is not None and finished.lease_owner is None
    attempt = conn.execute("SELECT outcome FROM attempts WHERE job_id = %s", (current.id,))
    assert attempt.fetchone()["outcome"] == "succeeded"
    assert reread(conn, stale).status == Status.RUNNING


def test_a_failed_attempt_waits_for_its_retry_and_a_dead_one_is_dead_lettered(conn):
    retried, doomed = running(conn), running(conn)
    store.jobs_finish_many(
        conn,
        [
            Completion(retried.id, 7, Outcome(Status.FAILED, "boom", retry_in=30)),
            Completion(doomed.id, 7, Outcome(Status.DEAD, "gave up")),
        ],
        dlq_topic="jobs.dlq",
    )
    waiting = reread(conn, retried)
    assert waiting.status == Status.FAILED and waiting.last_error == "boom"
    assert 25 < (waiting.run_at - waiting.updated_at).total_seconds() <= 30
    (letter,) = outbox_of(conn, doomed)
    assert letter["topic"] == "jobs.dlq" and letter["key"] == str(doomed.id)
    assert letter["value"] == {"job_id": str(doomed.id), "type": "noop", "payload": {}}
    assert letter["headers"] == {
        "job_id": str(doomed.id),
        "type": "noop",
        "attempts": "1",
        "last_error": "gave up",
    }
    assert outbox_of(conn, retried) == []


def test_an_outcome_running_cannot_reach_is_refused_before_any_write(conn):
    job = running(conn)
    with pytest.raises(IllegalTransition):
        store.jobs_finish_many(conn, [Completion(job.id, 7, Outcome(Status.QUEUED))], dlq_topic="d")


REAPER = ReaperConfig(dlq_topic="jobs.dlq", retry_base=1.0, retry_cap=2.0, batch=1000)


def reap(conn: psycopg.Connection, config: ReaperConfig = REAPER) -> dict[uuid.UUID, Status]:
    """One reaper pass on the test's connection: the expired rows, the service's decision,
    the batched write."""
    decided = expired_outcomes(store.jobs_expired(conn, config.batch), config)
    return store.jobs_reap_many(conn, decided, dlq_topic=config.dlq_topic)


def test_the_reaper_requeues_expired_leases_with_backoff_and_kills_the_last_attempt(conn):
    expired = running(conn, sql_lease_expires_at="now() - interval '1 minute'")
    last = running(
        conn, attempt=3, sql_lease_expires_at="now() - interval '1 minute'", max_attempts=3
    )
    live = running(conn, sql_lease_expires_at="now() + interval '1 minute'")
    reaped = reap(conn)
    assert reaped[expired.id] == "failed" and reaped[last.id] == "dead"
    assert live.id not in reaped
    again = reread(conn, expired)
    assert again.fence == 7 and again.lease_owner is None  # the lost worker's fence stays stale
    assert "expired (fence 7)" in again.last_error
    assert (again.run_at - again.updated_at).total_seconds() <= 1.0  # its own backoff: 1 s
    attempt = conn.execute("SELECT outcome, error FROM attempts WHERE job_id = %s", (expired.id,))
    assert attempt.fetchone() == {"outcome": "lease_expired", "error": again.last_error}
    dead = reread(conn, last)
    assert dead.status == Status.DEAD and dead.finished_at is not None
    (letter,) = outbox_of(conn, last)
    assert letter["topic"] == "jobs.dlq" and letter["key"] == str(last.id)
    assert letter["value"] == {"job_id": str(last.id), "type": "noop", "payload": {}}
    assert letter["headers"] == {
        "job_id": str(last.id),
        "type": "noop",
        "attempts": "3",
        "last_error": dead.last_error,
    }
    assert outbox_of(conn, expired) == []  # a retry waits for the promoter
    assert reread(conn, live).status == Status.RUNNING


def test_the_reapers_write_keeps_each_rows_fence_and_touches_no_one_elses(conn):
    taken = running(conn, fence=9, sql_lease_expires_at="now() - interval '1 minute'")
    other = running(conn, fence=9, sql_lease_expires_at="now() - interval '1 minute'")
    finished = make_job(conn, Status.SUCCEEDED, fence=9)
    outcome = Outcome(Status.DEAD, "lease of w expired (fence 9)")
    written = store.jobs_reap_many(
        conn,
        [
            Completion(taken.id, 9, outcome),
            Completion(other.id, 8, outcome),  # a newer claim holds it
            Completion(finished.id, 9, outcome),  # no longer running
        ],
        dlq_topic="jobs.dlq",
    )
    assert written == {taken.id: Status.DEAD}
    assert reread(conn, other).status == Status.RUNNING and outbox_of(conn, other) == []
    assert reread(conn, finished).status == Status.SUCCEEDED and outbox_of(conn, finished) == []
    assert len(outbox_of(conn, taken)) == 1
    with pytest.raises(IllegalTransition):
        store.jobs_reap_many(conn, [Completion(taken.id, 9, Outcome(Status.QUEUED))], dlq_topic="d")


async def test_a_reaper_pass_counts_and_logs_each_job_it_took_back(conn, caplog):
    requeued = running(conn, sql_lease_expires_at="now() - interval '1 minute'")
    doomed = running(
        conn, attempt=3, max_attempts=3, sql_lease_expires_at="now() - interval '1 minute'"
    )
    before = metrics.lease_expirations._value.get()
    reaper = Reaper(InTransaction(conn), REAPER)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="leasework.relay.reaper"):
        done = await reaper.run_once()
    # the shared table may hold expired leases of its own: at least ours were taken back
    assert done.failed >= 1 and done.dead >= 1
    assert metrics.lease_expirations._value.get() - before == done.failed + done.dead
    logged = {r.job_id: r.status for r in caplog.records if r.msg == "lease expired; job requeued"}
    assert logged[str(requeued.id)] == "failed" and logged[str(doomed.id)] == "dead"
    assert reread(conn, requeued).status == Status.FAILED


def test_the_promoter_queues_due_jobs_with_their_wake_up_and_leaves_the_rest(conn):
    due = make_job(conn, Status.SCHEDULED, sql_run_at="now() - interval '1 second'")
    retry = make_job(conn, Status.FAILED, attempt=1, sql_run_at="now() - interval '1 second'")
    later = make_job(conn, Status.SCHEDULED, sql_run_at="now() + interval '1 hour'")
    finished = make_job(conn, Status.DEAD, sql_run_at="now() - interval '1 second'")
    store.jobs_promote_due(conn, 100_000, "jobs.ready")
    assert reread(conn, due).status == Status.QUEUED
    assert reread(conn, retry).status == Status.QUEUED
    assert reread(conn, later).status == Status.SCHEDULED
    assert reread(conn, finished).status == Status.DEAD  # never offered to the promoter
    (wake,) = outbox_of(conn, retry)
    assert wake["value"] == {"job_id": str(retry.id), "type": "noop", "attempt": 2}
    assert wake["key"] == str(retry.id) and wake["topic"] == "jobs.ready"


def test_a_relay_pass_takes_the_highest_priority_first_and_each_priority_in_order(conn):
    """Every wake-up carries its job's priority (the promoter's statement and the insert
    function both write it), and a pass locks a priority 0 wake-up before a backlog of
    priority 3 written before it (migration 0017)."""
    due = "now() - interval '1 second'"
    low = [make_job(conn, Status.SCHEDULED, priority=3, sql_run_at=due) for _ in range(2)]
    store.jobs_promote_due(conn, 100_000, "jobs.ready")
    high = leasework.enqueue(conn, "noop", {}, priority=0)
    middle = leasework.enqueue(conn, "noop", {}, priority=2)
    ours = {
        r["id"]: r
        for r in conn.execute(
            "SELECT id, job_id, priority, topic FROM outbox WHERE job_id = ANY(%s)",
            ([j.id for j in low] + [high.id, middle.id],),
        ).fetchall()
    }
    assert sorted((r["priority"], r["topic"]) for r in ours.values()) == [
        (0, "jobs.ready"),
        (2, "jobs.ready.default.p2"),
        (3, "jobs.ready.default.p3"),
        (3, "jobs.ready.default.p3"),
    ]
    passed = [
        ours[m.id]["job_id"]
        for m in store_relay.outbox_fetch(conn, 100_000).messages
        if m.id in ours
    ]
    # the two of priority 3 in the order they were written (the promoter's own order between
    # two jobs due at the same instant is its choice)
    backlog = [r["job_id"] for _, r in sorted(ours.items()) if r["priority"] == 3]
    assert passed == [high.id, middle.id, *backlog]


def test_a_relay_pass_takes_each_topics_oldest_rows_in_turn(conn):
    """A burst in one queue holds no other queue's wake-up behind it: a pass shares its batch
    equally among the (priority, topic) pairs with rows waiting (migration 0023), each
    pair's oldest first, and says when a pair filled its share."""
    burst = leasework.enqueue_many(conn, [{"job_type": "noop", "queue": "emails"}] * 30)
    later = leasework.enqueue(conn, "noop", {})
    ours = {
        r["id"]: r["job_id"]
        for r in conn.execute(
            "SELECT id, job_id FROM outbox WHERE job_id = ANY(%s)",
            ([j.id for j in burst] + [later.id],),
        ).fetchall()
    }
    # rows the stack left committed share the batch too: ours are read among them
    pairs = conn.execute("SELECT count(DISTINCT (priority, topic)) AS n FROM outbox")
    waiting = pairs.fetchone()["n"]
    batch = store_relay.outbox_fetch(conn, 10 * waiting)
    passed = [ours[m.id] for m in batch.messages if m.id in ours]
    # the default queue's one row, and the burst's ten oldest, in id order
    assert passed == [j.id for j in burst[:10]] + [later.id] and batch.full
    alone = store_relay.outbox_fetch(conn, 100_000)
    assert not alone.full  # what is left fits: no pair filled its share
    # an empty outbox (the relay's every idle pass): no pairs, no rows. The stack's relay
    # skips the rows this rolled-back delete holds for the moment. Nothing may commit a row
    # between the delete and the fetch (a CI run's promoter re-published a job an earlier
    # test left deferred there): the table is locked against writers until the rollback.
    conn.execute("LOCK TABLE outbox IN EXCLUSIVE MODE")
    conn.execute("DELETE FROM outbox")
    assert store_relay.outbox_fetch(conn, 1000) == store_relay.OutboxBatch([], False)


def test_autovacuum_can_analyze_every_table(conn):
    """Maintenance runs with ``search_path`` ``pg_catalog, pg_temp``: ANALYZE evaluates every
    index's predicate and expressions so, and one that names a function of ours unqualified
    fails there (0007's unique predicate did: migration 0018), leaving the planner with stale
    statistics."""
    schema = conn.execute("SELECT current_schema() AS s").fetchone()["s"]
    tables = [
        r["relname"]
        for r in conn.execute(
            "SELECT relname FROM pg_stat_user_tables WHERE schemaname = %s", (schema,)
        ).fetchall()
    ]
    assert "jobs" in tables
    conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
    for table in tables:
        conn.execute(f'ANALYZE "{schema}"."{table}"')


@pytest.mark.parametrize("autocommit", [False, True], ids=["in-a-transaction", "one-round-trip"])
def test_a_stamp_that_waits_for_its_limits_lock_starts_when_the_wait_ends(stack, autocommit):
    """A job's start (its row's and its attempt's ``started_at``) is the stamp statement's, run
    once the limit's lock is granted, not its transaction's begin: the auditor compares
    attempts' spans, and a stamp that waited while a job of its limit finished must not seem
    to have started before that finish (chaos scenario w found three over_limit so). So too
    when BEGIN, the locks, the stamp and COMMIT are sent at once (the worker's
    Database.transact)."""
    key = f"stamp-wait-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(DIRECT_DSN, autocommit=True, row_factory=dict_row) as db:
        job = make_job(db, type="keyed", payload=json.dumps({"key": key, "seconds": 0}))
        try:
            (lock,) = (
                db.execute(
                    "SELECT hashtext(leasework_limit_key(j.type, j.payload, t.concurrency)) AS h "
                    "FROM jobs j JOIN job_types t ON t.name = j.type WHERE j.id = %s",
                    (job.id,),
                )
                .fetchone()
                .values()
            )
            with psycopg.connect(DIRECT_DSN, row_factory=dict_row) as holder:
                holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LIMIT_LOCK, lock))

                def stamp() -> None:
                    with psycopg.connect(
                        DIRECT_DSN, autocommit=autocommit, row_factory=dict_row
                    ) as stamper:
                        stamped = store.jobs_start_many(
                            stamper, [(job.id, 10**15)], worker="test-stamp", ttl=60
                        )
                        assert [j.id for j in stamped.started] == [job.id]

                waiting = threading.Thread(target=stamp)
                waiting.start()
                time.sleep(0.3)  # the stamp's transaction has begun and waits for the lock
                granted = holder.execute("SELECT clock_timestamp() AS t").fetchone()["t"]
                holder.commit()
                waiting.join(timeout=10)
            started = db.execute(
                "SELECT j.started_at AS job, a.started_at AS attempt FROM jobs j "
                "JOIN attempts a ON a.job_id = j.id WHERE j.id = %s",
                (job.id,),
            ).fetchone()
            assert started["job"] >= granted and started["attempt"] == started["job"], started
        finally:
            delete_jobs(db, "id = %s", (job.id,))


def plans_of(conn: psycopg.Connection, beginning: str) -> tuple[int, int]:
    """(generic, custom) plans this connection's prepared statement whose text begins as
    ``beginning`` does (up to its first parameter) has run."""
    prefix = beginning.strip().split("%", 1)[0]
    rows = conn.execute(
        "SELECT generic_plans AS g, custom_plans AS c FROM pg_prepared_statements "
        "WHERE left(ltrim(statement, E' \\n'), %s) = %s",
        (len(prefix), prefix),
    ).fetchall()
    assert len(rows) == 1, rows
    return rows[0]["g"], rows[0]["c"]


def test_the_stamp_and_the_finish_are_planned_once_per_connection_not_per_execution(conn):
    """The worker's hot statements run prepared with a generic plan (store.GENERIC_PLANS): a
    lone job's stamp on a connection of the pool had paid for its planning (about 2 ms, more
    on a new backend) at each of its first five executions there."""
    jobs = [make_job(conn) for _ in range(3)]
    for n, job in enumerate(jobs, start=1):
        stamped = store.jobs_start_many(conn, [(job.id, 10**15 + n)], worker="w", ttl=60)
        assert [j.id for j in stamped.started] == [job.id]
        store.jobs_finish_many(
            conn, [Completion(job.id, 10**15 + n, Outcome(Status.SUCCEEDED))], dlq_topic="d"
        )
    assert plans_of(conn, store.worker.STAMP) == (3, 0)
    assert plans_of(conn, store.worker.STAMP_LOCKS) == (3, 0)
    assert plans_of(conn, store.worker.FINISH_MANY) == (3, 0)


def test_a_stamp_on_an_autocommit_connection_is_one_round_trip_and_commits_itself(stack):
    """Database.transact's stamp: BEGIN, the statements and COMMIT in one pipeline, one Sync
    and nothing else the client waits for (psycopg's own transaction in a pipeline sent a
    Sync after BEGIN, a Flush for the fetch, and COMMIT as a query of its own)."""
    with psycopg.connect(DIRECT_DSN, autocommit=True, row_factory=dict_row) as db:
        job = make_job(db)
        try:
            stamped: list[store.Stamped] = []
            sent = client_messages(
                db,
                lambda: stamped.append(
                    store.jobs_start_many(db, [(job.id, 10**15)], worker="w", ttl=60)
                ),
            )
            assert [j.id for j in stamped[0].started] == [job.id]
            # one Sync, nothing before it that waits for an answer (psycopg sends a Flush
            # after it as it leaves the pipeline: answered by then, it costs no wait)
            assert sent.count("Sync") == 1 and "Query" not in sent, sent
            assert "Flush" not in sent[: sent.index("Sync")], sent
            assert plans_of(db, store.worker.STAMP) == (1, 0)  # SET LOCAL took: in BEGIN
            assert db.info.transaction_status == pq.TransactionStatus.IDLE
            with psycopg.connect(DIRECT_DSN, row_factory=dict_row) as other:
                assert reread(other, job).status == Status.RUNNING  # committed
        finally:
            delete_jobs(db, "id = %s", (job.id,))


def test_a_failed_statement_in_one_round_trip_commits_nothing(stack):
    with psycopg.connect(DIRECT_DSN, autocommit=True, row_factory=dict_row) as db:
        job = make_job(db)
        try:
            with pytest.raises(psycopg.errors.DivisionByZero):
                with store.common.one_round_trip(db):
                    db.execute("UPDATE jobs SET max_attempts = 9 WHERE id = %s", (job.id,))
                    db.execute("SELECT 1 / 0")
            assert db.info.transaction_status == pq.TransactionStatus.INERROR
            db.execute("ROLLBACK")
            assert reread(db, job).max_attempts == 3
        finally:
            delete_jobs(db, "id = %s", (job.id,))


def test_a_users_fenced_effects_keep_the_sessions_plan_cache_mode(conn):
    """The generic plans are the worker's own statements' (SET LOCAL, said after the
    effects): a user's effect in the finish's transaction plans as its session says."""
    seen = []

    def effect(c: psycopg.Connection) -> None:
        seen.append(c.execute("SELECT current_setting('plan_cache_mode') AS m").fetchone())

    job = running(conn)
    store.jobs_finish_many(
        conn,
        [Completion(job.id, job.fence, Outcome(Status.SUCCEEDED), effects=(effect,))],
        dlq_topic="d",
    )
    assert [r["m"] for r in seen] == ["auto"]


def test_the_insert_function_plans_its_statements_generically(conn):
    """Migration 0019: leasework_jobs_insert's statements plan once per connection. A later
    CREATE OR REPLACE of the function drops the setting unless it says it again."""
    (config_row,) = conn.execute(
        "SELECT proconfig FROM pg_proc "
        "WHERE oid = 'leasework_jobs_insert(jsonb, text)'::regprocedure"
    ).fetchall()
    assert config_row["proconfig"] == ["plan_cache_mode=force_generic_plan"]


def test_the_pruner_deletes_finished_jobs_past_retention_with_their_rows(conn):
    old = make_job(conn, Status.SUCCEEDED, sql_finished_at="now() - interval '3 days'")
    recent = make_job(conn, Status.SUCCEEDED, sql_finished_at="now() - interval '1 hour'")
    old_dead = make_job(conn, Status.DEAD, sql_finished_at="now() - interval '3 days'")
    conn.execute(
        "INSERT INTO attempts (job_id, attempt, worker, fence) VALUES (%s, 1, 'w', 1)", (old.id,)
    )
    store.jobs_prune(conn, Status.SUCCEEDED, 2 * 86400, 100_000)
    remaining = {j.id for j in store.jobs_get_many(conn, [old.id, recent.id, old_dead.id])}
    assert remaining == {recent.id, old_dead.id}  # another state, another retention
    assert (
        conn.execute("SELECT count(*) AS n FROM attempts WHERE job_id = %s", (old.id,)).fetchone()[
            "n"
        ]
        == 0
    )
    with pytest.raises(ValueError, match="only finished jobs"):
        store.jobs_prune(conn, Status.QUEUED, 1, 1)


def test_deferral_cancel_and_retry_move_only_the_states_they_may(conn):
    queued, running_job = make_job(conn), running(conn)
    deferred = store.jobs_defer_many(
        conn, [queued.id, running_job.id], base=1.0, cap=8.0, reason="no type"
    )
    assert [j.id for j in deferred] == [queued.id]
    assert deferred[0].status == Status.SCHEDULED and deferred[0].deferrals == 1
    assert store.job_cancel(conn, running_job.id).outcome == "requested"  # cooperative
    assert reread(conn, running_job).cancel_requested
    dead = make_job(conn, Status.DEAD, attempt=3, max_attempts=3)
    retried = store.job_retry(conn, dead.id, "jobs.ready")
    assert retried.outcome == "retried"
    again = reread(conn, dead)
    assert again.status == Status.QUEUED and again.max_attempts == 6 and again.attempt == 3
    assert outbox_of(conn, dead)[0]["value"]["attempt"] == 4
    assert store.job_retry(conn, running_job.id, "jobs.ready").outcome == "not-retryable"


def test_a_retried_write_whose_first_try_committed_reports_written_not_rejected(conn):
    job = running(conn)
    completion = Completion(job.id, 7, Outcome(Status.SUCCEEDED))
    assert store.jobs_finish_many(conn, [completion], dlq_topic="d") == {job.id: Status.SUCCEEDED}
    # the answer to that COMMIT was lost: the completer writes the same batch again
    assert store.jobs_finish_many(conn, [completion], dlq_topic="d") == {}
    again = store.jobs_finish_many(conn, [completion], dlq_topic="d", retrying=True)
    assert again == {job.id: Status.SUCCEEDED}
    # a write under a fence the reaper closed is still a rejection
    reaped = running(conn, sql_lease_expires_at="now() - interval '1 minute'")
    reap(conn)
    late = Completion(reaped.id, 7, Outcome(Status.SUCCEEDED))
    assert store.jobs_finish_many(conn, [late], dlq_topic="d", retrying=True) == {}


# ---------------------------------------------------------------- retention by age


# a row of each table pruned by age, `age` old (an interval)
AGED_INSERT = {
    "audit_log": "INSERT INTO audit_log (at, actor, action, target) "
    "VALUES (now() - %s::interval, 'test', 'retry', 'x') RETURNING id",
    "alert_notifications": "INSERT INTO alert_notifications (received_at, alertname, status) "
    "VALUES (now() - %s::interval, 'TestAlert', 'firing') RETURNING id",
    "schedule_deletions": "INSERT INTO schedule_deletions (name, created_at, deleted_at) "
    "VALUES ('test-deleted', now() - interval '400 days', now() - %s::interval) RETURNING id",
}


def aged(conn: psycopg.Connection, table: str, age: str) -> int:
    return conn.execute(AGED_INSERT[table], (age,)).fetchone()["id"]


def ids_left(conn: psycopg.Connection, table: str, ids: list[int]) -> set[int]:
    rows = conn.execute(f"SELECT id FROM {table} WHERE id = ANY(%s)", (ids,)).fetchall()
    return {r["id"] for r in rows}


async def test_the_pruner_deletes_audit_entries_and_notifications_past_their_retention(conn):
    old_audit = [aged(conn, "audit_log", age) for age in ("100 days", "91 days")]
    fresh_audit = [aged(conn, "audit_log", age) for age in ("89 days", "1 second")]
    old_alerts = [aged(conn, "alert_notifications", age) for age in ("45 days", "31 days")]
    fresh_alerts = [aged(conn, "alert_notifications", age) for age in ("29 days", "1 second")]
    before = {
        t: metrics.rows_pruned.labels(t)._value.get()
        for t in ("audit_log", "alert_notifications", "invariant_violations")
    }
    day = 86400.0
    retention = Retention(
        succeeded=None, dead=None, cancelled=None, audit=90 * day, alerts=30 * day
    )
    # batches of one: the pass goes on until a batch comes back short
    pruner = Pruner(InTransaction(conn), PrunerConfig(retention, batch=1))  # type: ignore[arg-type]
    counts = await pruner.run_once()
    assert ids_left(conn, "audit_log", old_audit + fresh_audit) == set(fresh_audit)
    assert ids_left(conn, "alert_notifications", old_alerts + fresh_alerts) == set(fresh_alerts)
    # the shared tables may hold older rows of their own: at least ours went
    assert counts.tables["audit_log"] >= 2 and counts.tables["alert_notifications"] >= 2
    assert counts.jobs == {}  # 'never' prunes nothing
    # the outbox has no age; the auditor's violations go with the audit's retention
    assert set(counts.tables) == {"audit_log", "alert_notifications", "invariant_violations"}
    settings = config.load("relay", {"LEASEWORK_RETAIN_AUDIT": "never"})
    assert Retention.from_settings(settings).of_tables()["audit_log"] is None
    assert Retention.from_settings(settings).of_tables()["alert_notifications"] == 30 * day
    for table, n in counts.tables.items():
        assert metrics.rows_pruned.labels(table)._value.get() - before[table] == n


async def test_the_pruner_deletes_schedule_deletions_with_the_ticks_retention(conn):
    old = [aged(conn, "schedule_deletions", age) for age in ("40 days", "31 days")]
    fresh = [aged(conn, "schedule_deletions", age) for age in ("29 days", "1 second")]
    day = 86400.0
    retention = Retention(succeeded=None, dead=None, cancelled=None, ticks=30 * day)
    pruner = Pruner(InTransaction(conn), PrunerConfig(retention, batch=1))  # type: ignore[arg-type]
    counts = await pruner.run_once()
    assert ids_left(conn, "schedule_deletions", old + fresh) == set(fresh)
    assert counts.tables["schedule_deletions"] >= 2


def test_one_prune_statement_deletes_at_most_its_batch_and_only_from_its_tables(conn):
    old = [aged(conn, "audit_log", "400 days") for _ in range(3)]
    assert store_relay.rows_prune(conn, "audit_log", 365 * 86400.0, 2) == 2
    assert len(ids_left(conn, "audit_log", old)) == 1
    with pytest.raises(KeyError):
        store_relay.rows_prune(conn, "jobs; DROP TABLE jobs", 1.0, 1)


# ---------------------------------------------------------------- the console's reads, by index

BIG = 20_000  # all of them in ANALYZE's sample (30,000 rows), so the statistics, and the plans,
# are the same on every run


@pytest.fixture
def big(conn: psycopg.Connection) -> psycopg.Connection:
    """A temporary ``jobs`` with the real table's columns and indexes (``LIKE ... INCLUDING
    ALL``: what the migrations made), which hides the shared one from this transaction's
    queries, filled with BIG rows of the timing tool's mix and analysed."""
    conn.execute("CREATE TEMP TABLE jobs (LIKE public.jobs INCLUDING ALL) ON COMMIT DROP")
    conn.execute("SELECT setseed(0.16)")
    conn.execute(console_timing.FILL, {"first": 1, "last": BIG})
    conn.execute("ANALYZE jobs")
    assert conn.execute("SELECT count(*) AS n FROM jobs").fetchone()["n"] == BIG  # ours alone
    return conn


# what a case may read of jobs and throw away (EXPLAIN ANALYZE's rows removed by its filters):
# an index that serves the filter leaves next to none; without 0004's indexes a type filter
# walks the newest-first index past every other type (800-2,700 rows here) and the overview
# reads the whole table
DISCARD_LIMIT = 200
# a finished window without a type walks the newest-first index past the jobs not finished
# yet, all at its top (about 480 here, 2.4% of the rows); tools/console_timing.py measures it
WALKS_PAST_UNFINISHED = "jobs page: finished last 24 h"


def test_every_filter_of_the_console_and_get_jobs_reads_jobs_through_an_index(big):
    """Each query the overview runs, and the jobs page and GET /jobs under each filter they
    offer (status, type, both, a created or a finished window, the next page), on 20,000
    rows: no plan reads jobs by a sequential scan, and each reads little it does not keep."""
    cases = console_timing.cases(datetime.now(UTC))
    scans, thrown = {}, {}
    for case in cases:
        _, case.plans = console_timing.plans_of(big, case.call)
        name = f"{case.group}: {case.name}"
        scans[name] = [s for plan in case.plans for s in console_timing.jobs_scans(plan)]
        thrown[name] = sum(console_timing.discarded(plan) for plan in case.plans)
    assert {name: s for name, s in scans.items() if any("Seq Scan" in x for x in s)} == {}
    assert all(scans[f"jobs page: {name}"] for name in ("type=fail", "status=dead type=ledger"))
    wasteful = {n: t for n, t in thrown.items() if t > DISCARD_LIMIT and n != WALKS_PAST_UNFINISHED}
    assert wasteful == {}
    # the check sees a sequential scan when there is one: without the migrations' indexes
    for row in big.execute(
        "SELECT indexrelid::regclass::text AS name FROM pg_index "
        "WHERE indrelid = 'pg_temp.jobs'::regclass AND NOT indisunique"
    ).fetchall():
        big.execute(f"DROP INDEX {row['name']}")
    type_page = next(c for c in cases if c.group == "jobs page" and c.name == "type=fail")
    _, type_page.plans = console_timing.plans_of(big, type_page.call)
    assert console_timing.seq_scans(type_page) == ["Seq Scan"]
    assert console_timing.discarded(type_page.plans[0]) > DISCARD_LIMIT


def test_the_overview_counts_each_cell_exactly_up_to_the_cap_and_says_at_least_beyond(big):
    exact = {
        (r["type"], r["status"]): r["n"]
        for r in big.execute("SELECT type, status, count(*) AS n FROM jobs GROUP BY 1, 2")
    }
    assert console.job_counts(big) == console.job_counts(big, cap=console.COUNT_CAP)
    uncapped = {(c.job_type, s): n for c in console.job_counts(big) for s, n in c.by_status.items()}
    assert uncapped == exact and max(exact.values()) < console.COUNT_CAP
    counts = console.job_counts(big, cap=500)
    assert [c.job_type for c in counts] == sorted({t for t, _ in exact})  # unregistered too
    for c in counts:
        for status, n in c.by_status.items():
            full = exact[(c.job_type, status)]
            assert n == min(full, 500) and isinstance(n, console.AtLeast) == (full >= 500)
        assert set(c.by_status) == {s for t, s in exact if t == c.job_type}
    noop = next(c for c in counts if c.job_type == "noop")
    assert str(noop.by_status["succeeded"]) == "500+" and str(noop.total).endswith("+")
    assert isinstance(sum(c.total for c in counts), console.AtLeast)


def test_a_finished_window_selects_what_its_bounds_alone_select(big):
    """The finished-window filter adds a state and a creation bound for the planner: both
    hold for every finished job, so the page is the one its bounds alone would give."""
    now = datetime.now(UTC)
    since, until = now - timedelta(days=3), now - timedelta(days=2)
    job_filter = console.JobFilter("dead", None, since, until, "finished_at")
    page = console.jobs_page(big, job_filter, before=None, limit=1000)
    plain = big.execute(
        "SELECT id FROM jobs WHERE status = 'dead' AND finished_at >= %s AND finished_at < %s "
        "ORDER BY created_at DESC, id DESC",
        (since, until),
    ).fetchall()
    assert [j.id for j in page] == [r["id"] for r in plain] and len(plain) > 10


@pytest.mark.parametrize("priority", [0, 2])
def test_the_ready_topic_is_inlined_into_the_statement_that_names_it(conn, priority):
    """Migration 0021: leasework_ready_topic is folded into the calling statement's plan,
    not run as a SQL function of its own per outbox row (parsed and planned at each
    statement: 11% of Postgres's CPU under one-job inserts)."""
    plan = conn.execute(
        # (a materialized CTE: constant arguments would fold the call away either way)
        "EXPLAIN (VERBOSE, COSTS OFF) WITH v(topic, queue, p) AS MATERIALIZED "
        "(VALUES (%s::text, %s::text, %s::smallint)) "
        "SELECT leasework_ready_topic(v.topic, v.queue, v.p) FROM v",
        ("jobs.ready", "emails", priority),
    ).fetchall()
    text = "\n".join(row["QUERY PLAN"] for row in plan)
    assert "leasework_ready_topic" not in text, text
    (row,) = conn.execute(
        "SELECT leasework_ready_topic('jobs.ready', 'emails', %s::smallint) AS t", (priority,)
    ).fetchall()
    assert row["t"] == ("jobs.ready.emails" if priority == 0 else "jobs.ready.emails.p2")


def test_outbox_rows_are_found_by_their_job_through_an_index(conn):
    """Migration 0022: a deleted job's cascade and the auditor's stuck check look outbox rows
    up by job_id; without an index each scanned the whole outbox once per job."""
    conn.execute("SET LOCAL enable_seqscan = off")
    plan = conn.execute(
        "EXPLAIN (COSTS OFF) SELECT 1 FROM outbox WHERE job_id = gen_random_uuid()"
    ).fetchall()
    text = "\n".join(row["QUERY PLAN"] for row in plan)
    assert "outbox_job_idx" in text, text
