"""Concurrency limits on the stack, across the demo's two workers: the demo's ``keyed`` type
runs at most two jobs at once per ``key``; a queue's cap holds all of its jobs. Sampled from
Postgres while the jobs run: never above the limit, yet at the limit (so the limit, not a
lack of jobs, is what held them), other keys running meanwhile, and every job run once with
one attempt (a held job spends none)."""

from __future__ import annotations

import time
import uuid

from tests.integration.conftest import wait_status


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
