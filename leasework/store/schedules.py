"""Schedules and their ticks (migration 0006): reconcile an app's declarations, create, list,
pause, resume, delete, trigger, backfill, and the scheduler's fire pass.

Every tick a schedule handles is one row of ``schedule_ticks``, unique on
``(schedule, nominal_at)``, inserted with its job (through ``leasework_jobs_insert``, the one
insert path of every door) in the transaction that moves the schedule's ``next_fire_at`` on
by compare-and-set. A tick another transaction already recorded inserts nothing here, so it
never gets a second job; a compare-and-set that finds ``next_fire_at`` moved raises
:class:`Raced` and the whole transaction rolls back.

:func:`schedules_fire_due_unsafe` is the same pass without those guards, for the chaos
harness's run that must find doubled ticks (``LEASEWORK_UNSAFE_SCHEDULER``) and nothing else.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from leasework.schedules import CatchUp, Definition, Overlap, Plan, SkipReason
from leasework.states import Status
from leasework.store.common import Row
from leasework.store.submit import jobs_insert

# the states in which a schedule's run counts against its overlap policy (every state but
# the terminal ones; migration 0006's partial index names the same)
UNFINISHED = tuple(str(s) for s in (Status.SCHEDULED, Status.QUEUED, Status.RUNNING, Status.FAILED))

# what an insert writes: every column but the two timestamps, which default to now()
INSERT_COLUMNS = (
    "name, type, payload, cron, timezone, overlap, catch_up, catch_up_limit, grace_seconds, "
    "paused, next_fire_at, source, declared_by"
)
SCHEDULE_COLUMNS = INSERT_COLUMNS + ", created_at, updated_at"


class Raced(RuntimeError):
    """Another transaction moved a schedule's next fire time while this one held it: this
    one rolls back (its ticks and jobs with it) and the next pass starts over."""


@dataclass(frozen=True)
class StoredSchedule:
    """A schedule as stored: its definition and its state."""

    definition: Definition
    paused: bool
    next_fire_at: datetime | None
    source: str
    declared_by: str | None
    created_at: datetime
    updated_at: datetime

    @property
    def name(self) -> str:
        return self.definition.name

    @classmethod
    def from_row(cls, row: Row) -> StoredSchedule:
        return cls(
            definition=Definition(
                name=row["name"],
                type=row["type"],
                cron=row["cron"],
                payload=row["payload"],
                timezone=row["timezone"],
                overlap=Overlap(row["overlap"]),
                catch_up=CatchUp(row["catch_up"]),
                catch_up_limit=row["catch_up_limit"],
                grace_seconds=row["grace_seconds"],
            ),
            paused=row["paused"],
            next_fire_at=row["next_fire_at"],
            source=row["source"],
            declared_by=row["declared_by"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True)
class LastTick:
    """A schedule's latest tick: when it stood for, what became of it, and its job's state."""

    nominal_at: datetime
    outcome: str
    reason: str | None
    source: str
    job_id: uuid.UUID | None
    job_status: str | None  # None once the job was pruned, or for a skip


@dataclass(frozen=True)
class ScheduleView:
    """A schedule for a listing: itself, its latest tick and its tick counts."""

    schedule: StoredSchedule
    last: LastTick | None
    fired: int
    skipped: int


def _definition_row(d: Definition) -> dict[str, Any]:
    return {**d.as_json(), "payload": Jsonb(d.payload)}


def schedules_reconcile(
    conn: psycopg.Connection, definitions: Sequence[Definition], declared_by: str, now: datetime
) -> list[str]:
    """Store an app's declared schedules: new ones start at their first tick after ``now``;
    existing ones take the declared definition, keep their pause, and keep their next fire
    time unless the calendar (cron or time zone) changed. A schedule of the same name
    created over the API becomes the app's. Returns the names of schedules the app declared
    before (source ``app``) but no longer does: left as they are, for an operator to delete."""
    for d in definitions:
        conn.execute(
            f"""INSERT INTO schedules AS s ({INSERT_COLUMNS})
                VALUES (%(name)s, %(type)s, %(payload)s, %(cron)s, %(timezone)s, %(overlap)s,
                        %(catch_up)s, %(catch_up_limit)s, %(grace_seconds)s, false,
                        %(next_fire_at)s, 'app', %(declared_by)s)
                ON CONFLICT (name) DO UPDATE SET
                    type = excluded.type, payload = excluded.payload, cron = excluded.cron,
                    timezone = excluded.timezone, overlap = excluded.overlap,
                    catch_up = excluded.catch_up, catch_up_limit = excluded.catch_up_limit,
                    grace_seconds = excluded.grace_seconds, source = 'app',
                    declared_by = excluded.declared_by, updated_at = now(),
                    next_fire_at = CASE
                        WHEN (s.cron, s.timezone)
                             IS DISTINCT FROM (excluded.cron, excluded.timezone)
                        THEN excluded.next_fire_at ELSE s.next_fire_at END
                WHERE (s.type, s.payload, s.cron, s.timezone, s.overlap, s.catch_up,
                       s.catch_up_limit, s.grace_seconds, s.source)
                      IS DISTINCT FROM
                      (excluded.type, excluded.payload, excluded.cron, excluded.timezone,
                       excluded.overlap, excluded.catch_up, excluded.catch_up_limit,
                       excluded.grace_seconds, 'app')""",
            {
                **_definition_row(d),
                "next_fire_at": d.first_fire_at(now),
                "declared_by": declared_by,
            },
        )
    rows = conn.execute(
        "SELECT name FROM schedules WHERE source = 'app' AND NOT name = ANY(%s) ORDER BY name",
        ([d.name for d in definitions],),
    ).fetchall()
    return [r["name"] for r in rows]


def schedule_create(
    conn: psycopg.Connection, definition: Definition, created_by: str, now: datetime
) -> StoredSchedule | None:
    """Create a schedule (source ``api``); None if one of that name exists."""
    row = conn.execute(
        f"""INSERT INTO schedules ({INSERT_COLUMNS})
            VALUES (%(name)s, %(type)s, %(payload)s, %(cron)s, %(timezone)s, %(overlap)s,
                    %(catch_up)s, %(catch_up_limit)s, %(grace_seconds)s, false,
                    %(next_fire_at)s, 'api', %(declared_by)s)
            ON CONFLICT (name) DO NOTHING RETURNING {SCHEDULE_COLUMNS}""",
        {
            **_definition_row(definition),
            "next_fire_at": definition.first_fire_at(now),
            "declared_by": created_by,
        },
    ).fetchone()
    return StoredSchedule.from_row(row) if row else None


def schedule_get(
    conn: psycopg.Connection, name: str, *, for_update: bool = False
) -> StoredSchedule | None:
    """A schedule; None if there is no such schedule. ``for_update`` locks it for the rest of
    the caller's transaction (a fire pass holding it is waited for)."""
    lock = " FOR UPDATE" if for_update else ""
    row = conn.execute(
        f"SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE name = %s{lock}", (name,)
    ).fetchone()
    return StoredSchedule.from_row(row) if row else None


