"""The console's recurring schedules in a real browser (Debian's headless Chromium driven by
Playwright, against the real api on the real stack): create one through the form (a refused
field shown beside it, nothing lost, nothing written), the list with its next fire time and
last tick, trigger now and follow to the job that names its schedule and tick, pause and resume
(the flag and the audit rows, via console), backfill a past range once (a second backfill of
it fires nothing; a range too large is refused with nothing written), delete; a read-only
token sees no action and its POSTs are refused. Every page is screenshot to reports/ui/."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
import pytest
from playwright.sync_api import BrowserContext, Page
from psycopg.rows import dict_row

from leasework.operations import Actor
from leasework.schedules import Definition
from leasework.schedules import operations as schedule_ops
from tests.integration import test_console
from tests.integration.conftest import API_URL, DIRECT_DSN
from tests.integration.test_console import login, shot

browser = test_console.browser  # its fixture (Debian's Chromium), for this module's tests too

UI = f"{API_URL}/ui"
# a calendar that fires every day of January at 12:00 UTC only: nothing fires while a test
# runs (on any other day), and 1970-2025 holds 1,736 ticks, more than one backfill fires
JANUARY_NOONS = "0 12 * 1 *"


def name_of(prefix: str) -> str:
    return f"t-ui-{prefix}-{uuid.uuid4().hex[:10]}"


def when(value: datetime) -> str:
    """A time as the console prints it."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def stored(db, name: str) -> dict | None:
    return db.execute("SELECT * FROM schedules WHERE name = %s", (name,)).fetchone()


def audit_rows(db, name: str) -> list[dict]:
    return db.execute(
        "SELECT actor, action, detail FROM audit_log WHERE target = %s ORDER BY id",
        (f"schedule:{name}",),
    ).fetchall()


def jobs_of(db, name: str) -> list[dict]:
    return db.execute(
        "SELECT id, tick_at, payload FROM jobs WHERE schedule = %s ORDER BY tick_at", (name,)
    ).fetchall()


def tick_count(db, name: str) -> int:
    return db.execute(
        "SELECT count(*) AS n FROM schedule_ticks WHERE schedule = %s", (name,)
    ).fetchone()["n"]


def remove(name: str) -> None:
    with psycopg.connect(DIRECT_DSN) as conn:
        conn.execute("DELETE FROM schedules WHERE name = %s", (name,))


@pytest.fixture
def made() -> Iterator[list[str]]:
    """The names of the schedules a test makes (through the console or not): deleted after."""
    names: list[str] = []
    yield names
    for name in names:
        remove(name)


@pytest.fixture
def make_schedule(made: list[str]) -> Callable[..., str]:
    """A schedule stored as the api would (source api), deleted after the test."""

    def make(prefix: str, cron: str = JANUARY_NOONS, job_type: str = "noop") -> str:
        name = name_of(prefix)
        definition = Definition(name=name, type=job_type, cron=cron)
        with psycopg.connect(DIRECT_DSN, row_factory=dict_row) as conn:
            created = schedule_ops.create(
                conn, definition, Actor("tests/integration", "tests"), datetime.now(UTC)
            )
        assert created is not None
        made.append(name)
        return name

    return make


@dataclass(frozen=True)
class Operator:
    """A browser logged in with a token of scopes read and cancel, on a schedule's page."""

    name: str  # the token's: the audit log's actor
    schedule: str
    context: BrowserContext
    page: Page


@pytest.fixture
def operator_on(browser, make_token, make_schedule) -> Iterator[Callable[..., Operator]]:
    """Opens a new schedule's page as an operator (closed after the test)."""
    opened: list[BrowserContext] = []

    def open_(prefix: str, job_type: str = "noop") -> Operator:
        name, token = make_token("read", "cancel")
        schedule = make_schedule(prefix, job_type=job_type)
        context, page = login(browser, token, f"/ui/schedules/{schedule}")
        opened.append(context)
        return Operator(name, schedule, context, page)

    yield open_
    for context in opened:
        context.close()


