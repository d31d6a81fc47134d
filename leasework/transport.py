"""HTTP/1.1 keep-alive transports for httpx that send each request in one write:
:class:`KeepAliveTransport` (blocking) and :class:`AsyncKeepAliveTransport` (Trio or
asyncio, through anyio), both on h11.

Why not httpx's own (httpcore): it writes a request's headers and its body in two sends, so
the api reads and parses two segments per submit (about a third more api CPU per job on
``just bench``'s single row), and its async pool rescans every connection, polling each
socket, for every request it assigns (encode/httpcore#1035, still open): with 16 requests in
flight that pool was about 40 % of the client's CPU. These transports keep a last-in,
first-out list of idle connections, take one per request (or open one, up to
``max_connections`` at a time) and put it back once the answer is read to its end.

The request body is read into memory before it is sent (the leasework API takes JSON bodies
of at most a few megabytes) and so is the answer. An idle connection the server has closed,
or that sat idle longer than ``keepalive_expiry``, is dropped before it is used, never
during a request: a request is never sent twice.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass

import anyio
import anyio.abc
import h11
import httpx

Origin = tuple[str, str, int]  # scheme, host, port
RECEIVE_SIZE = 65536
# below the api's keep-alive timeout (5 s), so the client drops an idle connection first
KEEPALIVE_EXPIRY = 4.0
MAX_CONNECTIONS = 100
MAX_KEEPALIVE = 20
CLOSED_EARLY = (
    "the server closed the connection before it answered in full; whether the request took "
    "effect is unknown: retry it with the same Idempotency-Key"
)


@dataclass(frozen=True)
class Answer:
    """A server's complete answer to one request."""

    status: int
    headers: list[tuple[bytes, bytes]]
    content: bytes
    reason: bytes = b""

    def response(self, request: httpx.Request) -> httpx.Response:
        """As an :class:`httpx.Response` to ``request``."""
        return httpx.Response(
            self.status,
            headers=self.headers,
            content=self.content,
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": self.reason},
        )


def request_parts(request: httpx.Request) -> tuple[str, bytes, list[tuple[bytes, bytes]]]:
    """An httpx request's method, target and headers, as :meth:`Exchange.request_bytes`
    takes them (its body is read by the caller: ``read()`` or ``aread()``)."""
    headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"transfer-encoding"]
    return request.method, request.url.raw_path, headers


class Exchange:
    """One connection's HTTP/1.1 state, without I/O: the bytes of a request, then the answer
    from whatever bytes arrive."""

    def __init__(self, sock: socket.socket | None = None) -> None:
        """``sock``: the socket under the connection, to tell whether an idle one is usable."""
        self.sock = sock
        self.h11 = h11.Connection(h11.CLIENT)
        self.response: h11.Response | None = None
        self.body: list[bytes] = []

    def request_bytes(
        self,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        request: httpx.Request | None = None,
    ) -> bytes:
        """The whole request, headers and body, as one buffer (``Content-Length`` added when
        a body has none). ``request``: the httpx request it stands for, named in errors."""
        if body and not any(k.lower() == b"content-length" for k, _ in headers):
            headers = [*headers, (b"Content-Length", str(len(body)).encode())]
        try:
            data = self.h11.send(h11.Request(method=method, target=target, headers=headers))
            if body:
                data += self.h11.send(h11.Data(data=body))
            data += self.h11.send(h11.EndOfMessage())
        except h11.ProtocolError as exc:
            raise httpx.LocalProtocolError(str(exc), request=request) from exc
        return data

    def receive(self, data: bytes, request: httpx.Request | None = None) -> bool:
        """Feed bytes from the server (``b""`` at its end of stream); True once the answer is
        complete."""
        try:
            return self._receive(data, request)
        except h11.ProtocolError as exc:
            if data == b"":
                raise httpx.RemoteProtocolError(CLOSED_EARLY, request=request) from exc
            raise httpx.RemoteProtocolError(str(exc), request=request) from exc

    def _receive(self, data: bytes, request: httpx.Request | None) -> bool:
        self.h11.receive_data(data)
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                if data == b"":
                    raise httpx.RemoteProtocolError(CLOSED_EARLY, request=request)
                return False
            if isinstance(event, h11.Response):
                self.response = event
            elif isinstance(event, h11.Data):
                self.body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return True
            elif isinstance(event, h11.ConnectionClosed):
                raise httpx.RemoteProtocolError(CLOSED_EARLY, request=request)

    def answer(self) -> Answer:
        """The complete answer."""
        assert self.response is not None
        return Answer(
            self.response.status_code,
            list(self.response.headers),
            b"".join(self.body),
            bytes(self.response.reason),
        )

    def reusable(self) -> bool:
        """Whether the connection can carry the next request; resets it for that if so."""
        self.response, self.body = None, []
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False


