"""leasework doctor's pure checks: right facts pass, wrong facts fail (or warn) and say why."""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace

import pytest

from leasework import doctor
from leasework.doctor import FAIL, OK, WARN, Check, Options, PostgresFacts, RedisFacts, TopicFacts
from leasework.kafka import producer_config

GOOD_TOPIC = TopicFacts("jobs.ready", True, partitions=12, replication=3, min_insync=2)
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
    failing = [Check("c", FAIL, "broken", "why", "fix")]
    monkeypatch.setattr(doctor, "run_checks", lambda settings, options: failing)
    assert doctor.run(argparse.Namespace(json=True, allow_single_replica=False, partitions=12), {})
    printed = json.loads(capsys.readouterr().out)
    assert printed["checks"][0]["status"] == FAIL
