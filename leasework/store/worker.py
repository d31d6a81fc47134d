"""The worker's and the reaper's statements: claim, stamp, heartbeat, fenced finish,
deferral, reaping. Every statement takes a whole batch; every row keeps its own fence."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import psycopg
from psycopg.types.json import Jsonb

from leasework.db import savepoint
from leasework.effects import Effect
from leasework.job import Job
from leasework.outcomes import Completion, Outcome
from leasework.queues import HELD_UNTIL, LIMIT_LOCK, PAUSE_LOCK
from leasework.states import TERMINAL, Status, transition
from leasework.store.common import (
    GENERIC_PLANS,
    JOB_COLUMNS,
    dead_letter_outbox_insert,
    one_round_trip,
    ready_outbox_insert,
    release_held,
)

READY_TOPIC = "jobs.ready"  # the deployment's ready topic unless the caller names it


def jobs_get_many(conn: psycopg.Connection, job_ids: list[uuid.UUID]) -> list[Job]:
    """The jobs of a batch of messages, in one query (missing ids are simply absent)."""
    if not job_ids:
        return []
    rows = conn.execute(
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE id = ANY(%s::uuid[])", (job_ids,)
    ).fetchall()
    return [Job.from_row(r) for r in rows]


# Every limit a claim's batch touches, locked in one order (LIMIT_LOCK, hash of the limit's
# name): its types' limit keys and its limited queues ('@' and the name). Its own statement,
# so that the stamp's statement, begun after, counts what every earlier stamp of those
# limits committed.
STAMP_LOCKS = """
SELECT count(pg_advisory_xact_lock(%(lock)s, l.h)) AS n FROM (
    SELECT DISTINCT hashtext(k.name) AS h FROM (
        SELECT leasework_limit_key(j.type, j.payload, t.concurrency) AS name
          FROM jobs j JOIN job_types t ON t.name = j.type AND t.concurrency IS NOT NULL
         WHERE j.id = ANY(%(ids)s::uuid[])
        UNION ALL
        SELECT '@' || q.name FROM queues q
         WHERE q.concurrency IS NOT NULL
           AND q.name IN (SELECT j.queue FROM jobs j WHERE j.id = ANY(%(ids)s::uuid[]))
    ) k ORDER BY 1 OFFSET 0) l"""

STAMP = f"""
WITH claim AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(fences)s::bigint[]) AS c(id, fence)),
candidate AS (
    SELECT c.id, c.fence, j.queue, q.concurrency AS queue_limit,
           coalesce(q.paused_at IS NOT NULL, false) AS paused,
           leasework_limit_key(j.type, j.payload, t.concurrency) AS limit_key,
           (t.concurrency->>'limit')::integer AS key_limit, t.rate
    FROM claim c
    -- "IS TRUE": not a condition the status index can serve, so each row is found by its
    -- primary key. Asked as a plain condition, the planner took the status index whenever
    -- its statistics said few jobs were queued, and under a backlog read every queued job
    -- for every claim (just bench's batch row: twice the CPU per job)
    JOIN jobs j ON j.id = c.id AND (j.status = 'queued') IS TRUE AND j.fence < c.fence
    -- (its type's row whatever its limits: a type with no concurrency limit has no limit key)
    LEFT JOIN job_types t ON t.name = j.type
    LEFT JOIN queues q ON q.name = j.queue),
load AS (
    -- the running jobs of each limit with this batch's jobs before it added, in id order
    SELECT candidate.*,
           CASE WHEN limit_key IS NOT NULL THEN
               row_number() OVER (PARTITION BY limit_key ORDER BY id)
               + (SELECT count(*) FROM jobs r
                   WHERE r.limit_key = candidate.limit_key AND r.status = 'running')
           END AS key_load,
           CASE WHEN queue_limit IS NOT NULL THEN
               row_number() OVER (PARTITION BY queue ORDER BY id)
               + (SELECT count(*) FROM jobs r
                   WHERE r.queue = candidate.queue AND r.status = 'running')
           END AS queue_load
    FROM candidate WHERE NOT paused),
fits AS (
    SELECT load.*,
           CASE WHEN key_load > key_limit THEN limit_key
                WHEN queue_load > queue_limit THEN '@' || queue END AS over
    FROM load),
-- started_at is this statement's start, after the limits' locks were granted, not the
-- transaction's (now(), before the wait): a stamp that waited for another while a job of its
-- limit finished would otherwise seem to have begun before that finish, and the auditor,
-- which compares attempts' spans, to find one job too many running (chaos scenario w)
started AS (
    UPDATE jobs SET status = 'running', attempt = jobs.attempt + 1,
           fence = fits.fence, lease_owner = %(worker)s,
           lease_expires_at = now() + make_interval(secs => %(ttl)s),
           started_at = statement_timestamp(), updated_at = now(),
           limit_key = fits.limit_key, held_for = NULL, rate_slot_at = NULL
    FROM fits
    WHERE fits.over IS NULL AND jobs.id = fits.id AND (jobs.status = 'queued') IS TRUE
      AND jobs.fence < fits.fence
    RETURNING jobs.*, fits.key_limit AS applied_key_limit,
              fits.queue_limit AS applied_queue_limit, fits.rate AS applied_rate),
held AS (
    UPDATE jobs SET status = 'scheduled', run_at = %(until)s, held_for = fits.over,
           last_error = 'held: over its concurrency limit (' || fits.over
                        || '); it runs once a slot frees up',
           updated_at = now()
    FROM fits
    WHERE fits.over IS NOT NULL AND jobs.id = fits.id AND (jobs.status = 'queued') IS TRUE
    RETURNING jobs.*),
-- each attempt with the limits this stamp held it to (migration 0025): the auditor judges its
-- start by them, not by the limits as set when it looks
opened AS (
    INSERT INTO attempts (job_id, attempt, worker, fence, started_at, limits_recorded,
                          key_limit, queue_limit, rate)
    SELECT id, attempt, %(worker)s, fence, started_at, true,
           applied_key_limit, applied_queue_limit, applied_rate FROM started)
SELECT {JOB_COLUMNS} FROM started
UNION ALL
SELECT {JOB_COLUMNS} FROM held"""


@dataclass(frozen=True)
class Stamped:
    """What a claim's stamp did: the jobs it started (``running`` under their fences) and
    the jobs it held because a concurrency limit was full (``scheduled``, waiting for a
    slot; no attempt spent)."""

    started: list[Job]
    held: list[Job]


def jobs_start_many(
    conn: psycopg.Connection, claims: list[tuple[uuid.UUID, int]], *, worker: str, ttl: float
) -> Stamped:
    """Stamp a batch of queued jobs ``running``, each under its own fence, and open their
    attempt rows, in one statement. Each row keeps its own condition: still ``queued``, a
    fence above the stored one (Postgres guards monotonicity even if Redis hands out an old
    token), its queue not paused, and room under its concurrency limits (its type's key's
    and its queue's, counted from ``running`` rows). A job over a limit is held instead.
    The jobs neither started nor held were not ``queued``, had a stale token or wait in a
    paused queue.

    Three statements in one round trip (:func:`one_round_trip`; with ``BEGIN`` and
    ``COMMIT`` too on an autocommit connection, :meth:`leasework.db.Database.transact`):
    :data:`PAUSE_LOCK` shared (a pause holds it exclusively while it commits, so no job
    starts once a pause has committed), the batch's limits' locks (:data:`STAMP_LOCKS`), the
    stamp, which begins after both."""
    if not claims:
        return Stamped([], [])
    ids = [c[0] for c in claims]
    with one_round_trip(conn):
        conn.execute(GENERIC_PLANS)
        conn.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", PAUSE_LOCK, prepare=True)
        conn.execute(STAMP_LOCKS, {"lock": LIMIT_LOCK, "ids": ids}, prepare=True)
        cur = conn.execute(
            STAMP,
            {
                "ids": ids,
                "fences": [c[1] for c in claims],
                "worker": worker,
                "ttl": ttl,
                "until": HELD_UNTIL,
            },
            prepare=True,
        )
    jobs = [Job.from_row(r) for r in cur.fetchall()]
    return Stamped(
        [j for j in jobs if j.status == Status.RUNNING],
        [j for j in jobs if j.status == Status.SCHEDULED],
    )


HELD = "held: its queue is paused; it runs once the queue is resumed"


def jobs_hold_paused(conn: psycopg.Connection, job_ids: list[uuid.UUID]) -> list[Job]:
    """Queued jobs a claim found in a paused queue wait for its resume: ``scheduled`` with
    ``run_at`` :data:`HELD_UNTIL` (the promoter never finds them due; the resume makes them due
    now), no lease, no attempt spent, no deferral counted. Jobs no longer queued, or whose
    queue is not paused (resumed meanwhile), are left alone."""
    if not job_ids:
        return []
    transition(Status.QUEUED, Status.SCHEDULED)
    rows = conn.execute(
        f"""UPDATE jobs SET status = 'scheduled', run_at = %(until)s, last_error = %(why)s,
                   held_for = NULL, updated_at = now()
            WHERE id = ANY(%(ids)s::uuid[]) AND (status = 'queued') IS TRUE  -- (by id)
              AND EXISTS (SELECT 1 FROM queues q
                          WHERE q.name = jobs.queue AND q.paused_at IS NOT NULL)
            RETURNING {JOB_COLUMNS}""",
        {"ids": job_ids, "why": HELD, "until": HELD_UNTIL},
    ).fetchall()
    return [Job.from_row(r) for r in rows]


def jobs_wait_rate(
    conn: psycopg.Connection, waits: list[tuple[uuid.UUID, str, int, int, str]]
) -> list[uuid.UUID]:
    """Queued jobs whose rate limit reserved them a later start wait for it: ``scheduled``,
    due a little before it, carrying the reservation (``rate_key``, ``rate_slot_at``) so
    that their next claim waits out the rest and starts them without asking again; no
    attempt spent, no deferral counted. ``waits``: (job id, limit key, start and due time in
    ms since the epoch, why). Returns the ids written (jobs no longer queued are left
    alone)."""
    if not waits:
        return []
    transition(Status.QUEUED, Status.SCHEDULED)
    rows = conn.execute(
        """UPDATE jobs SET status = 'scheduled', run_at = w.due, rate_key = w.key,
                  rate_slot_at = w.at, last_error = w.why, updated_at = now()
           FROM (SELECT id, key, to_timestamp(ms / 1000.0) AS at,
                        to_timestamp(due / 1000.0) AS due, why
                 FROM unnest(%s::uuid[], %s::text[], %s::bigint[], %s::bigint[], %s::text[])
                      AS u(id, key, ms, due, why)) w
           WHERE jobs.id = w.id AND (jobs.status = 'queued') IS TRUE  -- (by id)
           RETURNING jobs.id""",
        (
            [w[0] for w in waits],
            [w[1] for w in waits],
            [w[2] for w in waits],
            [w[3] for w in waits],
            [w[4] for w in waits],
        ),
    ).fetchall()
    return [r["id"] for r in rows]


def rate_floors(conn: psycopg.Connection, keys: list[str]) -> dict[str, int]:
    """The latest start reserved for a waiting job of each limit of ``keys``, in ms since
    the epoch (absent: none): where a rate limit whose Redis state was lost starts again."""
    rows = conn.execute(
        """SELECT rate_key, (extract(epoch FROM max(rate_slot_at)) * 1000)::bigint AS ms
           FROM jobs WHERE rate_key = ANY(%s) AND rate_slot_at IS NOT NULL
           GROUP BY rate_key""",
        (keys,),
    ).fetchall()
    return {r["rate_key"]: int(r["ms"]) for r in rows}


def jobs_heartbeat_many(
    conn: psycopg.Connection, leases: list[tuple[uuid.UUID, int]], ttl: float
) -> dict[uuid.UUID, bool]:
    """Extend the Postgres view of a batch of leases in one statement. Returns, for each job
    still running under its fence, whether a cancel was requested; a job absent from the
    answer has lost its lease (a newer claim, the reaper)."""
    if not leases:
        return {}
    rows = conn.execute(
        """UPDATE jobs SET lease_expires_at = now() + make_interval(secs => %(ttl)s)
           FROM unnest(%(ids)s::uuid[], %(fences)s::bigint[]) AS h(id, fence)
           WHERE jobs.id = h.id AND jobs.fence = h.fence AND jobs.status = 'running'
           RETURNING jobs.id, jobs.cancel_requested""",
        {
            "ids": [lease[0] for lease in leases],
            "fences": [lease[1] for lease in leases],
            "ttl": ttl,
        },
    ).fetchall()
    return {r["id"]: bool(r["cancel_requested"]) for r in rows}


def jobs_defer_many(
    conn: psycopg.Connection, job_ids: list[uuid.UUID], *, base: float, cap: float, reason: str
) -> list[Job]:
    """Queued jobs whose type this worker does not know (a rolling deploy) wait for a later
    ``run_at``: no lease, no attempt spent. The wait doubles with every deferral, from
    ``base`` up to ``cap`` (half fixed, half random). Jobs no longer queued are left alone."""
    if not job_ids:
        return []
    transition(Status.QUEUED, Status.SCHEDULED)
    rows = conn.execute(
        f"""UPDATE jobs SET status = 'scheduled', deferrals = deferrals + 1,
                   run_at = now() + make_interval(secs =>
                       least(%(cap)s, %(base)s * power(2, least(deferrals, 30)))
                       * (0.5 + random() / 2)),
                   last_error = %(reason)s, updated_at = now()
            WHERE id = ANY(%(ids)s::uuid[]) AND status = 'queued'
            RETURNING {JOB_COLUMNS}""",
        {"ids": job_ids, "base": base, "cap": cap, "reason": reason},
    ).fetchall()
    return [Job.from_row(r) for r in rows]


FINISH_MANY = f"""
WITH done AS (
    SELECT * FROM jsonb_to_recordset(%(done)s)
        AS d(id uuid, fence bigint, status text, error text, retry float8, result jsonb,
             effects boolean)),
finished AS (
    UPDATE jobs SET status = done.status, last_error = done.error, result = done.result,
           run_at = CASE WHEN done.retry IS NULL THEN jobs.run_at
                         ELSE now() + make_interval(secs => done.retry) END,
           lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
           finished_at = CASE WHEN done.status = ANY(%(terminal)s)
                              THEN now() END
    FROM done
    WHERE jobs.id = done.id AND jobs.fence = done.fence AND jobs.status = 'running'
    RETURNING jobs.id, jobs.fence, jobs.type, jobs.status, jobs.attempt, jobs.last_error,
              jobs.payload, done.effects, jobs.limit_key, jobs.queue),
closed AS (
    UPDATE attempts SET finished_at = now(), outcome = finished.status,
           error = finished.last_error,
           effects_committed = attempts.effects_committed OR coalesce(finished.effects, false)
    FROM finished WHERE attempts.job_id = finished.id AND attempts.fence = finished.fence),
dead AS ({dead_letter_outbox_insert("finished")}),
-- the slots these finishes free: for each, a job its limit (its key's, its queue's) held is
-- queued again at once, oldest first (the relay's pass releases what this misses)
freed AS (
    SELECT s.slot, count(*) AS n
    FROM finished CROSS JOIN LATERAL (VALUES (finished.limit_key), ('@' || finished.queue))
         AS s(slot)
    WHERE s.slot IS NOT NULL GROUP BY s.slot),
{release_held("freed", "slot", "freed.n")},
wake AS ({ready_outbox_insert("released", "%(ready)s")})
SELECT id, status FROM finished
"""


def _held(conn: psycopg.Connection, completions: list[Completion]) -> set[uuid.UUID]:
    """Lock the rows whose fence still holds: their effects may run, and no one can take the
    job from under them before this transaction ends."""
    rows = conn.execute(
        """SELECT jobs.id FROM jobs
           JOIN unnest(%s::uuid[], %s::bigint[]) AS c(id, fence)
             ON jobs.id = c.id AND jobs.fence = c.fence
           WHERE jobs.status = 'running'
           ORDER BY jobs.id FOR UPDATE OF jobs""",
        ([c.job_id for c in completions], [c.fence for c in completions]),
    ).fetchall()
    return {r["id"] for r in rows}


def _apply_effects(conn: psycopg.Connection, jobs: list[Completion]) -> dict[uuid.UUID, Exception]:
    """Run the effects of ``jobs`` (their rows locked, their fences holding); returns the
    failure of each job whose effects raised, with its effects undone. All run first in one
    savepoint (two round trips for the batch); only if one raises are they run again, one
    savepoint per job, so the failing job is found and the others keep theirs."""
    everything = [effect for c in jobs for effect in c.effects]
    if effects_apply(conn, everything) is None:
        return {}
    failures = {}
    for c in jobs:
        failure = effects_apply(conn, list(c.effects))
        if failure is not None:
            failures[c.job_id] = failure
    return failures


def _ours_already(
    conn: psycopg.Connection, completions: list[Completion]
) -> dict[uuid.UUID, Status]:
    """Outcomes of ``completions`` that an earlier try of this same write committed (its
    answer was lost): the attempt under that very fence is closed with an outcome other than
    the reaper's. Only the worker holding the fence writes one, so it is ours."""
    rows = conn.execute(
        """SELECT attempts.job_id, attempts.outcome FROM attempts
           JOIN unnest(%s::uuid[], %s::bigint[]) AS c(id, fence)
             ON attempts.job_id = c.id AND attempts.fence = c.fence
           WHERE attempts.outcome IS NOT NULL AND attempts.outcome <> 'lease_expired'""",
        ([c.job_id for c in completions], [c.fence for c in completions]),
    ).fetchall()
    return {r["job_id"]: Status(r["outcome"]) for r in rows}


def jobs_finish_many(
    conn: psycopg.Connection,
    completions: list[Completion],
    *,
    dlq_topic: str,
    ready_topic: str = READY_TOPIC,
    retrying: bool = False,
) -> dict[uuid.UUID, Status]:
    """The fenced terminal write of a batch: each job's outcome, attempt row and effects, only
    where its own fence still holds, in one transaction. Returns the status written per job;
    a job absent from the answer was rejected by the fence (a newer claim holds it) and none
    of its effects ran. An effect that raises is undone and turns that job's outcome into
    ``effect_failed(exc)``; the other jobs of the batch are not touched. The attempt row of a
    job whose effects committed says so (``effects_committed``: the auditor counts them, one
    per job at most). ``retrying``: an
    earlier try may have committed without its answer arriving; rows it wrote are reported
    as written, not as rejected."""
    outcomes = {c.job_id: c.outcome for c in completions}
    for outcome in outcomes.values():
        transition(Status.RUNNING, outcome.status)  # raises on an outcome running cannot reach
    with_effects = [c for c in completions if c.effects and c.outcome.status == Status.SUCCEEDED]
    applied: set[uuid.UUID] = set()  # jobs whose effects ran and stay: the attempt says so
    if with_effects:
        held = _held(conn, with_effects)
        failures = _apply_effects(conn, [c for c in with_effects if c.job_id in held])
        applied = {c.job_id for c in with_effects if c.job_id in held} - set(failures)
        for c in with_effects:
            if (failure := failures.get(c.job_id)) is None:
                continue
            message = f"a fenced effect raised {type(failure).__name__}: {failure}"[:2000]
            outcome = (
                c.effect_failed(failure)
                if c.effect_failed is not None
                else Outcome(Status.FAILED, message, retry_in=0.0)
            )
            transition(Status.RUNNING, outcome.status)
            outcomes[c.job_id] = outcome
    done = [
        {
            "id": str(c.job_id),
            "fence": c.fence,
            "status": str(outcomes[c.job_id].status),
            "error": outcomes[c.job_id].error,
            "retry": outcomes[c.job_id].retry_in,
            "result": outcomes[c.job_id].result,
            "effects": c.job_id in applied,
        }
        for c in completions
    ]
    with conn.pipeline():  # after the effects: they keep the session's plan_cache_mode
        conn.execute(GENERIC_PLANS)
        cur = conn.execute(
            FINISH_MANY,
            {
                "done": Jsonb(done),
                "dlq": dlq_topic,
                "ready": ready_topic,
                "terminal": [str(s) for s in TERMINAL],
            },
            prepare=True,
        )
        rows = cur.fetchall()
    written = {r["id"]: Status(r["status"]) for r in rows}
    if retrying and len(written) < len(completions):
        missing = [c for c in completions if c.job_id not in written]
        written.update(_ours_already(conn, missing))
    return written


def jobs_unfence_many(conn: psycopg.Connection, claims: list[tuple[uuid.UUID, int]]) -> None:
    """UNSAFE, for the plain-TTL demonstration only: put each job back to ``running`` under
    the given fence whatever happened meanwhile, so the fenced write that follows matches."""
    conn.execute(
        """UPDATE jobs SET status = 'running', fence = c.fence
           FROM unnest(%s::uuid[], %s::bigint[]) AS c(id, fence) WHERE jobs.id = c.id""",
        ([c[0] for c in claims], [c[1] for c in claims]),
    )


def effects_apply(conn: psycopg.Connection, effects: list[Effect]) -> Exception | None:
    """Run a handler's fenced effects in a savepoint of the open transaction. An effect that
    raises (a bug, a constraint of the user's table) is undone with the others and returned:
    the attempt failed, nothing of it commits. A lost connection propagates (retry the write)."""
    try:
        with savepoint(conn, "leasework_effects"):
            for effect in effects:
                effect(conn)
    except Exception as exc:  # the user's code: any failure is the attempt's
        if conn.broken or isinstance(exc, psycopg.InterfaceError):
            raise
        return exc
    return None


def fence_max(conn: psycopg.Connection) -> int:
    """The largest fence Postgres has stored: the floor for re-seeding the Redis counter."""
    return int(conn.execute("SELECT coalesce(max(fence), 0) AS f FROM jobs").fetchone()["f"])


def jobs_expired(conn: psycopg.Connection, limit: int) -> list[Job]:
    """Lock up to ``limit`` running jobs whose lease expired, longest expired first, for the
    reaper's write in the same transaction; rows another reaper holds are skipped."""
    rows = conn.execute(
        f"""SELECT {JOB_COLUMNS} FROM jobs
            WHERE status = 'running' AND lease_expires_at < now()
            ORDER BY lease_expires_at LIMIT %s FOR UPDATE SKIP LOCKED""",
        (limit,),
    ).fetchall()
    return [Job.from_row(r) for r in rows]


REAP_MANY = f"""
WITH reaped AS (
    SELECT * FROM jsonb_to_recordset(%(reaped)s)
        AS r(id uuid, fence bigint, status text, error text, retry float8)),
taken AS (
    UPDATE jobs SET status = reaped.status, last_error = reaped.error, result = NULL,
           run_at = CASE WHEN reaped.retry IS NULL THEN jobs.run_at
                         ELSE now() + make_interval(secs => reaped.retry) END,
           lease_owner = NULL, lease_expires_at = NULL, updated_at = now(),
           finished_at = CASE WHEN reaped.status = ANY(%(terminal)s) THEN now() END
    FROM reaped
    WHERE jobs.id = reaped.id AND jobs.fence = reaped.fence AND jobs.status = 'running'
    RETURNING jobs.id, jobs.fence, jobs.type, jobs.status, jobs.attempt, jobs.last_error,
              jobs.payload),
closed AS (
    UPDATE attempts SET finished_at = now(), outcome = 'lease_expired', error = taken.last_error
    FROM taken WHERE attempts.job_id = taken.id AND attempts.fence = taken.fence
                 AND attempts.finished_at IS NULL),
dead AS ({dead_letter_outbox_insert("taken")})
SELECT id, status FROM taken
"""


def jobs_reap_many(
    conn: psycopg.Connection, reaped: list[Completion], *, dlq_topic: str
) -> dict[uuid.UUID, Status]:
    """Take back a batch of expired leases with the outcomes the reaper decided (``failed``
    with its retry delay, or ``dead``), in one statement: each row only while it is still
    running under its own fence, its attempt closed as ``lease_expired`` with the outcome's
    error, a dead job's dead letter in the outbox. The fence is left as it is, so the lost
    worker's terminal write (conditioned on ``status = 'running'`` and its fence) matches
    nothing. Returns the status written per job (rows locked by :func:`jobs_expired` in the
    same transaction are all written)."""
    if not reaped:
        return {}
    for completion in reaped:
        transition(Status.RUNNING, completion.outcome.status)  # raises before any write
    rows = conn.execute(
        REAP_MANY,
        {
            "reaped": Jsonb(
                [
                    {
                        "id": str(c.job_id),
                        "fence": c.fence,
                        "status": str(c.outcome.status),
                        "error": c.outcome.error,
                        "retry": c.outcome.retry_in,
                    }
                    for c in reaped
                ]
            ),
            "dlq": dlq_topic,
            "terminal": [str(s) for s in TERMINAL],
        },
    ).fetchall()
    return {r["id"]: Status(r["status"]) for r in rows}
