"""Toxiproxy's HTTP API, spoken directly with httpx (Trio-friendly): the harness's client.

Not :class:`devstack.services.toxiproxy.Toxiproxy`, the stack's service that runs the server.
The proxies and toxics the harness adds for a run are named ``chaos-...`` (and only those).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from devstack.layout import TOXIPROXY_URL

RUNTIME_PREFIX = "chaos-"  # runtime proxies and toxics the harness adds, and only those


class ToxiproxyError(RuntimeError):
    """Toxiproxy answered a request with an error."""


class ToxiproxyClient:
    """Toxiproxy's HTTP API, spoken directly with httpx (Trio-friendly)."""

    def __init__(self, url: str = TOXIPROXY_URL, *, timeout: float = 5.0) -> None:
        self.http = httpx.AsyncClient(base_url=url, timeout=timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> ToxiproxyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(
        self, method: str, path: str, body: Any = None, *, missing_ok: bool = False
    ) -> Any:
        response = await self.http.request(method, path, json=body)
        if missing_ok and response.status_code == 404:
            return None
        if not response.is_success:
            raise ToxiproxyError(
                f"toxiproxy {method} {path} -> {response.status_code} {response.text.strip()}"
            )
        return response.json() if response.content else None

    async def proxies(self) -> dict[str, Any]:
        return await self._call("GET", "/proxies")

    async def create_proxy(self, name: str, listen: str, upstream: str) -> None:
        await self._call(
            "POST",
            "/proxies",
            {"name": name, "listen": listen, "upstream": upstream, "enabled": True},
        )

    async def delete_proxy(self, name: str) -> None:
        await self._call("DELETE", f"/proxies/{name}", missing_ok=True)

    async def set_enabled(self, name: str, enabled: bool) -> None:
        await self._call("POST", f"/proxies/{name}", {"enabled": enabled})

    async def add_toxic(self, proxy: str, toxic: Mapping[str, Any]) -> None:
        await self._call("POST", f"/proxies/{proxy}/toxics", dict(toxic))

    async def remove_toxic(self, proxy: str, name: str) -> None:
        await self._call("DELETE", f"/proxies/{proxy}/toxics/{name}", missing_ok=True)

    async def reset(self) -> None:
        """Remove every toxic and enable every proxy."""
        await self._call("POST", "/reset")

    async def delete_runtime_proxies(self) -> list[str]:
        """Delete the proxies this harness added (names starting ``chaos-``)."""
        names = [n for n in await self.proxies() if n.startswith(RUNTIME_PREFIX)]
        for name in names:
            await self.delete_proxy(name)
        return names
