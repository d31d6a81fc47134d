"""The operators' operations (leasework/operations.py): the one filter parser, read as each
door spells it, with each door's own messages; and which outcomes write an audit row (the
store is replaced here by fakes that record what was asked of it; the SQL itself is tested
against Postgres in tests/integration/test_pipeline.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from leasework import operations, store
from leasework.errors import FieldError
from leasework.operations import API_BODY, CONSOLE_QUERY, parse_job_filter
from leasework.store import operators
from leasework.store.jobs import JobFilter

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
API_ALLOWED = "unknown field; allowed: finished_after, finished_before, limit, status, type"


def errors(fields, spelling) -> list[tuple[str, str]]:
    return [(e.field, e.message) for e in parse_job_filter(fields, spelling).errors]


# ---------------------------------------------------------------- the api's body


def test_an_empty_body_retries_dead_jobs_a_thousand_at_a_time():
    parsed = parse_job_filter({}, API_BODY)
    assert parsed == operations.ParsedFilter(JobFilter("dead", time_field="finished_at"), 1000, ())


def test_the_api_body_bounds_the_finish_time_and_takes_a_whole_float_as_a_limit():
    body = {
        "status": "cancelled",
        "type": "fail",
        "finished_after": "2026-01-02T03:04:05Z",
        "finished_before": "2026-01-02T05:04:05+02:00",
        "limit": 5.0,
    }
    parsed = parse_job_filter(body, API_BODY)
    assert parsed.errors == ()
    assert parsed.job_filter == JobFilter("cancelled", "fail", T0, T0, "finished_at")
    assert parsed.limit == 5 and isinstance(parsed.limit, int)


def test_every_field_of_a_bad_api_body_is_named_in_order_with_its_message():
    body = {
        "status": "succeeded",
        "type": "x y",
        "finished_after": "yesterday",
        "finished_before": 5,
        "limit": 0,
        "what": 1,
    }
    rfc3339 = "must be RFC 3339 with an offset under 16 hours, e.g. 2026-01-02T03:04:05Z"
    assert errors(body, API_BODY) == [
        ("what", API_ALLOWED),
        # the enum's repr: the api's wording since its first release, kept as it is
        ("status", "must be one of cancelled, dead"),
        ("type", "must be 1-100 letters, digits and _ . : -"),
        ("finished_after", rfc3339),
        ("finished_before", rfc3339),
        ("limit", "must be an integer from 1 to 10000"),
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"status": 5}, "status"),
        ({"status": ""}, "status"),  # JSON's empty string is a value, not a field left out
        ({"type": ""}, "type"),
        ({"type": ["noop"]}, "type"),
        ({"limit": True}, "limit"),
        ({"limit": "5"}, "limit"),  # a number in JSON is a number
        ({"limit": 10_001}, "limit"),
        ({"limit": 2.5}, "limit"),
        ({"finished_after": "2026-01-02T03:04:05+16:00"}, "finished_after"),
        ({"finished_after": "2026-01-02T03:04:05"}, "finished_after"),  # no offset
        ({"since": "2026-01-02T03:04:05Z"}, "since"),  # the console's spelling is not the api's
    ],
)
def test_the_api_body_refuses(body, field):
    assert [f for f, _ in errors(body, API_BODY)] == [field]


def test_the_api_body_must_be_an_object_and_takes_crossed_bounds_as_matching_nothing():
    assert errors([1], API_BODY) == [("(body)", "must be a JSON object of filters")]
    assert errors("x", API_BODY) == [("(body)", "must be a JSON object of filters")]
    crossed = {"finished_after": "2026-01-03T00:00:00Z", "finished_before": "2026-01-02T00:00:00Z"}
    assert errors(crossed, API_BODY) == []  # as it always has: a 200 that retries nothing


# ---------------------------------------------------------------- the console's query string


def test_a_blank_query_string_field_is_left_out_and_other_fields_are_the_pages():
    query = {"status": " ", "type": "", "since": "", "before": "x", "notice": "retried"}
    parsed = parse_job_filter(query, CONSOLE_QUERY)
    assert parsed == operations.ParsedFilter(JobFilter(), operations.BULK_RETRY_LIMIT, ())


def test_the_console_reads_datetime_local_times_as_utc_on_either_time_field():
    query = {"status": "running", "time_field": "finished_at", "since": " 2026-01-02T03:04:05 "}
    parsed = parse_job_filter(query, CONSOLE_QUERY)
    assert parsed.job_filter == JobFilter("running", None, T0, None, "finished_at")


def test_the_console_names_what_it_leaves_out_in_its_own_words():
    query = {
        "status": "stuck",
        "type": "no spaces",
        "time_field": "run_at",
        "since": "soon",
        "until": "2026-01-02T03:00",
    }
    parsed = parse_job_filter(query, CONSOLE_QUERY)
    assert parsed.job_filter == JobFilter(until=datetime(2026, 1, 2, 3, tzinfo=UTC))
    statuses = "scheduled, queued, running, succeeded, failed, dead, cancelled"
    assert [(e.field, e.message) for e in parsed.errors] == [
        ("status", f"must be one of {statuses}"),
        ("type", "must be 1-100 letters, digits and _ . : -"),
        ("time_field", "must be one of created_at, finished_at"),
        ("since", "'soon' is not a time like 2026-01-02T03:04 (UTC)"),
    ]


def test_the_consoles_bounds_must_be_in_order():
    query = {"since": "2026-01-02T04:00", "until": "2026-01-02T03:00"}
    parsed = parse_job_filter(query, CONSOLE_QUERY)
    assert parsed.errors == (FieldError("until", "must be after since"),)
    assert parsed.job_filter.since is not None and parsed.job_filter.until is None


def test_what_filter_fields_writes_the_console_parses_back_and_the_api_selects_the_same():
    page = JobFilter("dead", "fail", T0, T0 + timedelta(hours=1), "finished_at")
    assert parse_job_filter(operations.filter_fields(page), CONSOLE_QUERY).job_filter == page
    body = {
        "status": "dead",
        "type": "fail",
        "finished_after": T0.isoformat(),
        "finished_before": (T0 + timedelta(hours=1)).isoformat(),
    }
    assert parse_job_filter(body, API_BODY).job_filter == page


# ---------------------------------------------------------------- what is audited


class Recorder:
    """Stands in for the store: answers with ``outcome`` and records every audit row."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, outcome=None, retried: int = 0) -> None:
        self.audit: list[tuple] = []
        job = None  # what the operation hands back unread
        monkeypatch.setattr(store, "job_cancel", lambda conn, jid: store.CancelResult(job, outcome))
        monkeypatch.setattr(
            store, "job_retry", lambda conn, jid, topic: store.RetryResult(job, outcome)
        )
        monkeypatch.setattr(store, "jobs_retry_matching", lambda conn, f, **kw: retried)
        monkeypatch.setattr(operators, "audit_add", lambda conn, *row: self.audit.append(row))


