"""An operator's operations on recurring schedules, one owner for every door: create, pause,
resume, trigger, backfill and delete. The api (:mod:`leasework.api.schedules`) and the console
(:mod:`leasework.api.console.routes`) call these (the CLI goes through the api) and differ only
in how they render the answer, as :mod:`leasework.operations` does for jobs.

Each operation is a function of an open transaction (``await db.run(schedule_ops.pause, ...)``)
and writes its audit row (:func:`leasework.store.operators.audit_add`) in that transaction, so
the row commits with the change or not at all. The rule is :mod:`leasework.operations`': a
request that was refused or changed nothing writes no row (a pause of a paused schedule, a
backfill whose every tick had fired). Every row names who asked and the door
(``detail.via``); its target is ``schedule:NAME``.

What a request may ask is checked here too, without I/O: :func:`definition_of` reads a create's
body into a :class:`~leasework.schedules.Definition` (or names every field it cannot use, in
:mod:`leasework.schedules`'s words), :func:`backfill_range` a backfill's bounds, and
:func:`backfill_ticks` refuses a range of more than :data:`MAX_BACKFILL` ticks before a
single job is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from leasework.app import App
from leasework.errors import FieldError
from leasework.jsonlimits import payload_errors, whole_numbers
from leasework.operations import Actor
from leasework.schedules import (
    DEFAULT_GRACE,
    NAME_PATTERN,
    CatchUp,
    Cron,
    Definition,
    Overlap,
    ScheduleError,
)
from leasework.store import operators
from leasework.store import schedules as store

MAX_BACKFILL = 1000  # ticks one backfill fires at most (the scheduler's per-pass bound)
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)  # a backfill's range starts no earlier
MAX_CRON_CHARS = 200
MAX_TIMEZONE_CHARS = 64
NAME_HINT = "1-100 letters, digits and _ . : -"

CREATE_FIELDS = (
    "name",
    "type",
    "cron",
    "payload",
    "timezone",
    "overlap",
    "catch_up",
    "catch_up_limit",
    "grace_seconds",
)


def target(name: str) -> str:
    """A schedule's audit target."""
    return f"schedule:{name}"


# ---------------------------------------------------------------- what a request asks (pure)


def _text(body: Mapping[str, Any], name: str, errors: list[FieldError], hint: str) -> str | None:
    value = body.get(name)
    if not isinstance(value, str) or "\x00" in value:
        errors.append(FieldError(name, f"required: {hint}"))
        return None
    return value


def _bounded(
    body: Mapping[str, Any], name: str, low: int, high: int, default: int, errors: list[FieldError]
) -> int:
    value = whole_numbers(body.get(name, default))
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        errors.append(FieldError(name, f"must be an integer from {low} to {high}"))
        return default
    return value


def _choice(
    body: Mapping[str, Any],
    name: str,
    kind: type[Overlap] | type[CatchUp],
    errors: list[FieldError],
) -> Any:
    value = body.get(name)
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(kind)
        errors.append(FieldError(name, f"must be one of {choices}, got {str(value)[:40]!r}"))
        return None


