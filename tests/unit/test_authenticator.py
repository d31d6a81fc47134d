"""The Authenticator's caches (pure, with a stand-in for the database): a verified token is
checked once, a wrong secret is refused for a minute without another scrypt check, and a
token missing from the live set is refused."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from leasework import auth
from leasework.store import operators
from leasework.tokens import hash_token, new_token

TOKEN, PREFIX = new_token()
ROW = operators.TokenRow(
    id=uuid.uuid4(),
    name="ci",
    prefix=PREFIX,
    token_hash=hash_token(TOKEN),
    scopes=frozenset({"read"}),
    rate=None,
    burst=None,
    created_at=datetime.now(UTC),
    created_by="test",
    revoked_at=None,
    last_used_at=None,
)


class Rows:
    """Answers the Authenticator's two queries from memory."""

    def __init__(self) -> None:
        self.live = {ROW.id}

    async def run(self, fn, *args):
        if fn is operators.token_by_prefix:
            # as the real query: only a live (unrevoked) token's row
            return ROW if args[0] == PREFIX and ROW.id in self.live else None
        if fn is operators.tokens_live_ids:
            return set(self.live)
        return None


async def test_a_token_is_verified_once_and_a_wrong_secret_refused_without_rehashing(
    monkeypatch,
):
    checks = []
    real = auth.verify_token
    monkeypatch.setattr(auth, "verify_token", lambda t, h: checks.append(t) or real(t, h))
    authenticator = auth.Authenticator(Rows())  # type: ignore[arg-type]
    assert (await authenticator.principal(TOKEN)).name == "ci"
    assert (await authenticator.principal(TOKEN)).name == "ci"
    wrong = TOKEN[:-1] + ("A" if TOKEN[-1] != "A" else "B")
    assert await authenticator.principal(wrong) is None
    assert await authenticator.principal(wrong) is None
    assert checks == [TOKEN, wrong]


async def test_a_token_no_longer_live_is_refused_after_the_reload():
    rows = Rows()
    authenticator = auth.Authenticator(rows)  # type: ignore[arg-type]
    await authenticator.refresh_once()
    assert await authenticator.principal(TOKEN) is not None
    rows.live.clear()
    await authenticator.refresh_once()
    assert await authenticator.principal(TOKEN) is None
