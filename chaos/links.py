"""Private links: one leasework process's own proxy for a run, so that a toxic hits it alone.

A toxic whose target is ``PROCESS/PROXY`` (``worker-1/redis``, ``api/postgres``,
``worker-2/mail``) needs a proxy of the process's own in front of the same upstream as the
shared one (:func:`link_proxies`), with the process restarted pointing at it
(:func:`process_envs`, :func:`link_env`). ``mail`` has no shared proxy: its upstream is the
example shop's mail service.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chaos import nemeses
from chaos.nemeses.base import NemesisError
from chaos.toxiproxy import RUNTIME_PREFIX, ToxiproxyClient
from devstack.layout import (
    HOST,
    PG_DATABASE,
    PG_PASSWORD,
    PG_USER,
    SHOP_MAIL_PORT,
    WORKER_PORTS,
)
from devstack.layout import PROXIES as PROXY_PORTS

if TYPE_CHECKING:
    from chaos.scenario import FaultSpec, RelaySpec

# upstream ports of the private links that have no shared proxy (nemeses.base.PRIVATE_LINKS)
PRIVATE_LINK_PORTS: dict[str, int] = {"mail": SHOP_MAIL_PORT}


def runtime_proxy_name(process: str, proxy: str) -> str:
    return f"{RUNTIME_PREFIX}{process}-{proxy}"


def link_targets(faults: Iterable[FaultSpec]) -> list[tuple[str, str]]:
    """The (process, proxy) pairs that need a proxy of their own, in a stable order."""
    found = {nemeses.lookup(spec.fault).link(spec.target) for spec in faults}
    return sorted(pair for pair in found if pair is not None)


def link_env(proxy: str, port: int) -> dict[str, str]:
    """The environment that points a leasework process at a private proxy on ``port``."""
    if proxy == "postgres":
        return {
            "LEASEWORK_POSTGRES_DSN": (
                f"postgresql://{PG_USER}:{PG_PASSWORD}@{HOST}:{port}/{PG_DATABASE}"
            )
        }
    if proxy == "redis":
        return {"LEASEWORK_REDIS_ADDR": f"{HOST}:{port}"}
    if proxy == "mail":  # read by the example shop's send_receipt (examples/shop/jobs.py)
        return {"SHOP_MAIL_URL": f"http://{HOST}:{port}"}
    raise NemesisError(f"no per-process link for {proxy!r}; only postgres, redis and mail")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Link:
    process: str
    proxy: str
    port: int

    @property
    def name(self) -> str:
        return runtime_proxy_name(self.process, self.proxy)


async def link_proxies(toxiproxy: ToxiproxyClient, pairs: Sequence[tuple[str, str]]) -> list[Link]:
    """Add a private proxy for each (process, proxy) pair, in front of the same upstream as
    the shared one. The caller restarts each process with :func:`process_envs`."""
    links = []
    for process, proxy in pairs:
        link = Link(process, proxy, free_port())
        port = PRIVATE_LINK_PORTS[proxy] if proxy in PRIVATE_LINK_PORTS else PROXY_PORTS[proxy][1]
        upstream = f"{HOST}:{port}"
        await toxiproxy.delete_proxy(link.name)
        await toxiproxy.create_proxy(link.name, f"{HOST}:{link.port}", upstream)
        links.append(link)
    return links


def process_envs(
    links: Sequence[Link],
    *,
    fencing: bool,
    unsafe_env: Mapping[str, str],
    relays: Sequence[RelaySpec] = (),
    mail_guard: str | None = None,
) -> dict[str, dict[str, str]]:
    """The extra environment of each of the stack's leasework processes for a run (each is
    restarted with it): the unsafe lease mode on the workers when fencing is off, the
    private proxy addresses, and the stack relay's options (a clock offset, the unsafe
    scheduler), the shop's mail service guards. The relays started for the run are not the
    stack's: :func:`extra_relay_envs`."""
    envs: dict[str, dict[str, str]] = {}
    if not fencing:
        for worker in WORKER_PORTS:
            envs.setdefault(worker, {}).update(unsafe_env)
    for link in links:
        envs.setdefault(link.process, {}).update(link_env(link.proxy, link.port))
    for relay in relays:
        if not relay.extra and relay.env():
            envs.setdefault(relay.name, {}).update(relay.env())
    if mail_guard is not None:
        envs.setdefault("shop", {})["SHOP_MAIL_GUARD"] = mail_guard
    return envs


def extra_relay_envs(relays: Sequence[RelaySpec]) -> dict[str, dict[str, str]]:
    """The relays the harness starts for a run (``relay-2``, ``relay-3``), each with its
    environment beyond the stack's (possibly none)."""
    return {relay.name: relay.env() for relay in relays if relay.extra}
