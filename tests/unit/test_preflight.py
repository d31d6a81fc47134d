"""The start-up checks' decisions (leasework/preflight.py): which failures refuse a start,
which an override lets pass, what an unreachable dependency does, and how an override shows
(logs, /readyz, the metric)."""

from __future__ import annotations

import logging
import time

import pytest
import trio

from leasework import config, metrics, preflight
from leasework.doctor import FAIL, OK, WARN, Check
from leasework.health import Health
from leasework.preflight import Preflight, Refused, allowed, decide

SYNC = Check("postgres.synchronous_commit", FAIL, "synchronous_commit=off", "loses jobs", "on")
REPLICATION = Check("kafka.replication.jobs.ready", FAIL, "replication factor 1", "w", "f")
MIN_INSYNC = Check("kafka.min_insync.jobs.dlq", FAIL, "min.insync.replicas=1", "w", "f")
TOKENS = Check("postgres.tokens", FAIL, "no live API token", "w", "f")
PARTITIONS = Check("kafka.partitions.jobs.ready", WARN, "3 partitions, expected 12", "w", "f")
REDIS_DOWN = Check("redis", FAIL, "cannot reach Redis at 127.0.0.1:1: refused", "w", "f")
POSTGRES_DOWN = Check("postgres", FAIL, "cannot reach Postgres: refused", "w", "f")
FINE = Check("redis.eviction", OK, "maxmemory-policy noeviction")


def names(checks) -> list[str]:
    return [c.name for c in checks]


def test_a_failure_refuses_and_nothing_else_does():
    verdict = decide([FINE, SYNC, PARTITIONS, TOKENS, REDIS_DOWN], ())
    assert names(verdict.refused) == ["postgres.synchronous_commit"]
    # a warning, and a failure that loses nothing (no token: the api refuses requests), are
    # reported only
    assert names(verdict.noted) == ["kafka.partitions.jobs.ready", "postgres.tokens"]
    # an unreachable dependency never refuses: its checks are deferred
    assert names(verdict.unreachable) == ["redis"]
    assert verdict.overridden == ()


def test_all_good_is_an_empty_verdict():
    assert decide([FINE], ()) == preflight.Verdict()


@pytest.mark.parametrize(
    "allow",
    [
        ("postgres.synchronous_commit",),
        ("postgres",),  # a dotted prefix
        ("all",),
        ("kafka.replication", "postgres.synchronous_commit"),
    ],
)
def test_an_override_lets_its_failure_pass(allow):
    verdict = decide([SYNC], allow)
    assert verdict.refused == () and names(verdict.overridden) == [SYNC.name]


@pytest.mark.parametrize(
    "allow",
    [
        (),
        ("postgres.synchronous",),  # a prefix only counts at a dot
        ("kafka.replication",),
        ("single-replica",),
        ("postgres.synchronous_commit.x",),
    ],
)
def test_an_override_of_something_else_does_not(allow):
    assert names(decide([SYNC], allow).refused) == [SYNC.name]


def test_single_replica_overrides_both_replication_checks_only():
    verdict = decide([REPLICATION, MIN_INSYNC, SYNC], ("single-replica",))
    assert names(verdict.overridden) == [REPLICATION.name, MIN_INSYNC.name]
    assert names(verdict.refused) == [SYNC.name]
    assert allowed("kafka.min_insync.jobs.ready", ["single-replica"])
    assert not allowed("kafka.producer", ["single-replica"])


def test_an_override_does_not_make_an_unreachable_dependency_a_pass():
    assert names(decide([REDIS_DOWN], ("all",)).unreachable) == ["redis"]


def test_the_refusal_names_the_override_that_would_start_it():
    message = preflight.refusal([SYNC, REPLICATION])
    assert "refusing to start: 2 start-up check(s)" in message
    assert (
        "LEASEWORK_DOCTOR_ALLOW=postgres.synchronous_commit,kafka.replication.jobs.ready" in message
    )


def test_the_setting():
    load = lambda raw: config.load("relay", {"LEASEWORK_DOCTOR_ALLOW": raw}).doctor_allow  # noqa: E731
    assert load(" kafka.replication , postgres.synchronous_commit") == (
        "kafka.replication",
        "postgres.synchronous_commit",
    )
    assert load("single-replica,all") == ("single-replica", "all")
    assert config.load("relay", {}).doctor_allow == ()
    for wrong in ("yes", "mysql.version", "postgres synchronous_commit", "Postgres"):
        with pytest.raises(config.ConfigError, match="names no start-up check"):
            load(wrong)
    assert "doctor_allow" in config.known_keys()
    rows = {r[0]: r for r in config.effective("relay", {"LEASEWORK_DOCTOR_ALLOW": "all"})}
    assert rows["doctor_allow"][1:] == ("all", "env")


