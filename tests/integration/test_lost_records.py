"""Kafka forgets, Postgres does not: a waiting job whose record is lost still runs, once.

The issue's probe, on the real stack: with the workers stopped, jobs are accepted and
published (the outbox drained), then Kafka drops their records (``delete_records``, what
retention does to a backlog older than it). The relay's recovery service
(:mod:`leasework.relay.recovery`) sees, by Kafka's own positions, that the records are gone
and publishes the jobs again; each runs once, its fenced effect once.
"""

from __future__ import annotations

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from chaos.promql import total
from devstack.layout import KAFKA_DIRECT_BOOTSTRAP
from tests.integration.conftest import wait_for
from tests.integration.test_console import browser, login, shot  # noqa: F401 (a fixture)
from tests.integration.test_fencing import effects_per_job

TOPIC = "jobs.ready"
RELAY_OPS_PORT = 9102


def republished() -> float:
    return total(RELAY_OPS_PORT, "leasework_lost_records_republished_total")


def delete_every_record(topic: str) -> dict[int, int]:
    """Delete every record ``topic`` holds now (each partition up to its high watermark), as
    retention would; returns each partition's new log start."""
    admin = AdminClient({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP})
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    asked = [TopicPartition(topic, p, -1) for p in partitions]  # -1: the high watermark
    done = admin.delete_records(asked, request_timeout=15)
    return {tp.partition: f.result().low_watermark for tp, f in done.items()}


def test_jobs_whose_records_kafka_deleted_while_workers_were_down_each_run_once(stack, client, db):
    before = republished()
    workers = ("worker-1", "worker-2")
    stack.stop_many(list(workers))
    try:
        ids = [client.submit("ledger", {})["id"] for _ in range(40)]
        wait_for(
            lambda: (
                db.execute(
                    "SELECT count(*) AS n FROM outbox WHERE job_id = ANY(%s::uuid[])", (ids,)
                ).fetchone()["n"]
                == 0
            ),
            30,
            "the relay to publish every job (its outbox rows retired)",
        )
        starts = delete_every_record(TOPIC)
        assert sum(starts.values()) >= len(ids)  # the records are gone from the log
    finally:
        for worker in workers:
            stack.start(worker)
    wait_for(
        lambda: (
            db.execute(
                "SELECT count(*) AS n FROM jobs "
                "WHERE id = ANY(%s::uuid[]) AND status = 'succeeded'",
                (ids,),
            ).fetchone()["n"]
            == len(ids)
        ),
        120,
        "every job whose record was deleted to succeed",
    )
    assert effects_per_job(db, ids) == {i: 1 for i in ids}
    attempts = db.execute(
        "SELECT max(attempt) AS most FROM jobs WHERE id = ANY(%s::uuid[])", (ids,)
    ).fetchone()
    assert attempts["most"] == 1  # each ran once
    assert republished() - before >= len(ids)


def test_the_console_overview_counts_the_jobs_published_again(browser, make_token):  # noqa: F811
    # after the test above: its jobs were published again within the hour
    _, token = make_token("read")
    context, page = login(browser, token)
    try:

        def shown() -> float | None:
            page.reload()
            number = page.inner_text("#lost-records .big").strip()
            return float(number) if number not in {"—", "0"} else None

        assert wait_for(shown, 60, "jobs published again on the overview", interval=2) >= 1
        shot(page, "overview-lost-records")
    finally:
        context.close()
