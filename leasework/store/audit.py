"""The auditor's statements (connections give rows as dicts): finished jobs from a watermark
with their attempts, the running and waiting jobs that break a bound now, the violations
found, and the watermark itself (:mod:`leasework.audit` holds the invariants)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from leasework.audit import (
    AttemptRow,
    FinishedJob,
    Kind,
    LimitSpan,
    RateRule,
    RateStart,
    Violation,
    attempt_row,
    cap_limits,
    check_finished,
    check_limits,
    check_rates,
    check_ticks,
    check_unique_keys,
    finished_job,
    key_jobs,
    limit_judged,
    overdue_lease,
    queue_capped,
    stuck_queued,
    tick_job,
)
from leasework.states import TERMINAL

NIL = uuid.UUID(int=0)
_TERMINAL = [str(s) for s in sorted(TERMINAL)]


@dataclass(frozen=True)
class Watermark:
    """Finished jobs up to and including (``finished_at``, ``job_id``) have been checked."""

    finished_at: datetime | None  # None: nothing checked yet
    job_id: uuid.UUID | None = None


@dataclass(frozen=True)
class AuditState:
    watermark: Watermark
    passes: int
    jobs_checked: int
    last_pass_at: datetime | None
    started_at: datetime
    vanished_after: int = 0


def audit_state(conn: psycopg.Connection, *, lock: bool = False) -> AuditState | None:
    """The auditor's row; with ``lock``, locked for this transaction, or None when another
    relay's pass holds it (``SKIP LOCKED``: it is auditing, this one need not)."""
    row = conn.execute(
        "SELECT finished_after, after_id, passes, jobs_checked, last_pass_at, started_at, "
        "vanished_after "
        "FROM invariant_audit WHERE id = 1" + (" FOR UPDATE SKIP LOCKED" if lock else "")
    ).fetchone()
    if row is None:
        return None
    return AuditState(
        Watermark(row["finished_after"], row["after_id"]),
        int(row["passes"]),
        int(row["jobs_checked"]),
        row["last_pass_at"],
        row["started_at"],
        int(row["vanished_after"]),
    )


# A batch of finished jobs with their attempts, in one statement: one snapshot, so each job's
# row (its budget, its fence) is the one its attempts were read with. (Read in two
# statements, an operator's retry and its new attempt committed between them made the job
# seem over its budget and its outcome stale.)
FINISHED = """
WITH batch AS MATERIALIZED (
    SELECT id, type, status, fence, attempt, max_attempts, finished_at, schedule, tick_at,
           unique_key, limit_key, queue
    FROM jobs
    WHERE status = ANY(%(terminal)s::text[])
      AND finished_at >= coalesce(%(after)s, '-infinity'::timestamptz)
      AND (finished_at > coalesce(%(after)s, '-infinity'::timestamptz) OR id > %(after_id)s)
      AND finished_at <= least(coalesce(%(until)s, 'infinity'::timestamptz),
                               now() - make_interval(secs => %(settle)s))
    ORDER BY finished_at, id
    LIMIT %(limit)s)
SELECT b.*, a.attempt AS a_attempt, a.fence AS a_fence, a.outcome AS a_outcome,
       a.effects_committed AS a_effects_committed, a.limits_recorded AS a_limits_recorded,
       a.key_limit AS a_key_limit, a.queue_limit AS a_queue_limit, a.rate AS a_rate
FROM batch b
-- (OFFSET 0: not flattened into a join, so each job's attempts are one index probe; as a
-- join, the planner hashed the whole attempts table for a batch)
LEFT JOIN LATERAL (SELECT attempt, fence, outcome, effects_committed, limits_recorded,
                          key_limit, queue_limit, rate
                   FROM attempts WHERE attempts.job_id = b.id OFFSET 0) a ON true
ORDER BY b.finished_at, b.id"""


