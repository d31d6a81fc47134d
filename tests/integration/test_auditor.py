"""The auditor on a real Postgres: a schema of the test's own with the product's jobs,
attempts, outbox and auditor tables (their indexes too), so that seeded violations never
reach the stack's own auditor. A job seeded to break each invariant must be found, by the
relay's pass and by ``leasework audit``'s window; the clean ones must not; and the
completer's own finish must record the effects it committed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from leasework import store
from leasework.audit import Kind
from leasework.audit_cli import audit_window
from leasework.outcomes import Completion, Outcome
from leasework.relay.auditor import AuditorConfig, audit_pass
from leasework.states import Status
from leasework.store import audit as store_audit
from tests.integration.conftest import DIRECT_DSN

TABLES = ("jobs", "attempts", "outbox", "invariant_audit", "invariant_violations", "queues")
CONFIG = AuditorConfig(settle=0.0, lease_grace=30.0, stuck_after=600.0)
FINISHED = 31  # the finished jobs seeded() makes


@pytest.fixture
def conn(stack) -> Iterator[psycopg.Connection]:
    schema = f"audit_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(DIRECT_DSN, autocommit=True, row_factory=dict_row) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
        for table in TABLES:
            admin.execute(f"CREATE TABLE {schema}.{table} (LIKE public.{table} INCLUDING ALL)")
        admin.execute(f"INSERT INTO {schema}.invariant_audit DEFAULT VALUES")
        # (LIKE copies no trigger) the product's, on this schema's jobs
        admin.execute(
            f"CREATE TRIGGER jobs_vanished AFTER DELETE ON {schema}.jobs "
            "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
            "EXECUTE FUNCTION public.leasework_jobs_deleted()"
        )
    try:
        with psycopg.connect(
            DIRECT_DSN, row_factory=dict_row, options=f"-c search_path={schema},public"
        ) as c:
            yield c
    finally:
        with psycopg.connect(DIRECT_DSN, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def seed(conn, status: str, attempts: list[tuple[int, str | None, bool]], **job) -> uuid.UUID:
    """A job of ``status`` (finished a minute ago unless waiting) and its attempts
    (fence, outcome, effects committed), started two hours ago and still open, or in
    ``ran`` = (started, finished); any other ``job`` column set after the insert."""
    job_id = uuid.uuid4()
    ran = job.pop("ran", None)
    finished = status in ("succeeded", "dead", "cancelled")
    fence = job.pop("fence", max((f for f, _, _ in attempts), default=0))
    conn.execute(
        """INSERT INTO jobs (id, type, payload, status, run_at, attempt, max_attempts,
                             attempt_budget, timeout_seconds, fence, lease_owner,
                             lease_expires_at, finished_at)
           VALUES (%(id)s, 'ledger', '{}', %(status)s,
                   now() - make_interval(secs => %(due)s), %(attempt)s, %(budget)s,
                   %(budget)s, 30,
                   %(fence)s, %(owner)s, now() - make_interval(secs => %(expired)s),
                   CASE WHEN %(finished)s THEN now() - interval '1 minute' END)""",
        {
            "id": job_id,
            "status": status,
            "due": job.pop("due", 60),
            "attempt": len(attempts),
            "budget": job.pop("budget", 5),
            "fence": fence,
            "owner": "worker-1" if status == "running" else None,
            "expired": job.pop("expired", -30) if status == "running" else 0,
            "finished": finished,
        },
    )
    if job:  # a tick it carries, a unique key, its creation: set after the insert
        sets = ", ".join(f"{k} = %({k})s" for k in job)
        conn.execute(f"UPDATE jobs SET {sets} WHERE id = %(id)s", {**job, "id": job_id})
    for n, (f, outcome, effects) in enumerate(attempts, start=1):
        conn.execute(
            """INSERT INTO attempts (job_id, attempt, worker, fence, outcome, effects_committed,
                                     started_at, finished_at)
               VALUES (%s, %s, 'worker-1', %s, %s, %s,
                       coalesce(%s, now() - interval '2 hours'), %s)""",
            (job_id, n, f, outcome, effects, *(ran or (None, None))),
        )
    conn.commit()
    return job_id


def seeded(conn) -> dict[Kind, set[uuid.UUID]]:
    """The jobs breaking each invariant (one each, two for a tick or a key held twice), and
    clean jobs around them: a tick with one job, a key taken again once its holder finished."""
    seed(conn, "succeeded", [(1, "lease_expired", False), (2, "succeeded", True)])
    seed(conn, "dead", [(1, "failed", False), (2, "lease_expired", False)], budget=2)
    seed(conn, "running", [(1, None, False)])  # within its lease
    seed(conn, "queued", [], due=3600)  # due long ago, but still in the outbox (below)
    conn.execute(
        "INSERT INTO outbox (job_id, topic, key, value) SELECT id, 'jobs.ready', id::text, '{}' "
        "FROM jobs WHERE status = 'queued'"
    )
    conn.commit()
    ok, failed, dead, lost = "succeeded", "failed", "dead", "lease_expired"
    now = conn.execute("SELECT now() AS t").fetchone()["t"]
    tick, key, other_key = now - timedelta(minutes=10), b"k" * 32, b"o" * 32
    once = [(1, ok, False)]
    seed(conn, ok, once, schedule="nightly", tick_at=tick - timedelta(seconds=1))

    def keyed(key: bytes, states: int, start: int, end: int) -> uuid.UUID:
        """A job of ``key`` that ran from ``start`` to ``end`` minutes ago, and finished."""
        span = (now - timedelta(minutes=start), now - timedelta(minutes=end))
        return seed(
            conn, ok, once, unique_key=key, unique_states=states, ran=span, finished_at=span[1]
        )

    keyed(other_key, 23, 60, 50)  # a key freed when its job succeeded, then taken again
    keyed(other_key, 23, 40, 30)
    holder = keyed(key, 31, 30, 25)  # a key that holds in succeeded too (23 | 8)
    inserted = keyed(key, 23, 20, 15)  # ran while the holder held it

    def limited(limit_key: str, start: int, end: int) -> uuid.UUID:
        """A job of the demo's keyed type (limit 2 per key, as its workers register it)
        that ran under ``limit_key`` from ``start`` to ``end`` minutes ago."""
        span = (now - timedelta(minutes=start), now - timedelta(minutes=end))
        created = span[0] - timedelta(minutes=1)
        return seed(
            conn, ok, once, limit_key=limit_key, ran=span, finished_at=span[1], created_at=created
        )

    limited("keyed/fine", 50, 40)  # two at once: at its limit, not over it
    limited("keyed/fine", 48, 42)
    over = {limited("keyed/over", 50, 40), limited("keyed/over", 48, 42)}
    over.add(limited("keyed/over", 45, 30))  # a third while both ran: all three named
    # a queue capped at one running job: two that overlapped, and one alone after them
    conn.execute("INSERT INTO queues (name, created_by, concurrency) VALUES ('capped', 't', 1)")

    def capped(start: int, end: int) -> uuid.UUID:
        span = (now - timedelta(minutes=start), now - timedelta(minutes=end))
        created = span[0] - timedelta(minutes=1)
        return seed(
            conn, ok, once, queue="capped", ran=span, finished_at=span[1], created_at=created
        )

    over |= {capped(50, 40), capped(45, 35)}
    capped(30, 25)

    def rated(key: str, every: float, n: int) -> uuid.UUID:
        """A job of the demo's rated type (5/s per key) started ``n`` times ``every``
        seconds after five minutes ago."""
        begun = now - timedelta(minutes=5) + timedelta(seconds=n * every)
        span = (begun, begun + timedelta(seconds=0.05))
        return seed(
            conn, ok, once, type="rated", payload=Jsonb({"key": key}), ran=span,
            finished_at=span[1], created_at=begun - timedelta(minutes=1),
        )  # fmt: skip

    over |= {rated("burst", 0.1, n) for n in range(7)}  # 7 within a second: 6 at most
    for n in range(2):
        rated("calm", 0.5, n)  # 2 a second
    singles = {
        Kind.EFFECTS_TWICE: seed(
            conn, ok, [(1, failed, False), (2, ok, True), (3, ok, True)], fence=3
        ),
        Kind.EFFECTS_WITHOUT_SUCCESS: seed(conn, dead, [(1, failed, True), (2, dead, False)]),
        Kind.SUCCEEDED_TWICE: seed(conn, ok, [(1, ok, False), (2, ok, False)]),
        Kind.STALE_OUTCOME: seed(conn, ok, [(1, ok, False), (2, lost, False)], fence=1),
        Kind.OVER_BUDGET: seed(
            conn, dead, [(1, failed, False), (2, failed, False), (3, dead, False)], budget=2
        ),
        Kind.OVERDUE_LEASE: seed(conn, "running", [(1, None, False)], expired=300),
        Kind.STUCK_QUEUED: seed(conn, "queued", [], due=3600),
    }
    wanted = {kind: {job} for kind, job in singles.items()}
    wanted[Kind.TICK_TWICE] = {
        seed(conn, ok, once, schedule="nightly", tick_at=tick) for _ in range(2)
    }
    wanted[Kind.UNIQUE_TWICE] = {holder, inserted}
    wanted[Kind.OVER_LIMIT] = over
    assert set(wanted) == set(Kind) - {Kind.VANISHED}  # (vanished: its own test below)
    return wanted


def by_kind(violations) -> dict[Kind, set[uuid.UUID]]:
    found: dict[Kind, set[uuid.UUID]] = {}
    for v in violations:
        found.setdefault(v.kind, set()).add(v.job_id)
    return found


def test_the_relays_pass_finds_each_seeded_violation_once_and_only_those(conn):
    wanted = seeded(conn)
    with conn.transaction():
        first = audit_pass(conn, CONFIG)
    assert first.checked == FINISHED and not first.skipped and not first.more_waiting
    found = by_kind(first.found)
    # the job with two successes breaks effects_twice and succeeded_twice together
    assert found.pop(Kind.SUCCEEDED_TWICE) == (
        wanted.pop(Kind.SUCCEEDED_TWICE) | wanted[Kind.EFFECTS_TWICE]
    )
    assert found == wanted
    assert all("has 2 jobs" in v.detail for v in first.found if v.kind == Kind.TICK_TWICE)
    with conn.transaction():
        again = audit_pass(conn, CONFIG)
    assert again.checked == 0 and again.found == ()  # the watermark moved; waiting ones known
    assert store_audit.violation_counts(conn)[str(Kind.OVERDUE_LEASE)] == 1
    state = store_audit.audit_state(conn)
    assert state is not None and state.jobs_checked == FINISHED and state.passes == 2


def test_a_pass_takes_a_batch_and_a_job_finished_again_is_checked_again(conn):
    ids = [seed(conn, "succeeded", [(1, "succeeded", True)]) for _ in range(3)]
    small = AuditorConfig(settle=0.0, batch=2)
    with conn.transaction():
        first = audit_pass(conn, small)
    assert first.checked == 2 and first.more_waiting
    with conn.transaction():
        assert audit_pass(conn, small).checked == 1
    # a stale worker finishes the first job again, under its old fence, later
    conn.execute(
        "INSERT INTO attempts (job_id, attempt, worker, fence, outcome, effects_committed) "
        "VALUES (%s, 2, 'worker-2', 2, 'succeeded', true)",
        (ids[0],),
    )
    conn.execute("UPDATE jobs SET finished_at = now() WHERE id = %s", (ids[0],))
    conn.commit()
    with conn.transaction():
        late = audit_pass(conn, small)
    assert late.checked == 1
    assert by_kind(late.found)[Kind.EFFECTS_TWICE] == {ids[0]}


def test_a_job_deleted_by_hand_is_found_vanished_and_the_pruners_deletes_are_not(conn):
    by_hand, on_purpose, old = (seed(conn, "succeeded", [(1, "succeeded", False)]) for _ in "abc")
    conn.execute("UPDATE jobs SET finished_at = now() - interval '30 days' WHERE id = %s", (old,))
    with conn.transaction():
        assert audit_pass(conn, CONFIG).found == ()
    conn.execute("DELETE FROM jobs WHERE id = %s", (by_hand,))
    conn.commit()
    with conn.transaction():
        conn.execute("SELECT set_config('leasework.deleting', 'deliberately', true)")
        conn.execute("DELETE FROM jobs WHERE id = %s", (on_purpose,))
    with conn.transaction():  # the pruner declares its deletes itself
        assert store.jobs_prune(conn, Status.SUCCEEDED, 7 * 86400.0, 10) == 1
    with conn.transaction():
        found = audit_pass(conn, CONFIG).found
    assert [(v.kind, v.job_id) for v in found] == [(Kind.VANISHED, by_hand)]
    assert "a succeeded ledger job" in found[0].detail and "not by the pruner" in found[0].detail
    with conn.transaction():
        assert audit_pass(conn, CONFIG).found == ()  # counted once
    report = audit_window(conn, None, None)
    assert [(v.kind, v.job_id) for v in report.violations] == [(Kind.VANISHED, by_hand)]


def test_a_second_relay_skips_the_pass_another_holds(conn):
    schema = conn.execute("SELECT current_schema() AS s").fetchone()["s"]
    with psycopg.connect(
        DIRECT_DSN, row_factory=dict_row, options=f"-c search_path={schema},public"
    ) as other:
        with conn.transaction(), other.transaction():
            assert not audit_pass(conn, CONFIG).skipped
            assert audit_pass(other, CONFIG).skipped


def test_the_cli_window_finds_what_the_pass_finds_and_nothing_outside_it(conn):
    wanted = seeded(conn)
    now = conn.execute("SELECT now() AS t").fetchone()["t"]
    report = audit_window(conn, now - timedelta(hours=1), None, lease_grace=30, stuck_after=600)
    assert report.jobs_checked == FINISHED and not report.valid
    assert {v.job_id for v in report.violations} == set().union(*wanted.values())
    assert len(report.violations) == len(set((v.kind, v.job_id) for v in report.violations))
    later = audit_window(conn, now - timedelta(seconds=10), None, lease_grace=30, stuck_after=600)
    assert later.jobs_checked == 0  # finished a minute ago: outside; the waiting ones are now
    assert by_kind(later.violations).keys() == {Kind.OVERDUE_LEASE, Kind.STUCK_QUEUED}


def test_the_completers_finish_records_the_effects_it_committed(conn):
    job_id = seed(conn, "running", [(7, None, False)])
    effect_ran = []
    done = Completion(
        job_id, 7, Outcome(Status.SUCCEEDED), effects=(lambda c: effect_ran.append(True),)
    )
    with conn.transaction():
        written = store.jobs_finish_many(conn, [done], dlq_topic="jobs.dlq")
    assert written == {job_id: Status.SUCCEEDED} and effect_ran == [True]
    row = conn.execute(
        "SELECT outcome, effects_committed FROM attempts WHERE job_id = %s", (job_id,)
    ).fetchone()
    assert row == {"outcome": "succeeded", "effects_committed": True}
    plain = seed(conn, "running", [(8, None, False)])
    with conn.transaction():
        store.jobs_finish_many(
            conn, [Completion(plain, 8, Outcome(Status.SUCCEEDED))], dlq_topic="x"
        )
    assert conn.execute(
        "SELECT effects_committed FROM attempts WHERE job_id = %s", (plain,)
    ).fetchone() == {"effects_committed": False}


def outbox_reads(conn) -> int:
    """Sequential scans of the outbox begun in this transaction (each rescan counts)."""
    return conn.execute(
        "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'outbox'::regclass"
    ).fetchone()["seq_scan"]


def test_a_backlog_stuck_since_the_last_analyze_costs_a_pass_no_read_of_the_outbox(conn):
    """2,000 jobs stuck for an hour that arrived after jobs was last analyzed, beside 300
    rows in the outbox: the stuck check finds them all by index probes. (Planned from the
    statistics, it expected a job or two and read the outbox once per stuck job: 2.2-2.6 s of
    Postgres a pass with 39,823 stuck jobs while the bench ran.)"""
    conn.execute("INSERT INTO queues (name, created_by) VALUES ('default', 't'), ('emails', 't')")
    conn.execute("UPDATE queues SET paused_at = now() WHERE name = 'emails'")
    jobs = """INSERT INTO jobs (id, type, payload, status, run_at, max_attempts, attempt_budget,
                                timeout_seconds, queue, finished_at)
              SELECT gen_random_uuid(), 'ledger', '{}', %(status)s,
                     now() - make_interval(secs => %(due)s), 5, 5, 30, %(queue)s,
                     CASE WHEN %(status)s = 'succeeded' THEN now() END
              FROM generate_series(1, %(n)s)"""
    conn.execute(jobs, {"status": "succeeded", "due": 7200, "queue": "default", "n": 5000})
    conn.execute("ANALYZE jobs")
    conn.execute("ANALYZE outbox")
    conn.execute(jobs, {"status": "queued", "due": 3600, "queue": "default", "n": 2000})
    conn.execute(jobs, {"status": "queued", "due": 3600, "queue": "emails", "n": 50})  # paused
    conn.execute(jobs, {"status": "queued", "due": 0, "queue": "default", "n": 300})
    conn.execute(  # the wake-ups of the 300 due now, on their way
        "INSERT INTO outbox (job_id, topic, key, value) SELECT id, 'jobs.ready', id::text, '{}' "
        "FROM jobs WHERE status = 'queued' AND run_at > now() - interval '1 minute'"
    )
    before = outbox_reads(conn)
    found = store_audit.waiting_violations(conn, lease_grace=30, stuck_after=600, limit=5000)
    assert outbox_reads(conn) - before <= 1
    assert len(found) == 2000 and {v.kind for v in found} == {Kind.STUCK_QUEUED}
    assert conn.execute("SHOW enable_seqscan").fetchone()["enable_seqscan"] == "on"
