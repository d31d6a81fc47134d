"""``leasework token create|list|revoke|ensure``: API tokens, straight in the database
(``$LEASEWORK_POSTGRES_DSN``), so the first admin token needs no token. The plaintext is
printed once, at creation; only its keyed hash is stored."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from pathlib import Path

import psycopg
from psycopg.rows import dict_row

from leasework import config
from leasework.store import operators
from leasework.tokens import TokenError, parse_scopes, prefix_of, verify_token


def add_parser(sub: argparse._SubParsersAction) -> None:
    token = sub.add_parser("token", help="create, list or revoke API tokens (in the database)")
    actions = token.add_subparsers(dest="token_command", required=True)
    create = actions.add_parser("create", help="create a token; prints it once")
    create.add_argument("--name", required=True)
    create.add_argument("--scopes", required=True, help="comma-separated: submit,read,...")
    create.add_argument("--rate", type=float, help="requests per second (default: unlimited)")
    create.add_argument("--burst", type=int, help="bucket size (default: the rate)")
    create.add_argument("--file", help="write the token to this file (mode 0600) too")
    listing = actions.add_parser("list", help="list tokens (never their secrets)")
    listing.add_argument("--revoked", action="store_true", help="include revoked tokens")
    revoke = actions.add_parser("revoke", help="revoke a token by name or id")
    revoke.add_argument("name")
    ensure = actions.add_parser(
        "ensure", help="keep the token in FILE if it is live, else create one (for `just up`)"
    )
    ensure.add_argument("--name", required=True)
    ensure.add_argument("--scopes", required=True)
    ensure.add_argument("--file", required=True)
    ensure.add_argument("--rate", type=float, help="requests per second (default: unlimited)")
    ensure.add_argument("--burst", type=int, help="bucket size (default: the rate)")


def _write_secret(path: str, token: str) -> None:
    target = Path(path)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    os.chmod(target, 0o600)


def _is_live(
    conn: psycopg.Connection,
    path: str,
    name: str,
    scopes: frozenset[str],
    rate: float | None,
    burst: int | None,
) -> bool:
    try:
        token = Path(path).read_text().strip()
    except OSError:
        return False
    prefix = prefix_of(token)
    row = operators.token_by_prefix(conn, prefix) if prefix else None
    return (
        row is not None
        and row.name == name
        and row.scopes == scopes
        and row.rate == rate
        and (burst is None or row.burst == burst)
        and verify_token(token, row.token_hash, operators.token_key(conn))
    )


def run(args: argparse.Namespace) -> int:
    try:
        settings = config.load("cli")
    except config.ConfigError as exc:
        print(f"leasework token: invalid configuration: {exc}", file=sys.stderr)
        return 2
    who = f"cli:{getpass.getuser()}"
    try:
        scopes = parse_scopes(args.scopes) if hasattr(args, "scopes") else frozenset()
        with psycopg.connect(
            settings.postgres_dsn, row_factory=dict_row, connect_timeout=5
        ) as conn:
            return _dispatch(conn, args, scopes, who)
    except TokenError as exc:
        print(f"leasework token: {exc}", file=sys.stderr)
        return 2
    except psycopg.errors.UniqueViolation:
        print(
            f"leasework token: a live token is named {args.name!r}; revoke it first "
            f"(`leasework token revoke {args.name}`) or choose another name",
            file=sys.stderr,
        )
        return 1
    except psycopg.OperationalError as exc:
        print(
            f"leasework token: cannot reach the database ({str(exc).strip()[:200]}); is the "
            "stack up (`just up`), is LEASEWORK_POSTGRES_DSN right?",
            file=sys.stderr,
        )
        return 1


def _dispatch(
    conn: psycopg.Connection, args: argparse.Namespace, scopes: frozenset[str], who: str
) -> int:
    command = args.token_command
    if command == "list":
        for row in operators.tokens_list(conn, include_revoked=args.revoked):
            view = {
                "name": row.name,
                "id": str(row.id),
                "prefix": f"lw_{row.prefix}_…",
                "scopes": sorted(row.scopes),
                "rate": row.rate,
                "created_at": row.created_at.isoformat(),
                "created_by": row.created_by,
                "last_used_at": row.last_used_at.isoformat() if row.last_used_at else None,
                "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None,
            }
            print(json.dumps(view))
        return 0
    if command == "revoke":
        row = operators.token_revoke(conn, args.name)
        if row is None:
            print(f"leasework token: no live token named {args.name!r}", file=sys.stderr)
            return 1
        operators.audit_add(conn, who, "token-revoke", row.name)
        print(f"revoked {row.name} ({row.id}); the api refuses it within a second", file=sys.stderr)
        return 0
    if args.burst is not None and args.rate is None:
        print("leasework token: --burst needs --rate", file=sys.stderr)
        return 2
    if args.rate is not None and args.rate <= 0:
        print("leasework token: --rate must be above 0", file=sys.stderr)
        return 2
    rate, burst = args.rate, args.burst
    if command == "ensure":
        if _is_live(conn, args.file, args.name, scopes, rate, burst):
            return 0
        operators.token_revoke(conn, args.name)  # a stale file's token, or a lost one
    token, row = operators.token_create(
        conn, name=args.name, scopes=scopes, rate=rate, burst=burst, created_by=who
    )
    conn.commit()
    if args.file:
        _write_secret(args.file, token)
    if command == "create":
        print(token)
        print(
            f"token {row.name!r} with scopes {','.join(sorted(row.scopes))}: shown once, "
            "only its hash is stored; send it as `Authorization: Bearer <token>` or set "
            "LEASEWORK_TOKEN",
            file=sys.stderr,
        )
    else:
        print(f"created token {row.name!r} in {args.file}", file=sys.stderr)
    return 0
