"""The operators' endpoints of the api: tokens (admin), the audit log, live workers, and the
webhook Alertmanager delivers notifications to (scope ``alerts``).

Each handler's scope is in its entry of the route table (:data:`leasework.api.routes.ROUTES`);
the guard (:mod:`leasework.api.guard`) has checked it before a handler here runs.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import psycopg
from quart import request

from leasework.api.bodies import invalid, json_body
from leasework.api.context import ApiContext, caller
from leasework.api.problems import Problem
from leasework.errors import FieldError
from leasework.jsonlimits import storable_errors, whole_numbers
from leasework.store import operators
from leasework.tokens import TOKEN_NAME_PATTERN, TokenError, parse_scopes

UNSET_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of an alert still firing
MAX_ALERTS = 1_000  # alerts in one notification (Alertmanager sends a group's)


def token_view(row: operators.TokenRow) -> dict[str, Any]:
    return {
        "id": str(row.id),
        "name": row.name,
        "prefix": row.prefix,
        "scopes": sorted(row.scopes),
        "rate": row.rate,
        "burst": row.burst,
        "created_at": row.created_at.isoformat(),
        "created_by": row.created_by,
        "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None,
        "last_used_at": row.last_used_at.isoformat() if row.last_used_at else None,
    }


def token_request(body: Any) -> tuple[str, frozenset[str], float | None, int | None]:
    """(name, scopes, rate, burst) of a ``POST /tokens`` body, or a 422 naming each field."""
    if not isinstance(body, dict):
        raise invalid([FieldError("(body)", "must be a JSON object")])
    errors: list[FieldError] = []
    allowed = {"name", "scopes", "rate", "burst"}
    errors += [FieldError(str(k), "unknown field") for k in sorted(set(body) - allowed, key=str)]
    name = body.get("name")
    if not isinstance(name, str) or not re.match(TOKEN_NAME_PATTERN, name):
        errors.append(FieldError("name", "must be 1-100 letters, digits and _ . : @ -"))
    scopes: frozenset[str] = frozenset()
    raw_scopes = body.get("scopes")
    if not isinstance(raw_scopes, list) or not all(isinstance(s, str) for s in raw_scopes):
        errors.append(FieldError("scopes", "must be a list of scope names"))
    else:
        try:
            scopes = parse_scopes(raw_scopes)
        except TokenError as exc:
            errors.append(FieldError("scopes", str(exc)))
    rate, burst = body.get("rate"), whole_numbers(body.get("burst"))
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.001 <= rate <= 1e6
    ):
        errors.append(FieldError("rate", "must be a number of requests per second, 0.001-1e6"))
    if burst is not None and (
        isinstance(burst, bool) or not isinstance(burst, int) or not 1 <= burst <= 1_000_000
    ):
        errors.append(FieldError("burst", "must be an integer from 1 to 1000000"))
    if burst is not None and rate is None:
        errors.append(FieldError("burst", "needs a rate"))
    if errors:
        raise invalid(errors)
    return name, scopes, rate, burst  # type: ignore[return-value]


def _time(raw: Any) -> datetime | None:
    if not isinstance(raw, str) or not raw or raw.startswith("0001-01-01"):
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def notification_alerts(body: Any) -> tuple[str, list[dict[str, Any]]]:
    """(receiver, one record per alert) of an Alertmanager webhook body (version 4), or a
    422 saying what is missing."""
    if not isinstance(body, dict) or not isinstance(body.get("alerts"), list):
        raise invalid([FieldError("alerts", "must be a list (Alertmanager webhook, version 4)")])
    errors = [
        FieldError(name, "must be a string")
        for name in ("receiver", "status")
        if name in body and not isinstance(body[name], str)
    ]
    if len(body["alerts"]) > MAX_ALERTS:
        raise invalid([FieldError("alerts", f"holds more than {MAX_ALERTS} alerts")])
    errors += storable_errors(body, "(body)")
    records = []
    for index, alert in enumerate(body["alerts"]):
        errors += _alert_errors(f"alerts[{index}]", alert)
        if len(errors) >= 20:  # enough to say what is wrong; the rest is not looked at
            break
        if errors:
            continue
        labels, annotations = alert["labels"], alert.get("annotations") or {}
        status = alert.get("status")
        records.append(
            {
                "alertname": labels["alertname"],
                "status": status if status in ("firing", "resolved") else "firing",
                "severity": labels.get("severity"),
                "summary": annotations.get("summary") if isinstance(annotations, dict) else None,
                "starts_at": _time(alert.get("startsAt")),
                "ends_at": _time(alert.get("endsAt")),
                "labels": {str(k): str(v) for k, v in labels.items()},
            }
        )
    if errors:
        raise invalid(errors)
    return str(body.get("receiver") or ""), records


def _alert_errors(where: str, alert: Any) -> list[FieldError]:
    if not isinstance(alert, dict):
        return [FieldError(where, "must be an object")]
    labels = alert.get("labels")
    if not isinstance(labels, dict) or not isinstance(labels.get("alertname"), str):
        return [FieldError(f"{where}.labels.alertname", "is required, a string")]
    errors = []
    for name in ("labels", "annotations"):
        values = alert.get(name, {})
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            errors.append(FieldError(f"{where}.{name}", "must map names to strings"))
    if "status" in alert and alert["status"] not in ("firing", "resolved"):
        errors.append(FieldError(f"{where}.status", "must be firing or resolved"))
    errors += [
        FieldError(f"{where}.{name}", "must be a string")
        for name in ("startsAt", "endsAt")
        if name in alert and not isinstance(alert[name], str)
    ]
    return errors


# ---------------------------------------------------------------- the handlers


async def list_tokens(ctx: ApiContext) -> dict[str, Any]:
    """``GET /tokens``: live tokens (``?revoked=true``: revoked ones too)."""
    revoked = request.args.getlist("revoked")
    if any(v not in ("true", "false") for v in revoked) or len(revoked) > 1:
        raise invalid([FieldError("revoked", "must be true or false, given once")])
    include = revoked == ["true"]
    rows = await ctx.db.run(lambda conn: operators.tokens_list(conn, include_revoked=include))
    return {"tokens": [token_view(r) for r in rows]}


async def create_token(ctx: ApiContext) -> tuple[dict[str, Any], int]:
    """``POST /tokens``: its secret is in this answer only."""
    name, scopes, rate, burst = await json_body(ctx.limits.small, token_request)
    who = caller().name

    def create(conn: psycopg.Connection) -> tuple[str, operators.TokenRow]:
        return operators.token_create(
            conn, name=name, scopes=scopes, rate=rate, burst=burst, created_by=who
        )

    try:
        token, row = await ctx.db.run(create)
    except psycopg.errors.UniqueViolation as exc:
        raise Problem(
            409,
            "token-name-taken",
            "Token name taken",
            f"a live token is named {name!r}; revoke it first or choose another name",
        ) from exc
    return {**token_view(row), "token": token}, 201


async def revoke_token(ctx: ApiContext, name: str) -> dict[str, Any]:
    """``DELETE /tokens/{name}``: by name or id; within a second it stops working."""
    who = caller().name

    def revoke(conn: psycopg.Connection) -> operators.TokenRow | None:
        row = operators.token_revoke(conn, name)
        if row is not None:
            operators.audit_add(conn, who, "token-revoke", row.name)
        return row

    row = await ctx.db.run(revoke)
    if row is None:
        raise Problem(404, "no-such-token", "No such token", f"no live token {name!r}")
    return token_view(row)


async def audit(ctx: ApiContext) -> dict[str, Any]:
    """``GET /audit``: the latest 200 entries (``?target=``: of one job or token)."""
    target = request.args.get("target")
    if target is not None and "\x00" in target:
        return {"entries": []}  # Postgres text holds no NUL: no entry has such a target
    rows = await ctx.db.run(lambda conn: operators.audit_list(conn, target=target, limit=200))
    return {
        "entries": [
            {
                "at": e.at.isoformat(),
                "actor": e.actor,
                "action": e.action,
                "target": e.target,
                "detail": e.detail,
            }
            for e in rows
        ]
    }


async def workers(ctx: ApiContext) -> dict[str, Any]:
    """``GET /workers``: those seen in the last five minutes."""
    rows = await ctx.db.run(operators.workers_list)
    return {
        "workers": [
            {
                "name": w.name,
                "app": w.app,
                "started_at": w.started_at.isoformat(),
                "last_seen": w.last_seen.isoformat(),
                "running": w.running,
                "capacity": w.capacity,
            }
            for w in rows
        ]
    }


async def alert_webhook(ctx: ApiContext) -> tuple[dict[str, int], int]:
    """``POST /alerts/webhook``: Alertmanager's notifications, one row per alert."""
    receiver, records = await json_body(ctx.limits.webhook, notification_alerts)
    count = await ctx.db.run(lambda conn: operators.alerts_record(conn, records, receiver))
    return {"recorded": count}, 200
