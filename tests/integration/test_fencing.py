"""Fenced leases on the real stack: a worker that dies, freezes or loses Redis never causes a
lost job or a second effect."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from chaos.promql import total
from tests.integration.conftest import wait_for, wait_status
from tools import demo_fence

WORKERS = {"worker-1": 9101, "worker-2": 9103}


def effects_per_job(db, ids: list[str]) -> dict[str, int]:
    rows = db.execute(
        "SELECT job_id::text AS id, count(*) AS n FROM effects WHERE job_id = ANY(%s::uuid[]) "
        "GROUP BY job_id",
        (ids,),
    ).fetchall()
    return {r["id"]: r["n"] for r in rows}


def all_finished(client, ids: list[str], statuses=frozenset({"succeeded"})):
    return all(client.get(i)["status"] in statuses for i in ids)


def test_killed_worker_job_is_reaped_and_rerun(stack, client, db):
    ids = [client.submit("ledger", {"seconds": 3})["id"] for _ in range(6)]
    owners = wait_for(
        lambda: (
            (
                rows := db.execute(
                    "SELECT lease_owner FROM jobs "
                    "WHERE id = ANY(%s::uuid[]) AND status = 'running'",
                    (ids,),
                ).fetchall()
            )
            and [r["lease_owner"] for r in rows]
        ),
        60,
        "a ledger job running",
    )
    victim = owners[0]
    stack.kill(victim)
    try:
        wait_for(lambda: all_finished(client, ids), 120, "every job to succeed after the kill")
    finally:
        stack.start(victim)
        stack.wait_ready(victim, timeout=90)
    assert set(effects_per_job(db, ids).values()) == {1}
    reaped = db.execute(
        "SELECT count(*) AS n FROM attempts WHERE job_id = ANY(%s::uuid[]) "
        "AND outcome = 'lease_expired' AND worker = %s",
        (ids, victim),
    ).fetchone()["n"]
    assert reaped >= 1, "the killed worker's jobs were requeued by the reaper"


def test_redelivered_message_for_finished_job_is_skipped(stack, client, db):
    job = client.submit("ledger", {})
    wait_status(client, job["id"], {"succeeded"}, timeout=30)
    skipped_before = sum(
        total(port, "leasework_messages_skipped_total") for port in WORKERS.values()
    )
    producer = Producer({"bootstrap.servers": "127.0.0.1:19092,127.0.0.1:29092,127.0.0.1:39092"})
    value = json.dumps({"job_id": job["id"], "type": "ledger", "attempt": 1}).encode()
    producer.produce("jobs.ready", key=job["id"].encode(), value=value)
    assert producer.flush(30) == 0
    wait_for(
        lambda: (
            sum(total(p, "leasework_messages_skipped_total") for p in WORKERS.values())
            > skipped_before
        ),
        60,
        "a worker to skip the duplicate message",
    )
    assert client.get(job["id"])["attempt"] == 1
    assert effects_per_job(db, [job["id"]]) == {job["id"]: 1}


def test_redis_wipe_mid_run_gives_no_duplicate_effect(stack, client, db):
    # retrying jobs hold fences from before the wipe, so their next claim gets a stale token
    retrying = [client.submit("fail", {"times": 1}, max_attempts=5)["id"] for _ in range(10)]
    ledgers = [client.submit("ledger", {"seconds": 1})["id"] for _ in range(20)]
    wait_for(
        lambda: (
            db.execute(
                "SELECT count(*) AS n FROM attempts WHERE job_id = ANY(%s::uuid[]) "
                "AND outcome = 'failed'",
                (retrying,),
            ).fetchone()["n"]
            >= 3
        ),
        60,
        "some fail jobs to have failed once",
    )
    reseeds_before = sum(total(p, "leasework_fence_reseeds_total") for p in WORKERS.values())
    stack.redis_flushall()
    wait_for(
        lambda: all_finished(client, retrying + ledgers), 180, "every job to succeed after wipe"
    )
    counts = effects_per_job(db, ledgers)
    assert len(counts) == 20 and set(counts.values()) == {1}, counts
    reseeds = sum(total(p, "leasework_fence_reseeds_total") for p in WORKERS.values())
    assert reseeds > reseeds_before, "postgres refused a stale fence and the counter was re-seeded"


def test_sigterm_mid_burst_loses_nothing(stack, client, db):
    ids = [client.submit("sleep", {"seconds": 0.5})["id"] for _ in range(40)]
    wait_for(
        lambda: (
            db.execute(
                "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[]) AND status = 'running'",
                (ids,),
            ).fetchone()["n"]
            > 0
        ),
        60,
        "the burst to start running",
    )
    stack.stop("worker-1")  # SIGTERM, then waits for the process to exit
    drained_log = stack.logs("worker-1", lines=400)
    try:
        wait_for(lambda: all_finished(client, ids), 120, "every job of the burst to succeed")
    finally:
        stack.start("worker-1")
        stack.wait_ready("worker-1", timeout=90)
    assert '"msg": "drained"' in drained_log
    succeeded = db.execute(
        "SELECT count(*) AS n FROM attempts WHERE job_id = ANY(%s::uuid[]) "
        "AND outcome = 'succeeded'",
        (ids,),
    ).fetchone()["n"]
    assert succeeded == 40


# 75 s for both; that fencing off gives duplicates and fencing on none is shown in CI by
# test_chaos.py (scenario b, fenced and unsafe, judged by the checker)
@pytest.mark.ondemand
@pytest.mark.parametrize("unsafe", [True, False], ids=["unsafe-plain-ttl", "fenced"])
def test_demo_fence_duplicates_only_when_unsafe(stack, unsafe):
    result = demo_fence.run_once(stack, unsafe=unsafe, jobs=4)
    assert result.all_succeeded
    if unsafe:
        assert result.duplicate_effects > 0, result
    else:
        assert result.duplicate_effects == 0, result
        assert result.fence_rejections + result.lease_loss_cancellations > 0, result
