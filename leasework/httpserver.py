"""An HTTP/1.1 ASGI server on Trio: a task per connection, none per request.

Every leasework process serves its HTTP (the api's routes and console, every process's
``/healthz``, ``/readyz`` and ``/metrics``) through :func:`serve`. Hypercorn, the only other
ASGI server for Trio, starts a task for the app and restarts an idle-timer task on every
request of a keep-alive connection; on the api's single-submit path that and the channels
between those tasks were a third of the api's CPU (``tools/profile_api.py``; the figures are in
docs/design-decisions.md, "The api's own HTTP server"). Here the connection's task parses the
request with h11, calls the app itself, and writes each answer's head and body in one send.
Timeouts are deadlines on the one cancel scope the connection already has.

What it does, and no more (the api needs nothing else; the guard in front of the app caps
every body and its read time):

* HTTP/1.1 (and 1.0) with keep-alive and pipelining (one request at a time per connection);
  no TLS, no HTTP/2, no WebSocket: an ``Upgrade`` is answered as plain HTTP/1.1.
* A request head (request line plus headers) must arrive whole within ``head_timeout`` and
  fit in ``max_head`` bytes (431 otherwise); a malformed one is answered 400 and the
  connection closed. An idle keep-alive connection is closed after ``keep_alive``.
* ``Expect: 100-continue`` is answered when the app first asks for the body.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from functools import partial
from typing import Any
from urllib.parse import unquote

import h11
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


@dataclass(frozen=True)
class ServerLimits:
    # a request's line and headers must arrive within this many seconds of its first byte
    # (of the connection's opening, for its first request)
    head_timeout: float = 30.0
    # an idle keep-alive connection is closed after this many seconds
    keep_alive: float = 5.0
    # bytes of request line plus headers (h11's max_incomplete_event_size): 431 past it
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


class Connection:
    """One client connection: its h11 state and its requests, one after another."""

    def __init__(self, server: Server, stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=server.limits.max_head)
        self.client, self.local = _addresses(stream)
        self.waiting = trio.CancelScope()  # the wait for the next request (a new one each time)
        self.idle = True  # between requests: closed at once when the server stops
        self.served = 0
        self.broken = False  # a send failed: the client is gone

    async def run(self) -> None:
        try:
            while not self.server.stopping:
                request = await self._next_request()
                if request is None:
                    return
                self.idle = False
                await Exchange(self, request).run()
                self.served += 1
                self.idle = True
                if not self._reusable():
                    return
                self.h11.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.ProtocolError):
            self.broken = True  # the client is gone, or the exchange broke HTTP: just close
        finally:
            with trio.CancelScope(shield=True):
                await self._close()

    async def _close(self) -> None:
        """Our FIN first, then the socket's close (a client reading its answer gets it whole)."""
        with trio.move_on_after(1):
            if not self.broken:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.stream.send_eof()
            await self.stream.aclose()

    def _reusable(self) -> bool:
        return (
            not self.server.stopping
            and not self.broken
            and self.h11.our_state is h11.DONE
            and self.h11.their_state is h11.DONE
        )

    async def _next_request(self) -> h11.Request | None:
        """The next request's head; None when the connection should close: the client closed
        it, sent a bad head, was idle (``keep_alive``) or slow (``head_timeout``) too long, or
        the server is stopping."""
        limits = self.server.limits
        begun = self.served == 0 or bool(self.h11.trailing_data[0])
        timeout = limits.head_timeout if begun else limits.keep_alive
        self.waiting = trio.CancelScope(deadline=trio.current_time() + timeout)
        with self.waiting:
            while True:
                try:
                    event = self.h11.next_event()
                except h11.RemoteProtocolError as error:
                    await self._refuse(error)
                    return None
                if isinstance(event, h11.Request):
                    if _head_size(event) <= limits.max_head:
                        return event
                    # h11 caps only a head still incomplete; one that came whole is measured
                    await self._refuse(
                        h11.RemoteProtocolError("request head too large", error_status_hint=431)
                    )
                    return None
                if event is not h11.NEED_DATA:  # ConnectionClosed
                    return None
                data = await self.stream.receive_some(MAX_RECV)
                if data and not begun:  # the next request began: its head has its own time
                    begun = True
                    self.waiting.deadline = trio.current_time() + limits.head_timeout
                self.h11.receive_data(data)
        return None  # timed out, or the server stopped while this connection was idle

    async def _refuse(self, error: h11.RemoteProtocolError) -> None:
        """Answer a request head h11 could not parse: 400, or 431 when it was too large."""
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        status = error.error_status_hint
        headers, body = problem_answer(
            status,
            "Request head too large" if status == 431 else "Bad request",
            f"the request could not be read as HTTP/1.1 ({error}); send a request line and "
            f"headers of at most {self.server.limits.max_head} bytes in all",
        )
        head = h11.Response(status_code=status, headers=[*headers, (b"date", _date.now())])
        data = self.h11.send(head) + self.h11.send(h11.Data(data=body))
        await self.stream.send_all(data + self.h11.send(h11.EndOfMessage()))


