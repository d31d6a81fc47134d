"""leasework.transport: each request in one write, connections reused, a closed idle
connection replaced before a request is sent on it, and h11's view of the bytes."""

from __future__ import annotations

import socket
import threading

import h11
import httpx
import pytest
import trio

from leasework.transport import (
    AsyncKeepAliveTransport,
    Exchange,
    KeepAliveTransport,
    request_parts,
)

ANSWER = (
    b"HTTP/1.1 202 Accepted\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"
    b'{"id":"j1"}'
)


def test_a_request_is_one_buffer_a_server_parses_whole():
    request = httpx.Request("POST", "http://api.test/jobs", json={"type": "noop"})
    data = Exchange().request_bytes(*request_parts(request), request.read())
    server = h11.Connection(h11.SERVER)
    server.receive_data(data)
    events = [server.next_event() for _ in range(3)]
    assert isinstance(events[0], h11.Request) and events[0].target == b"/jobs"
    assert events[1].data == b'{"type":"noop"}'
    assert isinstance(events[2], h11.EndOfMessage)
    assert server.next_event() is h11.NEED_DATA


def test_an_answer_arriving_in_pieces_is_read_to_its_end_and_the_connection_reset():
    exchange = Exchange()
    exchange.request_bytes("GET", b"/jobs/j1", [(b"host", b"api.test")], b"")
    pieces = [ANSWER[:10], ANSWER[10:70], ANSWER[70:]]
    assert [exchange.receive(piece) for piece in pieces] == [False, False, True]
    answer = exchange.answer()
    assert (answer.status, answer.content, answer.reason) == (202, b'{"id":"j1"}', b"Accepted")
    assert exchange.reusable()
    exchange.request_bytes("GET", b"/", [(b"host", b"api.test")], b"")  # the next cycle


def test_a_server_that_closes_before_answering_is_a_protocol_error():
    exchange = Exchange()
    exchange.request_bytes("GET", b"/jobs/j1", [(b"host", b"api.test")], b"")
    exchange.receive(ANSWER[:20])
    with pytest.raises(httpx.RemoteProtocolError, match="closed the connection before it answered"):
        exchange.receive(b"")


def test_an_answer_that_says_close_is_not_reused():
    exchange = Exchange()
    exchange.request_bytes("GET", b"/", [(b"host", b"api.test")], b"")
    closing = ANSWER.replace(b"content-length", b"connection: close\r\ncontent-length")
    assert exchange.receive(closing)
    assert not exchange.reusable()


class Server:
    """A loopback HTTP/1.1 server that answers ANSWER and records, per connection, the
    chunks each request arrived in; ``close_idle`` closes a connection after its answer."""

    def __init__(self, close_idle: bool = False, answer: bytes = ANSWER) -> None:
        self.close_idle = close_idle
        self.answer = answer
        self.requests: list[tuple[h11.Request, bytes]] = []  # each with its body
        self.connections: list[list[int]] = []  # per connection: chunks per request
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        chunks: list[int] = []
        self.connections.append(chunks)
        with conn:
            while True:
                parser, count, events = h11.Connection(h11.SERVER), 0, []
                while not any(isinstance(e, h11.EndOfMessage) for e in events):
                    data = conn.recv(65536)
                    if not data:
                        return
                    count += 1
                    parser.receive_data(data)
                    events += iter(parser.next_event, h11.NEED_DATA)
                body = b"".join(e.data for e in events if isinstance(e, h11.Data))
                self.requests.append((events[0], body))
                chunks.append(count)
                conn.sendall(self.answer)
                if self.close_idle:
                    return


def test_async_requests_reuse_one_connection_and_each_arrives_in_one_chunk():
    server = Server()

    async def main() -> list[int]:
        transport = AsyncKeepAliveTransport()
        async with httpx.AsyncClient(transport=transport) as client:
            url = f"http://127.0.0.1:{server.port}/jobs"
            for n in range(5):
                response = await client.post(url, json={"type": "noop", "payload": {"n": n}})
                assert response.json() == {"id": "j1"}
        return [len(c) for c in server.connections]

    assert trio.run(main) == [5]
    assert server.connections[0] == [1, 1, 1, 1, 1]


