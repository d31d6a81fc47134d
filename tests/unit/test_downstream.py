"""The fence handed downstream, without servers: the headers a job sends and how a service
reads them, the ASGI middleware's answers, the job's reading of a stale-fence answer, and
what the worker makes of an attempt a service refused."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import trio

from leasework import JobContext, StaleFence
from leasework.downstream import (
    SCOPE_KEY,
    STALE_FENCE_TYPE,
    Fence,
    FenceHeaderError,
    FenceMiddleware,
    problem,
    raise_if_stale,
)

JOB = uuid.UUID("0b6c1a52-3f1e-4d0e-9a57-5b7e2f1c9d10")


def test_a_job_sends_its_id_and_fence_and_a_service_reads_them_back():
    ctx = JobContext(job_id=JOB, type="t", attempt=2, max_attempts=5, fence=41, worker="w")
    headers = ctx.fence_headers()
    assert headers == {"Leasework-Job-Id": str(JOB), "Leasework-Fence": "41"}
    lower = {k.lower(): v for k, v in headers.items()}
    assert Fence.from_headers(lower) == Fence(JOB, 41)
    assert Fence.from_headers({"content-type": "application/json"}) is None


@pytest.mark.parametrize(
    ("headers", "says"),
    [
        ({"Leasework-Fence": "3"}, "Leasework-Job-Id is missing"),
        ({"Leasework-Job-Id": str(JOB)}, "Leasework-Fence is missing"),
        ({"Leasework-Job-Id": "nope", "Leasework-Fence": "3"}, "is not a UUID"),
        ({"Leasework-Job-Id": str(JOB), "Leasework-Fence": "0"}, "not an integer from 1"),
        ({"Leasework-Job-Id": str(JOB), "Leasework-Fence": "-4"}, "not an integer from 1"),
        ({"Leasework-Job-Id": str(JOB), "Leasework-Fence": str(2**63)}, "not an integer"),
        ({"Leasework-Job-Id": str(JOB), "Leasework-Fence": "\u00b2"}, "not an integer"),
    ],
)
def test_fence_headers_that_cannot_be_read_say_which_and_why(headers, says):
    with pytest.raises(FenceHeaderError, match=says):
        Fence.from_headers(headers)


def test_a_stale_fence_answer_raises_in_the_job_and_nothing_else_does():
    body = problem(StaleFence(JOB, 3, 5))
    assert body["type"] == STALE_FENCE_TYPE and body["status"] == 409
    with pytest.raises(StaleFence) as caught:
        raise_if_stale(409, json.dumps(body).encode())
    assert (caught.value.job_id, caught.value.fence, caught.value.highest) == (JOB, 3, 5)
    assert "it has seen fence 5" in str(caught.value)
    raise_if_stale(200, json.dumps(body))  # not a 409
    raise_if_stale(409, b'{"type": "about:blank"}')  # another conflict
    raise_if_stale(409, b"not json")
    with pytest.raises(StaleFence, match="odd"):
        raise_if_stale(409, {"type": STALE_FENCE_TYPE, "detail": "odd", "job_id": "x"})


async def call(app: Any, headers: dict[str, str]) -> tuple[int, dict[str, Any] | None, dict]:
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/send",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await FenceMiddleware(app)(scope, receive, send)
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, (json.loads(body) if body.startswith(b"{") else None), scope


async def ok_app(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"sent"})


async def stale_app(scope, receive, send) -> None:
    fence = scope[SCOPE_KEY]
    raise StaleFence(fence.job_id, fence.fence, fence.fence + 1)


def test_the_middleware_hands_the_fence_to_the_app_and_answers_a_stale_call_409():
    headers = Fence(JOB, 7).headers()
    status, _, scope = trio.run(call, ok_app, headers)
    assert status == 200 and scope[SCOPE_KEY] == Fence(JOB, 7)
    status, body, _ = trio.run(call, stale_app, headers)
    assert status == 409 and body is not None
    assert (body["type"], body["fence"], body["highest"]) == (STALE_FENCE_TYPE, 7, 8)
    with pytest.raises(StaleFence):  # and the job that reads that answer stops as stale
        raise_if_stale(status, body)


def test_the_middleware_refuses_unreadable_headers_and_may_require_them():
    status, body, _ = trio.run(call, ok_app, {"Leasework-Fence": "x"})
    assert status == 400 and body is not None and "Leasework-Job-Id is missing" in body["detail"]
    status, _, scope = trio.run(call, ok_app, {})
    assert status == 200 and scope[SCOPE_KEY] is None

    async def required(app, headers):
        sent: list[dict[str, Any]] = []

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "headers": []}
        await FenceMiddleware(app, required=True)(scope, None, send)
        return sent[0]["status"]

    assert trio.run(required, ok_app, {}) == 428


def test_a_stale_app_error_after_the_answer_started_is_not_hidden():
    async def late_app(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise StaleFence(JOB, 1, 2)

    with pytest.raises(StaleFence):
        trio.run(call, late_app, Fence(JOB, 1).headers())