class Exchange:
    """One request and its answer: the ASGI scope, ``receive`` and ``send``."""

    def __init__(self, connection: Connection, request: h11.Request) -> None:
        self.connection = connection
        self.conn = connection.h11
        self.request = request
        self.method = request.method.decode("ascii").upper()
        self.body_done = False
        self.head: h11.Response | None = None
        self.started = False
        self.finished = False

    def asgi_scope(self) -> dict:
        raw_path, _, query = self.request.target.partition(b"?")
        c = self.connection
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": self.request.http_version.decode("ascii"),
            "method": self.method,
            "scheme": "http",
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": list(self.request.headers),
            "client": c.client,
            "server": c.local,
            "state": dict(c.server.state),
        }

    async def run(self) -> None:
        try:
            await self.connection.server.app(self.asgi_scope(), self.receive, self.send)
        except Exception as exc:  # the app's bug: a 500 if nothing was sent, else close
            target = self.request.target[:200].decode("latin-1")
            log.error("the app raised", extra={"target": target}, exc_info=exc)
            if not self.started:
                with contextlib.suppress(h11.LocalProtocolError):
                    await self._internal_error()
            self.connection.broken = True
            return
        if not self.finished:  # the app returned without a whole answer
            if not self.started:
                await self._internal_error()
            self.connection.broken = True
            return
        if self.conn.their_state is h11.SEND_BODY and self.conn.our_state is h11.DONE:
            await self._discard_body()

    async def receive(self) -> dict:
        """The body, in as few messages as it arrived in; once the body is done, waits for
        the client to go away (``http.disconnect``)."""
        if self.body_done or self.connection.broken:
            await self._until_disconnect()
            return {"type": "http.disconnect"}
        if self.conn.they_are_waiting_for_100_continue:
            continue_ = h11.InformationalResponse(status_code=100, headers=[])
            await self.connection.stream.send_all(self.conn.send(continue_))
        chunks: list[bytes] = []
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError:
                self.connection.broken = True
                return {"type": "http.disconnect"}
            if isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self.body_done = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            elif event is h11.NEED_DATA:
                if chunks:
                    return {"type": "http.request", "body": b"".join(chunks), "more_body": True}
                data = await self.connection.stream.receive_some(MAX_RECV)
                if not data:
                    self.connection.broken = True
                    return {"type": "http.disconnect"}
                self.conn.receive_data(data)
            else:  # ConnectionClosed
                self.connection.broken = True
                return {"type": "http.disconnect"}

    async def _until_disconnect(self) -> None:
        """Returns when the client closes the connection; what it pipelines meanwhile is kept
        for the next request (up to MAX_BUFFERED bytes; then it is left unread)."""
        if self.connection.broken:
            return
        while len(self.conn.trailing_data[0]) < MAX_BUFFERED:
            data = await self.connection.stream.receive_some(MAX_RECV)
            if not data:
                self.connection.broken = True
                return
            self.conn.receive_data(data)
        await trio.sleep_forever()

    async def send(self, message: dict) -> None:
        """ASGI send: the answer's head is held until its first body message, then both go
        in one write. A client that went away is not the app's error: its answer is dropped."""
        kind = message["type"]
        if kind == "http.response.start":
            if self.head is not None:
                raise RuntimeError("http.response.start sent twice")
            headers = [*message.get("headers", ()), (b"date", _date.now())]
            self.head = h11.Response(status_code=message["status"], headers=headers)
            return
        if kind != "http.response.body":
            return  # no other message of the http scope asks anything of HTTP/1.1
        if self.head is None or self.finished:
            raise RuntimeError("http.response.body before the answer's start or after its end")
        data = b""
        if not self.started:
            self.started = True
            data = self.conn.send(self.head)
        body = message.get("body", b"")
        if body and self.method != "HEAD":
            data += self.conn.send(h11.Data(data=body))
        if not message.get("more_body", False):
            self.finished = True
            data += self.conn.send(h11.EndOfMessage())
        if data and not self.connection.broken:
            try:
                await self.connection.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.connection.broken = True

    async def _internal_error(self) -> None:
        headers, body = problem_answer(
            500,
            "Internal error",
            "the server failed on this request (a bug, logged with its traceback); nothing of "
            "it is known to be written unless a GET says so. Please report it.",
        )
        self.head = None
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    async def _discard_body(self) -> None:
        """The app answered, keeping the connection, without reading the whole body: read the
        rest, if it is small and quick to come (LINGER_BYTES, LINGER_SECONDS), so the
        connection can serve the next request; else it closes."""
        dropped = 0
        with trio.move_on_after(LINGER_SECONDS):
            while not self.body_done and not self.connection.broken:
                message = await self.receive()
                dropped += len(message.get("body", b""))
                if dropped > LINGER_BYTES:
                    break
        if not self.body_done:
            self.connection.broken = True


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


def _head_size(request: h11.Request) -> int:
    """The bytes of a request's line and headers, as sent (give or take whitespace)."""
    line = len(request.method) + len(request.target) + 11
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers) + 2


def _addresses(stream: trio.SocketStream) -> tuple[tuple[str, int] | None, tuple[str, int] | None]:
    try:
        peer, local = stream.socket.getpeername(), stream.socket.getsockname()
    except OSError:
        return None, None
    return (peer[0], peer[1]), (local[0], local[1])
