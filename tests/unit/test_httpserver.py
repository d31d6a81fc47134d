"""leasework.httpserver on a loopback socket: keep-alive, one write per answer, pipelining,
the head's limits and timeouts, 100-continue, the app's failures, the client's disconnect,
lifespan, and the drain."""

from __future__ import annotations

import contextlib
import json
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from leasework.httpserver import ServerLimits, serve

FAST = ServerLimits(head_timeout=0.5, keep_alive=0.3, max_head=1024, drain=1.0)


async def echo(scope, receive, send):
    """Answers with what it was asked: method, path, query, body."""
    if scope["type"] == "lifespan":
        raise RuntimeError("no lifespan here")
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = json.dumps(
        {
            "method": scope["method"],
            "path": scope["path"],
            "query": scope["query_string"].decode(),
            "body": body.decode(),
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(answer)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": answer})


class Clients:
    """Connections to the server under test, all closed at the end."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.addr = addr
        self.streams: list[trio.SocketStream] = []

    async def connect(self) -> trio.SocketStream:
        stream = await trio.open_tcp_stream(*self.addr)
        self.streams.append(stream)
        return stream

    async def close(self) -> None:
        for stream in self.streams:
            await stream.aclose()


@asynccontextmanager
async def running(app, limits=FAST):
    stopped = trio.Event()
    async with trio.open_nursery() as nursery:
        addr = await nursery.start(partial(serve, app, ("127.0.0.1", 0), stopped, limits=limits))
        clients = Clients(addr)
        try:
            yield clients, stopped
        finally:
            await clients.close()
            stopped.set()


async def read_answer(stream: trio.SocketStream, buffer: bytearray) -> tuple[bytes, bytes]:
    """One answer's head and body (by content-length), from ``buffer`` and the stream."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError(bytes(buffer))
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    rest = bytearray(rest)
    while len(rest) < length:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError(bytes(rest))
        rest += data
    buffer[:] = rest[length:]
    return head, bytes(rest[:length])


def request(method: str, target: str, body: bytes = b"", extra: str = "") -> bytes:
    head = f"{method} {target} HTTP/1.1\r\nhost: t\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    return head.encode() + body


async def answered_then_closed(stream: trio.SocketStream, status: int) -> bytes:
    """The one answer on ``stream`` has ``status``, and then the server closed it; its body."""
    head, body = await read_answer(stream, bytearray())
    assert head.startswith(b"HTTP/1.1 %d " % status), head
    assert await closed(stream)
    return body


async def closed(stream: trio.SocketStream) -> bool:
    with trio.move_on_after(3):
        while data := await stream.receive_some(65536):
            del data
        return True
    return False


async def test_one_connection_serves_requests_one_after_another_each_answer_in_one_write():
    async with running(echo) as (clients, _):
        stream = await clients.connect()
        buffer = bytearray()
        for n in range(3):
            await stream.send_all(request("POST", f"/jobs?n={n}", b'{"a": 1}'))
            data = await stream.receive_some(65536)  # head and body arrive together
            buffer += data
            head, body = await read_answer(stream, buffer)
            assert head.startswith(b"HTTP/1.1 200 ")
            assert b"\r\ndate: " in head.lower()
            assert json.loads(body) == {
                "method": "POST",
                "path": "/jobs",
                "query": f"n={n}",
                "body": '{"a": 1}',
            }
            assert data.endswith(body)


async def test_pipelined_requests_are_answered_in_order():
    async with running(echo) as (clients, _):
        stream = await clients.connect()
        await stream.send_all(b"".join(request("GET", f"/{n}") for n in range(5)))
        buffer = bytearray()
        paths = [json.loads((await read_answer(stream, buffer))[1])["path"] for _ in range(5)]
        assert paths == [f"/{n}" for n in range(5)]


async def test_a_body_in_pieces_reaches_the_app_whole_and_percent_escapes_are_decoded():
    async with running(echo) as (clients, _):
        stream = await clients.connect()
        whole = request("PUT", "/a%20b", b"x" * 3000)
        for at in range(0, len(whole), 700):
            await stream.send_all(whole[at : at + 700])
            await trio.sleep(0.01)
        answer = json.loads((await read_answer(stream, bytearray()))[1])
        assert (answer["path"], answer["body"]) == ("/a b", "x" * 3000)


async def test_a_head_too_large_is_431_and_a_malformed_one_400_then_closed():
    async with running(echo) as (clients, _):
        stream = await clients.connect()
        await stream.send_all(request("GET", "/", extra="x-big: " + "y" * 2000 + "\r\n"))
        body = await answered_then_closed(stream, 431)
        assert "at most 1024 bytes" in json.loads(body)["detail"]

        stream = await clients.connect()
        await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
        await answered_then_closed(stream, 400)


async def test_an_idle_connection_is_closed_after_keep_alive_and_a_slow_head_after_its_timeout():
    async with running(echo) as (clients, _):
        stream = await clients.connect()
        await stream.send_all(request("GET", "/"))
        await read_answer(stream, bytearray())
        start = trio.current_time()
        assert await closed(stream)
        assert 0.25 <= trio.current_time() - start < 2

        stream = await clients.connect()
        start = trio.current_time()
        await stream.send_all(b"GET / HTTP/1.1\r\n")  # and never the rest of the head
        assert await closed(stream)
        assert 0.45 <= trio.current_time() - start < 2


async def test_expect_100_continue_is_answered_when_the_app_reads_the_body():
    async with running(echo) as (clients, _):
        stream = await clients.connect()
        head = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n"
        await stream.send_all(head)
        interim = await stream.receive_some(65536)
        assert interim.startswith(b"HTTP/1.1 100 ")
        await stream.send_all(b"ok")
        assert json.loads((await read_answer(stream, bytearray()))[1])["body"] == "ok"


async def test_the_apps_exception_before_its_answer_is_a_500_problem_and_the_connection_closes():
    async def broken(scope, receive, send):
        if scope["type"] == "http":
            raise ValueError("bug")

    async with running(broken) as (clients, _):
        stream = await clients.connect()
        await stream.send_all(request("GET", "/"))
        body = await answered_then_closed(stream, 500)
        assert json.loads(body)["title"] == "Internal error"


async def test_an_answer_without_a_length_is_chunked_and_head_gets_no_body():
    async def chunks(scope, receive, send):
        if scope["type"] != "http":
            raise RuntimeError
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ab", "more_body": True})
        await send({"type": "http.response.body", "body": b"cd"})

    async with running(chunks) as (clients, _):
        stream = await clients.connect()
        await stream.send_all(request("GET", "/"))
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            data += await stream.receive_some(65536)
        assert b"transfer-encoding: chunked" in data.lower()
        assert b"2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n" in data
        await stream.send_all(request("HEAD", "/"))
        head = await stream.receive_some(65536)
        assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")


async def test_the_app_hears_the_client_go_away_after_the_body():
    heard = trio.Event()

    async def waits(scope, receive, send):
        if scope["type"] != "http":
            raise RuntimeError
        while (await receive())["type"] != "http.disconnect":
            pass
        heard.set()

    async with running(waits) as (clients, _):
        stream = await clients.connect()
        await stream.send_all(request("POST", "/", b"body"))
        await trio.sleep(0.05)
        await stream.aclose()
        with trio.fail_after(2):
            await heard.wait()


async def test_lifespan_runs_around_the_serving():
    events = []

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                events.append(message["type"])
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        await echo(scope, receive, send)

    async with running(app) as (clients, _):
        assert events == ["lifespan.startup"]
    assert events == ["lifespan.startup", "lifespan.shutdown"]


async def test_stopping_closes_idle_connections_at_once_and_answers_the_request_in_progress():
    release = trio.Event()

    async def slow(scope, receive, send):
        if scope["type"] != "http":
            raise RuntimeError
        if scope["path"] == "/slow":
            await release.wait()
        await echo(scope, receive, send)

    limits = ServerLimits(head_timeout=30, keep_alive=30, drain=5)
    async with trio.open_nursery() as nursery:
        stopped = trio.Event()
        addr = await nursery.start(partial(serve, slow, ("127.0.0.1", 0), stopped, limits=limits))
        clients = Clients(addr)
        idle = await clients.connect()
        await idle.send_all(request("GET", "/"))
        await read_answer(idle, bytearray())
        busy = await clients.connect()
        await busy.send_all(request("GET", "/slow"))
        await trio.sleep(0.1)
        stopped.set()
        with trio.fail_after(2):
            assert await closed(idle)
        with pytest.raises(OSError):
            await clients.connect()  # the listener is closed
        release.set()
        head, _ = await read_answer(busy, bytearray())
        assert head.startswith(b"HTTP/1.1 200 ")
        assert await closed(busy)
        await clients.close()


async def refuse_unread(scope, receive, send):
    """Answers 413 without reading the body (the guard's refusal of a declared length)."""
    if scope["type"] != "http":
        raise RuntimeError
    close = [(b"connection", b"close")] if scope["path"] == "/close" else []
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-length", b"2"), *close],
        }
    )
    await send({"type": "http.response.body", "body": b"no"})


