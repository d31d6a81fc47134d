"""The doors' pure parts (leasework/doors/): which door a connection gets, and each driver's
row read as the store's Inserted. The doors themselves run against Postgres in
tests/integration/test_doors.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import psycopg
import pytest

from leasework.doors import async_door, sync_door
from leasework.doors.statements import inserted
from leasework.states import Status


def row(**changes):
    base = {
        "ord": 1,
        "id": uuid.uuid4(),
        "status": "queued",
        "run_at": datetime(2026, 12, 7, tzinfo=UTC),
        "created_at": datetime(2026, 12, 7, tzinfo=UTC),
        "max_attempts": 3,
        "timeout_seconds": 300,
        "replay": False,
        "conflict": False,
        "duplicate": False,
        "unique_key": None,
    }
    return {**base, **changes}


def test_each_drivers_row_reads_as_the_same_inserted():
    job_id = uuid.uuid4()
    native = inserted(row(id=job_id, unique_key=b"k"))
    # psycopg2 through SQLAlchemy: a uuid as text, bytea as a memoryview
    psycopg2_like = inserted(row(id=str(job_id), unique_key=memoryview(b"k")))
    assert native == psycopg2_like
    assert native.id == job_id and native.unique_key == b"k" and native.status is Status.QUEUED


def test_a_connection_that_is_no_door_is_refused_naming_the_doors():
    with pytest.raises(
        TypeError,
        match="a SQLAlchemy Session or Connection, or a Django connection",
    ):
        sync_door(object())
    with pytest.raises(TypeError, match="asyncpg Connection"):
        async_door("postgresql://")


def test_a_sync_connection_at_the_async_door_is_sent_to_the_other(monkeypatch):
    conn = psycopg.Connection.__new__(psycopg.Connection)  # (never connected)
    with pytest.raises(TypeError, match="use leasework.enqueue"):
        async_door(conn)
    aconn = psycopg.AsyncConnection.__new__(psycopg.AsyncConnection)
    with pytest.raises(TypeError, match="enqueue_async"):
        sync_door(aconn)
