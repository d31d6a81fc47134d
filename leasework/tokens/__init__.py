"""API tokens (pure): their format, their slow hash, their scopes.

A token reads ``lw_<prefix>_<secret>``: the 8-character prefix finds its row, the secret is
checked against a keyed hash of the whole token, HMAC-SHA-256 under a per-deployment key
(``leasework_secrets``, :data:`HMAC_SECRET_NAME`). The secret is 256 random bits, so no
guessing can be helped by a slow hash: a check costs a microsecond, and a stranger's wrong
secret costs the api nothing worth stalling for. Rows made before this (a salted scrypt hash,
tens of milliseconds and 16 MiB a check) are still accepted and rewritten as HMAC on their
first good use (:func:`needs_rehash`). The plaintext is shown once, at creation, and never
stored. Comparisons are constant-time (``hmac.compare_digest``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

PREFIX_CHARS = 8
TOKEN_PATTERN = re.compile(r"^lw_([A-Za-z0-9]{8})_([A-Za-z0-9_-]{43})$")

TOKEN_NAME_PATTERN = r"^[A-Za-z0-9_.:@-]{1,100}$"  # ci, deploy-bot, alice@example.com

HMAC_SCHEME = "hmac-sha256"
HMAC_SECRET_NAME = "token-hmac"  # the key's name in leasework_secrets

SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1

SCOPES: dict[str, str] = {
    "submit": "submit jobs (POST /jobs, /jobs/batch)",
    "read": "read jobs, job types, workers and the console",
    "cancel": "cancel and retry jobs",
    "admin": "tokens, pruning, everything else",
    "alerts": "post alert notifications (Alertmanager's webhook)",
}
ALL_SCOPES = frozenset(SCOPES)


class TokenError(ValueError):
    """A token request that cannot be granted (an unknown scope, a bad name)."""


def parse_scopes(text: str | list[str]) -> frozenset[str]:
    """``submit,read`` (or a list) as a set of known scopes."""
    names = [s.strip() for s in (text.split(",") if isinstance(text, str) else text)]
    names = [s for s in names if s]
    unknown = sorted(set(names) - ALL_SCOPES)
    if unknown or not names:
        raise TokenError(
            f"unknown scope(s) {', '.join(unknown) or '(none given)'}; choose from "
            + ", ".join(f"{name} ({what})" for name, what in SCOPES.items())
        )
    return frozenset(names)


def new_token() -> tuple[str, str]:
    """(the token, its lookup prefix). The token is shown once; only its hash is kept."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    prefix = "".join(secrets.choice(alphabet) for _ in range(PREFIX_CHARS))
    secret = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")
    return f"lw_{prefix}_{secret}", prefix


def prefix_of(token: str) -> str | None:
    """The lookup prefix of a well-formed token, or None."""
    match = TOKEN_PATTERN.match(token)
    return match.group(1) if match else None


def _scrypt(token: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(token.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 * 1024 * 1024)


def hash_token(token: str, key: bytes) -> str:
    """``hmac-sha256$<base64>``: what the tokens table stores."""
    digest = hmac.new(key, token.encode(), hashlib.sha256).digest()
    return f"{HMAC_SCHEME}${base64.b64encode(digest).decode()}"


def needs_rehash(stored: str) -> bool:
    """Whether a stored hash is of the earlier, slow kind (rewritten on first good use)."""
    return not stored.startswith(HMAC_SCHEME + "$")


def hash_token_scrypt(token: str) -> str:
    """``scrypt$n$r$p$salt$hash`` (base64): what tokens made before the HMAC hash store;
    still verified, never written by leasework any more (kept to test the migration)."""
    salt = secrets.token_bytes(16)
    digest = _scrypt(token, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    b64 = base64.b64encode
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def verify_token(token: str, stored: str, key: bytes) -> bool:
    """Whether ``token`` is the one ``stored`` was made from (constant-time compare). A
    scrypt hash takes tens of milliseconds: call that one in a thread (see needs_rehash)."""
    if not needs_rehash(stored):
        return hmac.compare_digest(hash_token(token, key), stored)
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = _scrypt(token, base64.b64decode(salt), int(n), int(r), int(p))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


def fingerprint(token: str) -> str:
    """A fast, non-reversible key for the api's cache of verified tokens."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: a token's id, name and scopes, and its rate limit."""

    token_id: str
    name: str
    scopes: frozenset[str]
    rate: float | None = None  # requests per second; None: unlimited
    burst: int | None = None

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


DEFAULT_STATE_DIR = "/var/tmp/leasework"  # the local stack's (devstack.layout)


def default_token(environ: dict[str, str] | None = None) -> str | None:
    """The token a client sends when given none: ``$LEASEWORK_TOKEN``, else the file
    ``$LEASEWORK_TOKEN_FILE``, else the development token ``just up`` wrote
    (``$LEASEWORK_STATE_DIR/tokens/dev.token``), else None."""
    env = os.environ if environ is None else environ
    if token := env.get("LEASEWORK_TOKEN", "").strip():
        return token
    path = env.get("LEASEWORK_TOKEN_FILE") or str(
        Path(env.get("LEASEWORK_STATE_DIR") or DEFAULT_STATE_DIR) / "tokens" / "dev.token"
    )
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}
