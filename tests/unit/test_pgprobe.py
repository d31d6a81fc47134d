"""The Postgres probe's choice of connection: kept while young and working, replaced when it
ages or fails. The connections are stand-ins here; tests/integration/test_health.py runs it
against the real Postgres, through a link that swallows bytes."""

from __future__ import annotations

import psycopg
import pytest

from leasework.pgprobe import PostgresProbe


class StandIn:
    """What the probe uses of a psycopg connection: ``execute``, ``close``, ``closed``."""

    def __init__(self, failing: bool = False) -> None:
        self.failing = failing
        self.closed = False
        self.statements: list[str] = []

    def execute(self, sql: str) -> None:
        if self.closed:
            raise psycopg.OperationalError("the connection is closed")
        if self.failing:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        self.statements.append(sql)

    def close(self) -> None:
        self.closed = True


class Opener:
    def __init__(self) -> None:
        self.opened: list[StandIn] = []
        self.refuse = False
        self.next_fails = False

    def __call__(self) -> StandIn:
        if self.refuse:
            raise psycopg.OperationalError("connection refused")
        conn = StandIn(failing=self.next_fails)
        self.opened.append(conn)
        return conn


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def parts():
    opener, clock = Opener(), Clock()
    return opener, clock, PostgresProbe(opener, reopen_after=60.0, clock=clock)  # type: ignore[arg-type]


def test_one_connection_serves_every_probe_while_it_is_young(parts):
    opener, clock, probe = parts
    for second in range(59):
        clock.now = float(second)
        probe.check()
    assert len(opener.opened) == 1
    assert opener.opened[0].statements == ["SELECT 1"] * 59


def test_the_connection_is_replaced_once_it_is_old_so_a_new_one_is_still_proven(parts):
    opener, clock, probe = parts
    probe.check()
    clock.now = 60.0
    probe.check()
    assert len(opener.opened) == 2
    assert opener.opened[0].closed and not opener.opened[1].closed
    assert opener.opened[1].statements == ["SELECT 1"]


def test_a_kept_connection_that_fails_is_replaced_in_the_same_probe(parts):
    """A Postgres restart drops the kept connection; the probe says ready if a new one works."""
    opener, _, probe = parts
    probe.check()
    opener.opened[0].failing = True
    probe.check()  # no error: the new connection answered
    assert len(opener.opened) == 2 and opener.opened[0].closed


def test_a_failure_of_a_new_connection_is_reported_and_nothing_is_kept(parts):
    opener, _, probe = parts
    opener.refuse = True
    with pytest.raises(psycopg.OperationalError, match="refused"):
        probe.check()
    opener.refuse, opener.next_fails = False, True
    with pytest.raises(psycopg.OperationalError):
        probe.check()
    assert opener.opened[0].closed  # opened, failed its SELECT 1, not kept
    opener.next_fails = False
    probe.check()
    assert len(opener.opened) == 2


def test_close_closes_the_kept_connection(parts):
    opener, _, probe = parts
    probe.check()
    probe.close()
    assert opener.opened[0].closed
    probe.check()
    assert len(opener.opened) == 2