def test_async_an_idle_connection_the_server_closed_is_replaced_before_use():
    server = Server(close_idle=True)

    async def main() -> None:
        async with httpx.AsyncClient(transport=AsyncKeepAliveTransport()) as client:
            for _ in range(3):
                response = await client.get(f"http://127.0.0.1:{server.port}/")
                assert response.status_code == 202
                await trio.sleep(0.05)  # the server's close arrives

    trio.run(main)
    assert len(server.connections) == 3


def test_async_requests_in_flight_are_capped_and_the_rest_wait():
    server = Server()

    async def main() -> int:
        transport = AsyncKeepAliveTransport(max_connections=2)
        async with httpx.AsyncClient(transport=transport) as client:
            async with trio.open_nursery() as nursery:
                for _ in range(8):
                    nursery.start_soon(client.get, f"http://127.0.0.1:{server.port}/")
        return sum(len(c) for c in server.connections)

    assert trio.run(main) == 8
    assert len(server.connections) <= 2


def test_async_nothing_listening_is_a_connect_error():
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]

    async def main() -> None:
        async with httpx.AsyncClient(transport=AsyncKeepAliveTransport()) as client:
            await client.get(f"http://127.0.0.1:{port}/")

    with pytest.raises(httpx.ConnectError):
        trio.run(main)


def test_blocking_requests_reuse_one_connection_and_replace_a_closed_one():
    server = Server()
    with httpx.Client(transport=KeepAliveTransport()) as client:
        for _ in range(3):
            assert client.post(f"http://127.0.0.1:{server.port}/jobs", json={}).status_code == 202
    assert server.connections == [[1, 1, 1]]

    closing = Server(close_idle=True)
    with httpx.Client(transport=KeepAliveTransport()) as client:
        for _ in range(2):
            assert client.get(f"http://127.0.0.1:{closing.port}/").status_code == 202
            threading.Event().wait(0.05)
    assert len(closing.connections) == 2


def test_a_read_that_outlasts_its_timeout_is_a_read_timeout():
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    port = listener.getsockname()[1]
    with httpx.Client(transport=KeepAliveTransport(), timeout=0.2) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.get(f"http://127.0.0.1:{port}/")
    listener.close()


def test_the_clients_send_no_header_the_api_does_not_read():
    from leasework.client import AsyncClient, Client

    for client in (Client(token="lw_x"), AsyncClient(token="lw_x")):
        names = set(client.http.build_request("POST", "/jobs", json={}).headers.keys())
        assert names == {"host", "user-agent", "authorization", "content-length", "content-type"}


def test_a_submit_is_one_write_with_its_key_and_its_answer_decoded():
    from leasework.client import AsyncClient, Client

    server = Server()
    url = f"http://127.0.0.1:{server.port}"

    async def main() -> dict:
        async with AsyncClient(url, token="lw_x") as client:
            return await client.submit("noop", {"n": 1}, idempotency_key="order-7")

    assert trio.run(main) == {"id": "j1"}
    with Client(url + "/", token="lw_x") as client:
        assert client.submit("noop", max_attempts=2) == {"id": "j1"}
    assert server.connections == [[1], [1]]
    (first, first_body), (second, second_body) = server.requests
    assert (first.method, first.target) == (b"POST", b"/jobs")
    headers = dict(first.headers)
    assert headers[b"idempotency-key"] == b"order-7"
    assert headers[b"authorization"] == b"Bearer lw_x"
    assert headers[b"host"] == f"127.0.0.1:{server.port}".encode()
    assert first_body == b'{"type":"noop","payload":{"n":1}}'
    assert (second.target, b"idempotency-key" in dict(second.headers)) == (b"/jobs", False)
    assert second_body == b'{"type":"noop","payload":{},"max_attempts":2}'


def test_a_refused_submit_raises_the_problem_it_was_answered_with():
    from leasework.client import ApiError, Client

    problem = b'{"status":422,"detail":"unknown job type"}'
    answer = (
        b"HTTP/1.1 422 Unprocessable\r\ncontent-type: application/problem+json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(problem), problem)
    )
    server = Server(answer=answer)
    with Client(f"http://127.0.0.1:{server.port}", token="lw_x") as client:
        with pytest.raises(ApiError, match="unknown job type") as raised:
            client.submit("nope")
    assert raised.value.status == 422