def click_to(page: Page, selector: str) -> int:
    """Click what navigates, wait for the page it leads to; its HTTP status."""
    with page.expect_navigation() as navigation:
        page.click(selector)
    response = navigation.value
    return response.status if response is not None else 0


def field_errors(page: Page, field: str) -> str:
    return " ".join(page.locator(f"#field-{field} .field-error").all_inner_texts())


def csrf_of(page: Page) -> str:
    return page.input_value("input[name=csrf]")


def schedule_row(page: Page, name: str) -> str:
    return page.locator(f"table.schedules tr:has(a:text-is('{name}'))").inner_text()


def test_create_through_the_form_a_refused_field_then_created_listed_and_audited(
    browser, make_token, db, made
):
    operator, token = make_token("read", "cancel")
    name, mark = name_of("create"), uuid.uuid4().hex
    made.append(name)
    context, page = login(browser, token, "/ui/schedules")
    assert page.locator("#create").count() == 1

    page.fill("#f-name", name)
    page.select_option("#f-type", "echo")
    page.fill("#f-cron", "30 2 1 13 *")  # no 13th month
    page.fill("#f-timezone", "Europe/Berlin")
    page.fill("#f-payload", f'{{"mark": "{mark}"}}')
    page.select_option("#f-overlap", "skip")
    page.select_option("#f-catch_up", "all")
    page.fill("#f-catch_up_limit", "3")
    page.fill("#f-grace_seconds", "30")
    assert click_to(page, "#create-schedule") == 400
    assert "is not valid" in field_errors(page, "cron")
    assert field_errors(page, "name") == "" and field_errors(page, "payload") == ""
    # nothing lost from the form, nothing written
    assert page.input_value("#f-name") == name
    assert page.input_value("#f-cron") == "30 2 1 13 *"
    assert page.input_value("#f-timezone") == "Europe/Berlin"
    assert mark in page.input_value("#f-payload")
    assert page.input_value("#f-type") == "echo"
    assert page.input_value("#f-overlap") == "skip" and page.input_value("#f-catch_up") == "all"
    assert page.input_value("#f-catch_up_limit") == "3"
    assert page.input_value("#f-grace_seconds") == "30"
    assert stored(db, name) is None
    shot(page, "schedule-create-refused")

    # a payload that is not JSON and a limit out of range: each named beside its field
    page.fill("#f-payload", "{mark")
    page.fill("#f-catch_up_limit", "0")
    assert click_to(page, "#create-schedule") == 400
    assert "is not JSON" in field_errors(page, "payload")
    assert "from 1 to 1000" in field_errors(page, "catch_up_limit")
    assert page.input_value("#f-payload") == "{mark"

    page.fill("#f-cron", "30 2 1 1 *")  # once a year, 02:30 on 1 January in Berlin
    page.fill("#f-payload", f'{{"mark": "{mark}"}}')
    page.fill("#f-catch_up_limit", "3")
    assert click_to(page, "#create-schedule") == 200  # asks first
    question = page.inner_text("section.confirm")
    assert f"Create schedule {name}" in question and "It first fires at" in question
    assert stored(db, name) is None
    shot(page, "schedule-create-confirm")
    click_to(page, "#edit")  # change it: the form again, as it was
    assert page.input_value("#f-name") == name and mark in page.input_value("#f-payload")
    click_to(page, "#create-schedule")
    click_to(page, "#confirm")
    assert page.url == f"{UI}/schedules/{name}?notice=created"
    assert "Created." in page.inner_text("p.notice")
    row = stored(db, name)
    assert row is not None
    assert (row["type"], row["cron"], row["timezone"]) == ("echo", "30 2 1 1 *", "Europe/Berlin")
    assert (row["overlap"], row["catch_up"], row["catch_up_limit"]) == ("skip", "all", 3)
    assert row["grace_seconds"] == 30 and row["payload"] == {"mark": mark}
    assert (row["source"], row["declared_by"], row["paused"]) == ("api", operator, False)
    assert when(row["next_fire_at"]) in page.inner_text("dl.facts")
    assert [(r["actor"], r["action"], r["detail"]["via"]) for r in audit_rows(db, name)] == [
        (operator, "schedule-create", "console")
    ]
    shot(page, "schedule-created")

    # listed, with its next fire time and no tick yet
    click_to(page, "nav >> text=Schedules")
    listed = schedule_row(page, name)
    assert "echo" in listed and "30 2 1 1 * Europe/Berlin" in listed and "active" in listed
    assert when(row["next_fire_at"]) in listed and "no tick yet" in listed
    assert "0 fired · 0 skipped" in listed
    shot(page, "schedules")

    # the name is taken now: refused beside the name, the first one untouched
    page.fill("#f-name", name)
    page.fill("#f-cron", "0 0 * * *")
    click_to(page, "#create-schedule")
    assert click_to(page, "#confirm") == 400
    assert "already" in field_errors(page, "name")
    assert stored(db, name)["cron"] == "30 2 1 1 *"
    assert len(audit_rows(db, name)) == 1
    context.close()


