"""Declaring job types: payload typing, per-type policy, loading apps by name (pure)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

import leasework
from leasework.app import load_app
from leasework.errors import AppError, AppLoadError


class Receipt(BaseModel):
    order_id: int
    email: str


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Named(TypedDict):
    name: str


app = leasework.App("test")


@app.job("model", max_attempts=3, timeout=7.5, backoff=(2, 60), permanent=(KeyError,))
async def with_model(ctx: leasework.JobContext, payload: Receipt) -> dict:
    """Has a pydantic payload."""
    return {"sent_to": payload.email}


@app.job("dataclass")
async def with_dataclass(ctx: leasework.JobContext, payload: Point) -> int:
    return payload.x + payload.y


@app.job("typeddict")
async def with_typeddict(ctx: leasework.JobContext, payload: Named) -> str:
    return payload["name"]


@app.job("raw")
async def untyped(ctx, payload):
    return payload


@app.job()
async def no_payload(ctx: leasework.JobContext) -> None:
    return None


@pytest.mark.parametrize(
    ("name", "good", "bad", "field"),
    [
        ("model", {"order_id": 1, "email": "a@b"}, {"order_id": "x"}, "payload.order_id"),
        ("dataclass", {"x": 1, "y": 2}, {"x": 1}, "payload.y"),
        ("typeddict", {"name": "n"}, {"name": 5}, "payload.name"),
    ],
)
def test_payloads_are_typed_by_the_annotation(name, good, bad, field):
    job_type = app.get(name)
    assert job_type.payload_errors(good) == []
    errors = job_type.payload_errors(bad)
    assert errors and errors[0].field == field
    assert job_type.payload_schema()["type"] == "object"


def test_decoding_gives_the_handler_the_declared_type():
    assert app.get("model").decode({"order_id": 1, "email": "a@b"}) == Receipt(
        order_id=1, email="a@b"
    )
    assert app.get("dataclass").decode({"x": 1, "y": 2}) == Point(1, 2)


def test_untyped_handlers_take_the_raw_json_and_payloadless_ones_none():
    raw = app.get("raw")
    assert raw.adapter is None and raw.payload_errors([1, "anything"]) == []
    assert raw.payload_schema() == {}
    bare = app.get("no_payload")
    assert bare.takes_payload is False and bare.name == "no_payload"


def test_policy_sits_on_the_decorator():
    job_type = app.get("model")
    assert job_type.max_attempts == 3
    assert job_type.timeout_seconds == 8  # whole seconds, rounded up
    assert job_type.backoff == (2.0, 60.0)
    assert job_type.is_permanent(KeyError("k")) and job_type.is_permanent(leasework.Permanent())
    assert not job_type.is_permanent(ValueError())
    assert job_type.is_permanent(ExceptionGroup("g", [KeyError(), leasework.Permanent()]))
    assert not job_type.is_permanent(ExceptionGroup("g", [KeyError(), ValueError()]))
    assert job_type.description == "Has a pydantic payload."


def test_a_model_instance_becomes_plain_json_for_the_store():
    assert app.get("model").to_json(Receipt(order_id=5, email="e@x")) == {
        "order_id": 5,
        "email": "e@x",
    }
    with pytest.raises(ValueError, match="no JSON form"):
        app.get("raw").to_json({"when": object()})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to 100"),
        ({"timeout": -1}, "timeout must be a positive number"),
        ({"timeout": 86_401}, "at most 86400"),
        ({"backoff": (10, 5)}, "cap 5s is below its base 10s"),
        ({"backoff": 3}, r"backoff is \(base, cap\)"),
        ({"permanent": ("KeyError",)}, "permanent= takes exception classes"),
    ],
)
def test_invalid_policy_is_refused_at_declaration(kwargs, message):
    other = leasework.App()
    with pytest.raises(AppError, match=message):

        @other.job("x", **kwargs)
        async def handler(ctx):
            return None


def test_invalid_declarations_are_refused():
    other = leasework.App()
    with pytest.raises(AppError, match="must be a function"):
        other.job("not_a_function")(5)  # type: ignore[arg-type]
    assert other.job("plain")(lambda ctx: None).lane == "thread"  # a plain def is welcome
    with pytest.raises(AppError, match="invalid"):

        @other.job("has space")
        async def spaced(ctx):
            return None

    with pytest.raises(AppError, match=r"must take \(ctx\) or \(ctx, payload\)"):

        @other.job("three")
        async def three(ctx, payload, extra):
            return None

    @other.job("once")
    async def once(ctx):
        return None

    with pytest.raises(AppError, match="defined twice"):

        @other.job("once")
        async def twice(ctx):
            return None


def test_a_payload_type_defined_locally_can_be_given_explicitly():
    class Local(BaseModel):
        n: int

    other = leasework.App()

    @other.job("local", payload=Local)
    async def local(ctx: Any, payload: Local) -> int:
        return payload.n

    assert other.get("local").payload_errors({"n": "x"})[0].field == "payload.n"


def test_load_app_by_name_and_merge_several():
    loaded = load_app("tests.unit.apps.good:app,leasework.demo:app")
    assert "good.hello" in loaded and "noop" in loaded
    assert load_app("tests.unit.apps.good").names == ["good.hello"]  # :app by default


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "LEASEWORK_APP is empty"),
        ("no_such_module_xyz:app", "cannot import 'no_such_module_xyz': ModuleNotFoundError"),
        ("tests.unit.apps.broken:app", "RuntimeError: this module is broken on purpose"),
        ("tests.unit.apps.good:missing", "has no attribute 'missing'"),
        ("tests.unit.apps.good:not_an_app", "has int at 'not_an_app'"),
        ("tests.unit.apps.good:app,tests.unit.apps.good:other", "defined twice"),
    ],
)
def test_an_app_that_cannot_be_loaded_says_why_and_names_the_variable(spec, message):
    with pytest.raises(AppLoadError, match=message) as caught:
        load_app(spec)
    assert "LEASEWORK_APP" in str(caught.value)