async def test_an_answer_sent_before_a_large_body_arrived_reaches_the_client():
    async with running(refuse_unread) as (clients, _):
        stream = await clients.connect()
        await stream.send_all(request("POST", "/close", b"x" * 200_000)[:100_000])
        await trio.sleep(0.2)  # the answer is sent and the server closes meanwhile
        with contextlib.suppress(trio.BrokenResourceError):
            await stream.send_all(b"x" * 50_000)  # still sending
        head, body = await read_answer(stream, bytearray())
        assert head.startswith(b"HTTP/1.1 413 ") and body == b"no"


async def test_a_small_body_left_unread_is_dropped_and_the_connection_serves_the_next_request():
    async with running(refuse_unread) as (clients, _):
        stream = await clients.connect()
        buffer = bytearray()
        for _ in range(2):
            await stream.send_all(request("POST", "/keep", b"x" * 5000))
            head, _ = await read_answer(stream, buffer)
            assert head.startswith(b"HTTP/1.1 413 ")


async def test_a_head_too_large_in_pieces_is_refused_before_it_ends():
    async with running(echo) as (clients, _):
        stream = await clients.connect()
        await stream.send_all(b"GET / HTTP/1.1\r\nhost: t\r\nx-big: ")
        for _ in range(3):  # a header value growing past the 1 KiB head, never ending
            await stream.send_all(b"y" * 600)
            await trio.sleep(0.02)
        await answered_then_closed(stream, 431)


