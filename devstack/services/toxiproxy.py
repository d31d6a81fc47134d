"""Toxiproxy: the single path between leasework and postgres / redis / each Kafka broker.

Each broker N has three proxies: ``kafka-N`` (api, relay), ``kafka-N-worker-1`` and
``kafka-N-worker-2`` (each worker through a broker listener of its own), so one worker's
Kafka link can be cut, slowed or reset apart from the other worker's and the relay's.

Proxy definitions live in ``toxiproxy/proxies.json`` (Toxiproxy's config/populate
format). The server loads them with ``-config`` at start; on every ``up`` the
supervisor also POSTs them to ``/populate`` (reconciling a server that was already
running) and POSTs ``/reset`` (removes all toxics, re-enables all proxies).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from ..errors import StackError
from ..layout import HOST, PROXIES, TOXIPROXY_API_PORT, addr
from .base import Service

API = f"http://{addr(TOXIPROXY_API_PORT)}"


def render_proxies() -> list[dict[str, object]]:
    """The proxy list from the port contract (pure; must equal toxiproxy/proxies.json)."""
    return [
        {"name": name, "listen": addr(listen), "upstream": addr(upstream), "enabled": True}
        for name, (listen, upstream) in PROXIES.items()
    ]


def load_proxies(path: Path) -> list[dict[str, object]]:
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise StackError(f"{path}: expected a JSON list of proxies")
    return data


def populate(proxies: list[dict[str, object]], timeout: float = 5.0) -> None:
    r = httpx.post(f"{API}/populate", json=proxies, timeout=timeout)
    if not r.is_success:
        raise StackError(f"toxiproxy: POST /populate -> {r.status_code} {r.text.strip()}")


def reset(timeout: float = 5.0) -> None:
    """Remove every toxic and re-enable every proxy."""
    r = httpx.post(f"{API}/reset", timeout=timeout)
    if not r.is_success:
        raise StackError(f"toxiproxy: POST /reset -> {r.status_code} {r.text.strip()}")


class Toxiproxy(Service):
    name = "toxiproxy"
    ready_timeout = 30.0

    def ports(self) -> tuple[int, ...]:
        return (TOXIPROXY_API_PORT,)

    def address(self) -> str:
        return API

    def markers(self) -> tuple[str, ...]:
        return ("toxiproxy-server", "-port", str(TOXIPROXY_API_PORT))

    def command(self) -> list[str]:
        binary = self.layout.toxiproxy_bin
        if not binary.exists():
            raise StackError(f"{binary} missing; run `python -m devstack provision`")
        return [
            str(binary),
            "-host",
            HOST,
            "-port",
            str(TOXIPROXY_API_PORT),
            "-config",
            str(self.layout.proxies_json),
        ]

    def probe(self) -> bool:
        r = httpx.get(f"{API}/proxies", timeout=1.0)
        return r.status_code == 200

    def after_ready(self, fresh: bool) -> None:
        proxies = load_proxies(self.layout.proxies_json)
        remove_retired(proxies)
        populate(proxies)


# the chaos harness's runtime proxies (chaos.nemesis.RUNTIME_PREFIX) are not ours to remove
HARNESS_PREFIX = "chaos-"


def retired_proxies(running: list[str], defined: list[dict[str, object]]) -> list[str]:
    """Proxies a running server has that the definitions no longer name (pure): a renamed
    proxy would otherwise keep its port and make ``/populate`` fail."""
    names = {str(p["name"]) for p in defined}
    return sorted(n for n in running if n not in names and not n.startswith(HARNESS_PREFIX))


def remove_retired(defined: list[dict[str, object]], timeout: float = 5.0) -> None:
    r = httpx.get(f"{API}/proxies", timeout=timeout)
    r.raise_for_status()
    for name in retired_proxies(list(r.json()), defined):
        d = httpx.delete(f"{API}/proxies/{name}", timeout=timeout)
        if not d.is_success and d.status_code != 404:
            raise StackError(f"toxiproxy: DELETE /proxies/{name} -> {d.status_code} {d.text}")