def test_the_list_pages_by_name(browser, make_token, make_schedule):
    _, token = make_token("read")
    first, second = sorted([make_schedule("page"), make_schedule("page")])
    context, page = login(browser, token, f"/ui/schedules?after={first}")
    names = page.locator("table.schedules tbody td:first-child").all_inner_texts()
    assert second in names and first not in names
    assert page.locator("text=« first page").count() == 1
    page.goto(f"{UI}/schedules?after=not%20a%20name")
    assert "not a schedule name" in page.inner_text("main")
    context.close()


def test_trigger_now_then_the_job_shows_its_schedule_and_tick(db, operator_on):
    on = operator_on("trigger", job_type="echo")
    name, page = on.schedule, on.page
    assert "No tick yet." in page.inner_text("table.ticks")
    click_to(page, "a:text-is('Trigger now…')")
    assert f"Run schedule {name} once now" in page.inner_text("section.confirm")
    assert jobs_of(db, name) == []
    click_to(page, "#confirm")
    (job,) = jobs_of(db, name)
    assert page.inner_text("#triggered-job") == str(job["id"])
    ticks = page.locator("table.ticks tbody tr")
    assert ticks.count() == 1
    assert "trigger" in ticks.first.inner_text() and str(job["id"]) in ticks.first.inner_text()
    assert "fired →" in ticks.first.inner_text()
    shot(page, "schedule-triggered")

    click_to(page, "#triggered-job")
    assert page.url == f"{UI}/jobs/{job['id']}"
    facts = page.inner_text("dl.facts")
    assert re.search(rf"Schedule\s+{re.escape(name)}", facts)
    assert re.search(rf"Tick\s+{re.escape(when(job['tick_at']))}", facts)
    shot(page, "job-from-schedule")
    click_to(page, f"dl.facts a:text-is('{name}')")
    assert page.url == f"{UI}/schedules/{name}"

    click_to(page, "nav >> text=Schedules")
    listed = schedule_row(page, name)
    assert when(job["tick_at"]) in listed and "fired →" in listed and "1 fired" in listed
    link = page.locator(f"table.schedules tr:has(a:text-is('{name}')) a[href*='/ui/jobs/']")
    assert link.get_attribute("href") == f"/ui/jobs/{job['id']}"
    (row,) = [r for r in audit_rows(db, name) if r["action"] == "schedule-trigger"]
    assert row["detail"]["via"] == "console" and row["detail"]["job_id"] == str(job["id"])


