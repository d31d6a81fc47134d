"""leasework doctor against the real stack: it passes as the stack is configured, and fails
with its explanation on deliberately wrong settings that harm no one else (a setting of the
doctor's own connection, a topic name that does not exist, a Redis policy restored at once)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from devstack import layout
from leasework import config, doctor, redisconn
from leasework.doctor import FAIL, OK, Options


def stack_settings() -> config.Settings:
    """The settings leasework's processes on the stack run with (devstack/layout.py)."""
    return config.load(
        "doctor",
        {
            "LEASEWORK_POSTGRES_DSN": layout.POSTGRES_DSN,
            "LEASEWORK_REDIS_ADDR": layout.REDIS_ADDR,
            "LEASEWORK_KAFKA_BROKERS": layout.KAFKA_BROKERS,
        },
    )


def by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.name: c for c in checks}


def assert_explained_failure(check: doctor.Check, found: str) -> None:
    assert check.status == FAIL, check
    assert found in check.found, check
    assert check.why and check.fix


def test_doctor_passes_on_the_stack(stack):
    checks = doctor.run_checks(stack_settings(), Options())
    problems = [c for c in checks if c.status != OK]
    assert problems == []
    names = set(by_name(checks))
    assert {
        "kafka.topic.jobs.ready",
        "kafka.partitions.jobs.ready",
        "kafka.replication.jobs.ready",
        "kafka.min_insync.jobs.ready",
        "kafka.topic.jobs.dlq",
        "kafka.producer",
        "redis.persistence",
        "redis.eviction",
        "redis.clock",
        "postgres.version",
        "postgres.synchronous_commit",
        "postgres.migrations",
        "postgres.clock",
        "postgres.tokens",
    } <= names


def test_cli_exit_status_and_output(stack):
    env = {
        "PATH": "/usr/bin:/bin",
        "LEASEWORK_POSTGRES_DSN": layout.POSTGRES_DSN,
        "LEASEWORK_REDIS_ADDR": layout.REDIS_ADDR,
        "LEASEWORK_KAFKA_BROKERS": layout.KAFKA_BROKERS,
    }
    good = subprocess.run(
        [sys.executable, "-c", "import sys; from leasework.cli import main; sys.exit(main())"]
        + ["doctor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if "invalid choice: 'doctor'" in good.stderr:
        pytest.skip("leasework/cli.py of this tree has no doctor subcommand")
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.splitlines()[-1].startswith("doctor passed")
    bad = subprocess.run(
        [sys.executable, "-m", "leasework", "doctor", "--partitions", "7"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 0  # a partition count other than expected only warns
    assert "[WARN] kafka.partitions.jobs.ready: 12 partitions, expected 7" in bad.stdout


def test_synchronous_commit_off_in_the_dsn_fails(stack):
    # only the doctor's own connection runs with synchronous_commit=off
    dsn = f"{layout.POSTGRES_DSN}?options=-c%20synchronous_commit%3Doff"
    settings = replace(stack_settings(), postgres_dsn=dsn)
    checks = by_name(doctor.gather_postgres(settings))
    assert_explained_failure(checks["postgres.synchronous_commit"], "synchronous_commit=off")
    assert "crash loses accepted jobs" in checks["postgres.synchronous_commit"].why
    assert checks["postgres.migrations"].status == OK


def test_redis_eviction_policy_fails(stack):
    client = redisconn.connect(stack_settings().redis, timeout=3, decode_responses=True)
    before = client.config_get("maxmemory-policy")["maxmemory-policy"]
    assert before == "noeviction"
    try:
        client.config_set("maxmemory-policy", "allkeys-lru")
        checks = by_name(doctor.gather_redis(stack_settings()))
    finally:
        client.config_set("maxmemory-policy", before)
        client.close()
    assert_explained_failure(checks["redis.eviction"], "maxmemory-policy allkeys-lru")
    assert "evict a lease" in checks["redis.eviction"].why
    assert checks["redis.persistence"].status == OK


def test_missing_topic_fails(stack):
    settings = replace(stack_settings(), topic_ready="jobs.missing")
    checks = by_name(doctor.gather_kafka(settings, Options()))
    assert_explained_failure(checks["kafka.topic.jobs.missing"], "jobs.missing does not exist")
    assert checks["kafka.topic.jobs.dlq"].status == OK
    assert doctor.exit_status(list(checks.values())) == 1


def test_unreachable_dependencies_fail_and_say_so(stack):
    settings = replace(
        stack_settings(),
        redis_url="redis://127.0.0.1:1/0",
        kafka_brokers=("127.0.0.1:2",),
        postgres_dsn="postgresql://leasework:leasework@127.0.0.1:3/leasework",
    )
    checks = by_name(doctor.run_checks(settings, Options()))
    assert set(checks) == {"kafka", "redis", "postgres"}
    for name, check in checks.items():
        assert_explained_failure(check, "cannot reach")
        assert name in check.found.lower()


def test_redis_persistence_off_fails(stack):
    client = redisconn.connect(stack_settings().redis, timeout=3, decode_responses=True)
    appendonly, save = client.config_get("appendonly")["appendonly"], client.config_get("save")
    assert appendonly == "yes"
    try:
        client.config_set("appendonly", "no")
        client.config_set("save", "")
        checks = by_name(doctor.gather_redis(stack_settings()))
    finally:
        client.config_set("appendonly", appendonly)
        client.config_set("save", save["save"])
        client.close()
    assert_explained_failure(checks["redis.persistence"], "appendonly no")
    assert checks["redis.eviction"].status == OK


@pytest.fixture
def weak_topic(stack):
    """A scratch topic with replication factor 1 and min.insync.replicas 1 (the stack's own
    topics are left alone), deleted afterwards."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": layout.KAFKA_DIRECT_BOOTSTRAP})
    name = "doctor.weak"
    if name not in admin.list_topics(timeout=10).topics:
        spec = NewTopic(name, 12, 1, config={"min.insync.replicas": "1"})
        for future in admin.create_topics([spec]).values():
            future.result(30)
    yield name
    for future in admin.delete_topics([name]).values():
        future.result(30)


def test_replication_one_and_min_insync_one_fail_and_the_override_warns(weak_topic):
    settings = replace(stack_settings(), topic_ready=weak_topic)
    checks = by_name(doctor.gather_kafka(settings, Options()))
    assert_explained_failure(checks[f"kafka.replication.{weak_topic}"], "replication factor 1")
    assert_explained_failure(checks[f"kafka.min_insync.{weak_topic}"], "min.insync.replicas=1")
    assert checks[f"kafka.topic.{weak_topic}"].status == OK
    allowed = by_name(doctor.gather_kafka(settings, Options(allow_single_replica=True)))
    assert allowed[f"kafka.replication.{weak_topic}"].status == doctor.WARN
