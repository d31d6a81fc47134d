"""Named queues on the stack: the demo's workers serve ``default`` and ``emails`` (its
``notify`` type's queue, created when they started: topic, then row); a job waits in its
type's queue or the one its submit names and runs there; a queue that does not exist is a
422 at every HTTP door and a DataError in ``enqueue``, nothing written; the CLI lists the
queues and creates one, idempotently."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from chaos.promql import scrape
from leasework.client import ApiError
from leasework.enqueue import enqueue
from leasework.queues.priorities import band_topics
from tests.integration.conftest import DIRECT_DSN, delete_jobs, wait_for, wait_status

BROKERS = "127.0.0.1:19092,127.0.0.1:29092,127.0.0.1:39092"
RELAY_OPS_PORT = 9102  # the relay exports the consumer lag


def topics() -> set[str]:
    admin = AdminClient({"bootstrap.servers": BROKERS})
    return set(admin.list_topics(timeout=10).topics)


def delete_topics(names: list[str]) -> None:
    """Delete ``names``, waiting for each deletion (an unawaited ``delete_topics`` may never be
    sent: its client is collected first, and every run left four 12-partition topics behind)."""
    admin = AdminClient({"bootstrap.servers": BROKERS})
    for future in admin.delete_topics(names, operation_timeout=30).values():
        future.result(60)


def lag_of(queue: str) -> dict[str, float]:
    """The relay's ``leasework_consumer_lag`` of ``queue``, summed by priority band."""
    by_band: dict[str, float] = {}
    for sample, value in scrape(RELAY_OPS_PORT).items():
        if sample.startswith("leasework_consumer_lag{") and f'queue="{queue}"' in sample:
            band = sample.split('priority="')[1].split('"')[0]
            by_band[band] = by_band.get(band, 0) + value
    return by_band


def test_a_job_runs_in_its_types_queue_or_the_one_its_submit_names(client, db):
    assert "jobs.ready.emails" in topics()  # made by the workers, shaped like jobs.ready
    names = {r["name"] for r in db.execute("SELECT name FROM queues").fetchall()}
    assert {"default", "emails"} <= names
    by_type = client.submit("notify", {"n": 1})
    told = client.submit("noop", {}, queue="emails")
    plain = client.submit("noop", {})
    for job, queue in ((by_type, "emails"), (told, "emails"), (plain, "default")):
        done = wait_status(client, job["id"], {"succeeded"}, timeout=60)
        assert done["queue"] == queue
    listed = {q["name"]: q for q in client.http.get("/queues").json()["queues"]}
    assert listed["emails"]["finished_per_second"] > 0  # two of the last five minutes' jobs


def test_an_unknown_queue_is_refused_at_every_door_and_nothing_is_written(client, db):
    name = f"nosuch-{uuid.uuid4().hex[:8]}"
    before = db.execute("SELECT count(*) AS n FROM jobs").fetchone()["n"]
    with pytest.raises(ApiError) as single:
        client.submit("noop", {}, queue=name)
    assert single.value.status == 422 and single.value.problem["queue"] == name
    assert "leasework queues create" in single.value.problem["detail"]
    with pytest.raises(ApiError) as batch:
        client.submit_many([{"type": "noop"}, {"type": "noop", "queue": name}])
    assert batch.value.status == 422 and "whole batch" in batch.value.problem["detail"]
    with psycopg.connect(DIRECT_DSN) as conn, pytest.raises(psycopg.DataError, match=name):
        enqueue(conn, "noop", {}, queue=name)
    with pytest.raises(ApiError) as invalid:
        client.submit("noop", {}, queue="Not A Queue")
    assert invalid.value.status == 422 and "lower-case" in str(invalid.value.problem)
    assert db.execute("SELECT count(*) AS n FROM jobs").fetchone()["n"] == before


def leasework(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "leasework", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "LEASEWORK_POSTGRES_DSN": DIRECT_DSN,
            "LEASEWORK_KAFKA_BROKERS": BROKERS,
            "PATH": "/usr/bin:/bin",
        },
    )


