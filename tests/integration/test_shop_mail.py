"""The example shop's mail service under each of its guards: over HTTP as the stack runs it
(``key,fence``), and its ``send`` on the stack's Postgres with the guards the chaos scenarios
run it with (``fence`` alone, ``none``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from devstack.layout import SHOP_MAIL_URL
from examples.shop.guard import MailGuard
from examples.shop.mail import Email, send
from leasework import StaleFence
from leasework.downstream import Fence, raise_if_stale
from tests.integration.conftest import DIRECT_DSN

EMAIL = {"to": "ada@shop.test", "subject": "Your receipt", "body": "Thanks."}


def emails_of(job: uuid.UUID) -> list[dict]:
    with psycopg.connect(DIRECT_DSN, row_factory=dict_row) as conn:
        return conn.execute(
            "SELECT fence, idempotency_key FROM shop_emails WHERE job_id = %s ORDER BY id", (job,)
        ).fetchall()


def refusals_of(job: uuid.UUID) -> list[tuple[int, int]]:
    with psycopg.connect(DIRECT_DSN) as conn:
        return conn.execute(
            "SELECT fence, highest FROM shop_mail_refused WHERE job_id = %s ORDER BY id", (job,)
        ).fetchall()


def call(job: uuid.UUID, fence: int, key: str | None) -> httpx.Response:
    headers = Fence(job, fence).headers()
    if key is not None:
        headers["Idempotency-Key"] = key
    return httpx.post(f"{SHOP_MAIL_URL}/send", json=EMAIL, headers=headers, timeout=10)


def test_the_stacks_mail_service_dedupes_by_key_and_refuses_a_stale_fence(stack):
    job, key = uuid.uuid4(), f"leasework:{uuid.uuid4()}"
    first = call(job, 2, key)
    assert first.status_code == 200 and first.json()["duplicate"] is False, first.text
    again = call(job, 2, key)  # a retried call of the same attempt: the key answers it
    assert again.json() == {"message_id": first.json()["message_id"], "duplicate": True}
    stale = call(job, 1, key)  # an attempt that lost its lease to fence 2
    assert stale.status_code == 409, stale.text
    assert stale.headers["content-type"].startswith("application/problem+json")
    with pytest.raises(StaleFence) as refused:
        raise_if_stale(stale.status_code, stale.content)
    assert (refused.value.job_id, refused.value.fence, refused.value.highest) == (job, 1, 2)
    assert [e["fence"] for e in emails_of(job)] == [2]
    assert refusals_of(job) == [(1, 2)]


def test_the_mail_service_answers_bad_calls_clearly_and_sends_nothing(stack):
    job = uuid.uuid4()
    no_key = httpx.post(f"{SHOP_MAIL_URL}/send", json=EMAIL, headers=Fence(job, 1).headers())
    assert no_key.status_code == 400 and "Idempotency-Key" in no_key.text
    half = httpx.post(
        f"{SHOP_MAIL_URL}/send",
        json=EMAIL,
        headers={"Idempotency-Key": f"k-{job}", "Leasework-Fence": "3"},
    )
    assert half.status_code == 400 and "Leasework-Job-Id is missing" in half.text
    assert emails_of(job) == []


@pytest.fixture
def pool(stack) -> Iterator[ConnectionPool]:
    with ConnectionPool(DIRECT_DSN, min_size=1, max_size=2) as pool:
        yield pool


def test_with_the_fence_alone_a_stale_call_is_refused_but_a_newer_attempt_sends_again(pool):
    guard, job = MailGuard.parse("fence"), uuid.uuid4()
    email = Email(**EMAIL)
    send(pool, guard, email, None, Fence(job, 1))
    send(pool, guard, email, None, Fence(job, 2))  # no key: a later attempt is a new email
    with pytest.raises(StaleFence):
        send(pool, guard, email, None, Fence(job, 1))
    assert [e["fence"] for e in emails_of(job)] == [1, 2]
    assert refusals_of(job) == [(1, 2)]


def test_with_no_guard_the_stale_call_sends_a_duplicate(pool):
    guard, job = MailGuard.parse("none"), uuid.uuid4()
    email = Email(**EMAIL)
    for fence in (2, 1, 1):
        send(pool, guard, email, f"leasework:{job}", Fence(job, fence))
    assert [e["fence"] for e in emails_of(job)] == [2, 1, 1]
    assert refusals_of(job) == []
