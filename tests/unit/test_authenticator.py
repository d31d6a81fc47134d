"""The Authenticator (pure, with a stand-in for the database): live tokens are held in memory,
so a stranger's token never costs a query; a token is checked once; a wrong secret is refused
for a minute without another check; failures are counted and, past a prefix's budget,
answered late; a token made with the old slow hash is rewritten on first good use."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime

import trio

from leasework import metrics
from leasework.api import auth
from leasework.store import operators
from leasework.tokens import hash_token, hash_token_scrypt, needs_rehash, new_token

KEY = b"deployment key" * 3
TOKEN, PREFIX = new_token()
ROW = operators.TokenRow(
    id=uuid.uuid4(),
    name="ci",
    prefix=PREFIX,
    token_hash=hash_token(TOKEN, KEY),
    scopes=frozenset({"read"}),
    rate=None,
    burst=None,
    created_at=datetime.now(UTC),
    created_by="test",
    revoked_at=None,
    last_used_at=None,
)


class Rows:
    """Answers the Authenticator's reload from memory, and counts the round trips."""

    def __init__(self, row: operators.TokenRow = ROW) -> None:
        self.rows = {row.id: row}
        self.queries = 0
        self.rehashed: dict[uuid.UUID, tuple[str, str]] = {}

    async def run(self, fn, *args):
        self.queries += 1
        return fn(self, *args)

    # the store functions the reload calls, given this object as the "connection"
    def execute(self, *_):  # pragma: no cover - only the patched functions are called
        raise AssertionError("unexpected SQL")


def patch_store(monkeypatch, rows: Rows) -> None:
    monkeypatch.setattr(operators, "token_key", lambda conn: KEY)
    monkeypatch.setattr(operators, "tokens_live", lambda conn: list(conn.rows.values()))
    monkeypatch.setattr(operators, "tokens_touch", lambda conn, ids: None)

    def rehash(conn, hashes):
        conn.rehashed.update(hashes)
        for token_id, (_, new) in hashes.items():
            conn.rows[token_id] = replace(conn.rows[token_id], token_hash=new)

    monkeypatch.setattr(operators, "tokens_rehash", rehash)


def failures(reason: str) -> float:
    return metrics.auth_failures.labels(reason)._value.get()


async def test_a_token_is_verified_once_and_a_wrong_secret_refused_without_rechecking(
    monkeypatch,
):
    rows = Rows()
    patch_store(monkeypatch, rows)
    checks = []
    real = auth.verify_token
    monkeypatch.setattr(auth, "verify_token", lambda t, h, k: checks.append(t) or real(t, h, k))
    authenticator = auth.Authenticator(rows)  # type: ignore[arg-type]
    assert (await authenticator.principal(TOKEN)).name == "ci"
    assert (await authenticator.principal(TOKEN)).name == "ci"
    wrong = TOKEN[:-1] + ("A" if TOKEN[-1] != "A" else "B")
    before = failures("wrong_secret"), failures("refused_again")
    assert await authenticator.principal(wrong) is None
    assert await authenticator.principal(wrong) is None
    assert checks == [TOKEN, wrong]
    assert (failures("wrong_secret"), failures("refused_again")) == (before[0] + 1, before[1] + 1)


async def test_a_strangers_token_never_reaches_the_database(monkeypatch):
    rows = Rows()
    patch_store(monkeypatch, rows)
    authenticator = auth.Authenticator(rows)  # type: ignore[arg-type]
    await authenticator.refresh_once()
    loaded = rows.queries
    before = failures("unknown_prefix")
    for _ in range(50):
        stranger, _ = new_token()
        assert await authenticator.principal(stranger) is None
    assert await authenticator.principal("lw_not_a_token") is None
    assert rows.queries == loaded  # the live tokens are in memory: no query per request
    assert failures("unknown_prefix") == before + 50


async def test_a_token_no_longer_live_is_refused_after_the_reload(monkeypatch):
    rows = Rows()
    patch_store(monkeypatch, rows)
    authenticator = auth.Authenticator(rows)  # type: ignore[arg-type]
    await authenticator.refresh_once()
    assert await authenticator.principal(TOKEN) is not None
    assert authenticator.live_principal(str(ROW.id)).name == "ci"
    rows.rows.clear()
    await authenticator.refresh_once()
    assert await authenticator.principal(TOKEN) is None
    assert authenticator.live_principal(str(ROW.id)) is None


async def test_a_slow_hash_is_checked_in_a_thread_once_and_rewritten_as_hmac(monkeypatch):
    rows = Rows(replace(ROW, token_hash=hash_token_scrypt(TOKEN)))
    patch_store(monkeypatch, rows)
    authenticator = auth.Authenticator(rows)  # type: ignore[arg-type]
    assert (await authenticator.principal(TOKEN)).name == "ci"
    await authenticator.refresh_once()  # writes the new hash, then reloads it
    stored = rows.rows[ROW.id].token_hash
    assert not needs_rehash(stored) and stored == hash_token(TOKEN, KEY)
    assert list(rows.rehashed) == [ROW.id]


