"""The auditor on a real Postgres: a schema of the test's own with the product's jobs,
attempts, outbox and auditor tables (their indexes too), so that seeded violations never
reach the stack's own auditor. A job seeded to break each invariant must be found, by the
relay's pass and by ``leasework audit``'s window; the clean ones must not; and the
completer's own finish must record the effects it committed.

Each fact is judged by what held when it happened: a cap, a type's limit or a rate lowered
while jobs ran (the limits each claim recorded), an operator's retry committed between the
auditor's reads, a lease recorded under a TTL since changed; and, on the stack itself, a
schedule deleted and created again whose backfill fires its old ticks again, a unique
policy changed between two jobs of a key: none of them found, a seeded real violation
still found."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from leasework import store
from leasework.audit import Kind, attempt_row, finished_job
from leasework.audit.commands import audit_window
from leasework.outcomes import Completion, Outcome
from leasework.relay.auditor import AuditorConfig, audit_pass
from leasework.states import TERMINAL, Status
from leasework.store import audit as store_audit
from tests.integration.conftest import DIRECT_DSN, wait_for, wait_status

TABLES = (
    "jobs",
    "attempts",
    "outbox",
    "invariant_audit",
    "invariant_violations",
    "queues",
    "schedule_deletions",
)
CONFIG = AuditorConfig(settle=0.0, lease_grace=30.0, stuck_after=600.0)
FINISHED = 49  # the finished jobs seeded() makes


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
    ``ran`` = (started, finished), with the limits ``applied`` by their claims (key_limit,
    queue_limit, rate: recorded, as a stamp since migration 0025 does), or none recorded;
    any other ``job`` column set after the insert."""
    job_id = uuid.uuid4()
    ran = job.pop("ran", None)
    applied = job.pop("applied", None)
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
    limits = {"key_limit": None, "queue_limit": None, "rate": None, **(applied or {})}
    for n, (f, outcome, effects) in enumerate(attempts, start=1):
        conn.execute(
            """INSERT INTO attempts (job_id, attempt, worker, fence, outcome, effects_committed,
                                     started_at, finished_at, limits_recorded, key_limit,
                                     queue_limit, rate)
               VALUES (%s, %s, 'worker-1', %s, %s, %s,
                       coalesce(%s, now() - interval '2 hours'), %s, %s, %s, %s, %s)""",
            (
                job_id, n, f, outcome, effects, *(ran or (None, None)), applied is not None,
                limits["key_limit"], limits["queue_limit"],
                Jsonb(limits["rate"]) if limits["rate"] else None,
            ),
        )  # fmt: skip
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

    def limited(limit_key: str, start: float, end: float, **applied) -> uuid.UUID:
        """A job of the demo's keyed type (limit 2 per key, as its workers register it now)
        that ran under ``limit_key`` from ``start`` to ``end`` minutes ago, its claim having
        applied ``applied`` (or, none given, recorded nothing: held to the limit now)."""
        span = (now - timedelta(minutes=start), now - timedelta(minutes=end))
        created = span[0] - timedelta(minutes=1)
        return seed(
            conn, ok, once, limit_key=limit_key, ran=span, finished_at=span[1],
            created_at=created, applied=applied or None,
        )  # fmt: skip

    limited("keyed/fine", 50, 40)  # two at once: at its limit, not over it
    limited("keyed/fine", 48, 42)
    limited("keyed/over", 50, 40)
    limited("keyed/over", 48, 42)
    over = {limited("keyed/over", 45, 30)}  # a third started while both ran: it is named
    # three at once under the limit of 3 their claims applied (lowered to 2 since)
    for start in (50, 49, 48):
        limited("keyed/lowered", start, 40, key_limit=3)
    # a queue capped at one running job: two that overlapped, and one alone after them
    conn.execute("INSERT INTO queues (name, created_by, concurrency) VALUES ('capped', 't', 1)")

    def capped(start: float, end: float, queue: str = "capped", **applied) -> uuid.UUID:
        span = (now - timedelta(minutes=start), now - timedelta(minutes=end))
        created = span[0] - timedelta(minutes=1)
        return seed(
            conn, ok, once, queue=queue, ran=span, finished_at=span[1], created_at=created,
            applied=applied or None,
        )  # fmt: skip

    capped(50, 40)
    over.add(capped(45, 35))  # started while the first ran
    capped(30, 25)
    # a queue whose cap went down from 4 to 2 while four of its jobs ran: the stamp held the
    # next until fewer than two ran; a later one started while two ran (a real violation)
    conn.execute("INSERT INTO queues (name, created_by, concurrency) VALUES ('lowered', 't', 2)")
    for start, end in ((50, 40), (49, 41), (48, 42), (47, 43)):
        capped(start, end, "lowered", queue_limit=4)
    capped(40.5, 30, "lowered", queue_limit=2)  # with the first: two
    capped(40, 30, "lowered", queue_limit=2)  # as the first finished
    over.add(capped(35, 33, "lowered", queue_limit=2))

    def rated(key: str, every: float, n: int, **applied) -> uuid.UUID:
        """A job of the demo's rated type (5/s per key, as registered now) started ``n``
        times ``every`` seconds after five minutes ago."""
        begun = now - timedelta(minutes=5) + timedelta(seconds=n * every)
        span = (begun, begun + timedelta(seconds=0.05))
        return seed(
            conn, ok, once, type="rated", payload=Jsonb({"key": key}), ran=span,
            finished_at=span[1], created_at=begun - timedelta(minutes=1),
            applied=applied or None,
        )  # fmt: skip

    for n in range(6):
        rated("burst", 0.1, n)
    over.add(rated("burst", 0.1, 6))  # the seventh within a second: 6 at most
    for n in range(2):
        rated("calm", 0.5, n)  # 2 a second
    fast = {"count": 10, "per": 1.0, "burst": 1, "key": "key"}  # lowered to 5/s since
    for n in range(8):
        rated("lowered", 0.1, n, rate=fast)
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
        Kind.STUCK_QUEUED: seed(
            conn, "queued", [], due=3600, created_at=now - timedelta(hours=1, minutes=1)
        ),
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
                                timeout_seconds, queue, finished_at, created_at)
              SELECT gen_random_uuid(), 'ledger', '{}', %(status)s,
                     now() - make_interval(secs => %(due)s), 5, 5, 30, %(queue)s,
                     CASE WHEN %(status)s = 'succeeded' THEN now() END,
                     now() - make_interval(secs => %(due)s)
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


