"""leasework doctor's pure checks: right facts pass, wrong facts fail (or warn) and say why."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace

import pytest

from leasework import doctor, preflight
from leasework.doctor import FAIL, OK, WARN, Check, Options, PostgresFacts, RedisFacts, TopicFacts
from leasework.kafka import producer_config

DAY_MS = 86_400_000
GOOD_TOPIC = TopicFacts(
    "jobs.ready",
    True,
    partitions=12,
    replication=3,
    min_insync=2,
    unclean_election=False,
    retention_ms=7 * DAY_MS,
    retention_bytes=-1,
    cleanup_policy="delete",
)
# what DescribeConfigs answers when it is denied or times out: every setting unknown
UNREADABLE = replace(
    GOOD_TOPIC,
    min_insync=None,
    unclean_election=None,
    retention_ms=None,
    retention_bytes=None,
    cleanup_policy=None,
    configs_error="DescribeConfigs failed: Broker: Topic authorization failed",
)
GOOD_REDIS = RedisFacts("yes", "", "noeviction", 0.01)
FILES = [(1, "jobs", "a"), (2, "api", "b")]
GOOD_PG = PostgresFacts(
    server_version_num=150018,
    server_version="15.18",
    synchronous_commit="on",
    applied={1: "a", 2: "b"},
    expected=FILES,
    clock_offset=0.0,
    live_tokens=2,
)


def explained(check: Check) -> None:
    assert check.found and check.why and check.fix


def test_topic_exists():
    assert doctor.check_topic_exists(GOOD_TOPIC).status == OK
    missing = doctor.check_topic_exists(TopicFacts("jobs.missing", False))
    assert missing.status == FAIL and "jobs.missing does not exist" in missing.found
    explained(missing)
    leaderless = doctor.check_topic_exists(replace(GOOD_TOPIC, leaderless=2))
    assert leaderless.status == FAIL and "2 of 12" in leaderless.found


def test_partitions():
    assert doctor.check_partitions(GOOD_TOPIC, 12).status == OK
    assert doctor.check_partitions(GOOD_TOPIC, None).status == OK  # only reported
    wrong = doctor.check_partitions(replace(GOOD_TOPIC, partitions=3), 12)
    assert wrong.status == WARN and "3 partitions, expected 12" in wrong.found
    explained(wrong)


@pytest.mark.parametrize("replication", [1, 2])
def test_replication_below_three_fails(replication):
    check = doctor.check_replication(replace(GOOD_TOPIC, replication=replication))
    assert check.status == FAIL and f"replication factor {replication}" in check.found
    explained(check)


def test_replication_three_passes():
    assert doctor.check_replication(GOOD_TOPIC).status == OK


@pytest.mark.parametrize("min_insync", [1, None])
def test_min_insync_below_two_fails(min_insync):
    check = doctor.check_min_insync(replace(GOOD_TOPIC, min_insync=min_insync))
    assert check.status == FAIL
    explained(check)


def test_min_insync_two_passes():
    assert doctor.check_min_insync(GOOD_TOPIC).status == OK


def test_override_turns_replication_failures_into_logged_warnings(caplog):
    weak = replace(GOOD_TOPIC, replication=1, min_insync=1)
    with caplog.at_level(logging.WARNING, "leasework.doctor"):
        checks = [doctor.check_replication(weak, True), doctor.check_min_insync(weak, True)]
    assert [c.status for c in checks] == [WARN, WARN]
    assert all("OVERRIDE IN FORCE" in c.found for c in checks)
    assert "override" in caplog.text
    # the override does not touch other failures
    missing = doctor.kafka_checks(
        [TopicFacts("jobs.ready", False)], {}, Options(allow_single_replica=True), "jobs.ready"
    )
    assert all(c.status == FAIL for c in missing)


def test_allow_from_env():
    assert doctor.allow_from_env({"LEASEWORK_DOCTOR_ALLOW": "single-replica"})
    assert doctor.allow_from_env({"LEASEWORK_DOCTOR_ALLOW": "x, single-replica"})
    assert not doctor.allow_from_env({"LEASEWORK_DOCTOR_ALLOW": "yes"})
    assert not doctor.allow_from_env({})


def test_producer_config_of_the_product_passes():
    assert doctor.check_producer(producer_config(["h:1"], "x")).status == OK


@pytest.mark.parametrize(
    "config",
    [
        {"acks": "1", "enable.idempotence": True},
        {"acks": "all", "enable.idempotence": False},
        {"acks": "all"},
        {},
    ],
)
def test_producer_without_acks_all_or_idempotence_fails(config):
    check = doctor.check_producer(config)
    assert check.status == FAIL
    explained(check)


def test_redis_persistence():
    assert doctor.check_redis_persistence(GOOD_REDIS).status == OK
    rdb = doctor.check_redis_persistence(replace(GOOD_REDIS, appendonly="no", save="3600 1"))
    assert rdb.status == WARN and "RDB" in rdb.found
    none = doctor.check_redis_persistence(replace(GOOD_REDIS, appendonly="no", save=""))
    assert none.status == FAIL and "no persistence" in none.found
    explained(none)
    unknown = doctor.check_redis_persistence(replace(GOOD_REDIS, appendonly=None, save=None))
    assert unknown.status == WARN


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl", "allkeys-random"])
def test_redis_eviction_policy_other_than_noeviction_fails(policy):
    check = doctor.check_redis_eviction(replace(GOOD_REDIS, maxmemory_policy=policy))
    assert check.status == FAIL and policy in check.found
    explained(check)


def test_redis_noeviction_passes():
    assert doctor.check_redis_eviction(GOOD_REDIS).status == OK


@pytest.mark.parametrize(
    ("offset", "status"),
    [(0.0, OK), (0.5, OK), (-0.6, WARN), (2.5, WARN), (2.6, FAIL), (-30.0, FAIL)],
)
def test_clock_thresholds_of_a_ten_second_lease(offset, status):
    # warn above ttl/20 = 0.5 s, fail above ttl/4 = 2.5 s
    check = doctor.check_clock("redis.clock", "Redis", offset, 10.0)
    assert check.status == status
    if status != OK:
        explained(check)


def test_postgres_version():
    assert doctor.check_postgres_version(GOOD_PG).status == OK
    old = doctor.check_postgres_version(replace(GOOD_PG, server_version_num=140010))
    assert old.status == FAIL
    explained(old)


@pytest.mark.parametrize("value", ["off", "local"])
def test_synchronous_commit_off_or_local_fails(value):
    check = doctor.check_synchronous_commit(replace(GOOD_PG, synchronous_commit=value))
    assert check.status == FAIL and value in check.found
    explained(check)


@pytest.mark.parametrize("value", ["on", "remote_apply", "remote_write"])
def test_synchronous_commit_durable_values_pass(value):
    assert doctor.check_synchronous_commit(replace(GOOD_PG, synchronous_commit=value)).status == OK


def test_migrations():
    assert doctor.check_migrations(GOOD_PG).status == OK
    pending = doctor.check_migrations(replace(GOOD_PG, applied={1: "a"}))
    assert pending.status == FAIL and "pending migrations [2]" in pending.found
    explained(pending)
    never = doctor.check_migrations(replace(GOOD_PG, applied=None))
    assert never.status == FAIL and "never migrated" in never.found
    ahead = doctor.check_migrations(replace(GOOD_PG, applied={1: "a", 2: "b", 3: "c"}))
    assert ahead.status == WARN and "[3]" in ahead.found
    changed = doctor.check_migrations(replace(GOOD_PG, applied={1: "a", 2: "x"}))
    assert changed.status == WARN and "changed" in changed.found


def test_tokens():
    assert doctor.check_tokens(GOOD_PG).status == OK
    for count in (0, None):
        check = doctor.check_tokens(replace(GOOD_PG, live_tokens=count))
        assert check.status == FAIL
        explained(check)


def test_good_facts_give_only_ok_checks():
    checks = [
        *doctor.kafka_checks([GOOD_TOPIC], producer_config(["h:1"], "x"), Options(), "jobs.ready"),
        *doctor.redis_checks(GOOD_REDIS, 10.0),
        *doctor.postgres_checks(GOOD_PG, 10.0),
    ]
    assert {c.status for c in checks} == {OK}
    assert doctor.exit_status(checks) == 0


def test_render_and_exit_status():
    checks = [
        doctor.ok("a", "fine"),
        Check("b", WARN, "meh", "because", "do this"),
        Check("c", FAIL, "broken", "it loses jobs", "fix that"),
    ]
    text = doctor.render(checks)
    assert "[ok  ] a: fine" in text
    assert "why: it loses jobs" in text and "fix: fix that" in text
    assert "why: because" in text
    assert text.splitlines()[-1] == "doctor FAILED: 1 ok, 1 warning(s), 1 failed"
    assert doctor.exit_status(checks) == 1
    assert doctor.exit_status(checks[:2]) == 0


def test_unreachable_is_a_failure_naming_the_dependency():
    check = doctor.unreachable("redis", "Redis at h:1", "refused", "start it")
    assert check.status == FAIL and "cannot reach Redis at h:1: refused" in check.found


def test_dsn_options_are_kept_for_the_doctors_connection():
    kwargs = doctor.connect_kwargs("postgresql://u@h/db?options=-c%20synchronous_commit%3Doff")
    assert "-c synchronous_commit=off" in kwargs["options"]
    assert "statement_timeout" in kwargs["options"]


def test_doctor_arguments_and_json(monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    doctor.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor", "--json", "--allow-single-replica"])
    assert args.command == "doctor" and args.json and args.allow_single_replica
    assert args.partitions == doctor.DEFAULT_READY_PARTITIONS
    assert args.min_retention == doctor.DEFAULT_MIN_RETENTION == 7 * 86400
    failing = [Check("c", FAIL, "broken", "why", "fix")]
    monkeypatch.setattr(doctor, "run_checks", lambda settings, options: failing)
    assert doctor.run(
        argparse.Namespace(
            json=True, allow_single_replica=False, partitions=12, min_retention=86400.0
        ),
        {},
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed["checks"][0]["status"] == FAIL


# ------------------------------------------------------- what makes Kafka drop records


def test_unclean_leader_election():
    assert doctor.check_unclean_election(GOOD_TOPIC).status == OK
    unclean = doctor.check_unclean_election(replace(GOOD_TOPIC, unclean_election=True))
    assert unclean.status == FAIL and "unclean.leader.election.enable=true" in unclean.found
    assert "acknowledged ones included" in unclean.why
    explained(unclean)
    unknown = doctor.check_unclean_election(UNREADABLE)
    assert unknown.status == WARN and "unknown" in unknown.found
    assert "Topic authorization failed" in unknown.found and "DESCRIBE_CONFIGS" in unknown.fix
    explained(unknown)


@pytest.mark.parametrize(
    ("retention_ms", "status"),
    [
        (-1, OK),  # no time limit
        (7 * DAY_MS, OK),  # the bound itself
        (30 * DAY_MS, OK),
        (7 * DAY_MS - 1, FAIL),
        (DAY_MS, FAIL),  # the dev stack's 24 h
        (0, FAIL),
    ],
)
def test_retention_time_against_the_default_bound_of_seven_days(retention_ms, status):
    check = doctor.check_retention_time(replace(GOOD_TOPIC, retention_ms=retention_ms), 7 * 86400)
    assert check.status == status, check
    if status == FAIL:
        assert f"retention.ms={retention_ms}" in check.found and "below the bound 7d" in check.found
        assert "retention.ms=604800000" in check.fix
        explained(check)


def test_retention_time_bound_is_an_option():
    one_day = replace(GOOD_TOPIC, retention_ms=DAY_MS)
    assert doctor.check_retention_time(one_day, 86400).status == OK
    assert doctor.check_retention_time(one_day, 86400 + 1).status == FAIL
    checks = doctor.kafka_checks([one_day], {}, Options(min_retention=86400), "jobs.ready")
    assert {c.name: c.status for c in checks}["kafka.retention.jobs.ready"] == OK
    checks = doctor.kafka_checks([one_day], {}, Options(), "jobs.ready")
    assert {c.name: c.status for c in checks}["kafka.retention.jobs.ready"] == FAIL


def test_retention_time_unknown_warns():
    check = doctor.check_retention_time(UNREADABLE, 7 * 86400)
    assert check.status == WARN and check.found.startswith("retention.ms unknown")
    assert "-1 or at least 604800000 (7d)" in check.fix
    explained(check)


@pytest.mark.parametrize(("retention_bytes", "status"), [(-1, OK), (0, FAIL), (10**12, FAIL)])
def test_any_finite_retention_bytes_fails(retention_bytes, status):
    check = doctor.check_retention_size(replace(GOOD_TOPIC, retention_bytes=retention_bytes))
    assert check.status == status
    if status == FAIL:
        assert f"retention.bytes={retention_bytes} per partition" in check.found
        assert "retention.bytes=-1" in check.fix
        explained(check)
    unknown = doctor.check_retention_size(UNREADABLE)
    assert unknown.status == WARN and unknown.found.startswith("retention.bytes unknown")


@pytest.mark.parametrize(
    ("policy", "status"),
    [
        ("delete", OK),
        ("compact", FAIL),
        ("compact,delete", FAIL),
        ("delete,compact", FAIL),
        ("", OK),  # Kafka 4.2+: no cleanup at all, records kept for ever
        (None, WARN),
    ],
)
def test_cleanup_policy_must_be_delete(policy, status):
    check = doctor.check_cleanup_policy(replace(GOOD_TOPIC, cleanup_policy=policy))
    assert check.status == status, check
    if status == FAIL:
        assert f"cleanup.policy={policy}" in check.found and "cleanup.policy=delete" in check.fix
        explained(check)
    if status == WARN:
        assert "unknown" in check.found
        explained(check)


def test_an_empty_cleanup_policy_deletes_nothing_so_retention_does_not_apply():
    forever = replace(GOOD_TOPIC, cleanup_policy="", retention_ms=DAY_MS, retention_bytes=1)
    assert doctor.check_retention_time(forever, 7 * 86400).status == OK
    assert doctor.check_retention_size(forever).status == OK


def test_min_insync_unread_says_why():
    check = doctor.check_min_insync(UNREADABLE)
    assert check.status == FAIL and "Topic authorization failed" in check.found


def test_unknown_settings_warn_and_are_not_fatal_for_the_doctor_or_a_start():
    checks = doctor.kafka_checks([UNREADABLE], {}, Options(), "jobs.ready")
    by_name = {c.name: c.status for c in checks}
    for setting in ("unclean_election", "retention", "retention_bytes", "cleanup_policy"):
        assert by_name[f"kafka.{setting}.jobs.ready"] == WARN
    loss = [c for c in checks if c.name.split(".")[1] in ("unclean_election", "retention")]
    assert doctor.exit_status(loss) == 0
    assert doctor.summary(loss).startswith("doctor passed: 0 ok, 2 warning(s)")
    verdict = preflight.decide(loss, ())
    assert verdict.refused == () and len(verdict.noted) == 2


def test_every_topic_gets_the_loss_checks():
    band = replace(GOOD_TOPIC, name="jobs.ready.emails.p2", required=False, retention_bytes=5)
    checks = doctor.kafka_checks([GOOD_TOPIC, band], {}, Options(), "jobs.ready")
    failed = [c.name for c in checks if c.status != OK]
    assert failed == ["kafka.retention_bytes.jobs.ready.emails.p2", "kafka.producer"]
    names = {c.name for c in checks}
    assert "kafka.cleanup_policy.jobs.ready.emails.p2" in names
    assert "kafka.min_insync.jobs.ready.emails.p2" in names


def test_a_missing_band_topic_warns_where_a_missing_ready_topic_fails():
    band = doctor.check_topic_exists(TopicFacts("jobs.ready.emails.p1", False, required=False))
    assert band.status == WARN and "does not exist" in band.found
    assert "worker serving the queue" in band.fix
    explained(band)
    checks = doctor.kafka_checks(
        [TopicFacts("jobs.ready.emails.p1", False, required=False)], {}, Options(), "jobs.ready"
    )
    assert [c.name for c in checks] == ["kafka.topic.jobs.ready.emails.p1", "kafka.producer"]
    assert doctor.check_topic_exists(TopicFacts("jobs.ready", False)).status == FAIL


def test_topic_settings_read_from_describe_configs():
    answer = {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "false",
        "retention.ms": "-1",
        "retention.bytes": "1073741824",
        "cleanup.policy": "compact,delete",
        "segment.bytes": "67108864",
    }
    assert doctor.topic_settings(answer) == {
        "min_insync": 2,
        "unclean_election": False,
        "retention_ms": -1,
        "retention_bytes": 1073741824,
        "cleanup_policy": "compact,delete",
    }
    garbled = {"unclean.leader.election.enable": "maybe", "retention.ms": None}
    assert doctor.topic_settings(garbled) == {
        "min_insync": None,
        "unclean_election": None,
        "retention_ms": None,
        "retention_bytes": None,
        "cleanup_policy": None,
    }
    assert doctor.topic_settings({"unclean.leader.election.enable": "TRUE"})["unclean_election"]


def test_topics_to_check_are_every_band_of_every_queue_and_the_dead_letters():
    topics = doctor.topics_to_check("jobs.ready", "jobs.dlq", ["emails", "default"])
    assert topics == [
        ("jobs.ready", True),
        ("jobs.dlq", True),
        ("jobs.ready.default.p1", False),
        ("jobs.ready.default.p2", False),
        ("jobs.ready.default.p3", False),
        ("jobs.ready.emails", False),
        ("jobs.ready.emails.p1", False),
        ("jobs.ready.emails.p2", False),
        ("jobs.ready.emails.p3", False),
    ]
    # the queues unknown: default's bands still, as the ready topic is default's first band
    assert [t for t, _ in doctor.topics_to_check("r", "d", [])] == [
        "r",
        "d",
        "r.default.p1",
        "r.default.p2",
        "r.default.p3",
    ]


def test_the_queues_checked_are_said_and_unread_queues_warn():
    listed = doctor.check_queues(["default", "emails"], None)
    assert listed.status == OK and "2 queue(s) in Postgres (default, emails)" in listed.found
    many = doctor.check_queues([f"q{i}" for i in range(12)], None)
    assert "q9 and 2 more" in many.found
    unread = doctor.check_queues(None, 'relation "queues" does not exist')
    assert unread.status == WARN and 'relation "queues" does not exist' in unread.found
    explained(unread)


def test_retention_failures_are_reported_at_start_and_the_others_refuse():
    lossy = replace(
        GOOD_TOPIC,
        unclean_election=True,
        retention_ms=DAY_MS,
        retention_bytes=10**9,
        cleanup_policy="compact",
    )
    producer = producer_config(["h:1"], "x")
    checks = doctor.kafka_checks([lossy], producer, Options(), "jobs.ready")
    verdict = preflight.decide(checks, ())
    # a worker refused a start only lets the backlog grow older and bigger, which is what
    # retention deletes; Postgres holds the jobs and leasework republishes them
    assert sorted(c.name for c in verdict.noted) == [
        "kafka.retention.jobs.ready",
        "kafka.retention_bytes.jobs.ready",
    ]
    assert sorted(c.name for c in verdict.refused) == [
        "kafka.cleanup_policy.jobs.ready",
        "kafka.unclean_election.jobs.ready",
    ]
    assert not preflight.blocking("kafka.retention.jobs.ready.emails.p1")
    assert preflight.blocking("kafka.retention")  # a prefix, not a check of a topic
    assert preflight.blocking("kafka.retentions.jobs.ready")


def test_min_retention_argument():
    parser = argparse.ArgumentParser()
    doctor.add_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["doctor", "--min-retention", "36h"]).min_retention == 36 * 3600
    assert parser.parse_args(["doctor", "--min-retention", "3d"]).min_retention == 3 * 86400
    for bad in ("0", "soon", "-1d"):
        with pytest.raises(SystemExit):
            parser.parse_args(["doctor", "--min-retention", bad])
