"""Generators for the string formats of leasework's OpenAPI document that a schema cannot
spell and the api checks at run time (loaded through ``SCHEMATHESIS_HOOKS``, which
tools/conformance.py sets): a cron expression cronsim takes, a time zone zoneinfo has, and a
time in the past (a backfill's bounds). Without them nearly every schema-valid create or
backfill is refused with 422, and schemathesis rightly warns that its valid data never
reaches the api's logic. The refusals themselves are still exercised: the schema-violating
cases, and a generated range that is out of order (half of them)."""

from __future__ import annotations

import ast
import threading
from datetime import UTC, datetime, timedelta

import schemathesis
from hypothesis import strategies as st

# the formats /openapi.json names (leasework/api/openapi_schedules.py): the document is the
# contract, so they are spelt here as it spells them rather than imported from the api's room
CRON_FORMAT = "cron"
ZONE_FORMAT = "iana-time-zone"
PAST_TIME_FORMAT = "past-date-time"

MINUTE = st.sampled_from(["*", "0", "5", "*/5", "*/15", "0,30", "10-20", "59"])
HOUR = st.sampled_from(["*", "0", "3", "*/2", "9-17", "23"])
DAY = st.sampled_from(["*", "1", "15", "28", "*/10"])
MONTH = st.sampled_from(["*", "1", "6", "*/3", "1-6", "12"])
WEEKDAY = st.sampled_from(["*", "0", "1-5", "6", "MON", "SUN"])
SECOND = st.sampled_from(["*", "0", "*/5", "30"])

CRON = st.one_of(
    st.tuples(MINUTE, HOUR, DAY, MONTH, WEEKDAY),
    st.tuples(SECOND, MINUTE, HOUR, DAY, MONTH, WEEKDAY),
).map(" ".join)

ZONES = st.sampled_from(
    ["UTC", "Europe/Berlin", "America/New_York", "Asia/Tokyo", "Australia/Lord_Howe", "Etc/GMT+5"]
)

# a second of a whole year from 2000 to last year, in UTC: two of them make a range in the
# past, in order half the time


def _past_time(year: int, second: int) -> str:
    instant = datetime(year, 1, 1, tzinfo=UTC) + timedelta(seconds=second)
    return instant.strftime("%Y-%m-%dT%H:%M:%SZ")


PAST_TIME = st.builds(
    _past_time,
    st.integers(min_value=2000, max_value=datetime.now(UTC).year - 1),
    st.integers(min_value=0, max_value=365 * 86400 - 1),
)

schemathesis.openapi.format(CRON_FORMAT, CRON)
schemathesis.openapi.format(ZONE_FORMAT, ZONES)
schemathesis.openapi.format(PAST_TIME_FORMAT, PAST_TIME)

# CPython 3.11's ast.parse is not safe in two threads at once ("SystemError: AST constructor
# recursion depth mismatch"): hypothesis parses its strategies' lambdas to describe them, and
# schemathesis's two workers are threads. One parse at a time, in this process only.
_parse, _parsing = ast.parse, threading.Lock()


def _one_parse_at_a_time(*args, **kwargs):  # type: ignore[no-untyped-def]
    with _parsing:
        return _parse(*args, **kwargs)


ast.parse = _one_parse_at_a_time