async def test_failures_past_a_prefixs_budget_are_answered_late(monkeypatch, autojump_clock):
    rows = Rows()
    patch_store(monkeypatch, rows)
    authenticator = auth.Authenticator(rows)  # type: ignore[arg-type]
    await authenticator.refresh_once()
    before = failures("throttled")
    started = trio.current_time()
    refused = []

    async def guess(n: int) -> None:
        refused.append(await authenticator.principal(f"lw_{PREFIX}_" + f"{n:043d}"))

    async with trio.open_nursery() as nursery:  # a guesser's burst, all at once
        for n in range(auth.FAILURE_BURST + 3):
            nursery.start_soon(guess, n)
    assert refused == [None] * (auth.FAILURE_BURST + 3)
    assert failures("throttled") == before + 3
    assert trio.current_time() - started == auth.FAILURE_DELAY
    # the right secret is never held back by a guesser
    at = trio.current_time()
    assert await authenticator.principal(TOKEN) is not None
    assert trio.current_time() == at


async def test_a_token_made_a_moment_ago_is_found_at_the_next_reload_without_a_query(
    monkeypatch, autojump_clock
):
    rows = Rows()
    patch_store(monkeypatch, rows)
    authenticator = auth.Authenticator(rows)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(authenticator.run)
        await trio.sleep(auth.REFRESH_EVERY * 1.5)
        fresh, prefix = new_token()
        row = replace(ROW, id=uuid.uuid4(), name="fresh", prefix=prefix)
        rows.rows[row.id] = replace(row, token_hash=hash_token(fresh, KEY))
        queries = rows.queries
        found = await authenticator.principal(fresh)
        assert found is not None and found.name == "fresh"
        assert rows.queries - queries <= 1  # the reload it waited for, nothing of its own
        started = trio.current_time()
        assert await authenticator.principal(new_token()[0]) is None  # a stranger: refused
        # after one reload interval at most, not UNKNOWN_WAIT and not two reloads
        assert trio.current_time() - started <= auth.REFRESH_EVERY + 0.01
        nursery.cancel_scope.cancel()


async def test_a_reload_already_running_when_the_request_came_does_not_count(
    monkeypatch, autojump_clock
):
    """A reload that read the tokens before the new one was made must not end the wait."""
    rows = Rows()
    patch_store(monkeypatch, rows)
    authenticator = auth.Authenticator(rows)  # type: ignore[arg-type]
    await authenticator.refresh_once()
    authenticator._running = True
    fresh, prefix = new_token()
    reading = trio.Event()
    release = trio.Event()
    real_run = rows.run

    async def slow_run(fn, *args):
        answer = await real_run(fn, *args)  # read before the token exists
        reading.set()
        await release.wait()
        return answer

    rows.run = slow_run  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(authenticator.refresh_once)
        await reading.wait()
        row = replace(ROW, id=uuid.uuid4(), name="fresh", prefix=prefix)
        rows.rows[row.id] = replace(row, token_hash=hash_token(fresh, KEY))
        found: list = []

        async def ask() -> None:
            found.append(await authenticator.principal(fresh))

        nursery.start_soon(ask)
        await trio.sleep(0.01)
        release.set()  # the old reload ends without the token: the request keeps waiting
        await trio.sleep(0.01)
        assert found == []
        rows.run = real_run  # type: ignore[method-assign]
        await authenticator.refresh_once()  # one that began after the request
        await trio.sleep(0.01)
        assert found and found[0] is not None and found[0].name == "fresh"


async def test_past_a_prefixs_budget_a_slow_hash_is_not_checked_at_all(monkeypatch, autojump_clock):
    rows = Rows(replace(ROW, token_hash=hash_token_scrypt(TOKEN)))
    patch_store(monkeypatch, rows)
    checks = []
    real = auth.verify_token
    monkeypatch.setattr(auth, "verify_token", lambda t, h, k: checks.append(t) or real(t, h, k))
    authenticator = auth.Authenticator(rows)  # type: ignore[arg-type]
    await authenticator.refresh_once()

    async def guess(n: int) -> None:
        assert await authenticator.principal(f"lw_{PREFIX}_" + f"{n:043d}") is None

    async with trio.open_nursery() as nursery:  # a guesser's burst, all at once
        for n in range(auth.FAILURE_BURST + 5):
            nursery.start_soon(guess, n)
    # it bought at most the budget's scrypt checks, not one per guess
    assert len(checks) == auth.FAILURE_BURST