# a schedule's columns with its latest tick's (``last_*``, the tick's job's status too), for
# a listing: SELECT {_WITH_LAST_TICK} FROM schedules s {_LAST_TICK_JOIN}
_WITH_LAST_TICK = f"""s.{SCHEDULE_COLUMNS.replace(", ", ", s.")},
       last.nominal_at AS last_nominal_at, last.outcome AS last_outcome,
       last.reason AS last_reason, last.source AS last_source,
       last.job_id AS last_job_id, j.status AS last_job_status"""
_LAST_TICK_JOIN = """
    LEFT JOIN LATERAL (
        SELECT nominal_at, outcome, reason, source, job_id FROM schedule_ticks t
        WHERE t.schedule = s.name ORDER BY recorded_at DESC, nominal_at DESC LIMIT 1
    ) last ON true
    LEFT JOIN jobs j ON j.id = last.job_id"""


def schedule_list(conn: psycopg.Connection) -> list[ScheduleView]:
    """Every schedule by name, with its latest tick (and that tick's job's state) and how
    many ticks it fired and skipped (those the pruner still keeps)."""
    rows = conn.execute(
        f"""SELECT {_WITH_LAST_TICK},
                   counts.fired, counts.skipped
            FROM schedules s {_LAST_TICK_JOIN}
            LEFT JOIN LATERAL (
                SELECT count(*) FILTER (WHERE outcome = 'fired') AS fired,
                       count(*) FILTER (WHERE outcome = 'skipped') AS skipped
                FROM schedule_ticks t WHERE t.schedule = s.name
            ) counts ON true
            ORDER BY s.name"""
    ).fetchall()
    return [
        ScheduleView(StoredSchedule.from_row(r), _last_tick(r), r["fired"], r["skipped"])
        for r in rows
    ]