def finished_since(
    conn: psycopg.Connection,
    after: Watermark,
    *,
    until: datetime | None = None,
    settle: float = 0.0,
    limit: int,
) -> tuple[list[FinishedJob], list[AttemptRow]]:
    """Up to ``limit`` finished jobs after ``after`` in (finished_at, id) order, finished no
    later than ``until`` nor than ``settle`` seconds ago (a transaction that stamped
    finished_at and has not committed yet must not be overtaken), and all their attempts,
    read together (:data:`FINISHED`). Through ``jobs_finished_idx``: the cost follows the
    batch, not the table."""
    rows = conn.execute(
        FINISHED,
        {
            "terminal": _TERMINAL,
            "after": after.finished_at,
            "after_id": after.job_id or NIL,
            "until": until,
            "settle": settle,
            "limit": limit,
        },
    ).fetchall()
    jobs: dict[uuid.UUID, FinishedJob] = {}
    attempts: list[AttemptRow] = []
    for r in rows:
        if r["id"] not in jobs:
            jobs[r["id"]] = finished_job(r)
        if r["a_attempt"] is not None:  # (a job with no attempt: one row, its own)
            attempts.append(attempt_row({"job_id": r["id"], **_attempt_columns(r)}))
    return list(jobs.values()), attempts


def _attempt_columns(row: dict) -> dict:
    """The attempt's columns of a row of :data:`FINISHED` (named ``a_`` and the column)."""
    return {name[len("a_") :]: value for name, value in row.items() if name.startswith("a_")}


def finished_violations(
    conn: psycopg.Connection, jobs: list[FinishedJob], attempts: list[AttemptRow]
) -> list[Violation]:
    """What the finished ``jobs`` (with all their ``attempts``) break: their own invariants,
    and their ticks' and unique keys' against every other job that carries them (through
    jobs_schedule_tick_idx and jobs_unique_key_all_idx, migration 0010: one look-up each for
    the batch, and none when no job of it came from a schedule or had a key), and their
    limits' against the other attempts of each limit, each start held to the limits its
    stamp recorded (or, recorded nothing, to those in force now)."""
    if not jobs:
        return []
    found = check_finished(jobs, attempts)
    ticked = [j for j in jobs if j.schedule is not None and j.tick_at is not None]
    if ticked:
        rows = conn.execute(
            """SELECT j.id, j.schedule, j.tick_at, j.created_at
               FROM (SELECT DISTINCT * FROM unnest(%s::text[], %s::timestamptz[]))
                    AS t(schedule, tick_at)
               JOIN jobs j ON j.schedule = t.schedule AND j.tick_at = t.tick_at""",
            ([j.schedule for j in ticked], [j.tick_at for j in ticked]),
        ).fetchall()
        found += check_ticks(ticked, [tick_job(r) for r in rows], schedule_deletions(conn, ticked))
    keyed = [j for j in jobs if j.unique_key is not None]
    if keyed:
        rows = conn.execute(
            """SELECT id, unique_key, finished_at,
                      status = ANY(%s::text[])
                      AND leasework_unique_holds(unique_states, status) AS holds_final
               FROM jobs WHERE unique_key = ANY(%s::bytea[])""",
            (_TERMINAL, [j.unique_key for j in keyed]),
        ).fetchall()
        spans = conn.execute(
            "SELECT job_id, started_at, finished_at FROM attempts WHERE job_id = ANY(%s::uuid[])",
            ([r["id"] for r in rows],),
        ).fetchall()
        found += check_unique_keys(keyed, key_jobs(rows, spans))
    of: dict[uuid.UUID, list[AttemptRow]] = {}
    for row in attempts:
        of.setdefault(row.job_id, []).append(row)
    if any(j.limit_key is not None for j in jobs):
        limits = type_limits(conn)
        limited = [
            j
            for j in jobs
            if j.limit_key is not None
            and limit_judged(of.get(j.id, []), "key_limit", _type_of(j.limit_key) in limits)
        ]
        if limited:
            found += check_limits(limited, limit_spans(conn, limited), limits)
    caps = queue_caps(conn)
    if capped := queue_capped(jobs, caps, attempts):
        found += check_limits(capped, queue_spans(conn, capped), cap_limits(caps))
    rules = type_rates(conn)
    rated = [j for j in jobs if limit_judged(of.get(j.id, []), "rate", j.type in rules)]
    if rated:
        found += check_rates(rated, rate_starts(conn, rated, of, rules), rules)
    return found


