"""An HTTP/1.1 ASGI server on Trio: a task per connection, none per request.

Every leasework process serves its HTTP (the api's routes and console, every process's
``/healthz``, ``/readyz`` and ``/metrics``) through :func:`serve`. Hypercorn, the only other
ASGI server for Trio, starts a task for the app and restarts an idle-timer task on every
request of a keep-alive connection, and parses with h11 (pure Python, about 180 µs a request
on this machine); on the api's single-submit path those were most of the api's CPU
(``tools/profile_api.py``; the figures are in docs/design-decisions.md, "The api's own HTTP
server"). Here the connection's task parses requests with httptools (llhttp, the parser of
Node.js and uvicorn: about 9 µs), calls the app itself, and writes each answer's head and
body in one send. Timeouts are deadlines on the one cancel scope the connection waits in.

What it does, and no more (the api needs nothing else; the guard in front of the app caps
every body and its read time):

* HTTP/1.1 and 1.0 with keep-alive and pipelining (one request at a time per connection);
  no TLS, no HTTP/2, no WebSocket: a request asking to upgrade is refused (400).
* A request head (request line plus headers) must arrive whole within ``head_timeout`` and
  fit in ``max_head`` bytes (431 otherwise); a malformed one is answered 400 and the
  connection closed. An idle keep-alive connection is closed after ``keep_alive``.
* ``Expect: 100-continue`` is answered when the app first asks for the body.
* Answers are framed by the app's ``content-length``, else chunked (HTTP/1.0: closed); no
  body for HEAD, 1xx, 204 and 304. A header with a line break is the app's bug.
* The app's exception before its answer started is a 500 problem document; after, the
  connection is closed (the client sees a truncated answer, never a wrong one).
* ASGI lifespan, when the app speaks it.
* Stopping: the listeners close, idle connections close at once, a request in progress is
  answered (its connection then closes), and whatever is still open after ``drain`` seconds
  is cancelled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from functools import partial
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools
import trio

log = logging.getLogger("leasework.httpserver")

App = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable]

MAX_RECV = 64 * 1024
# bytes of a pipelined next request buffered while the current one is answered: past this
# the connection is not read until the answer is written
MAX_BUFFERED = 64 * 1024
PROBLEM = b"application/problem+json"
# a body the app left unread on a connection it keeps: how long and how many bytes of it are
# read and dropped so that the connection can serve its next request
LINGER_SECONDS = 1.0
LINGER_BYTES = 1024 * 1024
NO_BODY_STATUSES = frozenset((204, 304))


@dataclass(frozen=True)
class ServerLimits:
    # a request's line and headers must arrive within this many seconds of its first byte
    # (of the connection's opening, for its first request)
    head_timeout: float = 30.0
    # an idle keep-alive connection is closed after this many seconds
    keep_alive: float = 5.0
    # bytes of request line plus headers: 431 past it
    max_head: int = 16 * 1024
    # after the stop: how long a request in progress may take to be answered
    drain: float = 3.0


class _Date:
    """The ``date`` header's value, formatted at most once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = formatdate(second, usegmt=True).encode("ascii")
        return self._value


_date = _Date()