def _last_tick(row: Row) -> LastTick | None:
    """The ``last_*`` columns of a listing's row as its latest tick (None: no tick yet)."""
    if row["last_nominal_at"] is None:
        return None
    return LastTick(
        row["last_nominal_at"],
        row["last_outcome"],
        row["last_reason"],
        row["last_source"],
        row["last_job_id"],
        row["last_job_status"],
    )


@dataclass(frozen=True)
class TickRecord:
    nominal_at: datetime
    outcome: str
    reason: str | None
    source: str
    job_id: uuid.UUID | None
    job_status: str | None
    recorded_at: datetime


def schedule_ticks(conn: psycopg.Connection, name: str, limit: int) -> list[TickRecord]:
    """A schedule's latest ``limit`` ticks, newest first, each with its job's state."""
    rows = conn.execute(
        """SELECT t.nominal_at, t.outcome, t.reason, t.source, t.job_id, j.status AS job_status,
                  t.recorded_at
           FROM schedule_ticks t LEFT JOIN jobs j ON j.id = t.job_id
           WHERE t.schedule = %s ORDER BY t.recorded_at DESC, t.nominal_at DESC LIMIT %s""",
        (name, limit),
    ).fetchall()
    return [TickRecord(**r) for r in rows]


def schedule_set_paused(
    conn: psycopg.Connection, name: str, paused: bool, next_fire_at: datetime | None
) -> StoredSchedule | None:
    """Pause, or resume from ``next_fire_at`` (the first tick after now: ticks that came due
    while paused are not run). None if there is no such schedule."""
    row = conn.execute(
        f"""UPDATE schedules SET paused = %s, updated_at = now(),
                   next_fire_at = CASE WHEN %s THEN next_fire_at ELSE %s END
            WHERE name = %s RETURNING {SCHEDULE_COLUMNS}""",
        (paused, paused, next_fire_at, name),
    ).fetchone()
    return StoredSchedule.from_row(row) if row else None


def schedule_delete(conn: psycopg.Connection, name: str) -> StoredSchedule | None:
    """Delete a schedule and its ticks, returning it as it was; None if there was no such
    schedule. Its jobs stay (they keep the schedule's name)."""
    row = conn.execute(
        f"DELETE FROM schedules WHERE name = %s RETURNING {SCHEDULE_COLUMNS}", (name,)
    ).fetchone()
    return StoredSchedule.from_row(row) if row else None


@dataclass(frozen=True)
class Tick:
    """One tick to record: fired (``job_id`` the job it inserts) or skipped (``reason``;
    ``duplicate_of``, for reason ``unique``: the job that held the unique key)."""

    nominal_at: datetime
    source: str
    job_id: uuid.UUID | None = None
    reason: SkipReason | None = None
    duplicate_of: uuid.UUID | None = None


