"""Who may call the api: bearer tokens with scopes, a per-token rate limit, and the route
table that says which scope each operation needs.

* :class:`Authenticator` checks a token against its scrypt hash once, then remembers it; a
  loop reloads the live token ids twice a second, so a revoked token stops working within a
  second on every api process.
* :class:`RateLimiter` is a token bucket per token in Redis (one Lua script; concurrent checks
  share one call). A Redis outage lets requests through, counted and logged, and answers
  carry ``RateLimit-Status: unavailable``: it never costs a job.
* :class:`Routes` comes from the OpenAPI document: every operation names its scope there
  (``x-leasework-scope``), so an endpoint cannot be added without one.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from dataclasses import dataclass, field

import psycopg
import redis
import trio

from leasework import metrics
from leasework.db import Database
from leasework.store import operators
from leasework.tokens import Principal, fingerprint, prefix_of, verify_token

log = logging.getLogger("leasework.auth")

REFRESH_EVERY = 0.5  # seconds between reloads of the live token ids
REFUSED_FOR = 60.0  # seconds a token that failed its hash check is refused without another
REFUSED_MAX = 10_000  # such tokens remembered at once
VERIFY_CONCURRENCY = 2  # scrypt checks at once (each ~16 MiB and tens of ms)


class Authenticator:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._verified: dict[str, Principal] = {}  # fingerprint -> principal
        self._live: set[str] | None = None  # token ids; None until the first reload
        self._used: set[str] = set()
        # fingerprint -> until when: a wrong secret costs one scrypt check a minute, not one
        # per request (a guessed prefix must not buy an attacker the api's CPU)
        self._refused: dict[str, float] = {}
        self._limiter = trio.CapacityLimiter(VERIFY_CONCURRENCY)

    async def principal(self, token: str) -> Principal | None:
        """The principal of a valid, live token; None for anything else."""
        key = fingerprint(token)
        known = self._verified.get(key)
        if known is not None and (self._live is None or known.token_id in self._live):
            self._used.add(known.token_id)
            return known
        prefix = prefix_of(token)
        if prefix is None or self._refused.get(key, 0.0) > trio.current_time():
            return None
        row = await self.db.run(operators.token_by_prefix, prefix)
        if row is None:
            return None
        ok = await trio.to_thread.run_sync(
            verify_token, token, row.token_hash, limiter=self._limiter
        )
        if not ok:
            if len(self._refused) >= REFUSED_MAX:
                self._refused.clear()
            self._refused[key] = trio.current_time() + REFUSED_FOR
            return None
        principal = Principal(str(row.id), row.name, row.scopes, row.rate, row.burst)
        self._verified[key] = principal
        if self._live is not None:
            self._live.add(principal.token_id)
        self._used.add(principal.token_id)
        return principal

    def is_live(self, token_id: str) -> bool:
        return self._live is None or token_id in self._live

    async def refresh_once(self) -> None:
        live = {str(i) for i in await self.db.run(operators.tokens_live_ids)}
        self._live = live
        for key, principal in list(self._verified.items()):
            if principal.token_id not in live:
                del self._verified[key]
        used, self._used = self._used, set()
        if used:
            await self.db.run(operators.tokens_touch, [uuid.UUID(i) for i in used])

    async def run(self) -> None:
        """Reload the live token ids every REFRESH_EVERY seconds. While the database cannot
        be reached the last known set stands (revocations wait; nothing else does)."""
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

    def __init__(self, host: str, port: int) -> None:
        self.client = redis.Redis(host=host, port=port, socket_timeout=1, socket_connect_timeout=1)
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


# ---------------------------------------------------------------- the route table


@dataclass(frozen=True)
class Route:
    method: str
    template: str
    pattern: re.Pattern[str]
    scope: str | None  # None: public


class Routes:
    """(method, path) -> the scope the OpenAPI document names for that operation."""

    def __init__(self, document: dict) -> None:
        self.routes: list[Route] = []
        for template, operations in document["paths"].items():
            parts = re.split(r"\{[^}]+\}", template)
            regex = "^" + "[^/]+".join(re.escape(part) for part in parts) + "$"
            for method, operation in operations.items():
                scope = operation.get("x-leasework-scope")
                public = not operation.get("security", True)
                if scope is None and not public:
                    raise ValueError(f"{method.upper()} {template} names no x-leasework-scope")
                self.routes.append(
                    Route(method.upper(), template, re.compile(regex), None if public else scope)
                )
        # the most specific first: a literal segment beats a parameter, as in any router
        # (``/jobs/batch`` is not ``/jobs/{job_id}``)
        self.routes.sort(key=lambda r: (r.template.count("{"), -len(r.template)))

    def _template(self, path: str) -> str | None:
        """The most specific template ``path`` matches."""
        return next((r.template for r in self.routes if r.pattern.match(path)), None)

    def match(self, method: str, path: str) -> Route | None:
        template = self._template(path)
        return next((r for r in self.routes if r.template == template and r.method == method), None)

    def allowed(self, path: str) -> list[str]:
        """The methods the document defines for ``path`` (for a 405's ``Allow``)."""
        template = self._template(path)
        return sorted({r.method for r in self.routes if r.template == template})