async def test_an_upgrade_is_refused_and_http_1_0_is_answered_then_closed():
    async with running(echo) as (clients, _):
        stream = await clients.connect()
        await stream.send_all(
            b"GET / HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n"
        )
        assert b"upgrade" in (await answered_then_closed(stream, 400)).lower()

        stream = await clients.connect()
        await stream.send_all(b"GET /old HTTP/1.0\r\n\r\n")
        head, body = await read_answer(stream, bytearray())
        assert head.startswith(b"HTTP/1.1 200 ") and b"connection: close" in head.lower()
        assert json.loads(body)["path"] == "/old"
        assert await closed(stream)


async def test_a_header_with_a_line_break_is_the_apps_bug_not_a_second_header():
    async def injects(scope, receive, send):
        if scope["type"] != "http":
            raise RuntimeError
        headers = [(b"location", b"/x\r\nset-cookie: stolen=1"), (b"content-length", b"0")]
        await send({"type": "http.response.start", "status": 303, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    async with running(injects) as (clients, _):
        stream = await clients.connect()
        await stream.send_all(request("GET", "/"))
        head, _ = await read_answer(stream, bytearray())
        assert head.startswith(b"HTTP/1.1 500 ") and b"stolen" not in head


async def test_an_answer_short_of_its_length_closes_the_connection():
    async def short(scope, receive, send):
        if scope["type"] != "http":
            raise RuntimeError
        headers = [(b"content-length", b"10")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"abc"})

    async with running(short) as (clients, _):
        stream = await clients.connect()
        await stream.send_all(request("GET", "/"))
        data = b""
        with trio.fail_after(3):
            while chunk := await stream.receive_some(65536):
                data += chunk
        assert data.endswith(b"\r\n\r\nabc")  # and then the end of the stream