Timeouts = dict[str, float | None]  # httpx's: connect, read, write, pool (seconds or None)


def _timeouts(request: httpx.Request) -> Timeouts:
    return request.extensions.get("timeout", {})


def origin_of(url: httpx.URL) -> Origin:
    """The (scheme, host, port) a transport connects to for ``url``."""
    scheme = url.scheme
    if scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(f"cannot send a request to {url}: not http or https")
    return scheme, url.host, url.port or (443 if scheme == "https" else 80)


def _readable(sock: socket.socket) -> bool:
    """Whether an idle connection has something to read: the server's close, or bytes it
    should not have sent; either way, not a connection to send a request on."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class KeepAliveTransport(httpx.BaseTransport):
    """A blocking httpx transport: one request per connection at a time, each sent in one
    write; idle connections kept per origin (at most ``max_keepalive`` in all)."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_keepalive: int = MAX_KEEPALIVE,
        keepalive_expiry: float = KEEPALIVE_EXPIRY,
    ) -> None:
        self.ssl_context = ssl_context
        self.max_keepalive = max_keepalive
        self.keepalive_expiry = keepalive_expiry
        self.idle: dict[Origin, list[tuple[socket.socket, Exchange, float]]] = {}
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        method, target, headers = request_parts(request)
        body = request.read()
        origin = origin_of(request.url)
        answer = self.send(origin, method, target, headers, body, _timeouts(request), request)
        return answer.response(request)

    def send(
        self,
        origin: Origin,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        timeouts: Timeouts,
        request: httpx.Request | None = None,
    ) -> Answer:
        """One request to ``origin`` (scheme, host, port), answered in full; raises httpx's
        errors (``request``: the httpx request it stands for, if any, named in them)."""
        sock, exchange = self._connection(origin, request, timeouts.get("connect"))
        try:
            data = exchange.request_bytes(method, target, headers, body, request)
            try:
                sock.settimeout(timeouts.get("write"))
                sock.sendall(data)
            except TimeoutError as exc:
                raise httpx.WriteTimeout(str(exc) or "write timed out", request=request) from exc
            except OSError as exc:
                raise httpx.WriteError(str(exc), request=request) from exc
            sock.settimeout(timeouts.get("read"))
            while True:
                try:
                    data = sock.recv(RECEIVE_SIZE)
                except TimeoutError as exc:
                    raise httpx.ReadTimeout(str(exc) or "read timed out", request=request) from exc
                except OSError as exc:
                    raise httpx.ReadError(str(exc), request=request) from exc
                if exchange.receive(data, request):
                    break
            answer = exchange.answer()
        except BaseException:
            sock.close()
            raise
        self._release(origin, sock, exchange)
        return answer

    def _connection(
        self, origin: Origin, request: httpx.Request | None, timeout: float | None
    ) -> tuple[socket.socket, Exchange]:
        now = time.monotonic()
        with self.lock:
            idle = self.idle.get(origin, [])
            while idle:
                sock, exchange, since = idle.pop()
                if now - since < self.keepalive_expiry and not _readable(sock):
                    return sock, exchange
                sock.close()
        scheme, host, port = origin
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                context = self.ssl_context or ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=host)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timed out", request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        return sock, Exchange()

    def _release(self, origin: Origin, sock: socket.socket, exchange: Exchange) -> None:
        if exchange.reusable():
            with self.lock:
                if sum(len(idle) for idle in self.idle.values()) < self.max_keepalive:
                    self.idle.setdefault(origin, []).append((sock, exchange, time.monotonic()))
                    return
        sock.close()

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, {}
        for connections in idle.values():
            for sock, _, _ in connections:
                sock.close()


