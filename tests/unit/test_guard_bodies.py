"""The guard's bounds on a request's body (pure ASGI, no server): a body over its route's cap
is refused before the app sees it (at once from the declared length, or as soon as a streamed
one passes the cap), a body that does not arrive in time is a 408, too many large bodies at
once a 503, and a body within bounds reaches the app whole."""

from __future__ import annotations

import json

import pytest
import trio

from leasework.api.guard import Guard
from leasework.api.limits import LARGE_BODIES, LARGE_BODY_BYTES, BodyLimits
from leasework.api.routes import ROUTES
from leasework.api.routing import Router

LIMITS = BodyLimits(
    submit=1000, batch=4 * LARGE_BODY_BYTES, webhook=500, form=100, small=50, read_timeout=5.0
)


class App:
    """Records what reached it and answers 200."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


class Auth:
    async def principal(self, token):  # every token is an admin's here
        from leasework.tokens import Principal

        return Principal("id", "t", frozenset({"admin"}))


def guard() -> tuple[Guard, App]:
    app = App()
    return Guard(app, Router(ROUTES), Auth(), None, LIMITS), app  # type: ignore[arg-type]


def request(method: str, path: str, length: int | None) -> dict:
    headers = [(b"authorization", b"Bearer t")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "method": method, "path": path, "headers": headers}


async def call(g: Guard, scope: dict, chunks: list[bytes], *, stall: bool = False) -> tuple:
    """(status, body, chunks the guard read)."""
    read = []

    async def receive() -> dict:
        if not chunks:
            if stall:
                await trio.sleep_forever()
            return {"type": "http.disconnect"}
        chunk = chunks.pop(0)
        read.append(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks) or stall}

    answer: dict = {}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        else:
            answer["body"] = message.get("body", b"")

    await g(scope, receive, send)
    return answer.get("status"), answer.get("body", b""), read


@pytest.mark.parametrize(
    ("method", "path", "cap"),
    [
        ("POST", "/jobs", LIMITS.submit),
        ("POST", "/jobs/batch", LIMITS.batch),
        ("POST", "/alerts/webhook", LIMITS.webhook),
        ("POST", "/ui/login", LIMITS.form),
        ("POST", "/jobs/retry", LIMITS.small),
        ("GET", "/readyz", LIMITS.small),
        ("POST", "/no/such/path", LIMITS.small),
    ],
)
async def test_a_declared_length_over_the_cap_is_413_before_a_byte_is_read(method, path, cap):
    g, app = guard()
    status, body, read = await call(g, request(method, path, cap + 1), [b"x" * (cap + 1)])
    assert (status, read, app.bodies) == (413, [], [])
    assert json.loads(body)["limit_bytes"] == cap


async def test_a_streamed_body_is_refused_as_soon_as_it_passes_the_cap():
    g, app = guard()
    chunks = [b"x" * 400] * 10  # 4,000 bytes against a cap of 1,000
    status, _, read = await call(g, request("POST", "/jobs", None), chunks)
    assert status == 413 and len(read) == 3 and app.bodies == []


async def test_a_body_within_its_cap_reaches_the_app_whole():
    g, app = guard()
    status, _, _ = await call(g, request("POST", "/jobs", None), [b"a" * 500, b"b" * 500])
    assert status == 200 and app.bodies == [b"a" * 500 + b"b" * 500]


async def test_a_body_that_stops_arriving_is_408_at_the_read_timeout(autojump_clock):
    g, app = guard()
    started = trio.current_time()
    status, _, _ = await call(g, request("POST", "/jobs", 100), [b"{"], stall=True)
    assert status == 408 and app.bodies == []
    assert trio.current_time() - started == pytest.approx(LIMITS.read_timeout)


async def test_too_many_large_bodies_at_once_are_503(autojump_clock):
    g, _ = guard()
    size = LARGE_BODY_BYTES + 1
    statuses = []

    async def stalled() -> None:
        statuses.append((await call(g, request("POST", "/jobs/batch", size), [], stall=True))[0])

    async with trio.open_nursery() as nursery:
        for _ in range(LARGE_BODIES):
            nursery.start_soon(stalled)
        await trio.sleep(1)  # every slot is held by a body still arriving
        extra = await call(g, request("POST", "/jobs/batch", size), [b"x"])
        assert extra[0] == 503
    assert statuses == [408] * LARGE_BODIES  # and each slot was given back
    small = await call(g, request("POST", "/jobs/batch", 10), [b"x" * 10])
    assert small[0] == 200
