"""The downstream fence verifier (leasework.downstream) on a real Postgres, standing in for
a service's own database: a schema of the test's own holding ``leasework_fences`` and the
effect the fence protects (a mail ledger), each call's fence checked in the effect's
transaction."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.rows import dict_row

from leasework import StaleFence
from leasework.downstream import Fence, install, verify
from tests.integration.conftest import DIRECT_DSN

JOB = uuid.uuid4()


@pytest.fixture
def schema(stack) -> Iterator[str]:
    name = f"downstream_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(DIRECT_DSN, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
        conn.execute(f"SET search_path TO {name}")
        install(conn)
        conn.execute("CREATE TABLE mail (job_id uuid NOT NULL, fence bigint NOT NULL)")
    try:
        yield name
    finally:
        with psycopg.connect(DIRECT_DSN, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


def connect(schema: str) -> psycopg.Connection:
    # rows as dicts, as a service's connection may well give them: verify() reads its own
    return psycopg.connect(DIRECT_DSN, options=f"-c search_path={schema}", row_factory=dict_row)


def send_mail(conn: psycopg.Connection, fence: Fence) -> None:
    """What the service does for one call: the fence, then the effect, in one transaction."""
    with conn.transaction():
        verify(conn, fence)
        conn.execute("INSERT INTO mail VALUES (%s, %s)", (fence.job_id, fence.fence))


def mail(schema: str) -> list[int]:
    with connect(schema) as conn:
        return [r["fence"] for r in conn.execute("SELECT fence FROM mail ORDER BY fence")]


def test_a_newer_fence_passes_the_same_one_passes_again_and_an_older_one_is_refused(schema):
    with connect(schema) as conn:
        send_mail(conn, Fence(JOB, 3))
        send_mail(conn, Fence(JOB, 5))
        send_mail(conn, Fence(JOB, 5))  # the same attempt calling again: the fence allows it
        with pytest.raises(StaleFence) as refused:
            send_mail(conn, Fence(JOB, 4))
        send_mail(conn, Fence(uuid.uuid4(), 1))  # another job's fences are its own
    assert (refused.value.fence, refused.value.highest) == (4, 5)
    assert mail(schema) == [1, 3, 5, 5]  # the refused call's effect never happened


def test_two_attempts_calling_at_once_take_turns_and_the_stale_one_is_refused(schema):
    """The newer attempt's transaction holds the job's row; the stale one waits for it and,
    once it commits, is refused: never both effects."""
    first, second = connect(schema), connect(schema)
    try:
        first.execute("BEGIN")
        verify(first, Fence(JOB, 8))
        first.execute("INSERT INTO mail VALUES (%s, 8)", (JOB,))
        outcome: list[BaseException | None] = []

        def stale_call() -> None:
            try:
                send_mail(second, Fence(JOB, 7))
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        waiter = threading.Thread(target=stale_call)
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive(), "the stale call did not wait for the newer one's transaction"
        first.commit()
        waiter.join(10.0)
        assert len(outcome) == 1 and isinstance(outcome[0], StaleFence), outcome
    finally:
        first.close()
        second.close()
    assert mail(schema) == [8]


def test_a_newer_attempt_that_rolls_back_leaves_the_older_one_its_turn(schema):
    first, second = connect(schema), connect(schema)
    try:
        first.execute("BEGIN")
        verify(first, Fence(JOB, 9))
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (send_mail(second, Fence(JOB, 6)), done.set()))
        waiter.start()
        waiter.join(1.0)
        assert not done.is_set()
        first.rollback()  # its effect failed: nothing of it stays, the fence included
        waiter.join(10.0)
        assert done.is_set()
    finally:
        first.close()
        second.close()
    assert mail(schema) == [6]
