"""API tokens (pure): format, the keyed hash (and the slow one it replaces), scopes."""

import pytest

from leasework.tokens import (
    Principal,
    TokenError,
    fingerprint,
    hash_token,
    hash_token_scrypt,
    needs_rehash,
    new_token,
    parse_scopes,
    prefix_of,
    verify_token,
)

KEY = b"k" * 32


def test_a_token_is_found_by_its_prefix_and_checked_against_a_keyed_hash():
    token, prefix = new_token()
    assert token.startswith(f"lw_{prefix}_") and prefix_of(token) == prefix
    stored = hash_token(token, KEY)
    assert token not in stored and stored.startswith("hmac-sha256$")
    assert not needs_rehash(stored)
    assert verify_token(token, stored, KEY)
    assert not verify_token(token, stored, b"another key")  # the key is part of the hash
    other, _ = new_token()
    assert not verify_token(other, stored, KEY)
    assert not verify_token(token[:-1] + ("A" if token[-1] != "A" else "B"), stored, KEY)


def test_a_token_made_before_the_keyed_hash_still_verifies_and_asks_to_be_rehashed():
    token, _ = new_token()
    stored = hash_token_scrypt(token)
    assert stored.startswith("scrypt$16384$8$1$") and needs_rehash(stored)
    assert verify_token(token, stored, KEY)
    assert hash_token_scrypt(token) != stored  # a new salt each time
    other, _ = new_token()
    assert not verify_token(other, stored, KEY)


@pytest.mark.parametrize("bad", ["", "lw_short_x", "Bearer lw_x", "lw_ABCDEFGH_" + "a" * 10])
def test_a_malformed_token_has_no_prefix(bad):
    assert prefix_of(bad) is None


def test_a_stored_hash_of_another_scheme_never_verifies():
    assert not verify_token("lw_x", "plain$lw_x", KEY)
    assert not verify_token("lw_x", "not even split", KEY)
    assert not verify_token("lw_x", "hmac-sha256$", KEY)


def test_scopes_are_checked_and_admin_allows_everything():
    assert parse_scopes("submit, read") == {"submit", "read"}
    with pytest.raises(TokenError, match="unknown scope.*write.*choose from submit"):
        parse_scopes("read,write")
    with pytest.raises(TokenError, match="none given"):
        parse_scopes("")
    reader = Principal("1", "r", frozenset({"read"}))
    assert reader.allows("read") and not reader.allows("cancel")
    assert Principal("2", "a", frozenset({"admin"})).allows("cancel")


def test_fingerprints_are_stable_and_distinct():
    assert fingerprint("a") == fingerprint("a") != fingerprint("b")
