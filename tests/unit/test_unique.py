"""Unique jobs, the pure parts: the Unique record and its spec, the checks every door makes
(the spec, the payload, the payload model), what a request hands the insert, the SQL's copy
of the state bits, and the id enqueue returns."""

import pathlib
import pickle
import re
import uuid
from datetime import timedelta
from typing import Any

import pydantic
import pytest

from leasework import App, AppError, Enqueued, JobContext, Status, Unique, UniqueError
from leasework.api.validation import job_request
from leasework.store import Inserted
from leasework.submission import Defaults, JobRequest, insert_row, request_errors
from leasework.unique import STATE_BITS, UNFINISHED, mask_of, payload_errors, spec_errors, states_of

ROOT = pathlib.Path(__file__).resolve().parents[2]
MIGRATION = (ROOT / "leasework" / "migrations" / "0007_unique_jobs.sql").read_text()


class Order(pydantic.BaseModel):
    customer_id: int
    note: str = ""


def app_with(unique: Unique | None) -> App:
    app = App()

    @app.job("charge", unique=unique)
    async def charge(ctx: JobContext, payload: Order) -> None:
        return None

    @app.job("anything")
    async def anything(ctx: JobContext, payload: Any) -> None:
        return None

    return app


# ---------------------------------------------------------------- the record


def test_a_unique_defaults_to_the_unfinished_states_and_has_a_spec():
    unique = Unique(fields=("customer_id",), period=timedelta(hours=1))
    assert unique.states == UNFINISHED
    assert unique.spec() == {
        "fields": ["customer_id"],
        "period_seconds": 3600,
        "states": ["scheduled", "queued", "running", "failed"],
    }
    assert Unique.from_spec(unique.spec()) == unique


def test_a_unique_takes_a_lone_field_name_and_state_names():
    unique = Unique(fields="customer_id", states={*UNFINISHED, "succeeded"})
    assert unique.fields == ("customer_id",)
    assert Status.SUCCEEDED in unique.states


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"states": {"queued", "running"}}, "leaves out scheduled, failed"),
        ({"states": {"finished"}}, "give job states"),
        ({"period": timedelta(seconds=1.5)}, "whole number of seconds"),
        ({"period": timedelta(days=400)}, "366 days"),
        ({"period": 3600}, "must be a timedelta"),
        ({"fields": ("a", "a")}, "distinct"),
        ({"fields": ("",)}, "1-200 characters"),
    ],
)
def test_a_unique_that_cannot_be_kept_says_what_to_change(kwargs, says):
    with pytest.raises(UniqueError, match=says):
        Unique(**kwargs)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("customer_id", "unique"),
        ({}, "unique.fields"),
        ({"fields": "customer_id"}, "unique.fields"),
        ({"fields": [], "period_seconds": 0}, "unique.period_seconds"),
        ({"fields": [], "period_seconds": True}, "unique.period_seconds"),
        ({"fields": [], "states": ["queued"]}, "unique.states"),
        ({"fields": [], "colour": "red"}, "unique.colour"),
    ],
)
def test_spec_errors_name_the_field(spec, field):
    assert field in {e.field for e in spec_errors(spec)}


def test_a_spec_of_the_type_alone_is_fine():
    assert spec_errors({"fields": []}) == []
    assert spec_errors({"fields": ["a"], "period_seconds": 60.0, "states": list(UNFINISHED)}) == []


# ---------------------------------------------------------------- payloads and models


def test_a_field_the_payload_lacks_is_an_error():
    unique = Unique(fields=("customer_id",))
    assert payload_errors(unique, {"customer_id": 3}) == []
    assert [e.field for e in payload_errors(unique, {"note": "x"})] == ["payload.customer_id"]
    assert [e.field for e in payload_errors(unique, [1, 2])] == ["payload"]
    assert payload_errors(Unique(), "anything") == []  # the type alone needs no field


def test_a_field_the_payload_model_lacks_is_an_error():
    errors = payload_errors(Unique(fields=("customer",)), {"customer": 1}, ["customer_id", "note"])
    assert [e.field for e in errors] == ["unique.fields"]
    assert "customer_id, note" in errors[0].message