def problem_answer(status: int, title: str, detail: str) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body of a problem document the server answers by itself (a head it
    cannot read, the app's failure); the connection closes after it."""
    body = json.dumps({"type": "about:blank", "title": title, "status": status, "detail": detail})
    data = body.encode()
    headers = [
        (b"content-type", PROBLEM),
        (b"content-length", str(len(data)).encode()),
        (b"connection", b"close"),
    ]
    return headers, data


class BadRequest(Exception):
    """A request this server will not read: its status (400 or 431) and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class Message:
    """One request as it is parsed: its head, then its body's chunks as they arrive."""

    __slots__ = (
        "target", "headers", "method", "version", "keep_alive", "expect_continue",
        "head_done", "body", "complete", "head_bytes",
    )  # fmt: skip

    def __init__(self) -> None:
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.method = ""
        self.version = "1.1"
        self.keep_alive = True
        self.expect_continue = False
        self.head_done = False
        self.body: deque[bytes] = deque()
        self.complete = False
        self.head_bytes = 0  # of its line and headers so far


class Parser:
    """httptools's callbacks, turned into :class:`Message` records in arrival order."""

    def __init__(self, max_head: int) -> None:
        self.max_head = max_head
        self.messages: deque[Message] = deque()
        self.parser = httptools.HttpRequestParser(self)
        self.fed_in_head = 0  # bytes fed while a head was incomplete

    def feed(self, data: bytes) -> None:
        """Parse ``data``; raises :class:`BadRequest` for what cannot be served."""
        in_head = not self.messages or not self.messages[-1].head_done
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise BadRequest(
                400, "protocol upgrades (WebSocket, h2c) are not served: send plain HTTP/1.1"
            ) from None
        except httptools.HttpParserError as error:
            raise BadRequest(400, str(error)) from None
        last = self.messages[-1] if self.messages else None
        # a head arriving in pieces is measured as it comes (httptools would hold a header
        # of any length until it ends); one that came whole is measured by its parts
        self.fed_in_head = self.fed_in_head + len(data) if in_head else 0
        if last is not None and last.head_done:
            self.fed_in_head = 0
        if self.fed_in_head > self.max_head or (
            last is not None and last.head_bytes > self.max_head
        ):
            raise BadRequest(431, f"the request's line and headers exceed {self.max_head} bytes")

    # httptools's callbacks
    def on_message_begin(self) -> None:
        self.messages.append(Message())

    def on_url(self, url: bytes) -> None:
        message = self.messages[-1]
        message.target += url
        message.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self.messages[-1]
        name = name.lower()
        message.headers.append((name, value))
        message.head_bytes += len(name) + len(value) + 4
        if name == b"expect" and value.lower() == b"100-continue":
            message.expect_continue = True

    def on_headers_complete(self) -> None:
        message = self.messages[-1]
        message.method = self.parser.get_method().decode("ascii")
        message.version = self.parser.get_http_version()
        message.keep_alive = self.parser.should_keep_alive()
        message.head_done = True

    def on_body(self, body: bytes) -> None:
        self.messages[-1].body.append(body)

    def on_message_complete(self) -> None:
        self.messages[-1].complete = True


class Connection:
    """One client connection: its parser and its requests, one after another."""

    def __init__(self, server: Server, stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.parser = Parser(server.limits.max_head)
        self.client, self.local = _addresses(stream)
        self.waiting = trio.CancelScope()  # the wait for the next request (a new one each time)
        self.idle = True  # between requests: closed at once when the server stops
        self.served = 0
        self.broken = False  # the client is gone, or the stream's framing cannot be trusted
        self.eof = False

    async def run(self) -> None:
        try:
            while not self.server.stopping:
                message = await self._next_request()
                if message is None:
                    return
                self.idle = False
                exchange = Exchange(self, message)
                await exchange.run()
                self.served += 1
                self.idle = True
                if not exchange.reusable():
                    return
                self.parser.messages.popleft()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            self.broken = True  # the client is gone: just close
        finally:
            with trio.CancelScope(shield=True):
                await self._close()

    async def fill(self) -> int:
        """Read once more from the client and parse it: the bytes read, 0 at the client's end
        of stream. Raises :class:`BadRequest`."""
        if self.eof:
            return 0
        data = await self.stream.receive_some(MAX_RECV)
        if not data:
            self.eof = True
            return 0
        self.parser.feed(data)
        return len(data)

    async def _close(self) -> None:
        """Our FIN first, then the socket's close (a client reading its answer gets it whole)."""
        with trio.move_on_after(1):
            if not self.broken:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.stream.send_eof()
            await self.stream.aclose()

    async def _next_request(self) -> Message | None:
        """The next request, once its head is in; None when the connection should close: the
        client closed it, sent a bad head, was idle (``keep_alive``) or slow (``head_timeout``)
        too long, or the server is stopping."""
        limits = self.server.limits
        messages = self.parser.messages
        begun = self.served == 0 or bool(messages)
        timeout = limits.head_timeout if begun else limits.keep_alive
        self.waiting = trio.CancelScope(deadline=trio.current_time() + timeout)
        with self.waiting:
            while not (messages and messages[0].head_done):
                try:
                    if not await self.fill():
                        return None
                except BadRequest as refused:
                    await self._refuse(refused)
                    return None
                if messages and not begun:  # the next request began: its head has its own time
                    begun = True
                    self.waiting.deadline = trio.current_time() + limits.head_timeout
            return messages[0]
        return None  # timed out, or the server stopped while this connection was idle

    async def _refuse(self, refused: BadRequest) -> None:
        """Answer a request this server cannot read (400, or 431), then close."""
        self.broken = True
        title = "Request head too large" if refused.status == 431 else "Bad request"
        headers, body = problem_answer(
            refused.status,
            title,
            f"the request could not be read as HTTP/1.1 ({refused}); send a request line and "
            f"headers of at most {self.server.limits.max_head} bytes in all",
        )
        await self.stream.send_all(_head(refused.status, [*headers, (b"date", _date.now())]) + body)


class Exchange:
    """One request and its answer: the ASGI scope, ``receive`` and ``send``."""

    def __init__(self, connection: Connection, message: Message) -> None:
        self.connection = connection
        self.message = message
        self.body_done = False
        self.continued = False
        self.started = False
        self.finished = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunked = False
        self.bodiless = False
        self.declared: int | None = None  # the answer's content-length
        self.sent = 0  # body bytes sent
        self.close = not message.keep_alive  # after this answer

    def asgi_scope(self) -> dict:
        m = self.message
        raw_path, _, query = m.target.partition(b"?")
        c = self.connection
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": m.version,
            "method": m.method,
            "scheme": "http",
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": m.headers,
            "client": c.client,
            "server": c.local,
            "state": dict(c.server.state),
        }

    def reusable(self) -> bool:
        """Whether the connection may serve another request after this one."""
        c = self.connection
        return (
            self.finished
            and not self.close
            and self.message.complete
            and not c.broken
            and not c.eof
            and not c.server.stopping
        )

    async def run(self) -> None:
        try:
            await self.connection.server.app(self.asgi_scope(), self.receive, self.send)
        except Exception as exc:  # the app's bug: a 500 if nothing was sent, else close
            target = self.message.target[:200].decode("latin-1")
            log.error("the app raised", extra={"target": target}, exc_info=exc)
            if not self.started:
                await self._internal_error()
            self.connection.broken = True
            return
        if not self.finished:  # the app returned without a whole answer
            if not self.started:
                await self._internal_error()
            self.connection.broken = True
            return
        if not self.message.complete and not self.close:
            await self._discard_body()

    async def receive(self) -> dict:
        """The body, in as few messages as it arrived in; once the body is done, waits for
        the client to go away (``http.disconnect``)."""
        m, c = self.message, self.connection
        if self.body_done or c.broken:
            await self._until_disconnect()
            return {"type": "http.disconnect"}
        if m.expect_continue and not self.continued and not m.complete:
            self.continued = True
            await c.stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
        while True:
            if m.body:
                body = m.body.popleft() if len(m.body) == 1 else b"".join(m.body)
                m.body.clear()
                self.body_done = m.complete
                return {"type": "http.request", "body": body, "more_body": not m.complete}
            if m.complete:
                self.body_done = True
                return {"type": "http.request", "body": b"", "more_body": False}
            try:
                more = await c.fill()
            except BadRequest:
                more = False
            if not more:
                c.broken = True
                return {"type": "http.disconnect"}

    async def _until_disconnect(self) -> None:
        """Returns when the client closes the connection; what it pipelines meanwhile is kept
        for the next request (up to MAX_BUFFERED bytes; then it is left unread)."""
        c = self.connection
        read = 0
        while not c.broken and read < MAX_BUFFERED:
            try:
                got = await c.fill()
            except BadRequest:
                got = 0
            if not got:
                c.broken = True
                return
            read += got
        await trio.sleep_forever()

    async def send(self, message: dict) -> None:
        """ASGI send: the answer's head is held until its first body message, then both go
        in one write. A client that went away is not the app's error: its answer is dropped."""
        kind = message["type"]
        if kind == "http.response.start":
            if self.status:
                raise RuntimeError("http.response.start sent twice")
            self.status = message["status"]
            self.headers = list(message.get("headers", ()))
            return
        if kind != "http.response.body":
            return  # no other message of the http scope asks anything of HTTP/1.1
        if not self.status or self.finished:
            raise RuntimeError("http.response.body before the answer's start or after its end")
        data = b"" if self.started else self._start()
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if body and not self.bodiless:
            self.sent += len(body)
            if self.declared is not None and self.sent > self.declared:
                raise RuntimeError(f"an answer's body passed its content-length {self.declared}")
            data += b"%x\r\n%b\r\n" % (len(body), body) if self.chunked else body
        if not more:
            self.finished = True
            if self.chunked:
                data += b"0\r\n\r\n"
            elif self.declared is not None and self.sent != self.declared and not self.bodiless:
                self.close = True  # short of its length: the framing is lost, so is the stream
        if data and not self.connection.broken:
            try:
                await self.connection.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.connection.broken = True

    def _start(self) -> bytes:
        """The answer's head, its framing decided: the app's length, else chunked (HTTP/1.0:
        the connection's close ends it)."""
        status, headers = self.status, self.headers
        self.bodiless = self.message.method == "HEAD" or status < 200 or status in NO_BODY_STATUSES
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"content-length":
                self.declared = int(value)
            elif lowered == b"connection" and b"close" in value.lower():
                self.close = True
            elif lowered == b"transfer-encoding":
                raise RuntimeError("the app set transfer-encoding; the server frames answers")
        if self.declared is None and not self.bodiless:
            if self.message.version == "1.1":
                self.chunked = True
                headers.append((b"transfer-encoding", b"chunked"))
            else:
                self.close = True
        if self.close and not any(n.lower() == b"connection" for n, _ in headers):
            headers.append((b"connection", b"close"))
        headers.append((b"date", _date.now()))
        head = _head(status, headers)
        self.started = True
        return head

    async def _internal_error(self) -> None:
        headers, body = problem_answer(
            500,
            "Internal error",
            "the server failed on this request (a bug, logged with its traceback); nothing of "
            "it is known to be written unless a GET says so. Please report it.",
        )
        self.status, self.started, self.finished, self.sent = 0, False, False, 0
        self.chunked, self.declared = False, None
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    async def _discard_body(self) -> None:
        """The app answered, keeping the connection, without reading the whole body: read the
        rest, if it is small and quick to come (LINGER_BYTES, LINGER_SECONDS), so the
        connection can serve its next request; else it closes."""
        dropped = 0
        with trio.move_on_after(LINGER_SECONDS):
            while not self.message.complete and dropped <= LINGER_BYTES:
                message = await self.receive()
                if message["type"] == "http.disconnect":
                    break
                dropped += len(message["body"])
        if not self.message.complete:
            self.connection.broken = True


_REASONS = {s.value: s.phrase.encode("ascii") for s in HTTPStatus}


def _head(status: int, headers: list[tuple[bytes, bytes]]) -> bytes:
    """An answer's status line and headers; a line break in a header is refused (it would
    let a value the app took from a request start a header or an answer of its own)."""
    lines = [b"HTTP/1.1 %d %b\r\n" % (status, _REASONS.get(status, b""))]
    for name, value in headers:
        if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name or b":" in name:
            raise RuntimeError(f"a header with a line break or a colon in its name: {name!r}")
        lines.append(b"%b: %b\r\n" % (name, value))
    lines.append(b"\r\n")
    return b"".join(lines)


class Server:
    """One listener's connections, and its stop."""

    def __init__(self, app: App, limits: ServerLimits) -> None:
        self.app = app
        self.limits = limits
        self.stopping = False
        self.state: dict[str, Any] = {}  # the lifespan's state, copied into every request
        self.connections: set[Connection] = set()

    async def handle(self, stream: trio.SocketStream) -> None:
        connection = Connection(self, stream)
        self.connections.add(connection)
        try:
            await connection.run()
        except Exception as exc:  # a bug of this module: one connection lost, not the server
            log.error("connection failed", extra={"client": connection.client}, exc_info=exc)
        finally:
            self.connections.discard(connection)

    def stop(self) -> None:
        """No new requests: idle connections close now, busy ones after their answer."""
        self.stopping = True
        for connection in self.connections:
            if connection.idle:
                connection.waiting.cancel()


async def serve(
    app: App,
    addr: tuple[str, int],
    stopped: trio.Event,
    *,
    limits: ServerLimits = ServerLimits(),  # noqa: B008 (frozen)
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``addr`` until ``stopped`` is set, then drain (see the module).
    ``task_status.started`` gets the address listened on (port 0 picks a free one)."""
    host, port = addr
    listeners = await trio.open_tcp_listeners(port, host=host)
    server = Server(app, limits)
    async with trio.open_nursery() as outer:
        lifespan = Lifespan(app, server.state)
        await outer.start(lifespan.run)
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                accept = partial(
                    trio.serve_listeners, server.handle, listeners, handler_nursery=connections
                )
                await accepting.start(accept)
                task_status.started(listeners[0].socket.getsockname()[:2])
                await stopped.wait()
                server.stop()
                accepting.cancel_scope.cancel()
            for listener in listeners:
                await listener.aclose()
            # the connections finish their answers, or meet the drain's deadline
            connections.cancel_scope.deadline = trio.current_time() + limits.drain
        await lifespan.shutdown()
        outer.cancel_scope.cancel()


class Lifespan:
    """ASGI lifespan: startup before the first connection, shutdown after the last. An app
    that does not speak it (raises on the scope, or returns) is served without."""

    def __init__(self, app: App, state: dict[str, Any]) -> None:
        self.app = app
        self.state = state
        self.to_app, self.app_in = trio.open_memory_channel[dict](1)
        self.app_out, self.from_app = trio.open_memory_channel[dict](1)
        self.running = True

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._app)
            await self.to_app.send({"type": "lifespan.startup"})
            answer = await self.from_app.receive()
            if answer["type"] == "lifespan.startup.failed":
                raise RuntimeError(f"the app failed to start: {answer.get('message', '')}")
            task_status.started()

    async def _app(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": self.state}
        try:
            await self.app(scope, self.app_in.receive, self.app_out.send)
        except Exception as exc:
            log.debug("the app does not speak ASGI lifespan", exc_info=exc)
        finally:
            self.running = False
            # startup (or shutdown) may still wait for its answer: an app that ended has none
            with contextlib.suppress(trio.WouldBlock):
                self.app_out.send_nowait({"type": "lifespan.ended"})

    async def shutdown(self) -> None:
        if not self.running:
            return
        with trio.move_on_after(5):
            await self.to_app.send({"type": "lifespan.shutdown"})
            await self.from_app.receive()


def _addresses(stream: trio.SocketStream) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
    try:
        peer, local = stream.socket.getpeername(), stream.socket.getsockname()
    except OSError:
        return None, None
    return (peer[0], peer[1]), (local[0], local[1])
