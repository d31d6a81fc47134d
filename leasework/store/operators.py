"""The operators' tables: API tokens, the audit log, alert notifications, live workers, fence
rejections, per-deployment secrets; and the console's read-only views of jobs."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from leasework.tokens import HMAC_SECRET_NAME, hash_token, new_token


@dataclass(frozen=True)
class TokenRow:
    id: uuid.UUID
    name: str
    prefix: str
    token_hash: str
    scopes: frozenset[str]
    rate: float | None
    burst: int | None
    created_at: datetime
    created_by: str
    revoked_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> TokenRow:
        return cls(**{**row, "scopes": frozenset(row["scopes"])})


TOKEN_COLUMNS = (
    "id, name, prefix, token_hash, scopes, rate, burst, created_at, created_by, revoked_at, "
    "last_used_at"
)


def token_insert(
    conn: psycopg.Connection,
    *,
    name: str,
    prefix: str,
    token_hash: str,
    scopes: frozenset[str],
    rate: float | None,
    burst: int | None,
    created_by: str,
) -> TokenRow:
    """A new token row; raises ``psycopg.errors.UniqueViolation`` when a live token already
    has ``name``."""
    row = conn.execute(
        f"""INSERT INTO api_tokens (id, name, prefix, token_hash, scopes, rate, burst, created_by)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING {TOKEN_COLUMNS}""",
        (uuid.uuid4(), name, prefix, token_hash, sorted(scopes), rate, burst, created_by),
    ).fetchone()
    return TokenRow.from_row(row)


def token_create(
    conn: psycopg.Connection,
    *,
    name: str,
    scopes: frozenset[str],
    rate: float | None,
    burst: int | None,
    created_by: str,
) -> tuple[str, TokenRow]:
    """Make a token, store only its keyed hash, record who made it: (the plaintext, shown
    once, and its row). A rate without a burst gets a bucket of one second's requests.
    Raises ``psycopg.errors.UniqueViolation`` when a live token already has ``name``."""
    if rate is not None and burst is None:
        burst = max(1, int(rate))
    token, prefix = new_token()
    row = token_insert(
        conn,
        name=name,
        prefix=prefix,
        token_hash=hash_token(token, token_key(conn)),
        scopes=scopes,
        rate=rate,
        burst=burst,
        created_by=created_by,
    )
    audit_add(conn, created_by, "token-create", name, {"scopes": sorted(scopes), "rate": rate})
    return token, row


def token_by_prefix(conn: psycopg.Connection, prefix: str) -> TokenRow | None:
    row = conn.execute(
        f"SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE prefix = %s AND revoked_at IS NULL",
        (prefix,),
    ).fetchone()
    return None if row is None else TokenRow.from_row(row)


def tokens_list(conn: psycopg.Connection, *, include_revoked: bool = False) -> list[TokenRow]:
    where = "" if include_revoked else "WHERE revoked_at IS NULL"
    rows = conn.execute(
        f"SELECT {TOKEN_COLUMNS} FROM api_tokens {where} ORDER BY created_at"
    ).fetchall()
    return [TokenRow.from_row(r) for r in rows]


def token_revoke(conn: psycopg.Connection, name_or_id: str) -> TokenRow | None:
    """Revoke the live token of that name (or id); None when there is none."""
    try:
        by_id = uuid.UUID(name_or_id)
    except ValueError:
        by_id = None
    row = conn.execute(
        f"""UPDATE api_tokens SET revoked_at = now()
            WHERE revoked_at IS NULL AND (name = %s OR id = %s) RETURNING {TOKEN_COLUMNS}""",
        (name_or_id, by_id),
    ).fetchone()
    return None if row is None else TokenRow.from_row(row)


def tokens_live(conn: psycopg.Connection) -> list[TokenRow]:
    """Every live token: the api keeps them in memory, so a token's prefix is looked up
    without a query (a stranger's token never reaches Postgres)."""
    rows = conn.execute(
        f"SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE revoked_at IS NULL"
    ).fetchall()
    return [TokenRow.from_row(r) for r in rows]


def token_key(conn: psycopg.Connection) -> bytes:
    """The deployment's key for token hashes (made on first use)."""
    return secret(conn, HMAC_SECRET_NAME).encode()


def tokens_rehash(conn: psycopg.Connection, hashes: dict[uuid.UUID, tuple[str, str]]) -> None:
    """Replace slow hashes by keyed ones: token id -> (the hash checked, the new hash); a row
    whose hash changed meanwhile is left alone."""
    for token_id, (old, new) in hashes.items():
        conn.execute(
            "UPDATE api_tokens SET token_hash = %s WHERE id = %s AND token_hash = %s",
            (new, token_id, old),
        )


def tokens_touch(conn: psycopg.Connection, ids: list[uuid.UUID]) -> None:
    if ids:
        conn.execute("UPDATE api_tokens SET last_used_at = now() WHERE id = ANY(%s)", (ids,))


# ---------------------------------------------------------------- audit log


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: datetime
    actor: str
    action: str
    target: str | None
    detail: dict[str, Any]


def audit_add(
    conn: psycopg.Connection,
    actor: str,
    action: str,
    target: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    conn.execute(
        "INSERT INTO audit_log (actor, action, target, detail) VALUES (%s, %s, %s, %s)",
        (actor, action, target, Jsonb(detail or {})),
    )


def audit_list(
    conn: psycopg.Connection, *, target: str | None = None, limit: int = 100
) -> list[AuditEntry]:
    rows = conn.execute(
        """SELECT id, at, actor, action, target, detail FROM audit_log
           WHERE %(target)s::text IS NULL OR target = %(target)s::text
           ORDER BY at DESC, id DESC LIMIT %(limit)s""",
        {"target": target, "limit": limit},
    ).fetchall()
    return [AuditEntry(**r) for r in rows]


# ---------------------------------------------------------------- alert notifications


@dataclass(frozen=True)
class AlertNotification:
    id: int
    received_at: datetime
    alertname: str
    status: str
    severity: str | None
    summary: str | None
    starts_at: datetime | None
    ends_at: datetime | None
    labels: dict[str, Any]
    receiver: str | None


def alerts_record(conn: psycopg.Connection, alerts: list[dict[str, Any]], receiver: str) -> int:
    """One row per alert of an Alertmanager webhook notification."""
    rows = [
        (
            a["alertname"],
            a["status"],
            a.get("severity"),
            a.get("summary"),
            a.get("starts_at"),
            a.get("ends_at"),
            Jsonb(a.get("labels", {})),
            receiver,
        )
        for a in alerts
    ]
    with conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO alert_notifications
                   (alertname, status, severity, summary, starts_at, ends_at, labels, receiver)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s)""",
            rows,
        )
    return len(rows)


def alerts_list(
    conn: psycopg.Connection, *, since: datetime | None = None, limit: int = 100
) -> list[AlertNotification]:
    rows = conn.execute(
        """SELECT id, received_at, alertname, status, severity, summary, starts_at, ends_at,
                  labels, receiver
           FROM alert_notifications
           WHERE %(since)s::timestamptz IS NULL OR received_at >= %(since)s::timestamptz
           ORDER BY received_at DESC, id DESC LIMIT %(limit)s""",
        {"since": since, "limit": limit},
    ).fetchall()
    return [AlertNotification(**r) for r in rows]


# ---------------------------------------------------------------- workers, fence rejections


@dataclass(frozen=True)
class WorkerRow:
    name: str
    app: str
    started_at: datetime
    last_seen: datetime
    running: int
    capacity: int


def worker_seen(
    conn: psycopg.Connection, name: str, *, app: str, started_at: datetime, running: int,
    capacity: int,
) -> None:  # fmt: skip
    conn.execute(
        """INSERT INTO workers (name, app, started_at, last_seen, running, capacity)
           VALUES (%s, %s, %s, now(), %s, %s)
           ON CONFLICT (name) DO UPDATE SET app = excluded.app,
               started_at = excluded.started_at, last_seen = now(),
               running = excluded.running, capacity = excluded.capacity""",
        (name, app, started_at, running, capacity),
    )


def workers_list(conn: psycopg.Connection, *, seen_within: float = 300.0) -> list[WorkerRow]:
    rows = conn.execute(
        """SELECT name, app, started_at, last_seen, running, capacity FROM workers
           WHERE last_seen > now() - make_interval(secs => %s) ORDER BY name""",
        (seen_within,),
    ).fetchall()
    return [WorkerRow(**r) for r in rows]


def fence_rejections_add(
    conn: psycopg.Connection, rejected: list[tuple[uuid.UUID, int, str]], worker: str
) -> None:
    """(job id, fence, outcome it would have written) of writes the fence refused."""
    if not rejected:
        return
    conn.execute(
        """INSERT INTO fence_rejections (job_id, fence, worker, outcome)
           SELECT r.job_id, r.fence, %s, r.outcome
           FROM unnest(%s::uuid[], %s::bigint[], %s::text[]) AS r(job_id, fence, outcome)
           WHERE EXISTS (SELECT 1 FROM jobs WHERE jobs.id = r.job_id)""",
        (worker, [r[0] for r in rejected], [r[1] for r in rejected], [r[2] for r in rejected]),
    )


def secret(conn: psycopg.Connection, name: str) -> str:
    """A per-deployment secret, made on first use and shared by every api process."""
    conn.execute(
        "INSERT INTO leasework_secrets (name, value) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        (name, secrets.token_urlsafe(48)),
    )
    return conn.execute("SELECT value FROM leasework_secrets WHERE name = %s", (name,)).fetchone()[
        "value"
    ]