def test_pause_and_resume_set_the_flag_and_write_an_audit_row_each(db, operator_on):
    on = operator_on("pause")
    name, page = on.schedule, on.page
    assert page.locator("a:text-is('Resume…')").count() == 0
    click_to(page, "a:text-is('Pause…')")
    assert f"Pause schedule {name}" in page.inner_text("section.confirm")
    assert stored(db, name)["paused"] is False  # asking changed nothing
    click_to(page, "#confirm")
    assert "Paused: no tick fires" in page.inner_text("p.notice")
    assert stored(db, name)["paused"] is True
    assert page.locator("a:text-is('Pause…')").count() == 0
    shot(page, "schedule-paused")

    # a pause of a paused schedule changes nothing and writes no row
    again = on.context.request.post(f"{UI}/schedules/{name}/pause", form={"csrf": csrf_of(page)})
    assert again.ok and "Not changed: it was paused already." in again.text()

    click_to(page, "a:text-is('Resume…')")
    click_to(page, "#confirm")
    assert "Resumed from its first tick after now" in page.inner_text("p.notice")
    row = stored(db, name)
    assert row["paused"] is False and row["next_fire_at"] > datetime.now(UTC)
    rows = audit_rows(db, name)
    assert [r["action"] for r in rows] == ["schedule-create", "schedule-pause", "schedule-resume"]
    assert all(r["actor"] == on.name and r["detail"]["via"] == "console" for r in rows[1:])


def test_backfill_a_past_range_once_and_refuse_one_too_large_writing_nothing(db, operator_on):
    on = operator_on("backfill")
    name, page = on.schedule, on.page

    def backfill(since: str, until: str) -> int:
        page.fill("#f-from", since)
        page.fill("#f-until", until)
        return click_to(page, "#backfill-submit")

    assert backfill("2025-01-01T00:00:00", "2025-01-03T23:59:59") == 200
    assert "The range holds 3 ticks" in page.inner_text("section.confirm")
    assert jobs_of(db, name) == []  # asking wrote nothing
    shot(page, "schedule-backfill-confirm")
    click_to(page, "#confirm")
    assert "Backfilled: 3 ticks fired now; 0 had fired before" in page.inner_text("main")
    ticks = [t["tick_at"] for t in jobs_of(db, name)]
    assert ticks == [datetime(2025, 1, d, 12, tzinfo=UTC) for d in (1, 2, 3)]
    shown = page.locator("table.ticks tbody tr").all_inner_texts()
    assert len(shown) == 3 and all("backfill" in t and "fired →" in t for t in shown)
    shot(page, "schedule-backfilled")

    # the same range again: every tick fired before, so none fires now
    backfill("2025-01-01T00:00:00", "2025-01-03T23:59:59")
    click_to(page, "#confirm")
    assert "Backfilled: 0 ticks fired now; 3 had fired before" in page.inner_text("main")
    assert len(jobs_of(db, name)) == 3
    backfills = [r for r in audit_rows(db, name) if r["action"] == "schedule-backfill"]
    assert len(backfills) == 1 and backfills[0]["detail"]["via"] == "console"
    assert backfills[0]["detail"]["fired"] == 3

    # more ticks than one backfill fires: refused on the schedule's page, nothing written
    assert backfill("1970-01-01T00:00:00", "2025-12-31T00:00:00") == 400
    error = page.inner_text("#backfill-error")
    assert "more than 1000 ticks" in error and "nothing was written" in error
    assert page.input_value("#f-from").startswith("1970-01-01T00:00")  # kept as typed
    shot(page, "schedule-backfill-too-large")
    # the same range posted past the confirmation page is refused too
    forged = on.context.request.post(
        f"{UI}/schedules/{name}/backfill",
        form={
            "csrf": csrf_of(page),
            "from": "1970-01-01T00:00:00Z",
            "until": "2025-12-31T00:00:00Z",
        },
    )
    assert forged.status == 400 and "more than 1000 ticks" in forged.text()
    # a range that is not past, and one out of order: named beside their fields
    assert backfill("2025-01-01T00:00:00", "2099-01-01T00:00:00") == 400
    assert "must not be in the future" in field_errors(page, "until")
    assert backfill("2025-02-01T00:00:00", "2025-01-01T00:00:00") == 400
    assert "must not be before from" in field_errors(page, "until")
    assert len(jobs_of(db, name)) == 3
    assert tick_count(db, name) == 3
    assert len([r for r in audit_rows(db, name) if r["action"] == "schedule-backfill"]) == 1


