"""The api's schedule endpoints: list and show (``read``), and the operators' create, pause,
resume, trigger, backfill and delete (the scope of cancel and retry), which are
:mod:`leasework.schedules.operations`' (the console calls the same) and differ here only in how
their answer is rendered."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
from quart import request

from leasework.api.bodies import invalid, json_body
from leasework.api.context import ApiContext, caller
from leasework.api.problems import Problem
from leasework.errors import FieldError
from leasework.schedules import NAME_PATTERN, Definition
from leasework.schedules import operations as schedule_ops
from leasework.store import schedules as store
from leasework.submission import parse_run_at

MAX_LIST_LIMIT = 200
DEFAULT_LIST_LIMIT = 100
MAX_TICKS_SHOWN = 500
DEFAULT_TICKS_SHOWN = 50
BACKFILL_FIELDS = ("from", "until")
LIST_HINT = "list them with GET /schedules (or `leasework schedules list`)"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def definition_view(d: Definition) -> dict[str, Any]:
    return d.as_json()


def stored_view(s: store.StoredSchedule) -> dict[str, Any]:
    return {
        **definition_view(s.definition),
        "paused": s.paused,
        "next_fire_at": _iso(s.next_fire_at),
        "source": s.source,
        "declared_by": s.declared_by,
        "created_at": _iso(s.created_at),
        "updated_at": _iso(s.updated_at),
    }


def last_tick_view(last: store.LastTick | store.TickRecord | None) -> dict[str, Any] | None:
    if last is None:
        return None
    return {
        "nominal_at": _iso(last.nominal_at),
        "outcome": last.outcome,
        "reason": last.reason,
        "source": last.source,
        "job_id": str(last.job_id) if last.job_id else None,
        "job_status": last.job_status,
    }


def summary_view(s: store.ScheduleSummary) -> dict[str, Any]:
    return {
        **stored_view(s.schedule),
        "last_tick": last_tick_view(s.last),
        "fired": s.fired,
        "skipped": s.skipped,
        "counts_capped": s.capped,
    }


def tick_view(t: store.TickRecord) -> dict[str, Any]:
    return {**(last_tick_view(t) or {}), "recorded_at": _iso(t.recorded_at)}


def no_such_schedule(name: str) -> Problem:
    return Problem(
        404,
        "schedule-not-found",
        "Schedule not found",
        f"no schedule is named {name[:120]!r}; {LIST_HINT}",
    )


def schedule_name(raw: str) -> str:
    """A path's schedule name, or the 404 (a name no schedule can have has none)."""
    if not NAME_PATTERN.match(raw):
        raise no_such_schedule(raw)
    return raw


