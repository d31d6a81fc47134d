"""leasework doctor against the real stack: it passes as the stack is configured, and fails
with its explanation on deliberately wrong settings that harm no one else (a setting of the
doctor's own connection, a topic name that does not exist, a Redis policy restored at once,
topics of its own whose settings drop records)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from devstack import layout
from leasework import config, doctor, preflight, redisconn
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
        "kafka.queues",
        "kafka.unclean_election.jobs.ready",
        "kafka.retention.jobs.ready",
        "kafka.retention_bytes.jobs.dlq",
        "kafka.cleanup_policy.jobs.ready.default.p3",
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
        + ["doctor", "--min-retention", "1d"],
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
        [sys.executable, "-m", "leasework", "doctor", "--partitions", "7", "--min-retention", "1d"],
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


# ------------------------------------------------------- what makes Kafka drop records

# every setting that drops records a consumer has not read yet
DROPPING = {
    "unclean.leader.election.enable": "true",
    "retention.ms": "3600000",
    "retention.bytes": "1048576",
    "cleanup.policy": "compact,delete",
}


def _admin(bootstrap: str = layout.KAFKA_DIRECT_BOOTSTRAP):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def _known_to_every_broker(topics: list[str]) -> bool:
    """Whether each broker's own metadata lists ``topics`` (a new topic reaches them a moment
    after its creation is acknowledged, and the doctor may ask any of them)."""
    for node in layout.KAFKA_NODE_IDS:
        admin = _admin(layout.addr(layout.kafka_ports(node)["broker"]))
        known = admin.list_topics(timeout=10).topics
        if any(t not in known or known[t].error is not None for t in topics):
            return False
    return True


def _wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    """A changed topic setting reaches every broker's metadata a moment after it is
    acknowledged; DescribeConfigs may ask any broker."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the setting did not show within the time"
        time.sleep(0.2)


@pytest.fixture
def lossy_topics(stack):
    """A ready topic of the doctor's own (``doctor.lossy-PID``, shaped like the stack's, no time
    limit) and its queue ``default``'s band-2 topic with every setting that drops records
    (:data:`DROPPING`); both deleted afterwards. The stack's own topics are left alone."""
    from confluent_kafka.admin import NewTopic

    admin = _admin()
    base = f"doctor.lossy-{os.getpid()}"
    band = f"{base}.default.p2"  # leasework.queues.priorities.band_topic(base, "default", 2)
    good = {"min.insync.replicas": "2", "retention.ms": "-1"}
    specs = [
        NewTopic(base, 12, 3, config=good),
        NewTopic(band, 3, 3, config={"min.insync.replicas": "2", **DROPPING}),
    ]
    try:
        for future in admin.create_topics(specs, operation_timeout=30).values():
            future.result(30)
        _wait_for(lambda: _known_to_every_broker([base, band]))
        yield base, band
    finally:
        for future in admin.delete_topics([base, band], operation_timeout=30).values():
            try:
                future.result(30)
            except Exception as exc:  # one never made: nothing to delete
                print(f"deleting a doctor topic: {exc}")