def test_delete_removes_the_schedule_and_its_ticks_and_keeps_its_jobs(db, operator_on):
    on = operator_on("delete")
    name, page = on.schedule, on.page
    click_to(page, "a:text-is('Trigger now…')")
    click_to(page, "#confirm")
    (job,) = jobs_of(db, name)
    click_to(page, "a:text-is('Delete…')")
    assert f"Delete schedule {name}" in page.inner_text("section.confirm")
    assert stored(db, name) is not None
    click_to(page, "#confirm")
    assert page.url.startswith(f"{UI}/schedules?")
    assert f"Deleted schedule {name}" in page.inner_text("p.notice")
    assert page.locator(f"table.schedules a:text-is('{name}')").count() == 0
    assert stored(db, name) is None
    assert tick_count(db, name) == 0 and [j["id"] for j in jobs_of(db, name)] == [job["id"]]
    (row,) = [r for r in audit_rows(db, name) if r["action"] == "schedule-delete"]
    assert row["actor"] == on.name and row["detail"]["via"] == "console"
    page.goto(f"{UI}/schedules/{name}")
    assert "No such schedule" in page.inner_text("main")


def read_only_refusals(context: BrowserContext, csrf: str, name: str, made: list[str]) -> list[int]:
    """What a read-only session's POSTs of every change are answered (with its own valid
    CSRF token, as its pages' forms would send it)."""
    fields = {"name": name_of("forged"), "type": "noop", "cron": JANUARY_NOONS}
    made.append(fields["name"])
    statuses = [
        context.request.post(f"{UI}/schedules", form={"csrf": csrf, **fields, "confirmed": "yes"})
    ]
    for action in ("pause", "resume", "trigger", "delete"):
        statuses.append(
            context.request.post(f"{UI}/schedules/{name}/{action}", form={"csrf": csrf})
        )
    statuses.append(
        context.request.post(
            f"{UI}/schedules/{name}/backfill",
            form={"csrf": csrf, "from": "2025-01-01T00:00:00", "until": "2025-01-02T00:00:00"},
        )
    )
    texts = [s.text() for s in statuses]
    assert all("needs &#39;cancel&#39;" in t for t in texts), texts
    return [s.status for s in statuses]


def test_a_read_only_token_sees_no_action_and_its_posts_are_refused(
    browser, make_token, db, made, make_schedule
):
    _, reader_token = make_token("read")
    _, operator_token = make_token("read", "cancel")
    name = make_schedule("readonly")
    path = f"/ui/schedules/{name}"
    actions = ("a:text-is('Pause…')", "a:text-is('Trigger now…')", "a:text-is('Delete…')")

    operator, page = login(browser, operator_token, path)  # what the reader would miss
    assert all(page.locator(a).count() == 1 for a in actions)
    assert page.locator("#backfill").count() == 1
    operator.close()

    reader, page = login(browser, reader_token, path)
    assert page.url == f"{API_URL}{path}"
    assert all(page.locator(a).count() == 0 for a in actions)
    assert page.locator("#backfill").count() == 0
    shot(page, "schedule-read-only")
    click_to(page, "nav >> text=Schedules")
    assert name in page.inner_text("table.schedules")
    assert page.locator("#create").count() == 0
    assert reader.request.get(f"{UI}/schedules/{name}/pause").status == 403
    assert read_only_refusals(reader, csrf_of(page), name, made) == [403] * 6
    assert stored(db, made[-1]) is None  # the forged create wrote nothing
    row = stored(db, name)
    assert row is not None and row["paused"] is False
    assert jobs_of(db, name) == []
    assert [r["action"] for r in audit_rows(db, name)] == ["schedule-create"]
    reader.close()
