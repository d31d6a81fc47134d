"""The console's session, CSRF and login checks (pure: no request, no database).

* The session is a cookie signed with a key every api process shares (the
  ``leasework_secrets`` row ``console-session``), by itsdangerous with a timestamp: it holds
  the token's id, name and scopes and a random CSRF token, never the API token itself. It is
  ``HttpOnly``, ``SameSite=Strict``, ``Path=/ui``, and ``Secure`` when served over HTTPS. The
  console re-checks on every request that the token is still live (a revoked token's session
  ends with it) and refuses a session older than :data:`SESSION_MAX_AGE`.
* Every POST carries the session's CSRF token in a hidden field, compared in constant time;
  a POST whose ``Origin`` names another site is refused as well.
* The login form carries a nonce that a short-lived signed cookie repeats (a double submit),
  so another site cannot log a browser in under a token of its choosing.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from itsdangerous import BadSignature, URLSafeTimedSerializer

from leasework.tokens import Principal

COOKIE = "leasework_console"
LOGIN_COOKIE = "leasework_console_login"
COOKIE_PATH = "/ui"
SESSION_MAX_AGE = 12 * 3600  # seconds a login lasts
LOGIN_MAX_AGE = 600  # seconds a login form stays usable
SECRET_NAME = "console-session"  # the leasework_secrets row holding the signing key
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class Session:
    token_id: str
    name: str
    scopes: frozenset[str]
    csrf: str

    def allows(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes

    @classmethod
    def start(cls, principal: Principal) -> Session:
        """A new session (with a new CSRF token) for a principal that just logged in."""
        return cls(principal.token_id, principal.name, principal.scopes, secrets.token_urlsafe(32))


class SessionCodec:
    """Signs and checks the session and login cookies with one key."""

    def __init__(self, key: str) -> None:
        self._session = URLSafeTimedSerializer(key, salt="leasework-console-session")
        self._login = URLSafeTimedSerializer(key, salt="leasework-console-login")

    def dumps(self, session: Session) -> str:
        return self._session.dumps(
            {
                "t": session.token_id,
                "n": session.name,
                "s": sorted(session.scopes),
                "c": session.csrf,
            }
        )

    def loads(self, value: str | None, max_age: int = SESSION_MAX_AGE) -> Session | None:
        """The session a cookie holds; None when it is absent, forged, altered or too old."""
        if not value:
            return None
        try:
            data: Any = self._session.loads(value, max_age=max_age)
            return Session(str(data["t"]), str(data["n"]), frozenset(data["s"]), str(data["c"]))
        except (BadSignature, KeyError, TypeError, ValueError):
            return None

    def login_nonce(self) -> tuple[str, str]:
        """(the nonce for the login form's hidden field, the login cookie's value)."""
        nonce = secrets.token_urlsafe(24)
        return nonce, self._login.dumps(nonce)

    def login_ok(self, cookie: str | None, submitted: str | None) -> bool:
        """Whether the login form's nonce is the one its cookie signed, recently."""
        if not cookie or not submitted:
            return False
        try:
            expected = self._login.loads(cookie, max_age=LOGIN_MAX_AGE)
        except BadSignature:
            return False
        return isinstance(expected, str) and hmac.compare_digest(expected, submitted)


def csrf_ok(session: Session, submitted: str | None) -> bool:
    """Whether a form's CSRF field is this session's token (constant-time)."""
    return bool(submitted) and hmac.compare_digest(session.csrf, submitted or "")


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether a POST's ``Origin`` header (when the browser sent one) names this host. A
    missing header passes (the CSRF token still decides); ``null`` does not."""
    if origin is None:
        return True
    if not host:
        return False
    return urlsplit(origin).netloc.lower() == host.lower()


def safe_next(target: str | None) -> str:
    """Where to go after login: a console path, never another site."""
    if (
        not target
        or not (target == COOKIE_PATH or target.startswith(COOKIE_PATH + "/"))
        or "//" in target
        or "\\" in target
        or any(ord(c) < 0x20 for c in target)
    ):
        return COOKIE_PATH
    return target


def cookie_options(*, secure: bool, max_age: int = SESSION_MAX_AGE) -> dict[str, Any]:
    """``Response.set_cookie`` keywords of the console's cookies."""
    return {
        "max_age": max_age,
        "path": COOKIE_PATH,
        "httponly": True,
        "samesite": "Strict",
        "secure": secure,
    }
