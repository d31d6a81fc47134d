"""Rate limits on the stack, across the demo's two workers: the demo's ``rated`` type starts
at most five jobs per second per ``key`` (no burst). Read from the effects each job writes
(when its handler began): never more than the rate allows in any second, a key's backlog
spread over its reserved starts (some waiting in Postgres, no attempt spent), another key
not held back by it, and through a Redis wipe no slot handed out twice."""

from __future__ import annotations

import time
import uuid

from tests.integration.conftest import wait_for

RATE = 5  # leasework.demo's rated: 5/s per key


def began(db, ids: list[str]) -> list[float]:
    return sorted(
        float(r["began"])
        for r in db.execute(
            "SELECT (data->>'began')::float8 AS began FROM effects "
            "WHERE kind = 'rated' AND job_id = ANY(%s::uuid[])",
            (ids,),
        ).fetchall()
    )


def most_in_a_second(times: list[float]) -> int:
    """The most handler starts within any one second."""
    return max((sum(1 for u in times if t <= u < t + 1.0) for t in times), default=0)


def all_succeeded(db, ids: list[str]) -> bool:
    rows = db.execute(
        "SELECT status, attempt FROM jobs WHERE id = ANY(%s::uuid[])", (ids,)
    ).fetchall()
    assert all(r["status"] not in ("dead", "cancelled") for r in rows), rows
    return len(rows) == len(ids) and all(r["status"] == "succeeded" for r in rows)


def test_a_keys_backlog_starts_at_its_rate_while_another_key_runs_on(client, db):
    hot, cool = f"hot-{uuid.uuid4().hex[:6]}", f"cool-{uuid.uuid4().hex[:6]}"
    hot_ids = [client.submit("rated", {"key": hot})["id"] for _ in range(12)]
    cool_ids = [client.submit("rated", {"key": cool})["id"] for _ in range(3)]
    kept = 0  # jobs seen waiting in postgres for a reserved start
    deadline = time.monotonic() + 60
    while not all_succeeded(db, hot_ids + cool_ids):
        assert time.monotonic() < deadline, "the rated jobs did not all succeed in 60 s"
        kept = max(
            kept,
            db.execute(
                "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[]) "
                "AND status = 'scheduled' AND rate_slot_at IS NOT NULL",
                (hot_ids,),
            ).fetchone()["n"],
        )
        time.sleep(0.05)
    hot_began, cool_began = began(db, hot_ids), began(db, cool_ids)
    assert len(hot_began) == 12 and len(cool_began) == 3  # once each
    assert most_in_a_second(hot_began) <= RATE + 1, hot_began  # GCRA: W * rate + 1
    assert hot_began[-1] - hot_began[0] >= (12 - 1) / RATE - 0.1  # spread over its slots
    assert kept > 0  # starts more than a second off waited in postgres, not in memory
    assert cool_began[-1] - cool_began[0] <= 1.0  # its own rate, not behind the hot key
    assert {
        r["attempt"]
        for r in db.execute(
            "SELECT attempt FROM jobs WHERE id = ANY(%s::uuid[])", (hot_ids + cool_ids,)
        ).fetchall()
    } == {1}  # a wait spends no attempt


def test_a_redis_wipe_hands_out_no_reserved_start_twice(client, db, stack):
    key = f"wiped-{uuid.uuid4().hex[:6]}"
    first = [client.submit("rated", {"key": key})["id"] for _ in range(15)]
    wait_for(
        lambda: (
            db.execute(
                "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[]) "
                "AND rate_slot_at IS NOT NULL",
                (first,),
            ).fetchone()["n"]
            >= 5
        ),
        30,
        "the first jobs' later starts to be reserved in postgres",
    )
    stack.redis_flushall()
    second = [client.submit("rated", {"key": key})["id"] for _ in range(5)]
    wait_for(lambda: all_succeeded(db, first + second), 120, "every rated job to succeed")
    times = began(db, first + second)
    assert len(times) == 20
    assert most_in_a_second(times) <= RATE + 1, times
