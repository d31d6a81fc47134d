"""``just demo-fence``: a real duplicate, and the fence that prevents it.

A worker is frozen with SIGSTOP in the middle of ``ledger`` jobs for longer than the lease TTL
and the Kafka session timeout; the reaper requeues the jobs and another worker runs them;
then the first worker is resumed with SIGCONT. Run once with the plain-TTL lease
(``LEASEWORK_LEASE_MODE=unsafe-plain-ttl``: no deadline scope, no fence condition) and once
as built. The unsafe run must show duplicate effects; the fenced run must show none.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from dataclasses import asdict, dataclass

import psycopg
from psycopg.rows import dict_row

from chaos.poll import poll
from chaos.promql import total
from devstack import Stack
from leasework.client import Client

DIRECT_DSN = "postgresql://leasework:leasework@127.0.0.1:15433/leasework"
API_URL = "http://127.0.0.1:8080"
WORKER_PORTS = {"worker-1": 9101, "worker-2": 9103}
UNSAFE_ENV = {
    "LEASEWORK_LEASE_MODE": "unsafe-plain-ttl",
    "LEASEWORK_I_ACCEPT_DUPLICATE_EFFECTS": "yes",
}
LEASE_TTL = 4.0  # seconds; the consumer session timeout is 10 s
FREEZE_SECONDS = 16.0  # longer than both
HANDLER_SECONDS = 6.0  # the ledger handler is mid-sleep when the worker freezes


@dataclass(frozen=True)
class DemoResult:
    mode: str
    jobs: int
    executions: int  # attempt rows: handler runs started
    duplicate_effects: int  # effect rows beyond the first, over all jobs
    jobs_with_duplicates: int
    fence_rejections: float
    lease_loss_cancellations: float
    all_succeeded: bool


def _wait(predicate, timeout: float, what: str):
    polled = poll(predicate, patience=timeout, interval=0.2)
    if not polled.met:
        raise TimeoutError(f"demo-fence: timed out after {timeout:g}s waiting for {what}")
    return polled.value


def _start_workers(stack: Stack, names: list[str], env: dict[str, str]) -> None:
    for name in names:
        stack.start(name, extra_env=env)
    for name in names:
        stack.wait_ready(name, timeout=90)


def run_once(stack: Stack, *, unsafe: bool, jobs: int = 6) -> DemoResult:
    env = {"LEASEWORK_LEASE_TTL": f"{LEASE_TTL}s", **(UNSAFE_ENV if unsafe else {})}
    mode = "unsafe plain TTL" if unsafe else "fenced (as built)"
    for name in WORKER_PORTS:
        stack.stop(name)
    _start_workers(stack, ["worker-1"], env)
    tag = uuid.uuid4().hex[:8]
    with (
        Client(API_URL) as client,
        psycopg.connect(DIRECT_DSN, autocommit=True, row_factory=dict_row) as db,
    ):
        ids = [
            client.submit("ledger", {"seconds": HANDLER_SECONDS, "demo": tag}, max_attempts=5)["id"]
            for _ in range(jobs)
        ]

        def running_on_worker_1() -> bool:
            rows = db.execute(
                "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[]) "
                "AND status = 'running' AND lease_owner = 'worker-1'",
                (ids,),
            ).fetchone()
            return rows["n"] == jobs

        _wait(running_on_worker_1, 60, "every demo job running on worker-1")
        stack.pause("worker-1")
        try:
            _start_workers(stack, ["worker-2"], env)
            time.sleep(FREEZE_SECONDS)  # the fault itself: a frozen process
            _wait(
                lambda: (
                    db.execute(
                        "SELECT count(*) AS n FROM jobs WHERE id = ANY(%s::uuid[]) "
                        "AND status = 'succeeded'",
                        (ids,),
                    ).fetchone()["n"]
                    == jobs
                ),
                120,
                "worker-2 to finish the jobs taken over from the frozen worker",
            )
        finally:
            stack.resume("worker-1")

        def worker_1_done() -> bool:
            open_attempts = db.execute(
                "SELECT count(*) AS n FROM attempts WHERE job_id = ANY(%s::uuid[]) "
                "AND worker = 'worker-1' AND finished_at IS NULL",
                (ids,),
            ).fetchone()["n"]
            executed = total(WORKER_PORTS["worker-1"], "leasework_jobs_executed_total")
            rejected = total(WORKER_PORTS["worker-1"], "leasework_fence_rejections_total")
            # every resumed handler either wrote (unsafe) or was rejected/cancelled (fenced)
            return open_attempts == 0 or executed + rejected >= jobs

        _wait(worker_1_done, 60, "the resumed worker-1 to settle its jobs")
        time.sleep(1.0)  # let a last in-flight write land before counting
        effects = db.execute(
            "SELECT job_id, count(*) AS n FROM effects WHERE job_id = ANY(%s::uuid[]) "
            "GROUP BY job_id",
            (ids,),
        ).fetchall()
        executions = db.execute(
            "SELECT count(*) AS n FROM attempts WHERE job_id = ANY(%s::uuid[])", (ids,)
        ).fetchone()["n"]
        statuses = db.execute(
            "SELECT status FROM jobs WHERE id = ANY(%s::uuid[])", (ids,)
        ).fetchall()
    result = DemoResult(
        mode=mode,
        jobs=jobs,
        executions=executions,
        duplicate_effects=sum(max(0, e["n"] - 1) for e in effects),
        jobs_with_duplicates=sum(1 for e in effects if e["n"] > 1),
        fence_rejections=sum(
            total(p, "leasework_fence_rejections_total") for p in WORKER_PORTS.values()
        ),
        lease_loss_cancellations=sum(
            total(p, "leasework_lease_loss_cancellations_total") for p in WORKER_PORTS.values()
        ),
        all_succeeded=all(s["status"] == "succeeded" for s in statuses),
    )
    # back to the normal stack: both workers, fenced
    for name in WORKER_PORTS:
        stack.stop(name)
    _start_workers(stack, list(WORKER_PORTS), {})
    return result


def table(results: list[DemoResult]) -> str:
    header = (
        "| mode | jobs | handler executions | duplicate effects | fence rejections "
        "| lease-loss cancellations | all succeeded |"
    )
    lines = [header, "|---|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(
            f"| {r.mode} | {r.jobs} | {r.executions} | {r.duplicate_effects} | "
            f"{r.fence_rejections:g} | {r.lease_loss_cancellations:g} | {r.all_succeeded} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo-fence", description=__doc__)
    parser.add_argument("--jobs", type=int, default=6)
    args = parser.parse_args(argv)
    stack = Stack.from_env()
    stack.up(apps=True)
    results = [
        run_once(stack, unsafe=True, jobs=args.jobs),
        run_once(stack, unsafe=False, jobs=args.jobs),
    ]
    print(table(results))
    for r in results:
        print(asdict(r), file=sys.stderr)
    unsafe, fenced = results
    if unsafe.duplicate_effects > 0 and fenced.duplicate_effects == 0:
        print("\ndemo-fence: the plain TTL lease applied effects twice; the fence prevented it.")
        return 0
    print(
        "\ndemo-fence: UNEXPECTED: duplicates unsafe="
        f"{unsafe.duplicate_effects}, fenced={fenced.duplicate_effects}",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