def in_schema(conn) -> psycopg.Connection:
    """Another connection to the test's schema (rows as dicts, not autocommit)."""
    schema = conn.execute("SELECT current_schema() AS s").fetchone()["s"]
    return psycopg.connect(
        DIRECT_DSN, row_factory=dict_row, options=f"-c search_path={schema},public"
    )


def waits_for_a_lock(conn, pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row["wait_event_type"] == "Lock"


def test_an_operators_retry_committed_while_a_pass_reads_the_job_is_no_violation(conn):
    """A job dead after its 3 attempts of 3 is retried by an operator (its budget raised to
    3 + 3) and its fourth attempt stamped while an auditor's pass is reading it. Read
    together (one statement), the job is dead with three attempts or running with four;
    read apart, dead with four: over its budget and its outcome stale (fence 4 past its 3).
    The retried run, finished, is held to the budget the retry granted."""
    failed = [(1, "failed", False), (2, "failed", False), (3, "dead", False)]
    job_id = seed(conn, "dead", failed, budget=3)
    result: dict = {}
    with in_schema(conn) as operator, in_schema(conn) as auditor:
        # the operator's transaction holds the attempts table: the pass waits to read it
        operator.execute("LOCK TABLE attempts IN ACCESS EXCLUSIVE MODE")

        def audit() -> None:
            with auditor.transaction():
                result["pass"] = audit_pass(auditor, CONFIG)

        reading = threading.Thread(target=audit)
        reading.start()
        pid = auditor.info.backend_pid
        wait_for(lambda: waits_for_a_lock(conn, pid), 10, "the pass to wait for the attempts")
        retried = store.job_retry(operator, job_id, "jobs.ready")
        assert retried.outcome == store.RetryOutcome.RETRIED
        assert retried.job is not None and retried.job.max_attempts == 6
        stamped = store.jobs_start_many(operator, [(job_id, 4)], worker="worker-2", ttl=30)
        assert [j.attempt for j in stamped.started] == [4]
        operator.commit()
        reading.join(30)
    assert result["pass"].found == ()
    conn.commit()
    finished = Completion(job_id, 4, Outcome(Status.SUCCEEDED))
    with conn.transaction():
        assert store.jobs_finish_many(conn, [finished], dlq_topic="jobs.dlq") == {
            job_id: Status.SUCCEEDED
        }
    with conn.transaction():
        again = audit_pass(conn, CONFIG)
    assert again.checked == 1 and again.found == ()  # 4 attempts, max_attempts 6


def test_a_lease_is_judged_as_its_claim_recorded_it_whatever_the_ttl_is_now(conn):
    """A worker whose lease TTL was an hour claimed a job and kept its lease by heartbeats;
    the TTL is 10 s now (LEASEWORK_LEASE_TTL's default). Running two hours, its lease ahead
    of it: not overdue (by its start and today's TTL it would be). A job claimed under a
    TTL of 0.2 s with no heartbeat is overdue once its lease is past the grace, whatever
    the TTL now."""
    long_held, short_held = (seed(conn, "queued", [], due=0) for _ in range(2))
    with conn.transaction():
        store.jobs_start_many(conn, [(long_held, 1)], worker="worker-1", ttl=3600)
        assert store.jobs_heartbeat_many(conn, [(long_held, 1)], ttl=3600) == {long_held: False}
        conn.execute(  # it has run for two hours
            "UPDATE jobs SET started_at = now() - interval '2 hours' WHERE id = %s", (long_held,)
        )
        conn.execute(
            "UPDATE attempts SET started_at = now() - interval '2 hours' WHERE job_id = %s",
            (long_held,),
        )
        store.jobs_start_many(conn, [(short_held, 1)], worker="worker-2", ttl=0.2)

    def overdue() -> set[uuid.UUID]:
        with conn.transaction():
            found = store_audit.waiting_violations(conn, lease_grace=1.0, stuck_after=600, limit=50)
        return {v.job_id for v in found if v.kind == Kind.OVERDUE_LEASE}

    assert wait_for(overdue, 10, "the short lease to be overdue") == {short_held}


# ---------------------------------------------------------------- on the stack itself


def audited(db, ids: list) -> list:
    """What the auditor finds of the finished jobs ``ids`` (read only; nothing recorded),
    as the stack's tables have them."""
    rows = db.execute(
        """SELECT j.id, j.type, j.status, j.fence, j.attempt, j.max_attempts, j.finished_at,
                  j.schedule, j.tick_at, j.unique_key, j.limit_key, j.queue
           FROM jobs j WHERE j.id = ANY(%s::uuid[])""",
        (ids,),
    ).fetchall()
    attempts = db.execute(
        "SELECT * FROM attempts WHERE job_id = ANY(%s::uuid[])", (ids,)
    ).fetchall()
    jobs = [finished_job(r) for r in rows]
    assert len(jobs) == len(ids) and all(j.status in TERMINAL for j in jobs)
    return store_audit.finished_violations(db, jobs, [attempt_row(a) for a in attempts])


def recorded_by_the_stacks_auditor(db, ids: list) -> list:
    """The violations the stack's own auditor recorded of ``ids``, once its watermark has
    passed all of them."""
    last = db.execute(
        "SELECT max(finished_at) AS t FROM jobs WHERE id = ANY(%s::uuid[])", (ids,)
    ).fetchone()["t"]
    wait_for(
        lambda: db.execute(
            "SELECT finished_after >= %s AS past FROM invariant_audit", (last,)
        ).fetchone()["past"],
        90,
        "the stack's auditor to pass the jobs",
    )
    return db.execute(
        "SELECT kind, job_id, detail FROM invariant_violations WHERE job_id = ANY(%s::uuid[])",
        (ids,),
    ).fetchall()


def test_a_schedule_created_again_under_its_name_may_fire_the_deleted_ones_ticks_again(client, db):
    """The api has no edit: a schedule is changed by deleting it and creating it again
    under its name. The new one has no ticks, and a backfill of a range the old one fired
    rightly fires those instants again, as its own. No tick_twice; and two jobs of one
    tick of one schedule (seeded as the unsafe scheduler would make them) still are."""
    name = f"t-audit-{uuid.uuid4().hex[:10]}"
    definition = {"name": name, "type": "noop", "cron": "0 12 * * *"}
    days = {"from": "2026-01-01T00:00:00Z", "until": "2026-01-03T23:59:59Z"}
    fired = []
    try:
        for payload in ({"v": 1}, {"v": 2}):  # the second: the schedule as changed
            created = client.http.post("/schedules", json={**definition, "payload": payload})
            assert created.status_code == 201, created.text
            backfill = client.http.post(f"/schedules/{name}/backfill", json=days)
            assert backfill.status_code == 200, backfill.text
            fired += [t["job_id"] for t in backfill.json()["fired"]]
            assert client.http.delete(f"/schedules/{name}").status_code == 200
    finally:
        client.http.delete(f"/schedules/{name}")
    assert len(fired) == 6  # three instants, each fired by both schedules of the name
    for job_id in fired:
        wait_status(client, job_id, {"succeeded"})
    assert audited(db, fired) == []
    assert recorded_by_the_stacks_auditor(db, fired) == []


def test_a_unique_policy_changed_between_two_jobs_of_a_key_judges_each_by_its_own(client, db):
    """The first job of a key asked its key to hold while it was unfinished only; once it
    succeeded the key was free, and the second, whose policy holds the key in succeeded
    too, was inserted and ran. Judged by the second's policy, the first would have held the
    key when the second ran; each is judged by the states its own insert recorded."""
    key = Jsonb({"k": uuid.uuid4().hex})

    def enqueue(states: str) -> str:
        return str(
            db.execute(
                f"SELECT leasework_enqueue('noop', %s, unique_fields => ARRAY['k']{states}) AS id",
                (key,),
            ).fetchone()["id"]
        )

    first = enqueue("")
    wait_status(client, first, {"succeeded"})
    keeps = ", unique_states => ARRAY['scheduled', 'queued', 'running', 'failed', 'succeeded']"
    second = enqueue(keeps)
    assert second != first  # the key was free
    wait_status(client, second, {"succeeded"})
    assert enqueue(keeps) == second  # now it holds
    states = db.execute(
        "SELECT id, unique_states FROM jobs WHERE id = ANY(%s::uuid[])", ([first, second],)
    ).fetchall()
    assert {str(r["id"]): r["unique_states"] for r in states} == {first: 23, second: 31}
    assert audited(db, [first, second]) == []
    assert recorded_by_the_stacks_auditor(db, [first, second]) == []


def test_the_cli_says_to_migrate_when_the_schema_is_older_than_the_code(conn, monkeypatch, capsys):
    """A database before migration 0025 (the attempts without the limits their claims
    applied): ``leasework audit`` says to migrate, not a traceback."""
    from leasework import cli

    conn.execute("ALTER TABLE attempts DROP COLUMN limits_recorded")
    conn.commit()
    schema = conn.execute("SELECT current_schema() AS s").fetchone()["s"]
    dsn = f"{DIRECT_DSN}?options=-csearch_path%3D{schema}%2Cpublic"
    monkeypatch.setenv("LEASEWORK_POSTGRES_DSN", dsn)
    assert cli.main(["audit", "--since", "1h"]) == 1
    err = capsys.readouterr().err
    assert "older than this leasework" in err and "limits_recorded" in err
    assert "run `leasework migrate`" in err


def test_a_job_inserted_with_a_run_at_long_past_is_due_since_its_insert(conn):
    """A schedule's backfill inserts each tick's job with the tick's instant as its run_at,
    months ago. Published and not started yet (the workers take a backfill of a thousand
    ticks in turn) it is not stuck: it has been due since it was inserted, not since its
    run_at. One inserted as long ago as the bound, and still not started, is."""
    now = conn.execute("SELECT now() AS t").fetchone()["t"]
    seed(conn, "queued", [], due=90 * 86400)  # backfilled: inserted now
    waited = seed(conn, "queued", [], due=90 * 86400, created_at=now - timedelta(hours=1))
    with conn.transaction():
        found = store_audit.waiting_violations(conn, lease_grace=30, stuck_after=600, limit=50)
    assert [(v.kind, v.job_id) for v in found] == [(Kind.STUCK_QUEUED, waited)]
    assert found[0].detail.startswith("queued and due for 3600s")