def _record_ticks(
    conn: psycopg.Connection,
    schedule: Definition,
    ticks: Sequence[Tick],
    topic: str,
    *,
    refire_skipped: bool = False,
    unguarded: bool = False,
) -> list[Tick]:
    """Insert ``ticks`` of ``schedule`` and a job for each fired one that no transaction
    recorded before (``refire_skipped``: a tick recorded as skipped fires after all, the
    backfill's way; ``unguarded``, UNSAFE: every fired tick gets its job, recorded here or
    not). A fired tick whose job would be a duplicate (its type's unique key is held) writes
    no job: its row becomes a skip, reason ``unique``, naming the holder. Returns the ticks
    this transaction recorded, as recorded."""
    if not ticks:
        return []
    conflict = (
        """ON CONFLICT (schedule, nominal_at) DO UPDATE SET outcome = 'fired', reason = NULL,
               duplicate_of = NULL, job_id = excluded.job_id, source = excluded.source,
               recorded_at = now()
           WHERE t.outcome = 'skipped' AND excluded.outcome = 'fired'"""
        if refire_skipped
        else "ON CONFLICT (schedule, nominal_at) DO NOTHING"
    )
    rows = conn.execute(
        f"""INSERT INTO schedule_ticks AS t (schedule, nominal_at, outcome, reason, job_id, source)
            SELECT %s, r.nominal_at, r.outcome, r.reason, r.job_id, r.source
            FROM jsonb_to_recordset(%s) AS r(nominal_at timestamptz, outcome text, reason text,
                                             job_id uuid, source text)
            {conflict}
            RETURNING t.nominal_at""",
        (
            schedule.name,
            Jsonb(
                [
                    {
                        "nominal_at": t.nominal_at.isoformat(),
                        "outcome": "fired" if t.job_id else "skipped",
                        "reason": str(t.reason) if t.reason else None,
                        "job_id": str(t.job_id) if t.job_id else None,
                        "source": t.source,
                    }
                    for t in ticks
                ]
            ),
        ),
    ).fetchall()
    recorded = {r["nominal_at"] for r in rows}
    kept = [t for t in ticks if t.nominal_at in recorded]
    fired = [t for t in (ticks if unguarded else kept) if t.job_id is not None]
    if fired:
        requests = [
            {
                "id": str(t.job_id),
                "type": schedule.type,
                "payload": schedule.payload,
                "run_at": t.nominal_at.isoformat(),
            }
            for t in fired
        ]
        inserted = jobs_insert(conn, requests, topic)
        held = {t: i.id for t, i in zip(fired, inserted, strict=True) if i.duplicate}
        if held:
            kept = _skip_duplicates(conn, schedule.name, kept, held)
        fired = [t for t in fired if t not in held]
        conn.execute(
            """UPDATE jobs j SET schedule = %s, tick_at = r.tick_at
               FROM jsonb_to_recordset(%s) AS r(id uuid, tick_at timestamptz)
               WHERE j.id = r.id""",
            (
                schedule.name,
                Jsonb([{"id": str(t.job_id), "tick_at": t.nominal_at.isoformat()} for t in fired]),
            ),
        )
    return kept


def _skip_duplicates(
    conn: psycopg.Connection, name: str, kept: list[Tick], held: dict[Tick, uuid.UUID]
) -> list[Tick]:
    """The ticks of ``held`` (each with the job that holds its unique key) recorded as skips
    with reason ``unique`` instead of fired (only the rows this transaction wrote: a tick's row
    names the job it meant to insert); ``kept`` with those ticks as they now are."""
    conn.execute(
        """UPDATE schedule_ticks t SET outcome = 'skipped', reason = 'unique', job_id = NULL,
                  duplicate_of = r.holder
           FROM jsonb_to_recordset(%s) AS r(nominal_at timestamptz, job_id uuid, holder uuid)
           WHERE t.schedule = %s AND t.nominal_at = r.nominal_at AND t.job_id = r.job_id""",
        (
            Jsonb(
                [
                    {
                        "nominal_at": t.nominal_at.isoformat(),
                        "job_id": str(t.job_id),
                        "holder": str(holder),
                    }
                    for t, holder in held.items()
                ]
            ),
            name,
        ),
    )
    return [
        Tick(t.nominal_at, t.source, reason=SkipReason.UNIQUE, duplicate_of=held[t])
        if t in held
        else t
        for t in kept
    ]


@dataclass(frozen=True)
class Handled:
    """What one schedule's part of a fire pass recorded."""

    name: str
    fired: tuple[Tick, ...]
    skipped: tuple[Tick, ...]
    late: int  # ticks handled after their grace (fired by catch-up, skipped, or dropped)
    dropped: int  # due ticks older than the pass's bound: neither run nor recorded
    next_fire_at: datetime | None


Decide = Callable[[StoredSchedule, int], Plan]