class AsyncKeepAliveTransport(httpx.AsyncBaseTransport):
    """The same as :class:`KeepAliveTransport` on anyio (Trio or asyncio), with at most
    ``max_connections`` requests in flight at once (the others wait, under the request's
    ``pool`` timeout)."""

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        max_keepalive: int = MAX_KEEPALIVE,
        keepalive_expiry: float = KEEPALIVE_EXPIRY,
    ) -> None:
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self.max_keepalive = max_keepalive
        self.keepalive_expiry = keepalive_expiry
        self.idle: dict[Origin, list[tuple[anyio.abc.ByteStream, Exchange, float]]] = {}
        # made on first use: anyio's primitives belong to the event loop that runs them
        self._limiter: anyio.CapacityLimiter | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        method, target, headers = request_parts(request)
        body = await request.aread()
        origin = origin_of(request.url)
        answer = await self.send(origin, method, target, headers, body, _timeouts(request), request)
        return answer.response(request)

    async def send(
        self,
        origin: Origin,
        method: str,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        timeouts: Timeouts,
        request: httpx.Request | None = None,
    ) -> Answer:
        """See :meth:`KeepAliveTransport.send`."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.max_connections)
        try:
            with anyio.fail_after(timeouts.get("pool")):
                await self._limiter.acquire()
        except TimeoutError as exc:
            raise httpx.PoolTimeout(
                "no connection free within the pool timeout", request=request
            ) from exc
        try:
            stream, exchange = await self._connection(origin, request, timeouts.get("connect"))
            try:
                data = exchange.request_bytes(method, target, headers, body, request)
                answer = await self._exchange(stream, exchange, data, timeouts, request)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
                raise
            await self._release(origin, stream, exchange)
            return answer
        finally:
            self._limiter.release()

    async def _exchange(
        self,
        stream: anyio.abc.ByteStream,
        exchange: Exchange,
        data: bytes,
        timeouts: Timeouts,
        request: httpx.Request | None,
    ) -> Answer:
        try:
            with anyio.fail_after(timeouts.get("write")):
                await stream.send(data)
        except TimeoutError as exc:
            raise httpx.WriteTimeout("write timed out", request=request) from exc
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc
        while True:
            try:
                with anyio.fail_after(timeouts.get("read")):
                    data = await stream.receive(RECEIVE_SIZE)
            except anyio.EndOfStream:
                data = b""
            except TimeoutError as exc:
                raise httpx.ReadTimeout("read timed out", request=request) from exc
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
                raise httpx.ReadError(str(exc) or type(exc).__name__, request=request) from exc
            if exchange.receive(data, request):
                return exchange.answer()

    async def _connection(
        self, origin: Origin, request: httpx.Request | None, connect_timeout: float | None
    ) -> tuple[anyio.abc.ByteStream, Exchange]:
        now = time.monotonic()
        idle = self.idle.get(origin, [])
        while idle:
            stream, exchange, since = idle.pop()
            sock = exchange.sock
            if now - since < self.keepalive_expiry and sock is not None and not _readable(sock):
                return stream, exchange
            with anyio.CancelScope(shield=True):
                await stream.aclose()
        scheme, host, port = origin
        try:
            with anyio.fail_after(connect_timeout):
                stream = await anyio.connect_tcp(
                    host,
                    port,
                    tls=scheme == "https",
                    ssl_context=self.ssl_context,
                    tls_standard_compatible=False,
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout("connect timed out", request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc), request=request) from exc
        return stream, Exchange(stream.extra(anyio.abc.SocketAttribute.raw_socket, None))

    async def _release(
        self, origin: Origin, stream: anyio.abc.ByteStream, exchange: Exchange
    ) -> None:
        if exchange.reusable() and sum(len(i) for i in self.idle.values()) < self.max_keepalive:
            self.idle.setdefault(origin, []).append((stream, exchange, time.monotonic()))
            return
        with anyio.CancelScope(shield=True):
            await stream.aclose()

    async def aclose(self) -> None:
        idle, self.idle = self.idle, {}
        for connections in idle.values():
            for stream, _, _ in connections:
                with anyio.CancelScope(shield=True):
                    await stream.aclose()