def definition_of(body: Any, app: App | None, now: datetime) -> Definition | list[FieldError]:
    """The schedule a create's body asks for, or every reason it cannot be one. The body is
    strict: the fields of :data:`CREATE_FIELDS` only (null taken as left out for the optional
    ones), ``type`` one ``app`` defines, ``payload`` valid for it, ``cron`` and ``timezone``
    as :class:`~leasework.schedules.Cron` takes them, and a calendar with a tick after
    ``now``."""
    if not isinstance(body, Mapping):
        return [FieldError("(body)", "must be a JSON object with name, type and cron")]
    errors = [
        FieldError(str(k), f"unknown field; allowed: {', '.join(CREATE_FIELDS)}")
        for k in sorted(set(body) - set(CREATE_FIELDS), key=str)
    ]
    name = _text(body, "name", errors, NAME_HINT)
    if name is not None and not NAME_PATTERN.match(name):
        errors.append(FieldError("name", f"must be {NAME_HINT}, got {name[:120]!r}"))
    job_type = _text(body, "type", errors, "the job type each tick runs")
    if job_type is not None and app is not None and job_type not in app:
        known = ", ".join(app.names) or "none"
        errors.append(
            FieldError("type", f"unknown job type {job_type[:120]!r}; this app defines: {known}")
        )
        job_type = None
    payload = body.get("payload", {})  # null is a payload (a typed one refuses it), as at submit
    found = payload_errors(payload)
    if not found and job_type is not None and app is not None and (t := app.get(job_type)):
        found = t.payload_errors(payload)
    errors += found
    timezone = body.get("timezone")
    timezone = "UTC" if timezone is None else timezone
    if not isinstance(timezone, str) or not 1 <= len(timezone) <= MAX_TIMEZONE_CHARS:
        errors.append(FieldError("timezone", "must be an IANA name such as 'Europe/Berlin'"))
        timezone = None
    else:
        try:
            Cron("* * * * *", timezone)
        except ScheduleError as exc:
            errors.append(FieldError("timezone", str(exc)))
            timezone = None
    cron = _text(body, "cron", errors, "a cron expression, e.g. '*/5 * * * *'")
    if cron is not None and len(cron) > MAX_CRON_CHARS:
        errors.append(FieldError("cron", f"must be at most {MAX_CRON_CHARS} characters"))
        cron = None
    if cron is not None:
        try:
            calendar = Cron(cron, timezone or "UTC")
        except ScheduleError as exc:
            errors.append(FieldError("cron", str(exc)))
        else:
            if timezone is not None and calendar.after(now) is None:
                errors.append(
                    FieldError(
                        "cron", f"{cron!r} has no tick in the next 50 years; write one that does"
                    )
                )
    overlap = _choice(body, "overlap", Overlap, errors) or Overlap.ALLOW
    catch_up = _choice(body, "catch_up", CatchUp, errors) or CatchUp.LATEST
    limit = _bounded(body, "catch_up_limit", 1, 1000, 1, errors)
    grace = _bounded(body, "grace_seconds", 0, 86400, int(DEFAULT_GRACE.total_seconds()), errors)
    if errors:
        return errors
    assert name is not None and job_type is not None and cron is not None and timezone
    if app is not None and (t := app.get(job_type)) is not None:
        payload = t.to_json(payload)
    try:
        return Definition(
            name=name,
            type=job_type,
            cron=cron,
            payload=payload,
            timezone=timezone,
            overlap=overlap,
            catch_up=catch_up,
            catch_up_limit=limit,
            grace_seconds=grace,
        )
    except ScheduleError as exc:  # every field was checked above; kept for a rule added later
        return [FieldError("(body)", str(exc))]


def backfill_range(
    since: datetime | None, until: datetime | None, now: datetime, names: tuple[str, str]
) -> list[FieldError]:
    """Why ``[since, until]`` cannot be backfilled at ``now`` (``names``: how the door spells
    the two fields); empty when it can. The range must be in order and in the past: the
    ticks to come are the scheduler's."""
    errors = []
    if since is None:
        errors.append(FieldError(names[0], "required: the first instant of the range"))
    if until is None:
        errors.append(FieldError(names[1], "required: the last instant of the range"))
    if since is not None and since < EARLIEST:
        errors.append(FieldError(names[0], "must not be before 1970-01-01T00:00:00Z"))
    if since is not None and until is not None and since > until:
        errors.append(FieldError(names[1], f"must not be before {names[0]}"))
    if until is not None and until > now:
        errors.append(
            FieldError(
                names[1],
                f"must not be in the future (now is {now.isoformat(timespec='seconds')}): "
                "the ticks to come are the scheduler's",
            )
        )
    return errors


class TooManyTicks(ValueError):
    """A backfill's range holds more ticks than one backfill fires."""

    def __init__(self, name: str, last_allowed: datetime) -> None:
        self.last_allowed = last_allowed
        super().__init__(
            f"the range holds more than {MAX_BACKFILL} ticks of schedule {name!r}; "
            f"backfill at most {MAX_BACKFILL} at a time: the first {MAX_BACKFILL} end at "
            f"{last_allowed.isoformat()}, so split the range there; nothing was written"
        )


def backfill_ticks(definition: Definition, since: datetime, until: datetime) -> list[datetime]:
    """The nominal instants of ``definition``'s calendar in ``[since, until]``; raises
    :class:`TooManyTicks` past :data:`MAX_BACKFILL` (after at most one more step of cronsim)."""
    ticks = definition.calendar.between(since, until, MAX_BACKFILL)
    if len(ticks) > MAX_BACKFILL:
        raise TooManyTicks(definition.name, ticks[MAX_BACKFILL - 1])
    return ticks


# ---------------------------------------------------------------- the operations


def _audit(conn: psycopg.Connection, actor: Actor, action: str, name: str, **detail: Any) -> None:
    operators.audit_add(conn, actor.name, action, target(name), {"via": actor.via, **detail})


