"""The console's recurring schedules: the list (``/ui/schedules``, a page at a time, with a
form to create one), a schedule's page (its facts and latest ticks) and its actions (pause,
resume, trigger now, backfill a past range, delete).

Every change is :mod:`leasework.schedules.operations`' (the api calls the same functions, so
the doors
cannot drift), done as the api's twin allows (``cancel``, see the route table in
:mod:`.routes`) and, as every console action, asked twice: a GET (or, for the create form, a
first POST) shows a confirmation page and changes nothing, then a POST does it and redirects
with a notice. A request the checks refuse (a field of the create form, a backfill's range, a
range of more ticks than one backfill fires) is shown again with the reason beside its field,
as the operator typed it, and nothing is written.

The handlers are plain async functions of the :class:`~.routes.Console` serving the request
(the route table binds them to it); the form readers are pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import psycopg
from quart import Response, g, redirect, request, url_for

from leasework import operations
from leasework.api.console import filters
from leasework.api.console.errors import ConsoleError
from leasework.api.context import ApiContext
from leasework.app import App
from leasework.errors import FieldError
from leasework.jsonlimits import MalformedJSON, parse_json
from leasework.schedules import DEFAULT_GRACE, NAME_PATTERN, CatchUp, Definition, Overlap
from leasework.schedules import operations as schedule_ops
from leasework.store import schedules as store

if TYPE_CHECKING:
    from leasework.api.console.routes import Console

PAGE_SIZE = 50  # schedules on a page of the list
TICKS_SHOWN = 50  # latest ticks on a schedule's page
BACKFILL_FIELDS = ("from", "until")
GENERAL = "(form)"  # the errors that belong to no one field of a form

# what the create form shows before anything is typed (the api's defaults)
BLANK_FORM = {
    "name": "",
    "type": "",
    "cron": "",
    "timezone": "UTC",
    "payload": "{}",
    "overlap": str(Overlap.ALLOW),
    "catch_up": str(CatchUp.LATEST),
    "catch_up_limit": "1",
    "grace_seconds": str(int(DEFAULT_GRACE.total_seconds())),
}
INTEGER = re.compile(r"-?[0-9]{1,9}")
COUNT = re.compile(r"[0-9]{1,9}")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

# a tick's source, as the schedule's page says it
SOURCES = {
    "cron": "on time",
    "catch_up": "late (catch-up)",
    "trigger": "trigger",
    "backfill": "backfill",
}

# what a redirect after an action says, by code (the query string carries the code and the
# counts; the template renders the ones that name a job or a number)
NOTICES = {
    "created": "Created.",
    "paused": "Paused: no tick fires until it is resumed.",
    "already-paused": "Not changed: it was paused already.",
    "resumed": "Resumed from its first tick after now (the ticks that came due while it was "
    "paused are not run; backfill runs them if they are wanted).",
    "already-active": "Not changed: it was not paused.",
}


# ---------------------------------------------------------------- the forms (pure)


def create_body(form: Mapping[str, str]) -> tuple[dict[str, Any], list[FieldError]]:
    """The create form as the api's body (:data:`~leasework.schedules.operations.CREATE_FIELDS`),
    for :func:`~leasework.schedules.operations.definition_of` to check, and the errors of what
    cannot even be read (a payload that is not JSON). A blank field is left out: a required one is
    then named as missing, an optional one takes its default."""
    body: dict[str, Any] = {}
    errors: list[FieldError] = []
    for field in ("name", "type", "cron", "timezone", "overlap", "catch_up"):
        value = (form.get(field) or "").strip()
        if value:
            body[field] = value
    for field in ("catch_up_limit", "grace_seconds"):
        value = (form.get(field) or "").strip()
        if value:  # not a whole number: kept as text, for definition_of to refuse by name
            body[field] = int(value) if INTEGER.fullmatch(value) else value
    payload = (form.get("payload") or "").strip()
    if payload:
        try:
            body["payload"] = parse_json(payload)
        except MalformedJSON as exc:
            errors.append(FieldError("payload", f"is not JSON: {exc}"))
    return body, errors


def definition_from_form(
    form: Mapping[str, str], app: App | None, now: datetime
) -> Definition | list[FieldError]:
    """The schedule the create form asks for, or every reason it cannot be one."""
    body, unreadable = create_body(form)
    parsed = schedule_ops.definition_of(body, app, now)
    if not unreadable:
        return parsed
    # a payload that is not JSON was left out: its default's errors would be beside the point
    rest = [] if isinstance(parsed, Definition) else parsed
    return unreadable + [e for e in rest if not e.field.startswith("payload")]


def by_field(errors: list[FieldError], fields: tuple[str, ...]) -> dict[str, list[str]]:
    """A form's errors by the field they are shown beside: a payload's inner path goes to the
    payload (its message names the path), anything else to :data:`GENERAL`."""
    shown: dict[str, list[str]] = {}
    for e in errors:
        field = e.field.split(".", 1)[0].split("[", 1)[0]
        if e.field == GENERAL:
            shown.setdefault(GENERAL, []).append(e.message)
        elif field not in fields:
            shown.setdefault(GENERAL, []).append(f"{e.field}: {e.message}")
        elif field != e.field:
            shown.setdefault(field, []).append(f"{e.field}: {e.message}")
        else:
            shown.setdefault(field, []).append(e.message)
    return shown


def backfill_bounds(
    form: Mapping[str, str], now: datetime
) -> tuple[datetime, datetime] | list[FieldError]:
    """A backfill's ``from`` and ``until`` (``datetime-local`` values, read as UTC, or RFC
    3339 with an offset), or why they cannot be backfilled (as the api says it)."""
    errors: list[FieldError] = []
    bounds: list[datetime | None] = []
    for field in BACKFILL_FIELDS:
        raw = (form.get(field) or "").strip()
        try:
            bounds.append(operations.parse_time(raw) if raw else None)
        except ValueError:
            errors.append(
                FieldError(
                    field,
                    f"{raw[:40]!r} is not a time like 2026-01-02T03:04:05 (UTC) or "
                    "2026-01-02T03:04:05+01:00",
                )
            )
            bounds.append(None)
    since, until = bounds
    if not errors:
        errors = schedule_ops.backfill_range(since, until, now, BACKFILL_FIELDS)
    if errors:
        return errors
    assert since is not None and until is not None
    return since, until


def _as_typed(raw: str) -> str:
    """A backfill bound as its ``datetime-local`` field shows it again (UTC; one it cannot
    read as typed)."""
    try:
        return filters.format_time(operations.parse_time(raw)) if raw.strip() else ""
    except (ValueError, OverflowError):  # not a time; a time UTC cannot show (year 0)
        return raw


def zoned(value: datetime | None, timezone: str) -> str:
    """``value`` on the wall clock of ``timezone`` (a schedule's own)."""
    if value is None:
        return "—"
    return value.astimezone(ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M:%S %Z")


# ---------------------------------------------------------------- reading


def _name(raw: str) -> str:
    """A path's schedule name, or the 404 (a name no schedule can have has none)."""
    if not NAME_PATTERN.match(raw):
        raise no_such_schedule(raw)
    return raw


def no_such_schedule(name: str) -> ConsoleError:
    return ConsoleError(
        404, "No such schedule", f"No schedule is named {name[:120]!r} (or it was deleted)."
    )


def _actor() -> operations.Actor:
    return operations.Actor(g.session.name, "console")


def _now() -> datetime:
    return datetime.now(UTC)


def _app() -> App:
    """The app this api loaded: its job types are what a schedule may run."""
    return ApiContext.current().jobs_app


def _notice_arg(notice: str, arg: str, pattern: re.Pattern[str]) -> str | None:
    """What a redirect's query string says of the outcome of ``notice`` (the job triggered,
    the ticks backfilled), if it is one and its ``arg`` is of the form it writes."""
    value = request.args.get(arg, "")
    if request.args.get("notice") != notice or not pattern.fullmatch(value):
        return None
    return value


async def _summary(console: Console, name: str) -> store.ScheduleSummary:
    found = await console.db.run(store.schedule_summary, name)
    if found is None:
        raise no_such_schedule(name)
    return found


# ---------------------------------------------------------------- the list, the create form


async def schedules(console: Console) -> Response:
    """The list, by name, a page at a time (``after``: the last name of the previous page)."""
    return await _list_page(console)


async def _list_page(
    console: Console,
    form: Mapping[str, str] | None = None,
    errors: list[FieldError] | None = None,
) -> Response:
    problems = []
    after = request.args.get("after") or None
    if after is not None and not NAME_PATTERN.match(after):
        problems.append("page: not a schedule name (a 'next page' link's); the first page is shown")
        after = None
    rows = await console.db.run(lambda conn: store.schedule_page(conn, after, PAGE_SIZE + 1))
    page = rows[:PAGE_SIZE]
    shown = {**BLANK_FORM, **{k: v for k, v in (form or {}).items() if k in BLANK_FORM}}
    return await console.page(
        "schedules.html",
        400 if problems or errors else 200,
        nav="schedules",
        schedules=page,
        problems=problems,
        next_after=page[-1].schedule.name if len(rows) > PAGE_SIZE else None,
        first_page=after is not None,
        ticks_counted=store.TICKS_COUNTED,
        form=shown,
        errors=by_field(errors or [], tuple(BLANK_FORM)),
        types=_app().names,
        overlaps=[str(o) for o in Overlap],
        catch_ups=[str(c) for c in CatchUp],
        deleted=_notice_arg("deleted", "name", NAME_PATTERN),
    )


async def schedule_create(console: Console) -> Response:
    """The create form, posted: checked, then a confirmation page that posts it again with
    ``confirmed=yes``, which creates it (``edit``: the form again, as it was)."""
    form = await request.form
    fields = {k: form.get(k, "") for k in BLANK_FORM}
    if form.get("edit"):
        return await _list_page(console, fields)
    now = _now()
    definition = definition_from_form(fields, _app(), now)
    if isinstance(definition, list):
        return await _list_page(console, fields, definition)
    if form.get("confirmed") != "yes":
        return await console.page(
            "confirm.html",
            nav="schedules",
            action="schedule-create",
            job=None,
            definition=definition,
            first_fire=definition.first_fire_at(now),
            hidden={**fields, "confirmed": "yes"},
            post_to=url_for("console.schedule_create"),
            edit=True,
            back=url_for("console.schedules"),
        )
    actor = _actor()
    created = await console.db.run(lambda c: schedule_ops.create(c, definition, actor, now))
    if created is None:
        taken = FieldError(
            "name",
            f"a schedule is named {definition.name!r} already; choose another name, or delete "
            "that one first",
        )
        return await _list_page(console, fields, [taken])
    return redirect(url_for("console.schedule", name=created.name, notice="created"), 303)


# ---------------------------------------------------------------- one schedule


async def schedule(console: Console, name: str) -> Response:
    """A schedule's facts and its latest ticks, with its actions."""
    return await _schedule_page(console, _name(name))


async def _schedule_page(
    console: Console,
    name: str,
    backfill: Mapping[str, str] | None = None,
    errors: list[FieldError] | None = None,
) -> Response:
    def read(conn: psycopg.Connection) -> tuple[Any, list[store.TickRecord]]:
        return store.schedule_summary(conn, name), store.schedule_ticks(conn, name, TICKS_SHOWN)

    summary, ticks = await console.db.run(read)
    if summary is None:
        raise no_such_schedule(name)
    return await console.page(
        "schedule.html",
        400 if errors else 200,
        nav="schedules",
        s=summary.schedule,
        summary=summary,
        ticks=ticks,
        ticks_shown=TICKS_SHOWN,
        ticks_counted=store.TICKS_COUNTED,
        sources=SOURCES,
        backfill={f: _as_typed((backfill or {}).get(f, "")) for f in BACKFILL_FIELDS},
        max_backfill=schedule_ops.MAX_BACKFILL,
        backfill_errors=by_field(errors or [], BACKFILL_FIELDS),
        notice=NOTICES.get(request.args.get("notice", "")),
        triggered=_notice_arg("triggered", "job", UUID),
        backfilled=(
            {"fired": int(fired), "already": int(already)}
            if (fired := _notice_arg("backfilled", "fired", COUNT))
            and (already := _notice_arg("backfilled", "already", COUNT))
            else None
        ),
    )


async def _confirm(
    console: Console, s: store.ScheduleSummary, action: str, **more: Any
) -> Response:
    name = s.schedule.name
    return await console.page(
        "confirm.html",
        nav="schedules",
        action=f"schedule-{action}",
        job=None,
        summary=s,
        post_to=url_for(f"console.schedule_{action}", name=name),
        back=url_for("console.schedule", name=name),
        **more,
    )


async def _toggle(console: Console, raw: str, paused: bool) -> Response:
    """Pause or resume: GET asks, POST does (a pause of a paused one changes nothing)."""
    name = _name(raw)
    action = "pause" if paused else "resume"
    if request.method == "GET":
        s = await _summary(console, name)
        return await _confirm(
            console, s, action, next_fire=s.schedule.definition.first_fire_at(_now())
        )
    operation = schedule_ops.pause if paused else schedule_ops.resume
    actor, now = _actor(), _now()
    result = await console.db.run(lambda conn: operation(conn, name, actor, now))
    if result.schedule is None:
        raise no_such_schedule(name)
    if result.changed:
        notice = "paused" if paused else "resumed"
    else:
        notice = "already-paused" if paused else "already-active"
    return redirect(url_for("console.schedule", name=name, notice=notice), 303)


async def schedule_pause(console: Console, name: str) -> Response:
    return await _toggle(console, name, True)


async def schedule_resume(console: Console, name: str) -> Response:
    return await _toggle(console, name, False)


async def schedule_trigger(console: Console, name: str) -> Response:
    """Run it once now, outside its calendar: GET asks, POST does."""
    name = _name(name)
    if request.method == "GET":
        return await _confirm(console, await _summary(console, name), "trigger")
    actor, topic = _actor(), console.settings.topic_ready
    fired = await console.db.run(lambda conn: schedule_ops.trigger(conn, name, actor, topic=topic))
    if fired is None:
        raise no_such_schedule(name)
    target = url_for("console.schedule", name=name, notice="triggered", job=str(fired.job_id))
    return redirect(target, 303)


async def schedule_backfill(console: Console, name: str) -> Response:
    """A job for each tick of a past range that never fired: GET (the schedule page's form)
    checks the range and asks, POST does. A range that cannot be backfilled is shown on the
    schedule's page with the reason; nothing is written."""
    name = _name(name)
    form = request.args if request.method == "GET" else await request.form
    typed = {f: form.get(f, "") for f in BACKFILL_FIELDS}
    bounds = backfill_bounds(typed, _now())
    if isinstance(bounds, list):
        return await _schedule_page(console, name, typed, bounds)
    since, until = bounds
    if request.method == "GET":
        s = await _summary(console, name)
        try:
            ticks = schedule_ops.backfill_ticks(s.schedule.definition, since, until)
        except schedule_ops.TooManyTicks as exc:
            return await _schedule_page(console, name, typed, [FieldError(GENERAL, str(exc))])
        return await _confirm(
            console,
            s,
            "backfill",
            since=since,
            until=until,
            ticks=len(ticks),
            hidden={"from": since.isoformat(), "until": until.isoformat()},
        )
    actor, topic = _actor(), console.settings.topic_ready

    def run(conn: psycopg.Connection) -> schedule_ops.BackfillResult | None:
        return schedule_ops.backfill(conn, name, since, until, actor, topic=topic)

    try:
        result = await console.db.run(run)
    except schedule_ops.TooManyTicks as exc:  # the transaction rolled back: nothing written
        return await _schedule_page(console, name, typed, [FieldError(GENERAL, str(exc))])
    if result is None:
        raise no_such_schedule(name)
    done = {"fired": len(result.fired), "already": result.already}
    return redirect(url_for("console.schedule", name=name, notice="backfilled", **done), 303)


async def schedule_delete(console: Console, name: str) -> Response:
    """Delete it and its ticks (its jobs stay): GET asks, POST does."""
    name = _name(name)
    if request.method == "GET":
        return await _confirm(console, await _summary(console, name), "delete")
    actor = _actor()
    removed = await console.db.run(lambda conn: schedule_ops.delete(conn, name, actor))
    if removed is None:
        raise no_such_schedule(name)
    return redirect(url_for("console.schedules", notice="deleted", name=name), 303)
