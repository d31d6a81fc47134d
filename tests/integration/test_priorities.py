"""Priorities on the stack: behind a backlog of low-priority jobs (priority 3), jobs of the
highest priority submitted later start first, before low-priority jobs submitted with them;
every job runs once. A priority that is none is refused by every door, saying what to do."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from tests.integration.conftest import wait_for
from tests.integration.test_limits import attempts_of


def starts(db, ids: list[str]) -> list:
    return [
        r["started_at"]
        for r in db.execute(
            "SELECT started_at FROM jobs WHERE id = ANY(%s::uuid[])", (ids,)
        ).fetchall()
    ]


def count(db, ids: list[str], condition: str) -> int:
    return db.execute(
        f"SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[]) AND {condition}", (ids,)
    ).fetchone()["n"]


def test_a_high_priority_job_starts_before_a_low_priority_backlog(client, db):
    backlog = [
        r["id"]
        for r in client.submit_many(
            [{"type": "sleep", "payload": {"seconds": 0.4}, "priority": 3}] * 1000
        )
    ]
    wait_for(lambda: count(db, backlog, "status = 'running'") >= 100, 60, "the backlog to run")
    late = client.submit_many(
        [
            {"type": "sleep", "payload": {"seconds": 0.05}, "priority": p}
            for _ in range(4)
            for p in (3, 0)
        ]
    )
    high = [j["id"] for j in late[1::2]]
    low = [j["id"] for j in late[0::2]]
    every = backlog + high + low
    wait_for(lambda: count(db, every, "finished_at IS NOT NULL") == len(every), 120, "the end")
    high_starts, low_starts = starts(db, high), starts(db, low)
    assert max(high_starts) < min(low_starts), (high_starts, low_starts)
    # each high-priority job waited for a free slot, not for the backlog
    delays = db.execute(
        "SELECT extract(epoch FROM started_at - run_at) AS d FROM jobs WHERE id = ANY(%s::uuid[])",
        (high,),
    ).fetchall()
    assert max(r["d"] for r in delays) < 2.0, delays
    assert max(starts(db, backlog)) > max(high_starts)  # the backlog still waited
    assert attempts_of(db, every) == {("succeeded", 1, 1)}


@pytest.mark.parametrize("bad", [4, -1, "1", 1.5, True])
def test_a_priority_that_is_none_is_refused_by_the_api_and_the_sql_door(client, db, bad):
    answer = client.http.post("/jobs", json={"type": "noop", "payload": {}, "priority": bad})
    assert answer.status_code == 422 and "priority" in answer.text, answer.text
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        db.execute(
            "SELECT * FROM leasework_jobs_insert(%s::jsonb)",
            (json.dumps([{"id": str(uuid.uuid4()), "type": "noop", "priority": bad}]),),
        )
    assert "0 (the highest, and the default) to 3" in refused.value.diag.message_hint


def test_the_sql_door_names_a_queue_and_a_priority(db):
    job_id = db.execute(
        "SELECT leasework_enqueue('noop', '{}', queue => 'emails', priority => 2) AS id"
    ).fetchone()["id"]
    row = db.execute(
        "SELECT j.queue, j.priority, o.topic FROM jobs j LEFT JOIN outbox o ON o.job_id = j.id "
        "WHERE j.id = %s",
        (job_id,),
    ).fetchone()
    assert (row["queue"], row["priority"]) == ("emails", 2)
    assert row["topic"] in (None, "jobs.ready.emails.p2")  # (None: published already)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="priority 9"):
        db.execute("SELECT leasework_enqueue('noop', priority => 9)")
