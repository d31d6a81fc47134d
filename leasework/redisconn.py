"""Where Redis is and how to reach it: a ``redis://`` or ``rediss://`` URL (user and password for
an ACL user, a database number), a CA for TLS, and optionally Sentinels that name the current
primary. Every Redis client leasework makes (the worker's leases, the api's rate limiter, the
readiness probe, ``leasework doctor``) is made here, so they all reach the same Redis the same
way.

Sentinel: leasework asks the Sentinels (``LEASEWORK_REDIS_SENTINELS``) for the primary of
``LEASEWORK_REDIS_SENTINEL_MASTER`` and reconnects to the new primary after a failover; the
URL's host and port are then unused, its user, password, database and scheme (TLS or not)
apply to the primary. The Sentinels are reached over the same scheme, with
``LEASEWORK_REDIS_SENTINEL_PASSWORD`` if they need one.

A failover can lose the last writes the old primary had not yet replicated, among them the
fence counter's last increments and some leases. Redis is derived state: Postgres refuses a
stamp whose fence is not above the one it stored, the claimer then reseeds the counter above
the largest fence Postgres has seen (``Leases.reseed``), and a lease lost this way is a lease
that expired early; it costs a retry, never a duplicate (docs/failure-modes.md, the same as a
Redis wipe, which chaos scenario f runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import redis

SCHEMES = ("redis", "rediss")


class RedisURLError(ValueError):
    """A Redis URL leasework cannot use."""


@dataclass(frozen=True)
class RedisTarget:
    """A Redis to connect to: ``url`` (with any password in it), a CA file for ``rediss://``,
    and the Sentinels that know the primary (empty: connect to the URL's host)."""

    url: str = "redis://127.0.0.1:16379/0"
    ca_file: str | None = None
    sentinels: tuple[tuple[str, int], ...] = ()
    sentinel_master: str = "leasework"
    sentinel_password: str | None = None

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"

    def describe(self) -> str:
        """Where it is, for a message: no password in it."""
        parts = urlsplit(self.url)
        user = f"{unquote(parts.username)}@" if parts.username else ""
        where = f"{parts.scheme}://{user}{parts.hostname}:{parts.port or 6379}"
        if self.sentinels:
            listed = ",".join(f"{h}:{p}" for h, p in self.sentinels)
            return f"the primary {self.sentinel_master!r} of Sentinels {listed} ({where})"
        return where


def check_url(url: str) -> str:
    """``url`` if leasework can use it, else a :class:`RedisURLError` saying why."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise RedisURLError(
            f"{url!r} is not a redis:// or rediss:// URL (for example "
            "rediss://leasework:secret@redis.internal:6380/0)"
        )
    try:
        port = parts.port
    except ValueError:
        raise RedisURLError(f"{url!r} has a port that is not a number in 1..65535") from None
    if not parts.hostname or port == 0:
        raise RedisURLError(f"{url!r} names no host (redis://HOST:PORT/DB)")
    path = parts.path.strip("/")
    if path and not path.isdigit():
        raise RedisURLError(f"{url!r}: the path must be a database number such as /0")
    if parts.query:
        raise RedisURLError(
            f"{url!r} has a query string; set the CA with LEASEWORK_REDIS_CA and timeouts are "
            "leasework's own"
        )
    return url


def connect(target: RedisTarget, *, timeout: float, **options: object) -> redis.Redis:
    """A client of ``target`` whose calls give up after ``timeout`` seconds; ``options`` go to
    redis-py as they are (``health_check_interval``, ``decode_responses``)."""
    tls: dict[str, object] = {}
    if target.tls:
        tls = {"ssl": True, "ssl_cert_reqs": "required", "ssl_check_hostname": True}
        if target.ca_file:
            tls["ssl_ca_certs"] = target.ca_file
    timeouts = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    if not target.sentinels:
        return redis.Redis.from_url(
            target.url,
            **timeouts,
            **({k: v for k, v in tls.items() if k != "ssl"}),
            **options,  # type: ignore[arg-type]
        )
    from redis.sentinel import Sentinel

    parts = urlsplit(target.url)
    sentinel_auth = {"password": target.sentinel_password} if target.sentinel_password else {}
    sentinel = Sentinel(
        list(target.sentinels),
        sentinel_kwargs={**timeouts, **tls, **sentinel_auth},
    )
    return sentinel.master_for(
        target.sentinel_master,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        db=int(parts.path.strip("/") or 0),
        **timeouts,
        **tls,
        **options,
    )