JOB_ID = uuid.UUID(int=1)
ME = operations.Actor("ops-token", "console")


@pytest.mark.parametrize(
    ("outcome", "audited"),
    [
        (store.CancelOutcome.CANCELLED, True),
        (store.CancelOutcome.REQUESTED, True),
        (store.CancelOutcome.FINISHED, False),
        (store.CancelOutcome.MISSING, False),
    ],
)
def test_a_cancel_is_audited_only_when_it_changed_the_job(monkeypatch, outcome, audited):
    recorder = Recorder(monkeypatch, outcome)
    assert operations.cancel(None, JOB_ID, ME).outcome == outcome  # type: ignore[arg-type]
    expected = [("ops-token", "cancel", str(JOB_ID), {"via": "console", "outcome": outcome})]
    assert recorder.audit == (expected if audited else [])


@pytest.mark.parametrize(
    ("outcome", "audited"),
    [
        (store.RetryOutcome.RETRIED, True),
        (store.RetryOutcome.NOT_RETRYABLE, False),
        (store.RetryOutcome.MISSING, False),
    ],
)
def test_a_retry_is_audited_only_when_it_requeued_the_job(monkeypatch, outcome, audited):
    recorder = Recorder(monkeypatch, outcome)
    api = operations.Actor("ci", "api")
    assert operations.retry(None, JOB_ID, api, topic="t").outcome == outcome  # type: ignore[arg-type]
    assert recorder.audit == (
        [("ci", "retry", str(JOB_ID), {"via": "api", "outcome": "retried"})] if audited else []
    )


def test_a_bulk_retry_is_audited_with_its_filter_only_when_it_retried_a_job(monkeypatch):
    bulk = operations.bulk_retry(JobFilter("dead", "fail", T0, None, "finished_at"), 50)
    recorder = Recorder(monkeypatch, retried=0)
    assert operations.retry_matching(None, bulk, ME, topic="t").retried == 0  # type: ignore[arg-type]
    assert recorder.audit == []
    recorder = Recorder(monkeypatch, retried=3)
    assert operations.retry_matching(None, bulk, ME, topic="t").retried == 3  # type: ignore[arg-type]
    fields = {
        "status": "dead",
        "type": "fail",
        "time_field": "finished_at",
        "since": T0.isoformat(),
    }
    target = f"status=dead type=fail finished_at>={T0.isoformat()}"
    detail = {"via": "console", "filter": fields, "limit": 50, "retried": 3}
    assert recorder.audit == [("ops-token", "retry-many", target, detail)]