def _type_of(limit_key: str) -> str:
    """The type a limit key is of (its name, before any '/' and the key's value)."""
    return limit_key.split("/", 1)[0]


def schedule_deletions(
    conn: psycopg.Connection, ticked: list[FinishedJob]
) -> dict[str, list[datetime]]:
    """When each schedule of the names of ``ticked`` was deleted (migration 0025: a schedule
    deleted and created again under its name is another schedule), oldest first."""
    rows = conn.execute(
        "SELECT name, deleted_at FROM schedule_deletions WHERE name = ANY(%s) "
        "ORDER BY name, deleted_at",
        (sorted({j.schedule for j in ticked if j.schedule is not None}),),
    ).fetchall()
    deletions: dict[str, list[datetime]] = {}
    for r in rows:
        deletions.setdefault(r["name"], []).append(r["deleted_at"])
    return deletions


def _attempts_window(conn: psycopg.Connection, jobs: list[FinishedJob]) -> dict | None:
    """``lo`` and ``hi``: when the first attempt of ``jobs`` started and the last one
    (None: none started). The limits are judged at their starts, so the attempts that
    matter are those running (or, for a rate, started) between them."""
    own = conn.execute(
        "SELECT min(started_at) AS lo, max(started_at) AS hi FROM attempts "
        "WHERE job_id = ANY(%s::uuid[])",
        ([j.id for j in jobs],),
    ).fetchone()
    return None if own["lo"] is None else own


def limit_spans(conn: psycopg.Connection, limited: list[FinishedJob]) -> list[LimitSpan]:
    """The attempts of every job of the limits of ``limited`` that may have run at one of
    their starts (through jobs_limit_key_idx, migration 0015: created before the last of
    them, not finished before the first), each with the type's limit its stamp recorded."""
    if (own := _attempts_window(conn, limited)) is None:
        return []
    rows = conn.execute(
        """SELECT a.job_id, j.limit_key, a.started_at, a.finished_at, a.limits_recorded,
                  a.key_limit AS recorded_limit
           FROM jobs j JOIN attempts a ON a.job_id = j.id
           WHERE j.limit_key = ANY(%(keys)s) AND j.created_at <= %(hi)s
             AND (j.finished_at IS NULL OR j.finished_at >= %(lo)s)""",
        {"keys": sorted({j.limit_key for j in limited}), "lo": own["lo"], "hi": own["hi"]},
    ).fetchall()
    return [_limit_span(r) for r in rows if r["started_at"] is not None]


def _limit_span(row: dict) -> LimitSpan:
    return LimitSpan(
        row["job_id"],
        row["limit_key"],
        row["started_at"],
        row["finished_at"],
        recorded=bool(row["limits_recorded"]),
        limit=row["recorded_limit"],
    )


def queue_spans(conn: psycopg.Connection, capped: list[FinishedJob]) -> list[LimitSpan]:
    """The attempts of every job of the queues of ``capped`` (jobs of limit ``@<queue>``)
    that may have run at one of their starts: created before the last of them, and finished
    after the first or not finished (through jobs_finished_idx and jobs_status_created_idx),
    each with the queue's cap its stamp recorded."""
    if (own := _attempts_window(conn, capped)) is None:
        return []
    rows = conn.execute(
        """SELECT a.job_id, '@' || j.queue AS limit_key, a.started_at, a.finished_at,
                  a.limits_recorded, a.queue_limit AS recorded_limit
           FROM jobs j JOIN attempts a ON a.job_id = j.id
           WHERE j.queue = ANY(%(queues)s) AND j.created_at <= %(hi)s
             AND ((j.status = ANY(%(terminal)s::text[]) AND j.finished_at >= %(lo)s)
                  OR j.status <> ALL(%(terminal)s::text[]))""",
        {
            "queues": sorted({j.queue for j in capped}),
            "terminal": _TERMINAL,
            "lo": own["lo"],
            "hi": own["hi"],
        },
    ).fetchall()
    return [_limit_span(r) for r in rows if r["started_at"] is not None]


