"""The operator console at /ui in a real browser: Debian's headless Chromium driven by
Playwright, against the real api on the real stack. Tokens are made here through the store;
jobs are enqueued through the application API. Every page is screenshot to reports/ui/."""

from __future__ import annotations

import secrets
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode

import psycopg
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

import leasework
from leasework.demo import app as demo_app
from leasework.store import operators
from tests.integration.conftest import API_URL, DIRECT_DSN, delete_jobs, wait_for

CHROMIUM = "/usr/bin/chromium"  # Debian's package (devstack provisions it); no download
SHOTS = Path(__file__).resolve().parents[2] / "reports" / "ui"
UI = f"{API_URL}/ui"


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


@pytest.fixture(scope="module")
def browser(stack) -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `python -m devstack provision` (apt chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


def enqueue(job_type: str, payload: dict, **options) -> str:
    with psycopg.connect(DIRECT_DSN) as conn:  # committed when the block ends
        return str(leasework.enqueue(conn, job_type, payload, app=demo_app, **options))


def status_of(db, job_id: str) -> str:
    return db.execute("SELECT status FROM jobs WHERE id = %s", (job_id,)).fetchone()["status"]


def wait_db_status(db, job_id: str, status: str, timeout: float = 60.0) -> None:
    wait_for(lambda: status_of(db, job_id) == status, timeout, f"job {job_id} {status}")


def dead_job(db) -> str:
    """A ``fail`` job that dies on its only attempt; retried, its attempt 2 succeeds."""
    job_id = enqueue("fail", {"times": 1}, max_attempts=1)
    wait_db_status(db, job_id, "dead")
    return job_id


def login(browser: Browser, token: str, target: str = "/ui") -> tuple[BrowserContext, Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(f"{API_URL}{target}")
    assert "/ui/login" in page.url  # not logged in: every page sends you to the login
    page.fill("#token", token)
    with page.expect_navigation():
        page.click("button[type=submit]")
    return context, page


def reload_until(page: Page, text: str, timeout: float = 60.0) -> None:
    def seen() -> bool:
        page.reload()
        return text in page.inner_text("main")

    wait_for(seen, timeout, f"{text!r} on {page.url}", interval=0.5)


def test_login_find_a_dead_job_retry_it_and_see_it_succeed(browser, make_token, db):
    name, token = make_token("admin")  # an operator: the audit log is admin's, as in the API
    job_id = dead_job(db)

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(UI)
    page.fill("#token", "lw_notatokn_" + "x" * 43)
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert "Not a valid token" in page.inner_text("main")
    shot(page, "login")

    page.fill("#token", token)
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert page.url.rstrip("/") == UI
    cookie = next(c for c in context.cookies() if c["name"] == "leasework_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert token not in cookie["value"]  # the session names the token; it never holds it
    assert "Jobs by type and status" in page.inner_text("main")
    shot(page, "overview")

    # find it: dead jobs of type fail, newest first
    with page.expect_navigation():
        page.click("nav >> text=Jobs")
    page.select_option("select[name=status]", "dead")
    page.select_option("select[name=type]", "fail")
    with page.expect_navigation():
        page.click("form.filters button[type=submit]")
    assert "status=dead" in page.url and "type=fail" in page.url
    shot(page, "jobs")
    with page.expect_navigation():
        page.click(f"a:text-is('{job_id}')")
    main = page.inner_text("main")
    assert "dead" in main and "failing on purpose: attempt 1 of the first 1" in main
    shot(page, "job-dead")

    # retry it: a confirmation first, then the action
    with page.expect_navigation():
        page.click("a:text-is('Retry…')")
    assert f"Retry job {job_id}" in page.inner_text("main")
    shot(page, "confirm")
    with page.expect_navigation():
        page.click("#confirm")
    assert "Retried: queued again" in page.inner_text("main")
    reload_until(page, "succeeded_on_attempt")
    wait_db_status(db, job_id, "succeeded", timeout=5)
    rows = page.locator("table.attempts tbody tr")
    assert rows.count() == 2
    assert "dead" in rows.nth(0).inner_text() and "succeeded" in rows.nth(1).inner_text()
    actions = page.inner_text("table.audit")
    assert name in actions and "retry" in actions
    shot(page, "job")

    with page.expect_navigation():
        page.click("nav >> text=Audit")
    first = page.locator("table.audit tbody tr").first.inner_text()
    assert name in first and "retry" in first and job_id in first
    shot(page, "audit")

    with page.expect_navigation():
        page.click("nav >> text=Invariants")
    kinds = page.locator("table.invariants tbody tr").all_inner_texts()
    assert [k.split()[0] for k in kinds][:2] == ["effects_twice", "effects_without_success"]
    assert "finished job(s)" in page.locator("dl.facts").inner_text()
    shot(page, "invariants")

    with page.expect_navigation():
        page.click("text=Log out")  # a POST with the session's CSRF token
    assert "/ui/login" in page.url
    assert not [c for c in context.cookies() if c["name"] == "leasework_console"]
    page.goto(f"{UI}/audit")
    assert "/ui/login" in page.url
    logouts = operators.audit_list(db, target=None, limit=50)
    assert any(e.actor == name and e.action == "console-logout" for e in logouts)
    context.close()


def test_bulk_retry_by_filter_retries_exactly_what_the_filter_shows(browser, make_token, db):
    name, token = make_token("read", "cancel")
    doomed = [dead_job(db) for _ in range(2)]
    times = db.execute(
        "SELECT min(created_at) AS first, max(created_at) AS last FROM jobs WHERE id = ANY(%s)",
        ([uuid.UUID(j) for j in doomed],),
    ).fetchone()
    query = {
        "status": "dead",
        "type": "fail",
        "time_field": "created_at",
        "since": times["first"].isoformat(),
        "until": (times["last"] + timedelta(microseconds=1)).isoformat(),
    }
    context, page = login(browser, token, f"/ui/jobs?{urlencode(query)}")
    assert page.locator("table.jobs tbody tr").count() == 2
    with page.expect_navigation():
        page.click("text=Retry all matching…")
    assert "2 jobs match now" in page.inner_text("main")
    shot(page, "confirm-bulk")
    with page.expect_navigation():
        page.click("#confirm")
    assert "Retried 2 jobs." in page.inner_text("main")
    for job_id in doomed:
        wait_db_status(db, job_id, "succeeded")
    entry = operators.audit_list(db, target=None, limit=20)
    mine = [e for e in entry if e.actor == name and e.action == "retry-many"]
    assert mine and mine[0].detail["retried"] == 2
    context.close()


def test_a_read_only_token_sees_no_action_and_a_forged_post_is_refused(browser, make_token, db):
    _, reader_token = make_token("read")
    _, operator_token = make_token("read", "cancel")
    job_id = dead_job(db)
    path = f"/ui/jobs/{job_id}"

    reader, page = login(browser, reader_token, path)
    assert page.url == f"{API_URL}{path}"  # back where the login was asked for
    assert page.locator("text=Retry…").count() == 0
    assert page.locator("text=Cancel…").count() == 0
    shot(page, "job-read-only")
    csrf = page.input_value("input[name=csrf]")  # a valid token of this very session
    confirm = reader.request.get(f"{API_URL}{path}/retry")
    assert confirm.status == 403
    forged = reader.request.post(f"{API_URL}{path}/retry", form={"csrf": csrf})
    assert forged.status == 403 and "needs &#39;cancel&#39;" in forged.text()
    page.goto(f"{API_URL}{path}/retry")
    shot(page, "forbidden")
    reader.close()

    operator, page = login(browser, operator_token, path)
    csrf = page.input_value("input[name=csrf]")
    for form, headers in (
        ({}, {}),  # no CSRF token
        ({"csrf": "x" * 43}, {}),  # a wrong one
        ({"csrf": csrf}, {"Origin": "http://evil.example"}),  # the right one, from elsewhere
    ):
        refused = operator.request.post(f"{API_URL}{path}/retry", form=form, headers=headers)
        assert refused.status == 403, (form, headers, refused.status)
    assert status_of(db, job_id) == "dead"  # none of them did anything
    # the same POST with the session's token and no foreign origin is what the form sends
    done = operator.request.post(f"{API_URL}{path}/retry", form={"csrf": csrf})
    assert done.ok and status_of(db, job_id) in {"queued", "running", "succeeded"}
    operator.close()


def test_a_revoked_tokens_session_ends(browser, make_token, db):
    name, token = make_token("read")
    context, page = login(browser, token)
    assert page.url.rstrip("/") == UI
    operators.token_revoke(db, name)

    def sent_to_login() -> bool:
        page.goto(f"{UI}/jobs")
        return "/ui/login" in page.url

    wait_for(sent_to_login, 5, "the revoked token's session to end")  # revocations: < 1 s
    context.close()


def test_workers_page_shows_a_running_job_and_its_lease_and_cancel_stops_it(
    browser, make_token, db
):
    _, token = make_token("read", "cancel")
    job_id = enqueue("sleep", {"seconds": 120})
    wait_db_status(db, job_id, "running")
    context, page = login(browser, token, "/ui/workers")
    reload_until(page, job_id, timeout=10)
    row = page.locator(f"tr:has(a:text-is('{job_id}'))")
    assert "sleep" in row.inner_text() and "in " in row.inner_text()  # lease expires in …
    owner = db.execute("SELECT lease_owner FROM jobs WHERE id = %s", (job_id,)).fetchone()
    section = page.locator(f"section.worker:has(a:text-is('{job_id}'))")
    assert section.locator("h2").inner_text().startswith(owner["lease_owner"])
    assert "last heartbeat" in section.inner_text()
    shot(page, "workers")

    with page.expect_navigation():
        page.click(f"a:text-is('{job_id}')")
    with page.expect_navigation():
        page.click("a:text-is('Cancel…')")
    assert "It is running" in page.inner_text("main")
    with page.expect_navigation():
        page.click("#confirm")
    assert "Cancel requested" in page.inner_text("main")
    wait_db_status(db, job_id, "cancelled", timeout=30)
    context.close()


def test_alert_notifications_are_shown_escaped(browser, make_token, db):
    _, token = make_token("read")
    alertname = f"ConsoleTest{secrets.token_hex(3)}"
    summary = "<script>document.title='owned'</script> relay stalled"
    operators.alerts_record(
        db,
        [{"alertname": alertname, "status": "firing", "severity": "page", "summary": summary,
          "labels": {"alertname": alertname, "instance": "relay"}}],
        receiver="test-console",
    )  # fmt: skip
    try:
        context, page = login(browser, token, "/ui/alerts")
        row = page.locator(f"tr:has-text('{alertname}')")
        assert summary in row.inner_text()  # shown as text
        assert page.locator("main script").count() == 0 and page.title() != "owned"
        shot(page, "alerts")
        context.close()
    finally:
        db.execute("DELETE FROM alert_notifications WHERE alertname = %s", (alertname,))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_overview_says_so_when_prometheus_cannot_be_reached(browser, make_token, stack):
    _, token = make_token("read")
    context, page = login(browser, token)
    assert page.locator("#prometheus-unreachable").count() == 0  # the stack's answers
    assert "Alerts firing now" in page.inner_text("main")
    nowhere = f"http://127.0.0.1:{closed_port()}"
    stack.restart("api", extra_env={"LEASEWORK_PROMETHEUS_URL": nowhere})
    try:
        page.reload()  # the session survives the restart: its key is in Postgres
        warning = page.inner_text("#prometheus-unreachable")
        assert f"Prometheus at {nowhere} cannot be reached" in warning
        assert "Jobs by type and status" in page.inner_text("main")  # Postgres still answers
        shot(page, "overview-prometheus-unreachable")
    finally:
        stack.restart("api")
    context.close()


def test_the_job_page_shows_a_unique_key_and_a_retry_refused_while_it_is_held(
    browser, make_token, db
):
    _, token = make_token("read", "cancel")
    mark = uuid.uuid4().hex
    unique = leasework.Unique(fields=("k",))
    first = enqueue("echo", {"k": mark}, unique=unique, delay=timedelta(days=300))
    db.execute("UPDATE jobs SET status = 'cancelled', finished_at = now() WHERE id = %s", (first,))
    holder = enqueue("echo", {"k": mark}, unique=unique, delay=timedelta(days=300))
    try:
        path = f"/ui/jobs/{first}"
        context, page = login(browser, token, path)
        facts = page.locator("dl.facts").inner_text()
        assert "held while scheduled, queued, running, failed" in facts
        assert "released: the job left those states" in facts
        with page.expect_navigation():
            page.click("a:text-is('Retry…')")
        with page.expect_navigation():
            page.click("#confirm")
        assert page.url.endswith(f"{path}?notice=duplicate")
        assert "another job holds its unique key" in page.inner_text("p.notice")
        assert status_of(db, first) == "cancelled"
        shot(page, "job-unique-retry-refused")
        context.close()
    finally:
        delete_jobs(db, "id IN (%s, %s)", (first, holder))


def test_the_queues_page_pauses_a_queue_its_jobs_wait_and_resume_runs_them(browser, make_token, db):
    _, token = make_token("read", "cancel")
    context, page = login(browser, token, "/ui/queues")
    try:
        row = page.locator("tr#queue-emails")
        assert "active" in row.inner_text()
        with page.expect_navigation():
            row.locator("a:text-is('Pause…')").click()
        assert "Pause queue emails on every worker?" in page.inner_text("main")
        with page.expect_navigation():
            page.click("#confirm")
        assert "Queue emails: Paused" in page.inner_text("main")
        assert "paused" in page.locator("tr#queue-emails").inner_text()
        job_id = enqueue("notify", {"console": "paused"})
        shot(page, "queues-paused")
        wait_for(lambda: status_of(db, job_id) in ("queued", "scheduled"), 10, "the job waits")
        time.sleep(2.0)  # a pause is judged by what does not happen: give it time to
        assert status_of(db, job_id) in ("queued", "scheduled")
        with page.expect_navigation():
            page.locator("tr#queue-emails a:text-is('Resume…')").click()
        with page.expect_navigation():
            page.click("#confirm")
        assert "Queue emails: Resumed" in page.inner_text("main")
        wait_db_status(db, job_id, "succeeded", timeout=60)
        actions = [
            r["action"]
            for r in db.execute(
                "SELECT action, detail->>'via' AS via FROM audit_log WHERE target = "
                "'queue:emails' ORDER BY id DESC LIMIT 2"
            ).fetchall()
        ]
        assert actions == ["queue-resume", "queue-pause"]
    finally:
        with psycopg.connect(DIRECT_DSN) as conn:
            conn.execute(
                "UPDATE queues SET paused_at = NULL, paused_by = NULL WHERE name = 'emails'"
            )
        context.close()


def test_the_queues_page_caps_a_queue_refuses_a_cap_that_is_none_and_lifts_it(
    browser, make_token, db
):
    _, token = make_token("read", "cancel")
    context, page = login(browser, token, "/ui/queues")
    try:
        with page.expect_navigation():
            page.locator("tr#queue-emails a:text-is('Cap…')").click()
        assert page.inner_text("#current-cap") == "no cap"
        page.fill("#concurrency", "0")
        with page.expect_navigation():
            page.click("#confirm")
        assert "The cap must be a whole number of at least 1" in page.inner_text("p.error")
        page.fill("#concurrency", "2")
        with page.expect_navigation():
            page.click("#confirm")
        assert "Queue emails: Capped" in page.inner_text("main")
        cells = page.locator("tr#queue-emails td.num").all_inner_texts()
        assert "2" in cells, cells
        cap = db.execute("SELECT concurrency FROM queues WHERE name = 'emails'").fetchone()
        assert cap["concurrency"] == 2
        shot(page, "queues-capped")
        with page.expect_navigation():
            page.locator("tr#queue-emails a:text-is('Cap…')").click()
        page.fill("#concurrency", "")
        with page.expect_navigation():
            page.click("#confirm")
        assert "Queue emails: Its cap is lifted" in page.inner_text("main")
        audited = db.execute(
            "SELECT detail FROM audit_log WHERE action = 'queue-concurrency' "
            "AND target = 'queue:emails' ORDER BY id DESC LIMIT 2"
        ).fetchall()
        assert [a["detail"]["to"] for a in audited] == [None, 2]
    finally:
        with psycopg.connect(DIRECT_DSN) as conn:
            conn.execute("UPDATE queues SET concurrency = NULL WHERE name = 'emails'")
        context.close()


def test_a_read_only_token_sees_the_queues_but_cannot_pause_one(browser, make_token):
    _, token = make_token("read")
    context, page = login(browser, token, "/ui/queues")
    assert "emails" in page.inner_text("main")
    assert page.locator("a:text-is('Pause…')").count() == 0
    assert page.locator("a:text-is('Cap…')").count() == 0
    refused = context.request.get(f"{UI}/queues/emails/pause")
    assert refused.status == 403 and "needs &#39;cancel&#39;" in refused.text()
    context.close()
