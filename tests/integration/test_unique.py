"""Unique jobs on the real stack (issue 20, item 4): every door (HTTP single and batch,
``enqueue``/``enqueue_many``, the SQL function, schedules) answers ``duplicate`` with the
existing job's id; a job past its states frees its key; a period buckets by run_at; and a
second inserter of a key whose first holder has not committed waits for it, then inserts
(the holder rolled back: exactly one job, never zero) or answers duplicate (it committed).

The database-level tests read ``LEASEWORK_UNIQUE_TEST_DSN`` when set (a scratch database
holding a deliberately broken insert, to show each test can fail); unset, the stack's.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

import leasework
from leasework import App, JobContext, Unique
from leasework.schedules import Definition, SkipReason
from leasework.states import Status
from leasework.store import schedules as sched
from tests.integration.conftest import API_URL, DIRECT_DSN, auth, delete_jobs, wait_for

DSN = os.environ.get("LEASEWORK_UNIQUE_TEST_DSN") or DIRECT_DSN
# far enough ahead that no promoter makes these jobs due while a test runs
FAR = datetime(2098, 6, 1, 12, 0, tzinfo=UTC)
BY_K = Unique(fields=("k",))


@pytest.fixture
def token(stack) -> Iterator[str]:
    """A fresh value for the payload field ``k`` (so each test's keys are its own); the
    jobs carrying it are deleted afterwards."""
    value = uuid.uuid4().hex
    yield value
    with psycopg.connect(DSN, autocommit=True) as conn:
        delete_jobs(conn, "payload->>'k' LIKE %s", (value + "%",))


def jobs_of(token: str) -> list[dict[str, Any]]:
    with psycopg.connect(DSN, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT id, status, unique_key, unique_states, run_at FROM jobs "
            "WHERE payload->>'k' = %s ORDER BY created_at",
            (token,),
        ).fetchall()


def enqueue_one(
    token: str, unique: Unique = BY_K, run_at: datetime = FAR, **extra: Any
) -> leasework.Enqueued:
    with psycopg.connect(DSN) as conn:
        return leasework.enqueue(conn, "echo", {"k": token, **extra}, run_at=run_at, unique=unique)


# ---------------------------------------------------------------- every door


def test_enqueue_answers_duplicate_with_the_holders_id(token):
    first = enqueue_one(token)
    again = enqueue_one(token, extra="another payload, the same key")
    assert not first.duplicate and again.duplicate
    assert again == first and isinstance(again, uuid.UUID)
    assert [j["id"] for j in jobs_of(token)] == [first]


def test_a_types_declared_uniqueness_applies_at_enqueue(token):
    app = App()

    @app.job("echo", unique=Unique(fields=("k",)))
    async def echo(ctx: JobContext, payload: Any) -> Any:
        return payload

    with psycopg.connect(DSN) as conn:
        first = leasework.enqueue(conn, "echo", {"k": token}, run_at=FAR, app=app)
        second = leasework.enqueue(conn, "echo", {"k": token, "x": 1}, run_at=FAR, app=app)
    assert second.duplicate and second == first
    with psycopg.connect(DSN) as conn, pytest.raises(leasework.InvalidJob, match="payload.k"):
        leasework.enqueue(conn, "echo", {"other": token}, run_at=FAR, app=app)


def test_enqueue_many_with_two_items_of_one_key_writes_one_job(token):
    with psycopg.connect(DSN) as conn:
        ids = leasework.enqueue_many(
            conn,
            [
                leasework.job("echo", {"k": token}, run_at=FAR, unique=BY_K),
                leasework.job("echo", {"k": token, "n": 2}, run_at=FAR, unique=BY_K),
                leasework.job("echo", {"k": token}, run_at=FAR),  # no uniqueness asked
            ],
        )
    assert [i.duplicate for i in ids] == [False, True, False]
    assert ids[1] == ids[0]
    assert {j["id"] for j in jobs_of(token)} == {ids[0], ids[2]}


def test_the_sql_door_answers_the_holders_id_and_says_duplicate(token):
    sql = """SELECT leasework_enqueue('echo', %s, run_at => %s, unique_fields => '{k}')"""
    with psycopg.connect(DSN, autocommit=True) as conn:
        (first,) = conn.execute(sql, (psycopg.types.json.Jsonb({"k": token}), FAR)).fetchone()
    notices: list[str] = []
    with psycopg.connect(DSN) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        (again,) = conn.execute(sql, (psycopg.types.json.Jsonb({"k": token}), FAR)).fetchone()
        (outcome,) = conn.execute("SELECT current_setting('leasework.enqueue_outcome')").fetchone()
    assert again == first and outcome == "duplicate"
    assert notices == [f"leasework_enqueue: duplicate of job {first}"]
    assert len(jobs_of(token)) == 1


def test_the_sql_door_applies_a_registered_types_uniqueness_and_refuses_bad_asks(token):
    probe = f"unique_probe_{token[:12]}"
    with psycopg.connect(DSN) as conn:  # rolled back: the probe type and its jobs vanish
        conn.execute(
            """INSERT INTO job_types (name, registered_by, unique_policy)
               VALUES (%s, 'test_unique', '{"fields": ["k"]}')""",
            (probe,),
        )
        enqueue = "SELECT leasework_enqueue(%s, %s, run_at => %s)"
        payload = psycopg.types.json.Jsonb({"k": token})
        (first,) = conn.execute(enqueue, (probe, payload, FAR)).fetchone()
        (second,) = conn.execute(enqueue, (probe, payload, FAR)).fetchone()
        assert second == first
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="has no 'k'"):
            conn.execute(enqueue, (probe, psycopg.types.json.Jsonb({"j": 1}), FAR))
        conn.rollback()
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="leaves out scheduled"):
            conn.execute(
                "SELECT leasework_enqueue('echo', '{\"k\": 1}', unique_fields => '{k}', "
                "unique_states => '{queued, running, failed}')"
            )
        conn.rollback()


def post(path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{API_URL}{path}", json=body, headers=auth(), timeout=30)


def test_post_jobs_answers_200_with_the_holder_and_duplicate(token):
    body = {
        "type": "echo",
        "payload": {"k": token},
        "run_at": FAR.isoformat(),
        "unique": {"fields": ["k"], "period_seconds": 3600},
    }
    first = post("/jobs", body)
    assert first.status_code == 202 and first.json()["duplicate"] is False
    again = post("/jobs", {**body, "payload": {"k": token, "more": True}})
    assert again.status_code == 200, again.text
    view = again.json()
    assert view["duplicate"] is True and view["replay"] is False
    assert view["id"] == first.json()["id"]
    assert again.headers["location"] == f"/jobs/{view['id']}"
    shown = httpx.get(f"{API_URL}/jobs/{view['id']}", headers=auth(), timeout=30).json()
    assert shown["unique"]["states"] == ["scheduled", "queued", "running", "failed"]
    assert shown["unique"]["holds"] is True and len(shown["unique"]["key"]) == 64
    assert len(jobs_of(token)) == 1


def test_post_jobs_batch_marks_the_duplicate_item_and_keeps_the_rest(token):
    item = {"type": "echo", "payload": {"k": token}, "run_at": FAR.isoformat()}
    answer = post(
        "/jobs/batch",
        {
            "jobs": [
                {**item, "unique": {"fields": ["k"]}},
                {**item, "unique": {"fields": ["k"]}},
                item,
            ]
        },
    )
    assert answer.status_code == 202, answer.text
    views = answer.json()["jobs"]
    assert [v["duplicate"] for v in views] == [False, True, False]
    assert views[1]["id"] == views[0]["id"]
    assert {j["id"].hex for j in jobs_of(token)} == {uuid.UUID(v["id"]).hex for v in views}


def test_post_jobs_refuses_a_field_the_payload_lacks_and_states_without_an_unfinished_one(
    token,
):
    base = {"type": "echo", "payload": {"k": token}, "run_at": FAR.isoformat()}
    missing = post("/jobs", {**base, "unique": {"fields": ["customer_id"]}})
    assert missing.status_code == 422
    assert any(e["field"] == "payload.customer_id" for e in missing.json()["errors"])
    states = post("/jobs", {**base, "unique": {"fields": ["k"], "states": ["queued"]}})
    assert states.status_code == 422 and "leaves out scheduled" in states.text
    assert jobs_of(token) == []


def test_a_schedules_tick_whose_job_would_be_a_duplicate_is_skipped_for_unique(token):
    probe = f"unique_probe_{token[:12]}"
    with psycopg.connect(DSN, row_factory=dict_row) as conn:  # rolled back
        conn.execute(
            """INSERT INTO job_types (name, registered_by, unique_policy)
               VALUES (%s, 'test_unique', '{"fields": []}')""",
            (probe,),
        )
        definition = Definition(name=f"u-{token[:10]}", type=probe, cron="0 0 * * *")
        assert sched.schedule_create(conn, definition, "test", datetime.now(UTC))
        days = [datetime(2026, 1, d, tzinfo=UTC) for d in (1, 2)]
        done = sched.schedule_backfill(conn, definition, days, "jobs.ready")
        assert [t.nominal_at for t in done.fired] == days[:1]
        rows = conn.execute(
            "SELECT nominal_at, outcome, reason, job_id, duplicate_of FROM schedule_ticks "
            "WHERE schedule = %s ORDER BY nominal_at",
            (definition.name,),
        ).fetchall()
        holder = done.fired[0].job_id
        assert [(r["outcome"], r["reason"], r["job_id"], r["duplicate_of"]) for r in rows] == [
            ("fired", None, holder, None),
            ("skipped", SkipReason.UNIQUE, None, holder),
        ]
        triggered, _ = sched.schedule_trigger(conn, definition.name, "jobs.ready")
        assert triggered == holder  # the trigger's tick is a duplicate of the same job
        (count,) = conn.execute("SELECT count(*) AS n FROM jobs WHERE type = %s", (probe,))
        assert count["n"] == 1
        conn.rollback()


# ---------------------------------------------------------------- states and periods


def test_a_job_past_its_states_frees_the_key(token):
    first = enqueue_one(token)
    cancel = httpx.post(f"{API_URL}/jobs/{first}/cancel", headers=auth(), timeout=30)
    assert cancel.status_code == 200, cancel.text
    second = enqueue_one(token)
    assert not second.duplicate and second != first
    # a key asked to hold in cancelled too stays held after the cancel
    keeps = Unique(fields=("k",), states=Unique().states | {Status.CANCELLED})
    third = enqueue_one(token, unique=keeps)
    assert third.duplicate and third == second


def test_a_job_that_succeeds_frees_the_key(token):
    with psycopg.connect(DSN) as conn:
        first = leasework.enqueue(conn, "echo", {"k": token}, unique=BY_K)
    wait_for(
        lambda: [j["status"] for j in jobs_of(token)] == ["succeeded"], 60, "the echo job to run"
    )
    with psycopg.connect(DSN) as conn:
        second = leasework.enqueue(conn, "echo", {"k": token}, unique=BY_K, run_at=FAR)
    assert not second.duplicate and second != first


def test_a_period_buckets_by_run_at(token):
    hourly = Unique(fields=("k",), period=timedelta(hours=1))
    base = datetime(2098, 6, 1, 12, 0, tzinfo=UTC)
    first = enqueue_one(token, hourly, base + timedelta(minutes=10))
    same_hour = enqueue_one(token, hourly, base + timedelta(minutes=50))
    next_hour = enqueue_one(token, hourly, base + timedelta(minutes=70))
    assert same_hour.duplicate and same_hour == first
    assert not next_hour.duplicate and next_hour != first
    assert len(jobs_of(token)) == 2


# ---------------------------------------------------------------- two inserters at once


def _blocked_backend(conn_pid: int) -> bool:
    with psycopg.connect(DSN, autocommit=True) as conn:
        row = conn.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (conn_pid,)
        ).fetchone()
    return row is not None and row[0] == "Lock"


def _race(token: str, finish_first: str) -> tuple[uuid.UUID, leasework.Enqueued]:
    """The first connection inserts the key and holds its transaction open; a second one
    inserts the same key in a thread; it must still be waiting 0.5 s later (on a lock); then
    the first commits or rolls back and the second's answer is returned."""
    answer: dict[str, Any] = {}
    pid: list[int] = []

    def second() -> None:
        with psycopg.connect(DSN) as conn:
            pid.append(conn.info.backend_pid)
            answer["id"] = leasework.enqueue(conn, "echo", {"k": token}, run_at=FAR, unique=BY_K)

    with psycopg.connect(DSN) as first:
        held = leasework.enqueue(first, "echo", {"k": token}, run_at=FAR, unique=BY_K)
        thread = threading.Thread(target=second, daemon=True)
        thread.start()
        thread.join(0.5)
        assert thread.is_alive(), f"the second inserter returned {answer} while the first held"
        assert pid and _blocked_backend(pid[0]), "the second inserter is not waiting on a lock"
        getattr(first, finish_first)()
    thread.join(15)
    assert not thread.is_alive() and "id" in answer, "the second inserter never returned"
    return held, answer["id"]


def test_a_second_inserter_waits_and_inserts_when_the_first_rolls_back(token):
    held, second = _race(token, "rollback")
    assert not second.duplicate and second != held
    assert [j["id"] for j in jobs_of(token)] == [second]  # exactly one job, never zero


def test_a_second_inserter_waits_and_answers_duplicate_when_the_first_commits(token):
    held, second = _race(token, "commit")
    assert second.duplicate and second == held
    assert [j["id"] for j in jobs_of(token)] == [held]


def _keys_in_order(token: str) -> tuple[str, str]:
    """Two values of ``k`` (both starting with ``token``) whose unique keys sort in this order
    (the insert takes a batch's keys in order)."""
    a, b = f"{token}-a", f"{token}-b"
    with psycopg.connect(DSN, autocommit=True) as conn:
        (first,) = conn.execute(
            """SELECT leasework_unique_key('echo', jsonb_build_object('k', %s::text), '{k}',
                                           NULL, now())
                    < leasework_unique_key('echo', jsonb_build_object('k', %s::text), '{k}',
                                           NULL, now())""",
            (a, b),
        ).fetchone()
    return (a, b) if first else (b, a)


def test_a_holder_leaving_its_states_between_conflict_and_lookup_is_inserted_again(token):
    """A batch meets key A held by a committed job, then waits on key B (held by an open
    transaction); meanwhile A's holder is cancelled. When the batch's insert ends, A's
    holder no longer holds it: the insert must go round again and write A's job, not
    answer a duplicate of a cancelled job (nor fail)."""
    a, b = _keys_in_order(token)
    holder = enqueue_one(a)
    answer: dict[str, Any] = {}
    pid: list[int] = []

    def batch() -> None:
        with psycopg.connect(DSN) as conn:
            pid.append(conn.info.backend_pid)
            answer["ids"] = leasework.enqueue_many(
                conn,
                [leasework.job("echo", {"k": k}, run_at=FAR, unique=BY_K) for k in (a, b)],
            )

    with psycopg.connect(DSN) as blocker:
        leasework.enqueue(blocker, "echo", {"k": b}, run_at=FAR, unique=BY_K)
        thread = threading.Thread(target=batch, daemon=True)
        thread.start()
        wait_for(lambda: pid and _blocked_backend(pid[0]), 10, "the batch to wait on key B")
        with psycopg.connect(DSN) as mover:
            mover.execute(
                "UPDATE jobs SET status = 'cancelled', finished_at = now() WHERE id = %s",
                (holder,),
            )
        blocker.rollback()
    thread.join(15)
    ids = answer["ids"]
    assert [i.duplicate for i in ids] == [False, False]
    assert ids[0] != holder
    assert sorted(j["status"] for j in jobs_of(a)) == ["cancelled", "scheduled"]


def test_an_operators_retry_of_a_job_whose_key_another_holds_is_refused(token):
    first = enqueue_one(token)
    with psycopg.connect(DSN) as conn:
        conn.execute("UPDATE jobs SET status = 'cancelled' WHERE id = %s", (first,))
    holder = enqueue_one(token)
    retried = httpx.post(f"{API_URL}/jobs/{first}/retry", headers=auth(), timeout=30)
    assert retried.status_code == 409, retried.text
    assert retried.json()["holder"] == str(holder)
    bulk = post("/jobs/retry", {"status": "cancelled", "type": "echo", "limit": 1000})
    assert bulk.status_code == 200
    assert sorted(j["status"] for j in jobs_of(token)) == ["cancelled", "scheduled"]
