"""The console's session cookie, CSRF token and login nonce (leasework/api/console/session.py)."""

import time

import pytest
from itsdangerous import URLSafeTimedSerializer

from leasework.api.console.session import (
    Session,
    SessionCodec,
    cookie_options,
    csrf_ok,
    safe_next,
    same_origin,
)
from leasework.tokens import Principal

ALICE = Principal("0b7c3f5e-0000-4000-8000-000000000001", "alice", frozenset({"read", "cancel"}))


def test_a_session_round_trips_and_gets_a_fresh_csrf_token_per_login():
    codec = SessionCodec("key-one")
    first, second = Session.start(ALICE), Session.start(ALICE)
    assert first.csrf != second.csrf and len(first.csrf) >= 32
    assert codec.loads(codec.dumps(first)) == first
    assert first.allows("cancel") and not first.allows("admin")


def test_a_forged_altered_or_foreign_cookie_is_no_session():
    codec = SessionCodec("key-one")
    value = codec.dumps(Session.start(ALICE))
    assert codec.loads(None) is None and codec.loads("") is None
    assert codec.loads(value[:-2] + ("AA" if value[-2:] != "AA" else "BB")) is None
    assert SessionCodec("another-deployment").loads(value) is None
    # signed with the right key but not by the codec (no fields): still refused
    forged = URLSafeTimedSerializer("key-one", salt="leasework-console-session").dumps({"x": 1})
    assert codec.loads(forged) is None
    # the login nonce's signature does not pass as a session
    _, login_cookie = codec.login_nonce()
    assert codec.loads(login_cookie) is None


def test_a_session_older_than_its_max_age_is_refused(monkeypatch):
    codec = SessionCodec("key-one")
    value = codec.dumps(Session.start(ALICE))
    later = time.time() + 3601
    monkeypatch.setattr(time, "time", lambda: later)
    assert codec.loads(value, max_age=3600) is None
    assert codec.loads(value, max_age=7200) is not None


def test_csrf_needs_the_sessions_own_token():
    session = Session.start(ALICE)
    assert csrf_ok(session, session.csrf)
    assert not csrf_ok(session, None)
    assert not csrf_ok(session, "")
    assert not csrf_ok(session, Session.start(ALICE).csrf)


def test_the_login_nonce_must_match_its_signed_cookie():
    codec = SessionCodec("key-one")
    nonce, cookie = codec.login_nonce()
    assert codec.login_ok(cookie, nonce)
    other_nonce, _ = codec.login_nonce()
    assert not codec.login_ok(cookie, other_nonce)
    assert not codec.login_ok(None, nonce)
    assert not codec.login_ok(cookie, None)
    assert not SessionCodec("key-two").login_ok(cookie, nonce)


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        (None, "127.0.0.1:8080", True),
        ("http://127.0.0.1:8080", "127.0.0.1:8080", True),
        ("http://evil.example", "127.0.0.1:8080", False),
        ("http://127.0.0.1:9999", "127.0.0.1:8080", False),
        ("null", "127.0.0.1:8080", False),
        ("http://127.0.0.1:8080", None, False),
    ],
)
def test_same_origin(origin, host, same):
    assert same_origin(origin, host) is same


@pytest.mark.parametrize(
    ("target", "safe"),
    [
        ("/ui/jobs?status=dead", "/ui/jobs?status=dead"),
        ("/ui", "/ui"),
        (None, "/ui"),
        ("https://evil.example/ui", "/ui"),
        ("//evil.example/ui", "/ui"),
        ("/ui//evil.example", "/ui"),
        ("/uix", "/ui"),
        ("/ui/\\evil", "/ui"),
        ("/ui/\r\nSet-Cookie: x", "/ui"),
        ("/jobs", "/ui"),
    ],
)
def test_after_login_only_console_paths(target, safe):
    assert safe_next(target) == safe


def test_cookies_are_httponly_samesite_strict_and_scoped_to_the_console():
    options = cookie_options(secure=False)
    assert options["httponly"] is True and options["samesite"] == "Strict"
    assert options["path"] == "/ui" and options["secure"] is False
    assert cookie_options(secure=True)["secure"] is True


def test_the_cookie_is_secure_behind_a_trusted_tls_proxy_only():
    import ipaddress

    from leasework.api.console.routes import served_over_tls

    proxies = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1/128"))
    assert served_over_tls("https", None, None, ())
    assert served_over_tls("http", "10.1.2.3", "https", proxies)
    assert served_over_tls("http", "::1", "HTTPS", proxies)
    assert not served_over_tls("http", "10.1.2.3", "http", proxies)
    assert not served_over_tls("http", "192.0.2.7", "https", proxies)  # not a trusted peer
    assert not served_over_tls("http", "10.1.2.3", "https", ())  # no proxy declared
    assert not served_over_tls("http", "not an address", "https", proxies)