def test_the_cli_creates_a_queue_once_and_lists_every_queue(db):
    name = f"scratch-{uuid.uuid4().hex[:8]}"
    try:
        made = leasework("queues", "create", name)
        assert made.returncode == 0 and "created" in made.stdout, made.stderr
        assert f"jobs.ready.{name}" in topics()
        again = leasework("queues", "create", name)
        assert again.returncode == 0 and "exists already" in again.stdout
        listed = leasework("queues", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {q["name"]: q for q in json.loads(listed.stdout)}
        assert {"default", "emails", name} <= rows.keys()
        assert rows[name]["waiting"] == 0 and rows[name]["running"] == 0
        assert rows[name]["waiting_by_priority"] == [0, 0, 0, 0]
        # no worker serves the new queue: what is enqueued in it waits, counted by priority
        with psycopg.connect(DIRECT_DSN) as conn:
            for priority in (0, 3, 3, 1):
                enqueue(conn, "noop", {"queue": name}, queue=name, priority=priority)
        listed = json.loads(leasework("queues", "--json").stdout)
        (mine,) = [q for q in listed if q["name"] == name]
        assert mine["waiting"] == 4 and mine["waiting_by_priority"] == [1, 1, 0, 2]
        # the relay publishes them to the queue's bands; their lag is exported per band
        wait_for(
            lambda: lag_of(name) == {"0": 1, "1": 1, "2": 0, "3": 2},
            30,
            f"the relay's consumer lag of queue {name} by band",
        )
        table = leasework("queues")
        assert "oldest waiting" in table.stdout and name in table.stdout
        assert "1/1/0/2" in table.stdout
        bad = leasework("queues", "create", "Bad Name")
        assert bad.returncode == 1 and "lower-case" in bad.stderr
    finally:
        delete_jobs(db, "queue = %s", (name,))
        db.execute("DELETE FROM queues WHERE name = %s", (name,))
        delete_topics(band_topics("jobs.ready", name))
    # a deletion shows in the metadata a moment after the brokers acknowledged it
    wait_for(lambda: not {t for t in topics() if name in t}, 30, f"queue {name}'s topics deleted")
    wait_for(lambda: not lag_of(name), 30, f"the lag of the deleted queue {name} unexported")


def toggle(client, name: str, action: str) -> dict:
    answer = client.http.post(f"/queues/{name}/{action}")
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_paused_queue_starts_nothing_and_its_jobs_run_once_resumed(client, db):
    """Paused over the api: its jobs wait (none started, none spends an attempt) while the
    default queue runs on; the pause and the resume are audited; resumed, every job runs once."""
    try:
        paused = toggle(client, "emails", "pause")
        assert paused["paused"] and paused["changed"] and paused["paused_by"]
        assert toggle(client, "emails", "pause")["changed"] is False  # already: not audited
        waiting = [client.submit("notify", {"paused": n}) for n in range(5)]
        other = client.submit("noop", {"while": "emails paused"})
        wait_status(client, other["id"], {"succeeded"}, timeout=30)  # default runs on
        time.sleep(2.0)  # twice what a worker needs to notice, and more than a claim takes
        ids = [j["id"] for j in waiting]
        rows = db.execute(
            "SELECT status, attempt, (SELECT count(*) FROM attempts a WHERE a.job_id = j.id) "
            "AS tries FROM jobs j WHERE id = ANY(%s::uuid[])",
            (ids,),
        ).fetchall()
        assert {(r["status"], r["attempt"], r["tries"]) for r in rows} <= {
            ("queued", 0, 0),
            ("scheduled", 0, 0),  # held: a worker had fetched it when the pause came
        }
        listed = {q["name"]: q for q in client.http.get("/queues").json()["queues"]}
        assert listed["emails"]["paused"] and not listed["default"]["paused"]
        resumed = toggle(client, "emails", "resume")
        assert resumed["changed"] and not resumed["paused"]
        for job_id in ids:
            assert wait_status(client, job_id, {"succeeded"}, timeout=60)["attempt"] == 1
        actions = [
            r["action"]
            for r in db.execute(
                "SELECT action FROM audit_log WHERE target = 'queue:emails' "
                "AND at > now() - interval '5 minutes' ORDER BY id DESC LIMIT 2"
            ).fetchall()
        ]
        assert actions == ["queue-resume", "queue-pause"]
    finally:
        client.http.post("/queues/emails/resume")


def test_pausing_a_queue_that_does_not_exist_is_a_404(client):
    for name in ("nosuch-queue", "Not A Queue"):
        answer = client.http.post(f"/queues/{name}/pause")
        assert answer.status_code == 404, answer.text
        assert "GET /queues" in answer.json()["detail"]


def test_the_cli_pauses_and_resumes_a_queue(db):
    try:
        paused = leasework("queues", "pause", "emails")
        assert paused.returncode == 0 and "paused" in paused.stdout, paused.stderr
        listed = leasework("queues")
        assert "paused by" in listed.stdout
        resumed = leasework("queues", "resume", "emails")
        assert resumed.returncode == 0 and "resumed" in resumed.stdout, resumed.stderr
        missing = leasework("queues", "pause", "nosuch-queue")
        assert missing.returncode == 1 and "no queue" in missing.stderr
    finally:
        leasework("queues", "resume", "emails")
