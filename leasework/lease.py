"""Leases and fence tokens in Redis, each operation one Lua script (atomic on the server).

* claim: set ``lease:{job}`` only if unheld, with a TTL, and take the next fence token from
  the counter in the same script; returns the token, or None if another worker holds it.
* renew: extend the TTL only while the lease still carries our token.
* release: delete the lease only while it still carries our token.
* reseed: move the counter above a floor (the largest fence Postgres has seen), used when
  Redis lost its counter (restart without data, FLUSHALL) and handed out an old number.

Redis is derived state: Postgres refuses a stamp whose fence is not above the stored one,
so a wiped Redis costs a retry, never a duplicate. The client is redis-py's blocking one;
every call runs in a worker thread under a limiter.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import redis
import trio

FENCE_KEY = "leasework:fence"

CLAIM = """
if redis.call('EXISTS', KEYS[1]) == 1 then
    return {0, redis.call('GET', KEYS[1])}
end
local fence = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. fence, 'PX', ARGV[2])
return {1, fence}
"""

RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return 1
end
return 0
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
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

    def claim(self, job_id: uuid.UUID, owner: str, ttl: float) -> Claim | None:
        won, value = self._claim(keys=[lease_key(job_id), FENCE_KEY], args=[owner, int(ttl * 1000)])
        return Claim(job_id, owner, int(value)) if won else None

    def renew(self, claim: Claim, ttl: float) -> bool:
        return bool(
            self._renew(keys=[lease_key(claim.job_id)], args=[claim.token, int(ttl * 1000)])
        )

    def release(self, claim: Claim) -> bool:
        return bool(self._release(keys=[lease_key(claim.job_id)], args=[claim.token]))

    def reseed(self, floor: int) -> int:
        return int(self._reseed(keys=[FENCE_KEY], args=[floor]))


class Leases:
    def __init__(self, host: str, port: int, *, limit: int = 8) -> None:
        self.client = redis.Redis(
            host=host,
            port=port,
            socket_timeout=3,
            socket_connect_timeout=3,
            health_check_interval=10,
        )
        self.store = LeaseStore(self.client)
        self.limiter = trio.CapacityLimiter(limit)

    async def _call(self, fn, *args):
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    async def claim(self, job_id: uuid.UUID, owner: str, ttl: float) -> Claim | None:
        return await self._call(self.store.claim, job_id, owner, ttl)

    async def renew(self, claim: Claim, ttl: float) -> bool:
        return await self._call(self.store.renew, claim, ttl)

    async def release(self, claim: Claim) -> bool:
        return await self._call(self.store.release, claim)

    async def reseed(self, floor: int) -> int:
        return await self._call(self.store.reseed, floor)

    def close(self) -> None:
        self.client.close()