def create(
    conn: psycopg.Connection, definition: Definition, actor: Actor, now: datetime
) -> store.StoredSchedule | None:
    """Create a schedule (source ``api``), first firing at its first tick after ``now``;
    None if one of that name exists (nothing written)."""
    created = store.schedule_create(conn, definition, actor.name, now)
    if created is not None:
        _audit(
            conn,
            actor,
            "schedule-create",
            definition.name,
            type=definition.type,
            cron=definition.cron,
            timezone=definition.timezone,
        )
    return created


@dataclass(frozen=True)
class Toggled:
    """What a pause or resume found (None: no such schedule) and whether it changed it."""

    schedule: store.StoredSchedule | None
    changed: bool


def _set_paused(
    conn: psycopg.Connection, name: str, paused: bool, actor: Actor, now: datetime
) -> Toggled:
    current = store.schedule_get(conn, name, for_update=True)
    if current is None or current.paused == paused:
        return Toggled(current, False)
    # resumed, it starts from its first tick after now: the ticks that came due while it was
    # paused are not missed ticks (they were not wanted); backfill runs them if they were
    next_fire_at = None if paused else current.definition.first_fire_at(now)
    changed = store.schedule_set_paused(conn, name, paused, next_fire_at)
    detail = {} if paused else {"next_fire_at": _iso(next_fire_at)}
    _audit(conn, actor, "schedule-pause" if paused else "schedule-resume", name, **detail)
    return Toggled(changed, True)


def pause(conn: psycopg.Connection, name: str, actor: Actor, now: datetime) -> Toggled:
    """Pause a schedule: no tick fires until it is resumed (a paused one is left as it is)."""
    return _set_paused(conn, name, True, actor, now)


def resume(conn: psycopg.Connection, name: str, actor: Actor, now: datetime) -> Toggled:
    """Resume a paused schedule from its first tick after ``now`` (a running one is left as
    it is: its next fire time does not move)."""
    return _set_paused(conn, name, False, actor, now)


@dataclass(frozen=True)
class Triggered:
    job_id: uuid.UUID
    tick_at: datetime


def trigger(conn: psycopg.Connection, name: str, actor: Actor, *, topic: str) -> Triggered | None:
    """Run a schedule once now, outside its calendar (a tick of source ``trigger``, its
    job); None if there is no such schedule."""
    fired = store.schedule_trigger(conn, name, topic)
    if fired is None:
        return None
    job_id, at = fired
    _audit(conn, actor, "schedule-trigger", name, job_id=str(job_id), tick_at=_iso(at))
    return Triggered(job_id, at)


@dataclass(frozen=True)
class BackfillResult:
    """What a backfill of a range did: the ticks that got a job now (never recorded, or
    recorded as skipped), and how many of the range's ticks had fired before."""

    nominal: int  # the calendar's ticks in the range
    fired: tuple[Triggered, ...]
    already: int


def backfill(
    conn: psycopg.Connection,
    name: str,
    since: datetime,
    until: datetime,
    actor: Actor,
    *,
    topic: str,
) -> BackfillResult | None:
    """Fire each tick of the schedule's calendar in ``[since, until]`` that never fired, a
    job each; ticks that fired before are left alone, so a second backfill of a range makes
    none. None if there is no such schedule; :class:`TooManyTicks` for a range of more than
    :data:`MAX_BACKFILL` ticks (nothing written)."""
    schedule = store.schedule_get(conn, name, for_update=True)
    if schedule is None:
        return None
    nominal = backfill_ticks(schedule.definition, since, until)
    done = store.schedule_backfill(conn, schedule.definition, nominal, topic)
    fired = tuple(Triggered(t.job_id, t.nominal_at) for t in done.fired if t.job_id is not None)
    if fired:
        _audit(
            conn,
            actor,
            "schedule-backfill",
            name,
            since=_iso(since),
            until=_iso(until),
            fired=len(fired),
            already=done.already,
        )
    return BackfillResult(len(nominal), fired, done.already)


def delete(conn: psycopg.Connection, name: str, actor: Actor) -> store.StoredSchedule | None:
    """Delete a schedule and its ticks, returning it as it was; its jobs stay (they keep
    its name). None if there is no such schedule. One its app still declares is stored
    again when a process of that app next starts."""
    removed = store.schedule_delete(conn, name)
    if removed is not None:
        _audit(conn, actor, "schedule-delete", name, source=removed.source)
    return removed


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