def test_a_type_declaring_a_field_its_model_lacks_is_refused_at_declaration():
    with pytest.raises(AppError, match="'customer' not a field of the payload"):
        app_with(Unique(fields=("customer",)))
    with pytest.raises(AppError, match="takes a leasework.Unique"):
        app_with({"fields": ["customer_id"]})  # type: ignore[arg-type]


def test_the_types_uniqueness_is_registered_for_the_doors_that_do_not_load_the_app():
    rows = {r["name"]: r for r in app_with(Unique(fields=("customer_id",))).registry_rows()}
    assert rows["charge"]["unique_policy"]["fields"] == ["customer_id"]
    assert rows["anything"]["unique_policy"] is None


def test_a_request_asks_its_own_uniqueness_else_its_types():
    app = app_with(Unique(fields=("customer_id",)))
    declared = insert_row(JobRequest("charge", {"customer_id": 1}), app, Defaults())
    assert declared["default_unique"]["fields"] == ["customer_id"] and "unique" not in declared
    asked = JobRequest("anything", {"k": 1}, unique=Unique(fields=("k",)))
    row = insert_row(asked, app, Defaults())
    assert row["unique"]["fields"] == ["k"] and "default_unique" not in row
    assert "unique" not in insert_row(JobRequest("anything", {}), app, Defaults())


def test_request_errors_check_the_declared_and_the_asked_uniqueness():
    app = app_with(Unique(fields=("customer_id",), period=timedelta(days=1)))
    # the model makes customer_id required anyway; a field outside the model is refused too
    asked = JobRequest("charge", {"customer_id": 1}, unique=Unique(fields=("nope",)))
    assert "unique.fields" in {e.field for e in request_errors(asked, app)}
    missing = JobRequest("anything", {"j": 1}, unique=Unique(fields=("k",)))
    assert [e.field for e in request_errors(missing, app)] == ["payload.k"]


def test_the_http_body_takes_unique():
    app = app_with(None)
    body = {"type": "anything", "payload": {"k": 1}, "unique": {"fields": ["k"]}}
    parsed = job_request(body, app)
    assert isinstance(parsed, JobRequest) and parsed.unique == Unique(fields=("k",))
    bad = job_request({**body, "unique": {"fields": ["k"], "states": ["queued"]}}, app)
    assert isinstance(bad, list) and bad[0].field == "unique.states"
    assert "leaves out scheduled, running, failed" in bad[0].message
    lacking = job_request({**body, "payload": {}}, app)
    assert isinstance(lacking, list) and lacking[0].field == "payload.k"


# ---------------------------------------------------------------- the SQL's copy, the result


def test_the_state_bits_are_the_sqls():
    sql = re.search(r"CASE status (.*?) ELSE 0 END", MIGRATION, re.S).group(1)
    bits = {Status(name): int(bit) for name, bit in re.findall(r"WHEN '(\w+)' THEN (\d+)", sql)}
    assert bits == STATE_BITS
    unfinished = int(re.search(r"SELECT \((\d+) \| coalesce", MIGRATION).group(1))
    assert unfinished == mask_of(UNFINISHED)
    assert states_of(mask_of(UNFINISHED | {Status.DEAD})) == [
        Status.SCHEDULED,
        Status.QUEUED,
        Status.RUNNING,
        Status.FAILED,
        Status.DEAD,
    ]


def test_the_sql_door_refuses_the_same_states_and_periods():
    assert "31622400" in MIGRATION  # 366 days, as MAX_PERIOD_SECONDS
    assert "ARRAY['scheduled', 'queued', 'running', 'failed']" in MIGRATION


def test_enqueued_is_the_plain_id_and_says_what_became_of_it():
    job_id = uuid.uuid4()
    inserted = Inserted(1, job_id, Status.QUEUED, None, None, 5, 300, False, False, True)  # type: ignore[arg-type]
    result = Enqueued.of(inserted)
    assert result == job_id and hash(result) == hash(job_id) and str(result) == str(job_id)
    assert result.duplicate and not result.replay and type(result.id) is uuid.UUID
    assert repr(result) == f"Enqueued('{job_id}', duplicate=True)"
    copied = pickle.loads(pickle.dumps(result))
    assert copied == job_id and copied.duplicate
