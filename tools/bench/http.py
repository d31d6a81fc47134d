"""A lean HTTP/1.1 load client for the ``single`` row: one keep-alive connection per lane,
each request written from pre-encoded bytes and its answer read just far enough to check the
status and skip the body.

Why not httpx: on this 2-core machine the load generator shares the cores with what it
measures, and ``httpx.AsyncClient`` spent about 0.7 ms of CPU per request here, nearly as
much as the api spent serving it, so the row measured the client as much as leasework. This
client costs a small fraction of that; its CPU is still counted, in the ``client`` column.
The ``single-client`` row runs the same door with the shipped ``leasework.AsyncClient``.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import trio

from leasework.tokens import default_token


class HttpError(Exception):
    """The api answered a bench submit with something other than 202."""


class Connection:
    """One keep-alive connection to ``url``'s host; ``post`` sends a JSON body to a path."""

    def __init__(self, url: str, token: str | None = None) -> None:
        """``token``: the API token (default: :func:`leasework.tokens.default_token`)."""
        token = token if token is not None else default_token()
        self.authorization = f"Authorization: Bearer {token}\r\n" if token else ""
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.stream: trio.SocketStream | None = None
        self.buffer = b""

    async def open(self) -> None:
        self.stream = await trio.open_tcp_stream(self.host, self.port)

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()

    def request(self, path: str, body: dict) -> bytes:
        data = json.dumps(body, separators=(",", ":")).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"{self.authorization}Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        return head.encode() + data

    async def post(self, path: str, body: dict) -> int:
        """Send one request and read its whole answer; returns the status code."""
        assert self.stream is not None
        await self.stream.send_all(self.request(path, body))
        head = await self._until(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        await self._exactly(length)
        return status

    async def _until(self, marker: bytes) -> bytes:
        while marker not in self.buffer:
            await self._more()
        head, _, self.buffer = self.buffer.partition(marker)
        return head

    async def _exactly(self, count: int) -> bytes:
        while len(self.buffer) < count:
            await self._more()
        data, self.buffer = self.buffer[:count], self.buffer[count:]
        return data

    async def _more(self) -> None:
        assert self.stream is not None
        chunk = await self.stream.receive_some(65536)
        if not chunk:
            raise HttpError("the api closed the connection")
        self.buffer += chunk