def rate_starts(
    conn: psycopg.Connection,
    rated: list[FinishedJob],
    attempts: dict[uuid.UUID, list[AttemptRow]],
    rules: dict[str, RateRule],
) -> list[RateStart]:
    """The starts of every job of the types of ``rated`` within a rate's period before one
    of theirs (the longest period of the rates their starts are held to: recorded on their
    ``attempts``, or their types' now), each with the rate its stamp recorded and its key
    under that rate (or, recorded nothing, under its type's rate now); only those of the
    keys of the starts of ``rated``. Its type's jobs created before the last of those
    starts, finished since the first less a period, or not finished (through
    jobs_type_status_created_idx and jobs_finished_idx)."""
    if (own := _attempts_window(conn, rated)) is None:
        return []
    held_to = [r.rate for j in rated for r in attempts.get(j.id, []) if r.rate is not None]
    held_to += [rules[j.type] for j in rated if j.type in rules]
    if not held_to:
        return []
    per = timedelta(seconds=max(rule.per for rule in held_to))
    rows = conn.execute(
        """SELECT a.job_id, a.started_at, a.limits_recorded, a.rate,
                  leasework_limit_key(j.type, j.payload,
                                      CASE WHEN a.limits_recorded THEN a.rate ELSE t.rate END)
                      AS rate_key
           FROM jobs j LEFT JOIN job_types t ON t.name = j.type
           JOIN attempts a ON a.job_id = j.id
           WHERE j.type = ANY(%(types)s) AND j.created_at <= %(hi)s
             AND ((j.status = ANY(%(terminal)s::text[]) AND j.finished_at >= %(lo)s)
                  OR j.status <> ALL(%(terminal)s::text[]))
             AND a.started_at >= %(lo)s AND a.started_at <= %(hi)s""",
        {
            "types": sorted({j.type for j in rated if j.type is not None}),
            "terminal": _TERMINAL,
            "lo": own["lo"] - per,
            "hi": own["hi"],
        },
    ).fetchall()
    ids = {j.id for j in rated}
    keys = {r["rate_key"] for r in rows if r["job_id"] in ids}
    return [
        RateStart(
            r["job_id"],
            r["rate_key"],
            r["started_at"],
            recorded=bool(r["limits_recorded"]),
            rule=RateRule.of(r["rate"]),
        )
        for r in rows
        if r["rate_key"] is not None and r["rate_key"] in keys
    ]


def type_rates(conn: psycopg.Connection) -> dict[str, RateRule]:
    """Each type's rate limit as registered now (for the attempts that recorded none)."""
    rows = conn.execute(
        "SELECT name, rate FROM job_types WHERE jsonb_typeof(rate) = 'object'"
    ).fetchall()
    return {r["name"]: rule for r in rows if (rule := RateRule.of(r["rate"])) is not None}


def queue_caps(conn: psycopg.Connection) -> dict[str, int]:
    """Each capped queue's concurrency cap as set now (for the attempts that recorded
    none)."""
    rows = conn.execute("SELECT name, concurrency FROM queues WHERE concurrency IS NOT NULL")
    return {r["name"]: int(r["concurrency"]) for r in rows.fetchall()}


def type_limits(conn: psycopg.Connection) -> dict[str, int]:
    """Each type's concurrency limit as registered now (for the attempts that recorded
    none)."""
    rows = conn.execute(
        "SELECT name, (concurrency->>'limit')::integer AS n FROM job_types "
        "WHERE concurrency IS NOT NULL"
    ).fetchall()
    return {r["name"]: int(r["n"]) for r in rows if r["n"] is not None}


