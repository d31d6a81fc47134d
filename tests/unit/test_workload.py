"""The workload's client side without a server: how each HTTP outcome is classified, that an
unknown submit is retried with the same key and body as a new invocation, and the pure
analyses of a finished run (unknowns that landed, backlog drain, duplicate messages)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from chaos.generator import PlannedSubmit, plan_submits
from chaos.history import Op, Recorder, nemesis_value, submit_ok_value, submit_value
from chaos.messages import message_view
from chaos.scenario import Mix, WorkloadSpec
from chaos.workload import (
    WorkloadClient,
    backlog_drain,
    classify_exception,
    classify_response,
    client_view,
    request_body,
)

T0 = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)


def response(code: int, body: object = None) -> httpx.Response:
    return httpx.Response(code, json=body if body is not None else {})


# ---------------------------------------------------------------- classification


@pytest.mark.parametrize(
    ("code", "body", "kind", "retry"),
    [
        (202, {"id": "j1"}, "ok", False),
        (422, {"type": "invalid-fields"}, "fail", False),
        (409, {"type": "idempotency-key-reused"}, "fail", False),
        (415, {}, "fail", False),
        (429, {}, "fail", True),
        (503, {"type": "database-unavailable"}, "fail", True),  # "nothing was written"
        (503, {"type": "http-error"}, "info", True),
        (500, {}, "info", True),
        (502, {}, "info", True),
    ],
)
def test_responses_are_classified(code, body, kind, retry):
    result = classify_response(response(code, body))
    assert (result.type, result.retry) == (kind, retry)
    if kind != "ok":
        assert result.error and result.error.startswith(f"HTTP {code}")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ConnectError("refused"), "fail"),  # nothing was sent
        (httpx.ConnectTimeout("slow"), "fail"),
        (httpx.PoolTimeout("busy"), "fail"),
        (httpx.ReadTimeout("no answer"), "info"),  # sent, answer lost: unknown
        (httpx.WriteTimeout("half sent"), "info"),
        (httpx.RemoteProtocolError("reset"), "info"),
        (httpx.ReadError("reset"), "info"),
    ],
)
def test_exceptions_are_classified_unknown_unless_nothing_was_sent(exc, kind):
    result = classify_exception(exc)
    assert result.type == kind
    assert result.retry
    assert result.reason == type(exc).__name__


def planned(i: int = 0, **overrides) -> PlannedSubmit:
    values = dict(
        at=0.0,
        key=f"run-{i:06d}",
        kind="ledger",
        job_type="ledger",
        payload={"seconds": 1.0},
        delay=0.0,
        max_attempts=10,
        timeout_seconds=30,
        may_die=False,
    )
    values.update(overrides)
    return PlannedSubmit(**values)


def test_request_body_is_the_plan_and_omits_a_zero_delay():
    assert request_body(planned()) == {
        "type": "ledger",
        "payload": {"seconds": 1.0},
        "max_attempts": 10,
        "timeout_seconds": 30,
    }
    assert request_body(planned(delay=2.5))["delay_seconds"] == 2.5


def test_the_plan_carries_the_mix_and_unique_keys():
    workload = WorkloadSpec(rate=10, duration=3, mix=Mix(noop=1, delayed=1, fail=1, ledger=1))
    plan = list(plan_submits(workload, seed=3, key_prefix="p"))
    assert len(plan) == 30
    assert len({p.key for p in plan}) == 30
    assert {p.kind for p in plan} == {"noop", "delayed", "fail", "ledger"}


# ---------------------------------------------------------------- the client against a fake API


class FakeApi:
    """Answers per key from a script; records every request it saw."""

    def __init__(self, script: dict[str, list[object]]) -> None:
        self.script = {k: list(v) for k, v in script.items()}
        self.requests: list[tuple[str, dict]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["Idempotency-Key"]
        body = json.loads(request.content)
        self.requests.append((key, body))
        step = self.script[key].pop(0) if self.script.get(key) else "ok"
        if isinstance(step, Exception):
            raise step
        if step == "ok":
            replay = sum(1 for k, _ in self.requests if k == key) > 1
            return httpx.Response(
                202, json={"id": f"job-{key}", "status": "queued", "replay": replay}
            )
        return httpx.Response(int(step), json={"type": "database-unavailable"})


async def run_client(script: dict[str, list[object]], plan: list[PlannedSubmit], **kwargs):
    api = FakeApi(script)
    recorder = Recorder()
    client = WorkloadClient(
        recorder,
        plan,
        base_url="http://api.test",
        clients=kwargs.pop("clients", 2),
        submit_timeout=1.0,
        transport=httpx.MockTransport(api),
        **kwargs,
    )
    stats = await client.run()
    return api, recorder.ops, stats


async def test_an_unknown_submit_is_retried_with_its_key_and_body_as_a_new_invocation():
    plan = [planned(0), planned(1, at=0.01)]
    api, ops, stats = await run_client({"run-000000": [httpx.ReadTimeout("lost")]}, plan)
    mine = [op for op in ops if op.value.get("key") == "run-000000"]
    assert [op.type for op in mine] == ["invoke", "info", "invoke", "ok"]
    # after an unknown outcome the client continues as a new process (the old one may
    # still be in flight), and the ok names the job and that it was a replay
    assert mine[0].process == mine[1].process != mine[2].process == mine[3].process
    assert mine[1].error.startswith("ReadTimeout")
    assert mine[3].value["job_id"] == "job-run-000000"
    assert mine[3].value["replay"] is True
    bodies = [body for key, body in api.requests if key == "run-000000"]
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    assert stats.acknowledged == 2
    assert stats.by_outcome == {"ok": 2, "info": 1}


async def test_a_refused_connection_is_a_fail_and_is_retried():
    api, ops, stats = await run_client(
        {"run-000000": [httpx.ConnectError("refused"), 503]}, [planned(0)]
    )
    assert [op.type for op in ops] == ["invoke", "fail", "invoke", "fail", "invoke", "ok"]
    assert stats.acknowledged == 1


async def test_a_4xx_is_final():
    _, ops, stats = await run_client({"run-000000": [422]}, [planned(0)])
    assert [op.type for op in ops] == ["invoke", "fail"]
    assert stats.rejected == 1 and stats.acknowledged == 0


async def test_retries_stop_at_retry_until():
    script = {"run-000000": [httpx.ReadTimeout("x")] * 100}
    _, ops, stats = await run_client(script, [planned(0)], retry_until=0.3)
    assert stats.given_up == 1
    assert ops[-1].type == "info"
    assert stats.acknowledged == 0


async def test_submits_go_out_on_schedule_from_several_clients():
    plan = [planned(i, at=i * 0.02) for i in range(10)]
    _, ops, stats = await run_client({}, plan, clients=3)
    invokes = [op for op in ops if op.type == "invoke"]
    assert [op.value["key"] for op in invokes] == [p.key for p in plan]
    assert all(op.time >= p.at - 0.005 for op, p in zip(invokes, plan, strict=True))
    assert stats.acknowledged == 10 and stats.keys_invoked == 10


# ---------------------------------------------------------------- receipts, through the shop


def receipt(i: int = 0, **overrides) -> PlannedSubmit:
    values = dict(
        kind="receipt",
        job_type="send_receipt",
        payload={"email": f"buyer-{i:06d}@shop.test", "amount_cents": 1250},
        max_attempts=5,
    )
    values.update(overrides)
    return planned(i, **values)


class FakeShop:
    """The shop's ``POST /orders``: 201 for a new key, 200 with replay for a repeated one,
    or a scripted step; records every request it saw."""

    def __init__(self, script: dict[str, list[object]]) -> None:
        self.script = {k: list(v) for k, v in script.items()}
        self.requests: list[tuple[str, str, dict]] = []
        self.orders: dict[str, int] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        key = request.headers["Idempotency-Key"]
        body = json.loads(request.content)
        self.requests.append((request.method, request.url.path, body))
        step = self.script[key].pop(0) if self.script.get(key) else "ok"
        if isinstance(step, Exception):
            raise step
        if step == "no-job":
            return httpx.Response(201, json={"order_id": 1, "replay": False})
        if step == "answer-lost":  # placed, then the answer never came back
            self.orders.setdefault(key, len(self.orders) + 1)
            raise httpx.ReadTimeout("lost")
        if step != "ok":
            return httpx.Response(int(step), json={"error": "no"})
        replay = key in self.orders
        order_id = self.orders.setdefault(key, len(self.orders) + 1)
        answer = {"order_id": order_id, "receipt_job_id": f"job-{key}", "replay": replay}
        return httpx.Response(200 if replay else 201, json=answer)


async def run_shop_client(shop_script: dict[str, list[object]], plan: list[PlannedSubmit]):
    """The client with the API and the shop behind one transport, by host."""
    api, shop = FakeApi({}), FakeShop(shop_script)
    recorder = Recorder()

    def route(request: httpx.Request) -> httpx.Response:
        return shop(request) if request.url.host == "shop.test" else api(request)

    client = WorkloadClient(
        recorder,
        plan,
        base_url="http://api.test",
        shop_url="http://shop.test",
        clients=2,
        submit_timeout=1.0,
        transport=httpx.MockTransport(route),
    )
    stats = await client.run()
    return api, shop, recorder.ops, stats


def test_the_request_body_of_a_receipt_is_the_order():
    assert request_body(receipt(3)) == {"email": "buyer-000003@shop.test", "amount_cents": 1250}


async def test_a_receipt_is_an_order_placed_at_the_shop_under_its_key():
    plan = [receipt(0), planned(1, at=0.01)]
    api, shop, ops, stats = await run_shop_client({}, plan)
    assert shop.requests == [
        ("POST", "/orders", {"email": "buyer-000000@shop.test", "amount_cents": 1250})
    ]
    assert [key for key, _ in api.requests] == ["run-000001"]  # the ledger job: POST /jobs
    mine = [op for op in ops if op.value.get("key") == "run-000000"]
    assert [op.type for op in mine] == ["invoke", "ok"]
    assert mine[0].value["type"] == "send_receipt"
    # the history's ok names the receipt job, as the checker expects of any submit
    assert submit_ok_value(mine[0].value, "job-run-000000", "queued").items() <= (
        mine[1].value.items()
    )
    assert (mine[1].value["order_id"], mine[1].value["replay"]) == (1, False)
    assert stats.acknowledged == 2


async def test_an_unknown_order_is_retried_with_its_key_and_body_and_replays():
    _, shop, ops, _ = await run_shop_client({"run-000000": ["answer-lost"]}, [receipt(0)])
    assert [op.type for op in ops] == ["invoke", "info", "invoke", "ok"]
    assert ops[1].error.startswith("ReadTimeout")
    bodies = [body for _, _, body in shop.requests]
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    # the timed-out attempt had placed the order: the retry finds it (200, replay)
    assert ops[3].value["job_id"] == "job-run-000000" and ops[3].value["replay"] is True


async def test_shop_answers_are_classified_like_the_apis():
    script = {
        "run-000000": [422],  # refused as it is: final
        "run-000001": ["no-job", 503, 500],  # unknown each time, then placed
    }
    _, _, ops, stats = await run_shop_client(script, [receipt(0), receipt(1, at=0.01)])
    first = [op for op in ops if op.value.get("key") == "run-000000"]
    assert [op.type for op in first] == ["invoke", "fail"]
    second = [op for op in ops if op.value.get("key") == "run-000001"]
    assert [op.type for op in second if op.type != "invoke"] == ["info", "info", "info", "ok"]
    assert second[1].error == "201 without a job id"
    assert stats.rejected == 1 and stats.acknowledged == 1


def test_a_plan_with_receipts_needs_the_shop():
    with pytest.raises(ValueError, match="shop_url"):
        WorkloadClient(Recorder(), [receipt(0)], base_url="http://api.test")


# ---------------------------------------------------------------- analyses


class History:
    def __init__(self) -> None:
        self.ops: list[Op] = []

    def op(self, t, process, kind, value, error=None) -> None:
        self.ops.append(Op(len(self.ops), t, process, kind, "submit", value, error))

    def submit(self, t, process, key, outcomes, *, delay=0.0):
        """outcomes: a list of ("ok", replay) / ("info", error) / ("fail", error)."""
        value = submit_value(key, "noop", {}, delay=delay)
        for kind, extra in outcomes:
            self.op(t, process, "invoke", value)
            t += 0.1
            if kind == "ok":
                ok = submit_ok_value(value, f"job-{key}", "queued")
                ok["replay"] = extra
                self.op(t, process, "ok", ok)
            else:
                self.op(t, process, kind, value, extra)
            t += 0.1
            process += 10


def job(key: str, **fields):
    row = {
        "id": f"job-{key}",
        "idempotency_key": key,
        "created_at": T0,
        "finished_at": T0 + timedelta(seconds=1),
    }
    row.update(fields)
    return row


def test_client_view_counts_unknowns_that_landed_and_those_proven_by_a_replay():
    h = History()
    h.submit(0.0, 0, "a", [("info", "ReadTimeout: x"), ("ok", True)])  # landed, replayed
    h.submit(0.0, 1, "b", [("info", "ReadTimeout: x"), ("ok", False)])  # the retry made it
    h.submit(0.0, 2, "c", [("info", "ReadTimeout: x")])  # never answered, found in table
    h.submit(0.0, 3, "d", [("info", "ReadTimeout: x")])  # never answered, not in table
    h.submit(0.0, 4, "e", [("ok", False)])
    view = client_view(h.ops, [job("a"), job("b"), job("c"), job("e")])
    assert view.keys == 5
    assert view.unknown_keys == 4
    assert view.unknown_landed == 3
    assert view.unknown_replayed == 1
    assert view.unknown_not_landed == 1
    assert view.retried_keys == 2
    assert view.jobs_per_key_max == 1
    assert view.failed_then_replayed == ()


def test_client_view_flags_a_503_nothing_written_that_had_written():
    h = History()
    h.submit(0.0, 0, "liar", [("fail", "HTTP 503: nothing was written"), ("ok", True)])
    h.submit(0.0, 1, "honest", [("fail", "HTTP 503: nothing was written"), ("ok", False)])
    h.submit(0.0, 2, "refused", [("fail", "ConnectError: refused"), ("ok", True)])
    h.submit(0.0, 3, "unsure", [("info", "ReadTimeout"), ("fail", "HTTP 503: x"), ("ok", True)])
    view = client_view(h.ops, [job(k) for k in ("liar", "honest", "refused", "unsure")])
    assert view.failed_then_replayed == ("liar",)


def test_backlog_drain_waits_for_every_job_due_before_the_heal():
    h = History()
    h.submit(1.0, 0, "early", [("ok", False)])
    h.submit(2.0, 1, "delayed", [("ok", False)], delay=30.0)  # due after the heal: excluded
    h.ops.append(
        Op(len(h.ops), 3.0, "nemesis", "invoke", "nemesis", nemesis_value("x", "start", "t"))
    )
    h.ops.append(Op(len(h.ops), 3.1, "nemesis", "ok", "nemesis", nemesis_value("x", "start", "t")))
    h.ops.append(
        Op(len(h.ops), 9.0, "nemesis", "invoke", "nemesis", nemesis_value("x", "stop", "t"))
    )
    h.ops.append(Op(len(h.ops), 10.0, "nemesis", "ok", "nemesis", nemesis_value("x", "stop", "t")))
    jobs = [
        job("early", created_at=T0 + timedelta(seconds=1), finished_at=T0 + timedelta(seconds=14)),
        job(
            "delayed", created_at=T0 + timedelta(seconds=2), finished_at=T0 + timedelta(seconds=60)
        ),
    ]
    (drain,) = backlog_drain(h.ops, jobs, T0)
    assert (drain.fault, drain.target, drain.stopped, drain.jobs) == ("x", "t", 10.0, 1)
    assert drain.seconds == pytest.approx(4.0)
    jobs[0]["finished_at"] = None
    assert backlog_drain(h.ops, jobs, T0)[0].seconds is None


def test_message_view_counts_outbox_rows_produced_twice():
    messages = [
        {"job_id": "a", "attempt": 1},
        {"job_id": "a", "attempt": 1},  # produced again
        {"job_id": "a", "attempt": 2},  # a retry: a new outbox row, not a duplicate
        {"job_id": "b", "attempt": 1},
        {"job_id": "b", "attempt": 1},
        {"job_id": "b", "attempt": 1},
        {"job_id": "other-run", "attempt": 1},
        {"job_id": "other-run", "attempt": 1},
    ]
    view = message_view(messages, ["a", "b"])
    assert (view.messages, view.duplicate_messages, view.jobs_with_duplicates) == (6, 3, 2)