def test_a_band_topic_that_drops_records_fails_each_setting(lossy_topics):
    base, band = lossy_topics
    settings = replace(stack_settings(), topic_ready=base)
    checks = by_name(doctor.gather_kafka(settings, Options(), queues=["default"]))
    assert_explained_failure(
        checks[f"kafka.unclean_election.{band}"], "unclean.leader.election.enable=true"
    )
    assert_explained_failure(checks[f"kafka.retention.{band}"], "retention.ms=3600000 (1h)")
    assert "below the bound 7d" in checks[f"kafka.retention.{band}"].found
    assert_explained_failure(
        checks[f"kafka.retention_bytes.{band}"], "retention.bytes=1048576 per partition"
    )
    assert_explained_failure(
        checks[f"kafka.cleanup_policy.{band}"], "cleanup.policy=compact,delete"
    )
    # the band is checked as fully as the ready topic; the ready topic of its own passes
    assert checks[f"kafka.replication.{band}"].status == OK
    for setting in ("topic", "unclean_election", "retention", "retention_bytes", "cleanup_policy"):
        assert checks[f"kafka.{setting}.{base}"].status == OK, checks[f"kafka.{setting}.{base}"]
    # the other bands were never made: a worker serving the queue makes them, so only a warning
    for level in (1, 3):
        missing = checks[f"kafka.topic.{base}.default.p{level}"]
        assert missing.status == doctor.WARN and "does not exist" in missing.found
    assert doctor.exit_status(list(checks.values())) == 1
    # a start is refused for the unclean election and the compaction, not for the retention
    verdict = preflight.decide(list(checks.values()), ())
    refused = {c.name for c in verdict.refused}
    assert {f"kafka.unclean_election.{band}", f"kafka.cleanup_policy.{band}"} <= refused
    assert not refused & {f"kafka.retention.{band}", f"kafka.retention_bytes.{band}"}


def test_a_setting_altered_on_a_live_topic_is_seen_and_its_restoring_too(lossy_topics):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    base, _ = lossy_topics
    settings = replace(stack_settings(), topic_ready=base)
    name = f"kafka.retention_bytes.{base}"
    admin = _admin()  # kept: a client collected while its futures wait destroys them

    def status() -> str:
        return by_name(doctor.gather_kafka(settings, Options(), queues=["default"]))[name].status

    def alter(operation: AlterConfigOpType, value: str | None) -> None:
        entry = ConfigEntry("retention.bytes", value, incremental_operation=operation)
        resource = ConfigResource(ResourceType.TOPIC, base, incremental_configs=[entry])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)

    assert status() == OK
    alter(AlterConfigOpType.SET, "1073741824")
    try:
        _wait_for(lambda: status() == FAIL)
        check = by_name(doctor.gather_kafka(settings, Options()))[name]
        assert_explained_failure(check, "retention.bytes=1073741824 per partition")
    finally:
        alter(AlterConfigOpType.DELETE, None)  # back to the brokers' default, -1
    _wait_for(lambda: status() == OK)


def test_the_queues_are_read_from_postgres(stack):
    checks = by_name(doctor.gather_kafka(stack_settings(), Options()))
    listed = checks["kafka.queues"]
    assert listed.status == OK and "default" in listed.found, listed
    unread = replace(
        stack_settings(), postgres_dsn="postgresql://leasework:leasework@127.0.0.1:3/leasework"
    )
    checks = by_name(doctor.gather_kafka(unread, Options()))
    assert checks["kafka.queues"].status == doctor.WARN
    assert "could not be read from Postgres" in checks["kafka.queues"].found
    # default's bands are checked still
    assert "kafka.cleanup_policy.jobs.ready.default.p1" in checks


def test_settings_that_cannot_be_read_are_unknown_never_ok(stack):
    # the broker's refusal of DescribeConfigs for one topic (here: it does not exist; on a
    # managed cluster: not authorized) becomes that topic's unknown settings
    admin = _admin()
    answers = doctor.describe_topic_configs(admin, ["jobs.ready", "doctor.absent"], 10.0)
    assert answers["jobs.ready"][0] is not None
    assert answers["jobs.ready"][0]["cleanup.policy"] == "delete"
    values, why = answers["doctor.absent"]
    assert values is None and "Unknown topic" in str(why)
    ready = admin.list_topics("jobs.ready", timeout=10).topics["jobs.ready"]
    facts = doctor.topic_facts("jobs.ready", True, ready, answers["doctor.absent"])
    checks = by_name(doctor.kafka_checks([facts], {}, Options(), "jobs.ready"))
    for setting in ("unclean_election", "retention", "retention_bytes", "cleanup_policy"):
        check = checks[f"kafka.{setting}.jobs.ready"]
        assert check.status == doctor.WARN and "unknown" in check.found, check
        assert "Unknown topic" in check.found