# Jobs due for longer than the bound with nothing on their way to a worker. Due since the
# later of run_at and the insert (created_at): a job inserted with a run_at long past (a
# schedule's backfilled tick, a submit's past run_at) was not waiting before it existed, and
# paged as stuck the moment it was published, before a worker could start it.
STUCK_QUEUED = """
    SELECT j.id, extract(epoch FROM now() - greatest(j.run_at, j.created_at))::float8 AS due
    FROM jobs j
    WHERE j.status = 'queued' AND j.run_at < now() - make_interval(secs => %(bound)s)
      AND j.created_at < now() - make_interval(secs => %(bound)s)
      AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = j.id)
      AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = j.id
                      AND a.started_at > now() - make_interval(secs => %(bound)s))
      -- a paused queue's jobs wait by design, and a resumed one's get the bound anew
      AND NOT EXISTS (SELECT 1 FROM queues q WHERE q.name = j.queue
                      AND (q.paused_at IS NOT NULL OR
                           q.resumed_at > now() - make_interval(secs => %(bound)s)))
    ORDER BY j.run_at LIMIT %(limit)s"""


def _by_index(conn: psycopg.Connection, query: str, params: dict[str, Any]) -> list[Any]:
    """``query``'s rows, planned with sequential scans off. The stuck check probes the outbox
    and the attempts once per candidate job; a backlog that built up since ``jobs`` was last
    analyzed is estimated at a job or two, and the planner then read the whole outbox once per
    stuck job (2.2-2.6 s of Postgres a pass, every pass, with 39,823 stuck jobs beside the
    outbox of a running bench). With the setting off each probe is an index lookup whatever
    the statistics say. It is local to the transaction (a savepoint if one is open) and put
    back after; a failure rolls it back with the savepoint."""
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as setting:
        was, _ = setting.execute(
            "SELECT current_setting('enable_seqscan'), set_config('enable_seqscan', 'off', true)"
        ).fetchone()
        rows = conn.execute(query, params).fetchall()
        setting.execute("SELECT set_config('enable_seqscan', %s, true)", (was,))
    return rows


def waiting_violations(
    conn: psycopg.Connection, *, lease_grace: float, stuck_after: float, limit: int
) -> list[Violation]:
    """What breaks a bound now: jobs running past their lease by more than ``lease_grace``
    seconds, and jobs due for more than ``stuck_after`` with no outbox row and no attempt
    started since (at most ``limit`` of each; through ``jobs_lease_idx`` and the queued
    jobs, whatever the finished ones number)."""
    overdue = conn.execute(
        """SELECT id, extract(epoch FROM now() - lease_expires_at)::float8 AS overdue,
                  lease_owner
           FROM jobs WHERE status = 'running'
             AND lease_expires_at < now() - make_interval(secs => %s)
           ORDER BY lease_expires_at LIMIT %s""",
        (lease_grace, limit),
    ).fetchall()
    stuck = _by_index(conn, STUCK_QUEUED, {"bound": stuck_after, "limit": limit})
    return [overdue_lease(r["id"], r["overdue"], r["lease_owner"]) for r in overdue] + [
        stuck_queued(r["id"], r["due"]) for r in stuck
    ]


def violations_record(conn: psycopg.Connection, violations: list[Violation]) -> list[Violation]:
    """Record ``violations``; returns those not recorded before (one row per kind and job)."""
    if not violations:
        return []
    rows = conn.execute(
        """INSERT INTO invariant_violations (kind, job_id, detail)
           SELECT * FROM unnest(%s::text[], %s::uuid[], %s::text[])
           ON CONFLICT (kind, job_id) DO NOTHING
           RETURNING kind, job_id, detail""",
        (
            [str(v.kind) for v in violations],
            [v.job_id for v in violations],
            [v.detail for v in violations],
        ),
    ).fetchall()
    return [Violation(Kind(r["kind"]), r["job_id"], r["detail"]) for r in rows]


