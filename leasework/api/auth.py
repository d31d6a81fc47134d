"""Who may call the api: bearer tokens with scopes, and a per-token rate limit. Which scope each
operation needs is in its entry of the route table (:data:`leasework.api.routes.ROUTES`); the
guard (:mod:`leasework.api.guard`) checks it.

* :class:`Authenticator` keeps every live token in memory, reloaded twice a second, so a
  token is looked up by its prefix without a query (a stranger's token never reaches
  Postgres) and a revoked one stops working within a second on every api process. A secret
  is checked by HMAC (a microsecond); a token checked once is remembered; a wrong secret is
  refused for a minute without another check; failed checks are counted
  (``leasework_auth_failures_total{reason}``) and, past a few a second for one prefix,
  answered after a delay.
* :class:`RateLimiter` is a token bucket per token in Redis (one Lua script; concurrent checks
  share one call). A Redis outage lets requests through, counted and logged, and answers
  carry ``RateLimit-Status: unavailable``: it never costs a job.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import dataclass, field

import psycopg
import redis
import trio

from leasework import metrics, redisconn
from leasework.db import Database
from leasework.redisconn import RedisTarget
from leasework.store import operators
from leasework.tokens import (
    Principal,
    fingerprint,
    hash_token,
    needs_rehash,
    prefix_of,
    verify_token,
)

log = logging.getLogger("leasework.api.auth")

REFRESH_EVERY = 0.5  # seconds between reloads of the live tokens
REFUSED_FOR = 60.0  # seconds a token that failed its check is refused without another
REFUSED_MAX = 10_000  # such tokens remembered at once
SLOW_VERIFY_CONCURRENCY = 2  # legacy scrypt checks at once (each ~16 MiB and tens of ms)
# failed checks one prefix may cost per second (and in a burst) before its 401s are delayed
FAILURES_PER_PREFIX = 5.0
FAILURE_BURST = 20
FAILURE_DELAY = 1.0  # seconds a throttled failure waits before its answer
DELAYED_MAX = 256  # answers waiting at once; past that they are not delayed
# an unknown prefix may be a token made a moment ago: it waits for one reload that began
# after it arrived (shared by every request waiting, so still no query per request), at most
# this long
UNKNOWN_WAIT = 2.0
UNKNOWN_WAITING_MAX = 1_000


class _Bucket:
    """A token bucket on the Trio clock (per prefix, for failed checks)."""

    __slots__ = ("tokens", "at")

    def __init__(self, now: float) -> None:
        self.tokens = float(FAILURE_BURST)
        self.at = now

    def take(self, now: float) -> bool:
        self._refill(now)
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def empty(self, now: float) -> bool:
        self._refill(now)
        return self.tokens < 1

    def _refill(self, now: float) -> None:
        self.tokens = min(FAILURE_BURST, self.tokens + (now - self.at) * FAILURES_PER_PREFIX)
        self.at = now


class Authenticator:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._verified: dict[str, Principal] = {}  # fingerprint -> principal
        self._by_prefix: dict[str, operators.TokenRow] | None = None  # None until loaded
        self._by_id: dict[str, operators.TokenRow] = {}  # the same rows by token id
        self._gone: set[str] = set()  # prefixes that were live and no longer are (revoked)
        self._key: bytes | None = None  # the deployment's HMAC key
        self._used: set[str] = set()
        self._rehash: dict[uuid.UUID, tuple[str, str]] = {}
        self._refused: dict[str, float] = {}  # fingerprint -> until when
        self._failures: dict[str, _Bucket] = {}  # prefix -> failed checks
        self._delayed = 0
        self._waiting = 0
        self._running = False  # whether run() reloads
        self._reloaded = trio.Event()  # set (and replaced) by every reload
        self._reloads_begun = 0  # reloads started, and the last one finished, by number
        self._reload_finished = 0
        self._loading = trio.Lock()
        self._slow = trio.CapacityLimiter(SLOW_VERIFY_CONCURRENCY)

    async def principal(self, token: str) -> Principal | None:
        """The principal of a valid, live token; None for anything else."""
        key = fingerprint(token)
        known = self._verified.get(key)
        if known is not None and self.is_live(known.token_id):
            self._used.add(known.token_id)
            return known
        prefix = prefix_of(token)
        if prefix is None:
            return await self._failed("malformed", None)
        if self._refused.get(key, 0.0) > trio.current_time():
            return await self._failed("refused_again", prefix)
        if self._by_prefix is None or self._key is None:
            await self._first_load()
        row = (self._by_prefix or {}).get(prefix)
        if (
            row is None
            and prefix not in self._gone  # a revoked token is refused at once
            and self._running
            and self._waiting < UNKNOWN_WAITING_MAX
        ):
            row = await self._after_a_reload(prefix)
        if row is None or self._key is None:
            return await self._failed("unknown_prefix", prefix)
        slow = needs_rehash(row.token_hash)
        if slow:
            # a hash made before the keyed one costs scrypt's CPU and memory: each check is
            # paid from the prefix's failure budget up front, so wrong secrets cannot buy more
            # than the budget (the first good use rewrites it as HMAC)
            if not self._bucket(prefix).take(trio.current_time()):
                return await self._failed("throttled", prefix, charged=True)
            ok = await trio.to_thread.run_sync(
                verify_token, token, row.token_hash, self._key, limiter=self._slow
            )
            if ok:
                self._rehash[row.id] = (row.token_hash, hash_token(token, self._key))
        else:
            ok = verify_token(token, row.token_hash, self._key)
        if not ok:
            if len(self._refused) >= REFUSED_MAX:
                self._refused.clear()
            self._refused[key] = trio.current_time() + REFUSED_FOR
            return await self._failed("wrong_secret", prefix, charged=slow)
        principal = Principal(str(row.id), row.name, row.scopes, row.rate, row.burst)
        self._verified[key] = principal
        self._used.add(principal.token_id)
        return principal

    def _bucket(self, prefix: str) -> _Bucket:
        bucket = self._failures.get(prefix)
        if bucket is None:
            if len(self._failures) >= REFUSED_MAX:
                self._failures.clear()
            bucket = self._failures[prefix] = _Bucket(trio.current_time())
        return bucket

    async def _failed(self, reason: str, prefix: str | None, charged: bool = False) -> None:
        """Count a failed check; past the prefix's budget, answer it a little later
        (``charged``: the check was paid from the budget already)."""
        metrics.auth_failures.labels(reason).inc()
        if prefix is None:
            return None
        bucket = self._bucket(prefix)
        spent = (
            bucket.empty(trio.current_time()) if charged else not bucket.take(trio.current_time())
        )
        if spent and self._delayed < DELAYED_MAX:
            metrics.auth_failures.labels("throttled").inc()
            self._delayed += 1
            try:
                await trio.sleep(FAILURE_DELAY)
            finally:
                self._delayed -= 1
        return None

    async def _after_a_reload(self, prefix: str) -> operators.TokenRow | None:
        """The prefix's row once a reload that began after this request has finished (one in
        progress when it arrived may have read the tokens before the new one was made): a
        token made just before its first use is found, with no query of its own, at most
        :data:`REFRESH_EVERY` plus one query later."""
        wanted = self._reloads_begun + 1
        self._waiting += 1
        try:
            with trio.move_on_after(UNKNOWN_WAIT):
                while self._reload_finished < wanted:
                    await self._reloaded.wait()
        finally:
            self._waiting -= 1
        return (self._by_prefix or {}).get(prefix)

    def is_live(self, token_id: str) -> bool:
        return self._by_prefix is None or token_id in self._by_id

    def live_principal(self, token_id: str) -> Principal | None:
        """The principal of a live token by id (the console's sessions carry the id)."""
        row = self._by_id.get(token_id)
        if row is None:
            return None
        return Principal(str(row.id), row.name, row.scopes, row.rate, row.burst)

    async def _first_load(self) -> None:
        """Before the first reload has run: one load, shared by every request waiting."""
        async with self._loading:
            if self._by_prefix is None or self._key is None:
                try:
                    await self.refresh_once()
                except psycopg.Error as exc:
                    log.warning("cannot load live tokens", extra={"error": str(exc)[:200]})

    async def refresh_once(self) -> None:
        self._reloads_begun += 1
        number = self._reloads_begun
        used, self._used = self._used, set()
        rehash, self._rehash = self._rehash, {}

        def reload(conn: psycopg.Connection) -> tuple[bytes, list[operators.TokenRow]]:
            if rehash:
                operators.tokens_rehash(conn, rehash)
            if used:
                operators.tokens_touch(conn, [uuid.UUID(i) for i in used])
            key = self._key if self._key is not None else operators.token_key(conn)
            return key, operators.tokens_live(conn)

        self._key, rows = await self.db.run(reload)
        if self._by_prefix is not None:
            if len(self._gone) >= REFUSED_MAX:
                self._gone.clear()
            self._gone |= set(self._by_prefix) - {row.prefix for row in rows}
        self._by_prefix = {row.prefix: row for row in rows}
        self._by_id = {str(row.id): row for row in rows}
        for key, principal in list(self._verified.items()):
            if principal.token_id not in self._by_id:
                del self._verified[key]
        self._reload_finished = max(self._reload_finished, number)
        self._reloaded.set()
        self._reloaded = trio.Event()

    async def run(self) -> None:
        """Reload the live tokens every REFRESH_EVERY seconds. While the database cannot be
        reached the last known set stands (revocations wait; nothing else does)."""
        self._running = True
        while True:
            try:
                await self.refresh_once()
            except psycopg.Error as exc:
                log.warning("cannot reload live tokens", extra={"error": str(exc)[:200]})
            await trio.sleep(REFRESH_EVERY)


# KEYS: the buckets; ARGV: per bucket its rate (per second) and burst. Returns per bucket 0
# (allowed, one token taken) or the milliseconds until one token is back. Redis's own clock.
RATE_SCRIPT = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local out = {}
for i = 1, #KEYS do
    local rate = tonumber(ARGV[2 * i - 1])
    local burst = tonumber(ARGV[2 * i])
    local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
    local tokens = tonumber(state[1]) or burst
    local ts = tonumber(state[2]) or now
    tokens = math.min(burst, tokens + math.max(0, now - ts) / 1000 * rate)
    if tokens >= 1 then
        tokens = tokens - 1
        out[i] = 0
    else
        out[i] = math.ceil((1 - tokens) / rate * 1000)
    end
    redis.call('HSET', KEYS[i], 'tokens', tostring(tokens), 'ts', now)
    redis.call('PEXPIRE', KEYS[i], math.ceil(burst / rate * 1000) + 1000)
end
return out
"""


@dataclass
class _Check:
    principal: Principal
    done: trio.Event = field(default_factory=trio.Event)
    retry_after: float | None = None


class RateLimiter:
    """Token buckets per token in Redis; checks made at once share one script call."""

    def __init__(self, target: RedisTarget) -> None:
        self.client = redisconn.connect(target, timeout=1)
        self._script = self.client.register_script(RATE_SCRIPT)
        self._send, self._receive = trio.open_memory_channel[_Check](math.inf)
        self._limiter = trio.CapacityLimiter(1)
        self.degraded = False  # Redis unreachable: requests pass unmetered

    async def check(self, principal: Principal) -> float | None:
        """None: allowed; else seconds until the token may try again (a 429)."""
        if principal.rate is None:
            return None
        check = _Check(principal)
        self._send.send_nowait(check)
        await check.done.wait()
        return check.retry_after

    def _call(self, checks: list[_Check]) -> list[int]:
        keys = [f"leasework:rate:{c.principal.token_id}" for c in checks]
        args: list[float] = []
        for c in checks:
            args += [
                c.principal.rate or 1.0,
                c.principal.burst or max(1, int(c.principal.rate or 1)),
            ]
        return [int(v) for v in self._script(keys=keys, args=args)]

    async def run(self) -> None:
        while True:
            batch = [await self._receive.receive()]
            while True:
                try:
                    batch.append(self._receive.receive_nowait())
                except trio.WouldBlock:
                    break
            try:
                waits = await trio.to_thread.run_sync(self._call, batch, limiter=self._limiter)
                if self.degraded:
                    log.info("rate limiting works again")
                self.degraded = False
            except redis.RedisError as exc:
                if not self.degraded:
                    log.warning(
                        "rate limit store unreachable: letting requests through unmetered",
                        extra={"error": str(exc)[:200]},
                    )
                self.degraded = True
                metrics.rate_limit_unavailable.inc(len(batch))
                waits = [0] * len(batch)
            for check, wait_ms in zip(batch, waits, strict=True):
                check.retry_after = wait_ms / 1000 if wait_ms else None
                check.done.set()