def test_readyz_lists_overrides_and_stays_ready():
    health = Health()
    health.overridden.append({"check": SYNC.name, "found": SYNC.found})
    body, status = health.readiness("p", detail=True)
    assert status == 200 and body["status"] == "ready"
    assert body["overridden"] == [{"check": SYNC.name, "found": SYNC.found}]
    public, _ = health.readiness("p", detail=False)  # a port that may face a network
    assert public["overridden"] == [{"check": SYNC.name}]
    assert "overridden" not in Health().readiness("p", detail=True)[0]


def settings(allow: tuple[str, ...] = ()) -> config.Settings:
    return config.Settings(role="relay", process_name="t", doctor_allow=allow)


def fake(monkeypatch, answers: dict[str, list]) -> None:
    """Gatherers that answer from ``answers`` (name -> a list of answers, one per call; a
    callable is called instead)."""

    def gatherers(_settings):
        def one(name):
            def call():
                answer = answers[name].pop(0) if len(answers[name]) > 1 else answers[name][0]
                return answer() if callable(answer) else answer

            return call

        return {name: one(name) for name in answers}

    monkeypatch.setattr(preflight, "gatherers", gatherers)


async def test_an_override_is_logged_shown_and_measured(monkeypatch, caplog):
    fake(monkeypatch, {"postgres": [[SYNC]], "redis": [[FINE]]})
    health = Health()
    checks = Preflight(settings(("postgres.synchronous_commit",)), health)
    with caplog.at_level(logging.WARNING, "leasework.preflight"):
        await checks.start(["postgres", "redis"])
    assert health.overridden == [{"check": SYNC.name, "found": SYNC.found}]
    assert metrics.doctor_overridden.labels(SYNC.name)._value.get() == 1
    warning = next(r for r in caplog.records if "OVERRIDDEN" in r.getMessage())
    assert warning.levelno == logging.WARNING and warning.check == SYNC.name
    assert checks.pending == () and checks.refused == ()


async def test_a_refused_start_raises_with_the_failures(monkeypatch, caplog):
    fake(monkeypatch, {"postgres": [[SYNC, TOKENS]]})
    with caplog.at_level(logging.ERROR, "leasework.preflight"), pytest.raises(Refused) as raised:
        await Preflight(settings(), Health()).start(["postgres"])
    assert names(raised.value.checks) == [SYNC.name]
    assert "LEASEWORK_DOCTOR_ALLOW=postgres.synchronous_commit" in str(raised.value)
    error = next(r for r in caplog.records if r.levelno == logging.ERROR)
    assert error.found == SYNC.found and error.why and error.fix
    lines = preflight.failure_lines(raised.value.checks)
    assert lines[0] == "[FAIL] postgres.synchronous_commit: synchronous_commit=off"


async def test_a_slow_or_broken_gatherer_counts_as_unreachable(monkeypatch):
    def broken():
        raise RuntimeError("a bug")

    fake(monkeypatch, {"kafka": [lambda: time.sleep(2) or [FINE]], "redis": [broken]})
    began = trio.current_time()
    checks = await preflight.gather(settings(), ["kafka", "redis"], budget=0.2)
    assert trio.current_time() - began < 1.5  # the budget bounds the start, not the thread
    assert [(c.name, c.status) for c in checks] == [("kafka", FAIL), ("redis", FAIL)]
    assert "no answer within 0.2s" in checks[0].found
    assert "a bug" in checks[1].found
    verdict = decide(checks, ())
    assert verdict.refused == () and names(verdict.unreachable) == ["kafka", "redis"]


async def test_unreachable_at_start_is_checked_once_it_answers(monkeypatch):
    monkeypatch.setattr(preflight, "DEFER_INTERVAL", 0.01)
    # redis: down at start, down once more, then up and misconfigured
    fake(monkeypatch, {"redis": [[REDIS_DOWN], [REDIS_DOWN], [REDIS_DOWN], [SYNC]]})
    health = Health()
    checks = Preflight(settings(), health)
    await checks.start(["redis"])  # does not refuse
    assert checks.pending == ("redis",)
    drained: list[str] = []
    with trio.fail_after(5):
        await checks.run_deferred(drained.append)
    assert drained == ["start-up checks failed"]
    assert names(checks.refused) == [SYNC.name]
    assert "LEASEWORK_DOCTOR_ALLOW=postgres.synchronous_commit" in health.conditions["preflight"]


async def test_deferred_checks_that_pass_or_are_overridden_stop_quietly(monkeypatch):
    monkeypatch.setattr(preflight, "DEFER_INTERVAL", 0.01)
    fake(monkeypatch, {"postgres": [[POSTGRES_DOWN], [SYNC]]})
    health = Health()
    checks = Preflight(settings(("all",)), health)
    await checks.start(["postgres"])
    drained: list[str] = []
    with trio.fail_after(5):
        await checks.run_deferred(drained.append)
    assert drained == [] and checks.pending == () and checks.refused == ()
    assert [o["check"] for o in health.overridden] == [SYNC.name]