def audit_advance(
    conn: psycopg.Connection, watermark: Watermark, checked: int, vanished_after: int | None
) -> None:
    conn.execute(
        """UPDATE invariant_audit SET finished_after = coalesce(%s, finished_after),
                  after_id = coalesce(%s, after_id), passes = passes + 1,
                  jobs_checked = jobs_checked + %s, last_pass_at = now(),
                  vanished_after = coalesce(%s, vanished_after)
           WHERE id = 1""",
        (watermark.finished_at, watermark.job_id, checked, vanished_after),
    )


@dataclass(frozen=True)
class Checked:
    """What one pass did: finished jobs checked, the violations it recorded that were new,
    the watermark after it; ``skipped`` when another relay's pass held the auditor's row."""

    checked: int
    found: tuple[Violation, ...]
    watermark: Watermark | None
    skipped: bool = False


def audit_pass(
    conn: psycopg.Connection,
    *,
    batch: int,
    settle: float,
    lease_grace: float,
    stuck_after: float,
) -> Checked:
    """One auditor pass in the caller's transaction: lock the auditor's row (or skip), check
    up to ``batch`` finished jobs after the watermark and the waiting ones, record the
    violations, advance the watermark."""
    state = audit_state(conn, lock=True)
    if state is None:
        return Checked(0, (), None, skipped=True)
    jobs, attempts = finished_since(conn, state.watermark, settle=settle, limit=batch)
    violations = finished_violations(conn, jobs, attempts) + waiting_violations(
        conn, lease_grace=lease_grace, stuck_after=stuck_after, limit=batch
    )
    new = violations_record(conn, violations)
    watermark = Watermark(jobs[-1].finished_at, jobs[-1].id) if jobs else state.watermark
    vanished = vanished_since(conn, state.vanished_after, limit=batch)
    audit_advance(conn, watermark, len(jobs), vanished[-1][0] if vanished else None)
    return Checked(len(jobs), tuple(new) + tuple(v for _, v in vanished), watermark)


def vanished_since(
    conn: psycopg.Connection, after: int, *, limit: int
) -> list[tuple[int, Violation]]:
    """The ``vanished`` violations the delete trigger recorded after row ``after`` (id,
    violation), oldest first."""
    rows = conn.execute(
        "SELECT id, job_id, detail FROM invariant_violations WHERE kind = %s AND id > %s "
        "ORDER BY id LIMIT %s",
        (str(Kind.VANISHED), after, limit),
    ).fetchall()
    return [(int(r["id"]), Violation(Kind.VANISHED, r["job_id"], r["detail"])) for r in rows]


def vanished_between(
    conn: psycopg.Connection, since: datetime | None, until: datetime | None
) -> list[Violation]:
    """The ``vanished`` violations recorded in ``since``..``until`` (for ``leasework audit``)."""
    rows = conn.execute(
        "SELECT job_id, detail FROM invariant_violations WHERE kind = %s "
        "AND found_at >= coalesce(%s, '-infinity'::timestamptz) "
        "AND found_at <= coalesce(%s, 'infinity'::timestamptz) ORDER BY id",
        (str(Kind.VANISHED), since, until),
    ).fetchall()
    return [Violation(Kind.VANISHED, r["job_id"], r["detail"]) for r in rows]


def violations_recent(conn: psycopg.Connection, limit: int = 200) -> list[dict[str, Any]]:
    """The latest violations found, newest first, each with its job's type and status."""
    return conn.execute(
        """SELECT v.kind, v.job_id, v.detail, v.found_at, j.type, j.status
           FROM invariant_violations v LEFT JOIN jobs j ON j.id = v.job_id
           ORDER BY v.found_at DESC, v.id DESC LIMIT %s""",
        (limit,),
    ).fetchall()


def violation_counts(conn: psycopg.Connection) -> dict[str, int]:
    """Every violation recorded and kept, by kind."""
    rows = conn.execute(
        "SELECT kind, count(*) AS n FROM invariant_violations GROUP BY kind"
    ).fetchall()
    return {r["kind"]: int(r["n"]) for r in rows}