def _source(lateness: timedelta, grace: timedelta) -> str:
    return "cron" if lateness <= grace else "catch_up"


def schedules_fire_due(
    conn: psycopg.Connection, now: datetime, limit: int, topic: str, decide: Decide
) -> list[Handled]:
    """The scheduler's pass, in the caller's transaction: lock up to ``limit`` schedules
    due at ``now`` (``FOR UPDATE SKIP LOCKED``: schedulers side by side take different
    ones), ask ``decide(schedule, unfinished runs)`` what to do, record each tick (a job for
    each fired one) and move ``next_fire_at`` on by compare-and-set."""
    return _fire_due(conn, now, limit, topic, decide, guarded=True)


def schedules_fire_due_unsafe(
    conn: psycopg.Connection, now: datetime, limit: int, topic: str, decide: Decide
) -> list[Handled]:
    """UNSAFE, for the chaos harness's "can it fail" run only: the pass of
    :func:`schedules_fire_due` without its guards. The due schedules are read without a
    row lock, each tick it plans to fire gets a job whether or not its tick row was inserted
    here (the row still ``ON CONFLICT DO NOTHING``), and ``next_fire_at`` is written without
    compare-and-set. Two schedulers that read a schedule before either commits both insert
    a job for its tick."""
    return _fire_due(conn, now, limit, topic, decide, guarded=False)


def _fire_due(
    conn: psycopg.Connection,
    now: datetime,
    limit: int,
    topic: str,
    decide: Decide,
    *,
    guarded: bool,
) -> list[Handled]:
    lock = "FOR UPDATE SKIP LOCKED" if guarded else ""
    rows = conn.execute(
        f"""SELECT {SCHEDULE_COLUMNS} FROM schedules
            WHERE NOT paused AND next_fire_at <= %s
            ORDER BY next_fire_at, name LIMIT %s {lock}""",
        (now, limit),
    ).fetchall()
    due = [StoredSchedule.from_row(r) for r in rows]
    if not due:
        return []
    bounded = [s.name for s in due if s.definition.overlap is not Overlap.ALLOW]
    unfinished: dict[str, int] = {}
    if bounded:
        counted = conn.execute(
            """SELECT schedule, count(*) AS n FROM jobs
               WHERE schedule = ANY(%s) AND status = ANY(%s) GROUP BY schedule""",
            (bounded, list(UNFINISHED)),
        ).fetchall()
        unfinished = {r["schedule"]: r["n"] for r in counted}
    handled = []
    for schedule in due:
        decided = decide(schedule, unfinished.get(schedule.name, 0))
        grace = schedule.definition.policy.grace
        ticks = [Tick(t, _source(now - t, grace), job_id=uuid.uuid4()) for t in decided.fire]
        ticks += [Tick(t, _source(now - t, grace), reason=why) for t, why in decided.skipped]
        recorded = _record_ticks(conn, schedule.definition, ticks, topic, unguarded=not guarded)
        if guarded:
            moved = conn.execute(
                """UPDATE schedules SET next_fire_at = %s, updated_at = now()
                   WHERE name = %s AND next_fire_at = %s""",
                (decided.next_fire_at, schedule.name, schedule.next_fire_at),
            ).rowcount
            if moved != 1:
                raise Raced(f"schedule {schedule.name!r} moved on while this pass held it")
        else:
            conn.execute(
                "UPDATE schedules SET next_fire_at = %s, updated_at = now() WHERE name = %s",
                (decided.next_fire_at, schedule.name),
            )
        jobs = recorded if guarded else ticks
        fired = tuple(t for t in jobs if t.job_id is not None)
        skipped = tuple(t for t in recorded if t.job_id is None)
        late = decided.dropped + sum(1 for t in recorded if now - t.nominal_at > grace)
        handled.append(
            Handled(schedule.name, fired, skipped, late, decided.dropped, decided.next_fire_at)
        )
    return handled


