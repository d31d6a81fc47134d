"""Concurrency limits on the stack, across the demo's two workers: the demo's ``keyed`` type
runs at most two jobs at once per ``key``; a queue's cap holds all of its jobs. Sampled from
Postgres while the jobs run: never above the limit, yet at the limit (so the limit, not a
lack of jobs, is what held them), other keys running meanwhile, and every job run once with
one attempt (a held job spends none). A cap lowered while its jobs run holds the starts after
it, and the auditor judges each start by the cap its claim applied: no violation."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

from leasework.audit import FinishedJob, LimitSpan, check_limits, running_at_starts
from leasework.states import Status
from tests.integration.conftest import wait_for, wait_status
from tests.integration.test_auditor import audited, recorded_by_the_stacks_auditor


def sample_running(db, sql: str, params: tuple, ids: list[str], timeout: float) -> list[dict]:
    """Rows of ``sql`` (the running count of each limit) every 20 ms until every job of
    ``ids`` finished."""
    samples: list[dict] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        samples.extend(db.execute(sql, params).fetchall())
        left = db.execute(
            "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[]) "
            "AND status NOT IN ('succeeded', 'dead', 'cancelled')",
            (ids,),
        ).fetchone()["n"]
        if left == 0:
            return samples
        time.sleep(0.02)
    raise AssertionError(f"{left} job(s) still unfinished after {timeout}s")


def attempts_of(db, ids: list[str]) -> set[tuple[str, int, int]]:
    return {
        (r["status"], r["attempt"], r["tries"])
        for r in db.execute(
            "SELECT status, attempt, (SELECT count(*) FROM attempts a WHERE a.job_id = j.id) "
            "AS tries FROM jobs j WHERE id = ANY(%s::uuid[])",
            (ids,),
        ).fetchall()
    }


def test_a_keys_jobs_never_run_above_its_limit_while_other_keys_run_on(client, db):
    hot, cool = f"hot-{uuid.uuid4().hex[:6]}", f"cool-{uuid.uuid4().hex[:6]}"
    hot_ids = [client.submit("keyed", {"key": hot, "seconds": 0.4})["id"] for _ in range(8)]
    cool_ids = [client.submit("keyed", {"key": cool, "seconds": 0.4})["id"] for _ in range(2)]
    samples = sample_running(
        db,
        "SELECT payload->>'key' AS key, count(*) FILTER (WHERE status = 'running') AS n, "
        "count(*) FILTER (WHERE held_for IS NOT NULL) AS held FROM jobs "
        "WHERE type = 'keyed' AND payload->>'key' IN (%s, %s) GROUP BY 1",
        (hot, cool),
        hot_ids + cool_ids,
        timeout=90,
    )
    most = {
        key: max((s["n"] for s in samples if s["key"] == key), default=0) for key in (hot, cool)
    }
    assert most[hot] == 2, most  # at the limit, never above it
    assert most[cool] >= 1
    assert max(s["held"] for s in samples if s["key"] == hot) > 0  # held, not merely slow
    assert attempts_of(db, hot_ids + cool_ids) == {("succeeded", 1, 1)}  # once, no attempt spent
    # no head-of-line blocking: both cool jobs finished before the last hot one started
    last_hot_start = db.execute(
        "SELECT max(started_at) AS t FROM jobs WHERE id = ANY(%s::uuid[])", (hot_ids,)
    ).fetchone()["t"]
    cool_done = db.execute(
        "SELECT max(finished_at) AS t FROM jobs WHERE id = ANY(%s::uuid[])", (cool_ids,)
    ).fetchone()["t"]
    assert cool_done < last_hot_start


def most_running_in_emails(db, ids: list[str]) -> int:
    return max(
        s["n"]
        for s in sample_running(
            db,
            "SELECT count(*) AS n FROM jobs WHERE queue = 'emails' AND status = 'running'",
            (),
            ids,
            timeout=90,
        )
    )


def cap(client, name: str, value: int | None) -> dict:
    answer = client.http.put(f"/queues/{name}/concurrency", json={"concurrency": value})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_queues_cap_holds_across_workers_and_lifts(client, db):
    """Set over the api (audited), refused when it is no cap, lifted with null."""
    for bad in (0, 1.5, "2", True):
        answer = client.http.put("/queues/emails/concurrency", json={"concurrency": bad})
        assert answer.status_code == 422 and "whole number" in answer.text, answer.text
    assert (
        client.http.put("/queues/nosuch-q/concurrency", json={"concurrency": 1}).status_code == 404
    )
    assert cap(client, "emails", 1)["concurrency"] == 1
    try:
        ids = [client.submit("sleep", {"seconds": 0.3}, queue="emails")["id"] for _ in range(6)]
        assert most_running_in_emails(db, ids) == 1
        assert attempts_of(db, ids) == {("succeeded", 1, 1)}
        listed = {q["name"]: q for q in client.http.get("/queues").json()["queues"]}
        assert listed["emails"]["concurrency"] == 1
        audited = db.execute(
            "SELECT detail FROM audit_log WHERE action = 'queue-concurrency' "
            "AND target = 'queue:emails' ORDER BY id DESC LIMIT 1"
        ).fetchone()["detail"]
        assert audited["to"] == 1
    finally:
        assert cap(client, "emails", None)["concurrency"] is None
    # lifted: six at once are not held to one
    ids = [client.submit("sleep", {"seconds": 1.0}, queue="emails")["id"] for _ in range(6)]
    assert most_running_in_emails(db, ids) > 1
    for job_id in ids:
        wait_status(client, job_id, {"succeeded"}, timeout=30)


def test_lowering_a_queues_cap_while_its_jobs_run_is_no_violation(client, db):
    """The issue's case: an operator lowers a queue's cap (4 to 2) while four of its jobs
    run. Each attempt records the cap its claim applied; the four that started under 4 ran
    legally, those started after the change were held to 2 (never more than two of them at
    once), and the auditor, with the cap still at 2, finds nothing, where judged by the cap
    as set now it would find the early ones over it. The stack's own auditor records
    nothing of them either."""
    assert cap(client, "emails", 4)["concurrency"] == 4
    try:
        ids = [client.submit("sleep", {"seconds": 2.0}, queue="emails")["id"] for _ in range(8)]
        wait_for(
            lambda: db.execute(
                "SELECT count(*) = 4 AS full FROM jobs WHERE id = ANY(%s::uuid[]) "
                "AND status = 'running'",
                (ids,),
            ).fetchone()["full"],
            30,
            "four of the queue's jobs to run",
        )
        assert cap(client, "emails", 2)["concurrency"] == 2
        lowered_at = db.execute("SELECT now() AS t").fetchone()["t"]
        for job_id in ids:
            wait_status(client, job_id, {"succeeded"}, timeout=60)
        attempts = db.execute(
            "SELECT job_id, started_at, finished_at, limits_recorded, queue_limit FROM attempts "
            "WHERE job_id = ANY(%s::uuid[]) ORDER BY started_at",
            (ids,),
        ).fetchall()
        assert len(attempts) == 8 and all(a["limits_recorded"] for a in attempts)
        applied = [(a["started_at"] < lowered_at, a["queue_limit"]) for a in attempts]
        assert applied == [(True, 4)] * 4 + [(False, 2)] * 4
        spans = [
            LimitSpan(
                a["job_id"], "@emails", a["started_at"], a["finished_at"], True, a["queue_limit"]
            )
            for a in attempts
        ]
        # the new cap held: at each start after it, at most two of these ran
        assert max(running_at_starts(spans)[4:]) == 2
        assert audited(db, ids) == []
        # judged by the cap as set now (2), the early ones' starts would be over it (the
        # third's and the fourth's at least; a start batched with another shares its count)
        as_now = [replace(s, recorded=False, limit=None) for s in spans]
        jobs = [
            FinishedJob(s.job_id, Status.SUCCEEDED, 1, 1, 5, s.started, limit_key="@emails")
            for s in as_now
        ]
        assert len(check_limits(jobs, as_now, {"@emails": 2})) >= 2
        assert recorded_by_the_stacks_auditor(db, ids) == []
    finally:
        assert cap(client, "emails", None)["concurrency"] is None
