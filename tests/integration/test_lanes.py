"""The lanes through the real stack's workers (leasework/lanes.py, leasework/worker/lanes.py).

The demo app's ``ledger`` in each lane runs once with one fenced effect, where its lane says;
the asyncio lane waits without a thread per job. Then the matrix of issue 55: a handler that
misbehaves for longer than the lease's TTL (``time.sleep``, a pure-Python loop, one C call
holding the GIL) in each lane, started while 20 well-behaved jobs of 8 s run on both
workers' loops; the neighbours must keep their leases and their first attempt, and the
handler, longer than the
TTL, must finish on its first (the worker's loop guard keeps the leases while a trio-lane
handler blocks the loop: leasework/worker/loop_guard.py, whose mechanism
tests/unit/test_loop_guard.py shows in CI on a real loop). One cell runs in CI (a child
holding its GIL, which no thread survives); the rest on demand (`just test-ondemand`), 15-20 s
each."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import wait_status

pytestmark = pytest.mark.usefixtures("stack")

LANES = {"ledger_thread": "thread", "ledger_asyncio": "asyncio", "ledger_process": "process"}
TTL = 10.0  # the stack's LEASEWORK_LEASE_TTL
NEIGHBOURS = 20


def effects_of(db, job_id: str) -> list[dict]:
    return db.execute(
        "SELECT data FROM effects WHERE job_id = %s ORDER BY id", (job_id,)
    ).fetchall()


def worker_pids(stack) -> set[int]:
    return {stack.pid(name) for name in ("worker-1", "worker-2")}


@pytest.mark.parametrize("job_type", sorted(LANES))
def test_each_lane_runs_its_job_once_with_one_fenced_effect_where_it_says(
    client, db, stack, job_type
):
    job = client.submit(job_type, {"seconds": 0.2})
    done = wait_status(client, job["id"], {"succeeded"}, timeout=60)
    assert done["attempt"] == 1
    (effect,) = effects_of(db, job["id"])
    assert effect["data"]["lane"] == LANES[job_type]
    in_a_worker = effect["data"]["pid"] in worker_pids(stack)
    assert in_a_worker is (LANES[job_type] != "process")  # a child's pid is its own


def test_the_asyncio_lane_waits_for_many_jobs_at_once_without_a_thread_each(client):
    # 40 jobs of 3 s each on 2 workers: all at once, in about 3 s (16 threads a worker, the
    # thread lane's capacity, would take 6 s and more)
    began = time.monotonic()
    ids = [client.submit("ledger_asyncio", {"seconds": 3.0})["id"] for _ in range(40)]
    for job_id in ids:
        wait_status(client, job_id, {"succeeded"}, timeout=60)
    assert time.monotonic() - began < 6.0


# ---------------------------------------------------------------- the matrix

IN_CI = {("process", "gil")}


def cells():
    for lane in ("trio", "thread", "asyncio", "process"):
        for how in ("sleep", "spin", "gil"):
            if how == "gil" and lane != "process":
                continue  # one C call holding the GIL stops every thread: only a child is safe
            marks = [] if (lane, how) in IN_CI else [pytest.mark.ondemand]
            yield pytest.param(lane, how, marks=marks, id=f"{lane}-{how}")


@pytest.mark.parametrize(("lane", "how"), list(cells()))
def test_a_misbehaving_handler_costs_no_neighbour_its_lease_or_attempt(client, db, lane, how):
    # the neighbours first, on both workers' own loops, each running for most of a TTL; then
    # the handler that misbehaves beside some of them for longer than a TTL
    neighbours = [client.submit("ledger", {"seconds": TTL * 0.8})["id"] for _ in range(NEIGHBOURS)]
    time.sleep(1.0)
    blocker = client.submit(f"block_{lane}", {"how": how, "seconds": TTL * 1.3})
    for job_id in neighbours:
        done = wait_status(client, job_id, {"succeeded"}, timeout=90)
        assert done["attempt"] == 1, f"a neighbour of {lane}/{how} lost its first attempt"
        assert len(effects_of(db, job_id)) == 1
    done = wait_status(client, blocker["id"], {"succeeded"}, timeout=120)
    assert done["attempt"] == 1, f"{lane}/{how} past the TTL did not finish on its first attempt"
    assert len(effects_of(db, blocker["id"])) == 1


# ---------------------------------------------------------------- lanes and slots

FLOOD = 300  # process-lane jobs of FLOOD_SECONDS: about 15 s for the 4 children of 2 workers
FLOOD_SECONDS = 0.2


@pytest.mark.ondemand
def test_a_flood_for_a_full_lane_does_not_starve_its_queues_other_jobs(client, db):
    # 300 CPU-lane jobs, then a trio-lane one in the same queue: the flood's jobs beyond
    # what the process lane admits (its 2 runners plus half of a worker's 64 slots) wait
    # unclaimed without a slot (leasework/worker/lane_gate.py), so the quick job is claimed
    # and run at once. Holding their slots, they would keep it behind about 170 of them
    # (some 8 s at 20 a second); tried without the gate (an admission of 10,000): the quick
    # job ran only once 69 of the flood were left, and the test failed
    flood = [
        client.submit("block_process", {"how": "sleep", "seconds": FLOOD_SECONDS})["id"]
        for _ in range(FLOOD)
    ]
    time.sleep(1.0)  # the flood's messages are read and its first jobs run
    submitted = time.monotonic()
    quick = client.submit("ledger", {})
    wait_status(client, quick["id"], {"succeeded"}, timeout=60)
    waited = time.monotonic() - submitted
    left = db.execute(
        "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[]) AND status <> 'succeeded'",
        (flood,),
    ).fetchone()["n"]
    assert waited < 3.0, f"the quick job waited {waited:.1f} s behind a full process lane"
    assert left > 100, f"the flood was nearly done ({left} left): the test showed nothing"
    for job_id in flood:
        done = wait_status(client, job_id, {"succeeded"}, timeout=120)
        assert done["attempt"] == 1