def schedule_trigger(
    conn: psycopg.Connection, name: str, topic: str
) -> tuple[uuid.UUID, datetime] | None:
    """Run a schedule now, outside its calendar: a tick at the database's now (source
    ``trigger``) and its job; the calendar and the overlap policy are left alone. None if
    there is no such schedule."""
    row = conn.execute(
        f"SELECT {SCHEDULE_COLUMNS}, clock_timestamp() AS now FROM schedules WHERE name = %s "
        "FOR UPDATE",
        (name,),
    ).fetchone()
    if row is None:
        return None
    schedule = StoredSchedule.from_row(row)
    tick = Tick(row["now"], "trigger", job_id=uuid.uuid4())
    recorded = _record_ticks(conn, schedule.definition, [tick], topic)
    # a duplicate (the type's unique key is held): the job that holds it
    holder = recorded[0].duplicate_of if recorded else None
    return holder or tick.job_id, tick.nominal_at


@dataclass(frozen=True)
class Backfilled:
    fired: tuple[Tick, ...]  # ticks that got a job now (new ones, and earlier skips)
    already: int  # ticks in the range that had fired before: left alone


def schedule_backfill(
    conn: psycopg.Connection,
    schedule: Definition,
    nominal: Sequence[datetime],
    topic: str,
) -> Backfilled:
    """Fire the ticks at ``nominal`` (the calendar's ticks of a past range) that never fired:
    ticks never recorded and ticks recorded as skipped get a job each (source
    ``backfill``); ticks that fired before are left alone."""
    ticks = [Tick(t, "backfill", job_id=uuid.uuid4()) for t in nominal]
    recorded = _record_ticks(conn, schedule, ticks, topic, refire_skipped=True)
    # a tick whose job would be a duplicate is recorded skipped (reason unique): not fired
    fired = tuple(t for t in recorded if t.job_id is not None)
    return Backfilled(fired, len(ticks) - len(recorded))


# ---------------------------------------------------------------- the management surface's reads

# a listing counts each schedule's latest ticks only, this many at most: a per-second
# schedule keeps 2.6 million ticks under the default retention, and a page of schedules must
# cost the same whatever their calendars (the counts say when they were capped)
TICKS_COUNTED = 1000


@dataclass(frozen=True)
class ScheduleSummary:
    """A schedule for the management surface (API, console): itself, its latest tick with
    its job's state, and what its latest :data:`TICKS_COUNTED` ticks came to."""

    schedule: StoredSchedule
    last: LastTick | None
    fired: int
    skipped: int
    capped: bool  # the schedule has more ticks than were counted


def _summaries(
    conn: psycopg.Connection, where: str, params: dict[str, Any]
) -> list[ScheduleSummary]:
    rows = conn.execute(
        f"""SELECT {_WITH_LAST_TICK},
                   counts.fired, counts.skipped,
                   EXISTS (SELECT 1 FROM schedule_ticks t WHERE t.schedule = s.name
                           ORDER BY recorded_at DESC OFFSET %(counted)s) AS capped
            FROM schedules s {_LAST_TICK_JOIN}
            LEFT JOIN LATERAL (
                SELECT count(*) FILTER (WHERE outcome = 'fired') AS fired,
                       count(*) FILTER (WHERE outcome = 'skipped') AS skipped
                FROM (SELECT outcome FROM schedule_ticks t WHERE t.schedule = s.name
                      ORDER BY recorded_at DESC LIMIT %(counted)s) latest
            ) counts ON true
            {where}""",
        {"counted": TICKS_COUNTED, **params},
    ).fetchall()
    return [
        ScheduleSummary(
            StoredSchedule.from_row(r), _last_tick(r), r["fired"], r["skipped"], r["capped"]
        )
        for r in rows
    ]


def schedule_page(conn: psycopg.Connection, after: str | None, limit: int) -> list[ScheduleSummary]:
    """Up to ``limit`` schedules by name, after ``after`` (keyset), each summarised."""
    where = "WHERE s.name > %(after)s ORDER BY s.name LIMIT %(limit)s"
    return _summaries(conn, where, {"after": after or "", "limit": limit})


def schedule_summary(conn: psycopg.Connection, name: str) -> ScheduleSummary | None:
    """One schedule, summarised; None if there is no such schedule."""
    found = _summaries(conn, "WHERE s.name = %(name)s", {"name": name})
    return found[0] if found else None
