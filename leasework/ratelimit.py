"""Rate limits in Redis: one Lua script reserves the start slots of a whole batch of jobs
on Redis's clock (:func:`leasework.rates.reserve` is the same rule in Python). Each limit's
state is one key, ``leasework:rate:<limit key>``, holding its theoretical arrival time in
ms. A limit whose state is missing answers -1 unless the call gives its floor (the latest
start Postgres keeps reserved for it); :class:`RateLimits` then asks Postgres and calls
again for those alone.

The blocking client is the leases' (one connection pool, one limiter): one thread hop per
batch. Redis unreachable raises, and the claim waits: a rate limit degrades to waiting,
never to running more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import redis
import trio

from leasework.rates import KEEP_FULL_MS, Rate

# KEYS: a limit's state key per request (repeated for several jobs of one limit); ARGV: per
# request its interval ms, tau ms and floor ms (-1: not known). Returns Redis's now (ms),
# then each request's reserved start (ms), or -1 where the state is missing and no floor
# was given (nothing written for it).
RESERVE = f"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {{now}}
for i = 1, #KEYS do
    local interval = tonumber(ARGV[3 * i - 2])
    local tau = tonumber(ARGV[3 * i - 1])
    local floor = tonumber(ARGV[3 * i])
    local tat = tonumber(redis.call('GET', KEYS[i]) or '-1')
    if tat < 0 and floor >= 0 then
        tat = now + tau
        if floor > 0 then
            tat = math.max(tat, floor + tau + interval)
        end
    end
    if tat < 0 then
        out[i + 1] = -1
    else
        out[i + 1] = math.max(tat - tau, now)
        tat = math.max(tat, now) + interval
        redis.call('SET', KEYS[i], string.format('%d', tat), 'PX',
                   string.format('%d', math.max(tat - now, 0) + tau + {KEEP_FULL_MS}))
    end
end
return out
"""


def state_key(limit_key: str) -> str:
    return f"leasework:rate:{limit_key}"


@dataclass(frozen=True)
class Reservation:
    """A request's reserved start and Redis's clock when it was made, in ms."""

    start_ms: int
    now_ms: int

    @property
    def wait(self) -> float:
        """Seconds until the start (0: now)."""
        return max(0, self.start_ms - self.now_ms) / 1000


class RateStore:
    """The blocking script call; :class:`RateLimits` is the Trio front."""

    def __init__(self, client: redis.Redis) -> None:
        self._reserve = client.register_script(RESERVE)

    def reserve_many(
        self, requests: Sequence[tuple[str, Rate]], floors: Sequence[int | None]
    ) -> tuple[int, list[int | None]]:
        """(Redis's now, each request's start; None where its state is missing and its floor
        None)."""
        if not requests:
            return 0, []
        args: list[int] = []
        for (_, rate), floor in zip(requests, floors, strict=True):
            args += [rate.interval_ms, rate.tau_ms, -1 if floor is None else floor]
        answer = self._reserve(keys=[state_key(k) for k, _ in requests], args=args)
        now, starts = int(answer[0]), [int(s) for s in answer[1:]]
        return now, [None if s < 0 else s for s in starts]


class RateLimits:
    """Reserve start slots for a batch: ``floors`` reads Postgres's latest reservation of
    the limits whose state Redis lost (ms; 0 where none)."""

    def __init__(self, client: redis.Redis, limiter: trio.CapacityLimiter) -> None:
        self.store = RateStore(client)
        self.limiter = limiter

    async def reserve(
        self,
        requests: Sequence[tuple[str, Rate]],
        floors: Callable[[list[str]], Awaitable[dict[str, int]]],
    ) -> list[Reservation]:
        now, starts = await trio.to_thread.run_sync(
            self.store.reserve_many, requests, [None] * len(requests), limiter=self.limiter
        )
        missing = [i for i, s in enumerate(starts) if s is None]
        if missing:
            keys = sorted({requests[i][0] for i in missing})
            known = await floors(keys)
            again = [requests[i] for i in missing]
            now, seeded = await trio.to_thread.run_sync(
                self.store.reserve_many,
                again,
                [known.get(k, 0) for k, _ in again],
                limiter=self.limiter,
            )
            for i, start in zip(missing, seeded, strict=True):
                starts[i] = start if start is not None else now  # (a floor was given)
        return [Reservation(s if s is not None else now, now) for s in starts]
