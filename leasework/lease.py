"""Leases and fence tokens in Redis, each operation one Lua script (atomic on the server), for
a whole batch of jobs in one call.

* claim: for each job, set ``lease:{job}`` only if unheld, with a TTL, and take the next
  fence token from the counter in the same script; a token per job won, None where another
  worker holds the lease.
* renew: extend each TTL only while the lease still carries our token.
* release: delete each lease only while it still carries our token.
* reseed: move the counter above a floor (the largest fence Postgres has seen), used when
  Redis lost its counter (restart without data, FLUSHALL) and handed out an old number.

Redis is derived state: Postgres refuses a stamp whose fence is not above the stored one,
so a wiped Redis costs a retry, never a duplicate. The client is redis-py's blocking one;
every call runs in a worker thread under a limiter, one thread hop per batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import trio

from leasework import redisconn
from leasework.redisconn import RedisTarget

FENCE_KEY = "leasework:fence"

# KEYS: the lease keys, then the fence counter; ARGV: owner, ttl ms.
# Returns per lease key: its new fence, or 0 when another holder has it.
CLAIM = """
local counter = KEYS[#KEYS]
local won = {}
for i = 1, #KEYS - 1 do
    if redis.call('EXISTS', KEYS[i]) == 1 then
        won[i] = 0
    else
        local fence = redis.call('INCR', counter)
        redis.call('SET', KEYS[i], ARGV[1] .. '|' .. fence, 'PX', ARGV[2])
        won[i] = fence
    end
end
return won
"""

# KEYS: the lease keys; ARGV: ttl ms, then each key's token. Returns 1 or 0 per key.
RENEW = """
local held = {}
for i = 1, #KEYS do
    if redis.call('GET', KEYS[i]) == ARGV[i + 1] then
        redis.call('PEXPIRE', KEYS[i], ARGV[1])
        held[i] = 1
    else
        held[i] = 0
    end
end
return held
"""

# KEYS: the lease keys; ARGV: each key's token. Returns 1 or 0 per key.
RELEASE = """
local released = {}
for i = 1, #KEYS do
    if redis.call('GET', KEYS[i]) == ARGV[i] then
        released[i] = redis.call('DEL', KEYS[i])
    else
        released[i] = 0
    end
end
return released
"""

RESEED = """
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local floor = tonumber(ARGV[1])
if current < floor then
    redis.call('SET', KEYS[1], floor)
    return floor
end
return current
"""


def lease_key(job_id: uuid.UUID | str) -> str:
    return f"leasework:lease:{job_id}"


@dataclass(frozen=True)
class Claim:
    job_id: uuid.UUID
    owner: str
    fence: int

    @property
    def token(self) -> str:
        return f"{self.owner}|{self.fence}"


class LeaseStore:
    """Blocking lease operations; :class:`Leases` is the Trio front."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._claim = client.register_script(CLAIM)
        self._renew = client.register_script(RENEW)
        self._release = client.register_script(RELEASE)
        self._reseed = client.register_script(RESEED)

    def claim_many(
        self, job_ids: Sequence[uuid.UUID], owner: str, ttl: float
    ) -> list[Claim | None]:
        """A claim per job won, None where another worker holds the lease."""
        if not job_ids:
            return []
        keys = [lease_key(j) for j in job_ids] + [FENCE_KEY]
        fences = self._claim(keys=keys, args=[owner, int(ttl * 1000)])
        return [
            Claim(job_id, owner, int(fence)) if int(fence) else None
            for job_id, fence in zip(job_ids, fences, strict=True)
        ]

    def renew_many(self, claims: Sequence[Claim], ttl: float) -> list[bool]:
        if not claims:
            return []
        keys = [lease_key(c.job_id) for c in claims]
        held = self._renew(keys=keys, args=[int(ttl * 1000), *(c.token for c in claims)])
        return [bool(h) for h in held]

    def release_many(self, claims: Sequence[Claim]) -> list[bool]:
        if not claims:
            return []
        keys = [lease_key(c.job_id) for c in claims]
        return [bool(r) for r in self._release(keys=keys, args=[c.token for c in claims])]

    def claim(self, job_id: uuid.UUID, owner: str, ttl: float) -> Claim | None:
        return self.claim_many([job_id], owner, ttl)[0]

    def renew(self, claim: Claim, ttl: float) -> bool:
        return self.renew_many([claim], ttl)[0]

    def release(self, claim: Claim) -> bool:
        return self.release_many([claim])[0]

    def reseed(self, floor: int) -> int:
        return int(self._reseed(keys=[FENCE_KEY], args=[floor]))


class Leases:
    def __init__(self, target: RedisTarget, *, limit: int = 4) -> None:
        self.client = redisconn.connect(target, timeout=3, health_check_interval=10)
        self.store = LeaseStore(self.client)
        self.limiter = trio.CapacityLimiter(limit)

    async def _call(self, fn, *args):
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def claim_many(
        self, job_ids: Sequence[uuid.UUID], owner: str, ttl: float
    ) -> list[Claim | None]:
        return await self._call(self.store.claim_many, job_ids, owner, ttl)

    async def renew_many(self, claims: Sequence[Claim], ttl: float) -> list[bool]:
        return await self._call(self.store.renew_many, claims, ttl)

    async def release_many(self, claims: Sequence[Claim]) -> list[bool]:
        return await self._call(self.store.release_many, claims)

    async def reseed(self, floor: int) -> int:
        return await self._call(self.store.reseed, floor)