def _query_int(name: str, default: int, high: int) -> int:
    raw = request.args.get(name, str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= high:
        raise invalid([FieldError(name, f"must be an integer from 1 to {high}")])
    return int(raw)


def now() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------- reads


async def list_schedules(ctx: ApiContext) -> dict[str, Any]:
    """``GET /schedules``: by name, a page at a time (``after``: the previous page's
    ``next_after``)."""
    limit = _query_int("limit", DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)
    after = request.args.get("after")
    if after is not None and not NAME_PATTERN.match(after):
        raise invalid([FieldError("after", "must be a schedule name (a page's next_after)")])
    rows = await ctx.db.run(lambda conn: store.schedule_page(conn, after, limit + 1))
    page = rows[:limit]
    return {
        "schedules": [summary_view(s) for s in page],
        "next_after": page[-1].schedule.name if len(rows) > limit else None,
        "ticks_counted": store.TICKS_COUNTED,
    }


async def get_schedule(ctx: ApiContext, name: str) -> dict[str, Any]:
    """``GET /schedules/{name}``: with its latest ticks, newest first."""
    name = schedule_name(name)
    shown = _query_int("ticks", DEFAULT_TICKS_SHOWN, MAX_TICKS_SHOWN)

    def read(conn: psycopg.Connection) -> tuple[Any, list[store.TickRecord]]:
        return store.schedule_summary(conn, name), store.schedule_ticks(conn, name, shown)

    summary, ticks = await ctx.db.run(read)
    if summary is None:
        raise no_such_schedule(name)
    return {**summary_view(summary), "ticks": [tick_view(t) for t in ticks]}


# ---------------------------------------------------------------- operations


async def create_schedule(ctx: ApiContext) -> tuple[dict[str, Any], int, dict[str, str]]:
    """``POST /schedules``: 201, or 409 when the name is taken."""
    app, at = ctx.jobs_app, now()

    def check(body: Any) -> Definition:
        parsed = schedule_ops.definition_of(body, app, at)
        if isinstance(parsed, list):
            raise invalid(parsed)
        return parsed

    definition = await json_body(ctx.limits.small, check)
    who = caller()
    created = await ctx.db.run(lambda conn: schedule_ops.create(conn, definition, who, at))
    if created is None:
        raise Problem(
            409,
            "schedule-exists",
            "Schedule exists",
            f"a schedule is named {definition.name!r} already; choose another name, or delete "
            f"that one first (DELETE /schedules/{definition.name})",
        )
    view = {**stored_view(created), "last_tick": None, "fired": 0, "skipped": 0}
    view["counts_capped"] = False
    return view, 201, {"Location": f"/schedules/{created.name}"}


async def _toggle(ctx: ApiContext, name: str, paused: bool) -> dict[str, Any]:
    name, who, at = schedule_name(name), caller(), now()
    operation = schedule_ops.pause if paused else schedule_ops.resume
    result = await ctx.db.run(lambda conn: operation(conn, name, who, at))
    if result.schedule is None:
        raise no_such_schedule(name)
    return {**stored_view(result.schedule), "changed": result.changed}


async def pause_schedule(ctx: ApiContext, name: str) -> dict[str, Any]:
    """``POST /schedules/{name}/pause``: ``changed`` false when it was paused already."""
    return await _toggle(ctx, name, True)


async def resume_schedule(ctx: ApiContext, name: str) -> dict[str, Any]:
    """``POST /schedules/{name}/resume``: from its first tick after now."""
    return await _toggle(ctx, name, False)


async def trigger_schedule(ctx: ApiContext, name: str) -> tuple[dict[str, Any], int]:
    """``POST /schedules/{name}/trigger``: one job now, outside the calendar."""
    name, who, topic = schedule_name(name), caller(), ctx.settings.topic_ready
    fired = await ctx.db.run(lambda conn: schedule_ops.trigger(conn, name, who, topic=topic))
    if fired is None:
        raise no_such_schedule(name)
    return {"schedule": name, "job_id": str(fired.job_id), "tick_at": _iso(fired.tick_at)}, 202


def backfill_body(body: Any, at: datetime) -> tuple[datetime, datetime]:
    """(from, until) of a backfill's body, or a 422 naming each field (pure)."""
    if not isinstance(body, dict):
        raise invalid([FieldError("(body)", 'must be a JSON object: {"from": ..., "until": ...}')])
    errors = [
        FieldError(str(k), "unknown field; allowed: from, until")
        for k in sorted(set(body) - set(BACKFILL_FIELDS), key=str)
    ]
    bounds: list[datetime | None] = []
    for field in BACKFILL_FIELDS:
        raw = body.get(field)
        parsed = None if raw is None else parse_run_at(raw)
        if isinstance(parsed, FieldError):
            errors.append(FieldError(field, parsed.message))
            bounds.append(None)
            continue
        bounds.append(parsed)
    since, until = bounds
    if not [e for e in errors if e.field in BACKFILL_FIELDS]:
        errors += schedule_ops.backfill_range(since, until, at, BACKFILL_FIELDS)
    if errors:
        raise invalid(errors)
    assert since is not None and until is not None
    return since, until


async def backfill_schedule(ctx: ApiContext, name: str) -> dict[str, Any]:
    """``POST /schedules/{name}/backfill``: a job for each tick of ``[from, until]`` that
    never fired."""
    name, who, topic, at = schedule_name(name), caller(), ctx.settings.topic_ready, now()
    since, until = await json_body(ctx.limits.small, lambda body: backfill_body(body, at))

    def run(conn: psycopg.Connection) -> schedule_ops.BackfillResult | None:
        return schedule_ops.backfill(conn, name, since, until, who, topic=topic)

    try:
        result = await ctx.db.run(run)
    except schedule_ops.TooManyTicks as exc:
        raise Problem(
            422,
            "backfill-too-large",
            "Backfill range too large",
            str(exc),
            limit_ticks=schedule_ops.MAX_BACKFILL,
            split_at=exc.last_allowed.isoformat(),
        ) from None
    if result is None:
        raise no_such_schedule(name)
    return {
        "schedule": name,
        "from": since.isoformat(),
        "until": until.isoformat(),
        "ticks": result.nominal,
        "fired": [{"tick_at": _iso(t.tick_at), "job_id": str(t.job_id)} for t in result.fired],
        "already": result.already,
    }


async def delete_schedule(ctx: ApiContext, name: str) -> dict[str, Any]:
    """``DELETE /schedules/{name}``: the schedule as it was; its jobs stay."""
    name, who = schedule_name(name), caller()
    removed = await ctx.db.run(lambda conn: schedule_ops.delete(conn, name, who))
    if removed is None:
        raise no_such_schedule(name)
    return stored_view(removed)
