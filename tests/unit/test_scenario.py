"""Scenario files: loading, errors that name the file and the field, the seeded fault mix and
the workload's plan."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from chaos import nemeses
from chaos.generator import RECEIPT_JOB_TYPE, plan_submits, random_schedule
from chaos.loader import ScenarioError, load_scenario, load_scenarios
from chaos.nemeses import FAULTS
from chaos.nemeses.base import WAIT_GAUGES, WORKERS, WaitFor, fault_workers
from chaos.scenario import MIX_KINDS, Expectations, Mix, WorkloadSpec


def target_problem(fault: str, target: str | None) -> str | None:
    return nemeses.lookup(fault).target_problem(target)


SAMPLE = """
name = "stalled-worker"
description = "SIGSTOP a worker past its lease while it holds ledger jobs."

[workload]
rate = 20.0
duration = 60.0
ledger_seconds = 3.0
fail_times = 2
fail_max_attempts = 5

[workload.mix]
noop = 4
delayed = 2
fail = 2
ledger = 2

[[faults]]
at = 40.0
duration = 5.0
fault = "latency"
target = "postgres"
params = { latency = 500, jitter = 100, stream = "both" }

[[faults]]
at = 10.0
duration = 20.0
fault = "sigstop"
target = "worker-1"

[[faults]]
at = 50
fault = "redis_flushall"

[[faults]]
at = 52
duration = 4
fault = "reset_peer"
target = "worker-2/kafka-3"

[expect]
max_lost = 0
max_doubled = 0
recovery_seconds = 30
alerts = ["LeaseworkFenceRejections"]
"""

MINIMAL = 'name = "x"\n[workload]\nrate = 1\nduration = 10\n'


def write(tmp_path: Path, text: str, name: str = "scenario.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_sample_scenario_loads(tmp_path):
    scenario = load_scenario(write(tmp_path, SAMPLE))
    assert scenario.name == "stalled-worker"
    assert scenario.source.endswith("scenario.toml")
    assert scenario.fencing is True and scenario.lease_mode == "fenced"
    w = scenario.workload
    assert (w.rate, w.duration, w.ledger_seconds) == (20.0, 60.0, 3.0)
    assert w.mix == Mix(noop=4.0, delayed=2.0, fail=2.0, ledger=2.0)
    assert w.fail_may_die is False
    # sorted by start time; defaults filled in
    assert [f.fault for f in scenario.faults] == [
        "sigstop",
        "latency",
        "redis_flushall",
        "reset_peer",
    ]
    sigstop, latency, flush, reset = scenario.faults
    assert (sigstop.at, sigstop.stop, sigstop.target, sigstop.kind) == (
        10.0,
        30.0,
        "worker-1",
        "process",
    )
    assert latency.params == {"latency": 500, "jitter": 100, "stream": "both"}
    assert (flush.duration, flush.target) == (0.0, "redis")
    assert reset.target == "worker-2/kafka-3"
    assert scenario.expect == Expectations(
        recovery_seconds=30.0, alerts=("LeaseworkFenceRejections",)
    )
    assert scenario.fault_names == ("sigstop", "latency", "redis_flushall", "reset_peer")


def test_the_unsafe_run_declares_fencing_off(tmp_path):
    text = MINIMAL.replace('name = "x"', 'name = "x"\nfencing = false') + (
        "[expect]\nexpect_doubled = true\n"
    )
    scenario = load_scenario(write(tmp_path, text))
    assert scenario.fencing is False and scenario.lease_mode == "unsafe-plain-ttl"
    assert scenario.expect.expect_doubled is True


SHOP = 'name = "x"\n[workload]\nrate = 1\nduration = 10\n[workload.mix]\nreceipt = 1\n'


def test_a_run_may_pick_the_shops_mail_guard_and_without_the_fence_expect_doubles(tmp_path):
    plain = load_scenario(write(tmp_path, SHOP))
    assert plain.mail_guard is None and plain.mail_fenced
    fenced = load_scenario(
        write(tmp_path, SHOP.replace('name = "x"', 'name = "x"\nmail_guard = " fence"'))
    )
    assert fenced.mail_guard == "fence" and fenced.mail_fenced
    open_text = SHOP.replace('name = "x"', 'name = "x"\nmail_guard = "none"')
    unguarded = load_scenario(write(tmp_path, open_text + "[expect]\nexpect_doubled = true\n"))
    assert unguarded.mail_guard == "none" and not unguarded.mail_fenced
    assert unguarded.expect.expect_doubled and unguarded.fencing


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        (
            SHOP.replace('name = "x"', 'name = "x"\nmail_guard = "fence,smtp"'),
            "mail_guard",
            "comma list of key, fence, or none",
        ),
        (
            MINIMAL.replace('name = "x"', 'name = "x"\nmail_guard = "fence"'),
            "mail_guard",
            "places no orders",
        ),
        (
            SHOP.replace('name = "x"', 'name = "x"\nmail_guard = "key,fence"')
            + "[expect]\nexpect_doubled = true\n",
            "expect.expect_doubled",
            "mail_guard without fence",
        ),
        ('description = "no name"\n[workload]\nrate = 1\nduration = 1\n', "name", "required"),
        ('name = "x"\n', "workload", "required"),
        (MINIMAL + "ratee = 3\n", "workload.ratee", "unknown field"),
        (MINIMAL.replace("rate = 1", "rate = 0"), "workload.rate", "> 0"),
        (MINIMAL.replace("rate = 1", 'rate = "fast"'), "workload.rate", "number"),
        (MINIMAL + "fail_times = 1.5\n", "workload.fail_times", "integer"),
        (MINIMAL + "[workload.mix]\nnoop = 0\n", "workload.mix.noop", "positive"),
        (MINIMAL + "[workload.mix]\nsleepy = 1\n", "workload.mix.sleepy", "unknown field"),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "meteor"\ntarget = "api"\n',
            "faults[0].fault",
            "not a fault",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "latency"\ntarget = "mysql"\n'
            "params = { latency = 100 }\n",
            "faults[0].target",
            "not a toxiproxy proxy",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "latency"\ntarget = "redis"\n',
            "faults[0].params.latency",
            "required",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "sigstop"\n',
            "faults[0].target",
            "required",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 0\nfault = "sigstop"\ntarget = "relay"\n',
            "faults[0].duration",
            "> 0",
        ),
        (
            MINIMAL
            + '[[faults]]\nat = 1\nduration = 2\nfault = "kafka_kill"\ntarget = "kafka-4"\n',
            "faults[0].target",
            "Kafka node",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "sigkill"\ntarget = "api"\n'
            "params = { signal = 9 }\n",
            "faults[0].params.signal",
            "takes no params",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "bandwidth"\ntarget = "redis"\n'
            'params = { rate = 8, stream = "sideways" }\n',
            "faults[0].params.stream",
            "upstream",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "sigkill"\ntarget = "worker-1"\n'
            'wait_for = { gauge = "cpu" }\n',
            "faults[0].wait_for.gauge",
            "completer_waiting",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "sigkill"\ntarget = "worker-1"\n'
            "wait_for = { at_least = 3 }\n",
            "faults[0].wait_for.gauge",
            "required",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "sigkill"\ntarget = "worker-1"\n'
            'wait_for = { gauge = "completer_waiting", at_least = 0 }\n',
            "faults[0].wait_for.at_least",
            "> 0",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "sigkill"\ntarget = "worker-1"\n'
            'wait_for = { gauge = "completer_waiting", patience = 601 }\n',
            "faults[0].wait_for.patience",
            "<= 600",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "sigkill"\ntarget = "worker-1"\n'
            'wait_for = { gauge = "completer_waiting", atleast = 5 }\n',
            "faults[0].wait_for.atleast",
            "unknown field",
        ),
        (
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "sigkill"\ntarget = "worker-1"\n'
            "wait_for = 20\n",
            "faults[0].wait_for",
            "must be a table",
        ),
        (
            # a toxic's wait is the fault's, not one of Toxiproxy's attributes
            MINIMAL + '[[faults]]\nat = 1\nduration = 2\nfault = "reset_peer"\n'
            'target = "worker-1/postgres"\nparams = { wait_for = "completer_waiting" }\n',
            "faults[0].params.wait_for",
            "unknown field",
        ),
        (MINIMAL + "[expect]\nexpect_doubled = true\n", "expect.expect_doubled", "fencing"),
        (MINIMAL + "[expect]\nmax_lost = -1\n", "expect.max_lost", ">= 0"),
        (MINIMAL + '[expect]\nalerts = "X"\n', "expect.alerts", "list"),
        (MINIMAL + '[random_faults]\nfaults = ["latency"]\n', "random_faults.seed", "required"),
        ("surprise = 1\n" + MINIMAL, "surprise", "unknown field"),
    ],
)
def test_bad_scenarios_name_the_file_and_the_field(tmp_path, text, field, words):
    path = write(tmp_path, text, "bad.toml")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {field}: "), message
    assert words in message
    assert caught.value.field == field


def test_invalid_toml_and_missing_files_name_the_file(tmp_path):
    with pytest.raises(ScenarioError, match=r"broken\.toml: not valid TOML"):
        load_scenario(write(tmp_path, "name = \n", "broken.toml"))
    with pytest.raises(ScenarioError, match=r"absent\.toml: cannot read"):
        load_scenario(tmp_path / "absent.toml")


def test_a_directory_of_scenarios_loads_in_order_with_unique_names(tmp_path):
    write(tmp_path, MINIMAL.replace('"x"', '"b"'), "b.toml")
    write(tmp_path, MINIMAL.replace('"x"', '"a"'), "a.toml")
    assert [s.name for s in load_scenarios(tmp_path)] == ["a", "b"]
    write(tmp_path, MINIMAL.replace('"x"', '"a"'), "c.toml")
    with pytest.raises(ScenarioError, match=r"c\.toml: name: 'a' is already used"):
        load_scenarios(tmp_path)


# ---------------------------------------------------------------- the random fault mix


def test_the_random_schedule_is_a_function_of_its_seed():
    first = random_schedule(42, 300.0)
    assert first == random_schedule(42, 300.0)
    assert first != random_schedule(43, 300.0)
    assert len(first) >= 5


@pytest.mark.parametrize("seed", range(20))
def test_the_random_schedule_stays_inside_the_run_and_is_valid(seed):
    schedule = random_schedule(seed, 120.0, start=5.0, tail=10.0, min_gap=2.0, max_gap=6.0)
    for previous, fault in zip(schedule, schedule[1:], strict=False):
        assert fault.at >= previous.stop + 2.0 - 1e-6  # one at a time, with a gap
    for fault in schedule:
        assert fault.at >= 5.0 and fault.stop <= 110.0 + 1e-9
        assert fault.fault in FAULTS
        assert target_problem(fault.fault, fault.target) is None
        assert fault.duration == 0.0 if fault.fault == "redis_flushall" else fault.duration >= 2.0


def test_the_random_schedule_draws_only_the_faults_asked_for():
    schedule = random_schedule(1, 600.0, faults=["latency", "kafka_kill"])
    assert {f.fault for f in schedule} == {"latency", "kafka_kill"}
    assert all(f.params["latency"] > 0 for f in schedule if f.fault == "latency")
    with pytest.raises(ValueError):
        random_schedule(1, 60.0, faults=["meteor"])


def test_random_faults_in_a_file_are_expanded_deterministically(tmp_path):
    text = MINIMAL.replace("duration = 10", "duration = 120") + (
        '[random_faults]\nseed = 7\nfaults = ["sigkill", "latency"]\n'
    )
    one = load_scenario(write(tmp_path, text, "one.toml"))
    two = load_scenario(write(tmp_path, text, "two.toml"))
    assert one.faults == two.faults and one.faults
    assert one.random_faults is not None and one.random_faults.seed == 7


# ---------------------------------------------------------------- the workload's plan


def test_the_plan_follows_rate_mix_and_seed():
    workload = WorkloadSpec(
        rate=10.0,
        duration=20.0,
        mix=Mix(noop=1, delayed=1, fail=1, ledger=1),
        fail_times=3,
        fail_max_attempts=3,
        ledger_seconds=2.0,
    )
    plan = list(plan_submits(workload, seed=5, key_prefix="run1"))
    assert plan == list(plan_submits(workload, seed=5, key_prefix="run1"))
    assert len(plan) == 200 and len({p.key for p in plan}) == 200
    assert plan[1].at == pytest.approx(0.1) and plan[0].key == "run1-000000"
    assert {p.kind for p in plan} == {"noop", "delayed", "fail", "ledger"}
    for p in plan:
        assert p.may_die == (p.kind == "fail")  # three failures, three attempts: may die
        if p.kind == "ledger":
            assert p.payload == {"seconds": 2.0} and p.job_type == "ledger"
        if p.kind == "delayed":
            assert 0.0 <= p.delay <= workload.delay_seconds and p.job_type == "noop"
    value = plan[0].value()
    assert value["key"] == "run1-000000" and "may_die" in value


def test_receipts_are_orders_placed_through_the_shop_under_its_policy():
    from examples.shop.jobs import app as shop_app

    workload = WorkloadSpec(rate=10.0, duration=5.0, mix=Mix(noop=0, receipt=1), max_attempts=9)
    plan = list(plan_submits(workload, seed=2, key_prefix="shop"))
    assert plan == list(plan_submits(workload, seed=2, key_prefix="shop"))
    assert len(plan) == 50 and len({p.key for p in plan}) == 50
    policy = shop_app.get(RECEIPT_JOB_TYPE)
    assert policy is not None
    for i, p in enumerate(plan):
        assert (p.kind, p.job_type, p.via_shop) == ("receipt", "send_receipt", True)
        assert p.key == f"shop-{i:06d}"
        assert set(p.payload) == {"email", "amount_cents"}
        assert "@" in p.payload["email"] and 0 < p.payload["amount_cents"] < 10**9
        assert (p.delay, p.may_die) == (0.0, False)
        # the shop's endpoint takes no job options: the history records its policy
        assert (p.max_attempts, p.timeout_seconds) == (
            policy.max_attempts,
            policy.timeout_seconds,
        )
    assert len({p.payload["amount_cents"] for p in plan}) > 1
    assert plan[0].value()["type"] == "send_receipt"


def test_a_zero_receipt_weight_leaves_a_plan_unchanged():
    # the kind drawn for each submit is what a mix of the four older kinds draws: reports of
    # earlier runs replay with the same seed
    workload = WorkloadSpec(rate=10.0, duration=10.0, mix=Mix(noop=1, delayed=2, fail=1, ledger=3))
    plan = list(plan_submits(workload, seed=9, key_prefix="k"))
    rng = random.Random(9)
    older = []
    for _ in plan:
        older.append(rng.choices(["noop", "delayed", "fail", "ledger"], [1, 2, 1, 3])[0])
        if older[-1] == "delayed":
            rng.uniform(0.0, workload.delay_seconds)
    assert [p.kind for p in plan] == older
    assert not any(p.via_shop for p in plan)
    mixed = dataclasses.replace(workload, mix=Mix(**dict.fromkeys(MIX_KINDS, 1.0)))
    planned = list(plan_submits(mixed, seed=9, key_prefix="k"))
    assert {p.kind for p in planned} == set(MIX_KINDS)
    # a lane's ledger submits the demo type of its own name, with ledger's payload
    lanes = {p.job_type: p.payload for p in planned if p.kind.startswith("ledger_")}
    assert lanes == dict.fromkeys(
        ("ledger_thread", "ledger_asyncio", "ledger_process"), {"seconds": 0.0}
    )


def test_a_scenario_with_receipts_uses_the_shop(tmp_path):
    text = MINIMAL + "[workload.mix]\nreceipt = 1\n"
    scenario = load_scenario(write(tmp_path, text))
    assert scenario.workload.mix == Mix(noop=0, receipt=1)
    assert scenario.uses_shop
    assert not load_scenario(write(tmp_path, MINIMAL, "plain.toml")).uses_shop


def test_the_shop_stalled_worker_scenario():
    path = Path(__file__).resolve().parents[2] / "scenarios" / "b-shop-sigstop.toml"
    scenario = load_scenario(path)
    assert scenario.uses_shop and scenario.fencing
    assert [(w, kind) for kind, w in scenario.workload.mix.weights() if w] == [(1.0, "receipt")]
    expect = scenario.expect
    assert (expect.max_lost, expect.max_doubled, expect.min_redeliveries) == (0, 0, 1)
    # worker-1's mail calls are slow from before the freeze until after it wakes, so the
    # freeze lands inside its receipt handlers
    slow, freeze = scenario.faults
    assert (slow.fault, slow.target, slow.params) == ("latency", "worker-1/mail", {"latency": 1000})
    assert (freeze.fault, freeze.target, freeze.duration) == ("sigstop", "worker-1", 25.0)
    assert slow.at < freeze.at and slow.stop > freeze.stop
    assert expect.alerts == ("LeaseworkFenceRejections",)


def test_only_a_worker_has_a_private_mail_link():
    assert target_problem("latency", "worker-2/mail") is None
    for target in ("mail", "api/mail", "relay/mail"):
        assert "mail service" in str(target_problem("latency", target))


# ---------------------------------------------------------------- waiting for busy workers


def test_a_fault_may_wait_for_a_workers_gauge(tmp_path):
    text = MINIMAL + (
        '[[faults]]\nat = 2\nduration = 3\nfault = "sigkill"\ntarget = "worker-1"\n'
        'wait_for = { gauge = "completer_waiting", at_least = 20, patience = 8 }\n'
        '[[faults]]\nat = 4\nduration = 1\nfault = "reset_peer"\n'
        'target = "worker-2/postgres"\nparams = { timeout = 0 }\n'
        'wait_for = "completer_waiting"\n'
        '[[faults]]\nat = 6\nduration = 1\nfault = "sigkill"\ntarget = "worker-2"\n'
    )
    kill, reset, plain = load_scenario(write(tmp_path, text)).faults
    assert kill.wait_for == WaitFor("completer_waiting", 20.0, 8.0)
    assert kill.wait_for.metric == "leasework_completer_waiting"
    assert kill.wait_for.label == "completer_waiting >= 20"
    # the shorthand: the gauge alone, at least 1, the default patience; the toxic's own
    # attributes stay Toxiproxy's
    assert reset.wait_for == WaitFor("completer_waiting", 1.0, 15.0)
    assert reset.params == {"timeout": 0}
    assert plain.wait_for is None  # the nemesis's default mid-job wait applies (test_nemesis)
    assert set(WAIT_GAUGES) == {"jobs_in_flight", "completer_waiting"}


@pytest.mark.parametrize(
    ("target", "workers"),
    [
        ("worker-1", ("worker-1",)),
        ("worker-2/postgres", ("worker-2",)),
        ("worker-1/mail", ("worker-1",)),
        ("kafka-3-worker-2", ("worker-2",)),
        ("postgres", WORKERS),  # a shared link: every worker meets it
        ("redis", WORKERS),
        ("kafka-1", WORKERS),
        ("relay", WORKERS),
        (None, WORKERS),
    ],
)
def test_a_wait_reads_the_workers_its_fault_hits(target, workers):
    assert fault_workers(target) == workers


def test_a_relay_may_run_without_lost_record_recovery_and_its_run_then_expects_lost_jobs(
    tmp_path,
):
    relay = '[[relays]]\nname = "relay"\nrecovery = false\n'
    scenario = load_scenario(write(tmp_path, MINIMAL + relay + "[expect]\nexpect_lost = true\n"))
    (spec,) = scenario.relays
    assert spec.env() == {"LEASEWORK_RECOVERY_AFTER": "never"}
    assert scenario.expect.expect_lost is True
    with pytest.raises(ScenarioError, match="recovery = false"):
        load_scenario(write(tmp_path, MINIMAL + "[expect]\nexpect_lost = true\n"))
    both = relay + "[expect]\nexpect_lost = true\nmax_lost = 2\n"
    with pytest.raises(ScenarioError, match="expect.max_lost"):
        load_scenario(write(tmp_path, MINIMAL + both))


def test_the_record_faults_act_on_a_queue_bands_topic_only():
    for fault in ("records_delete", "topic_recreate", "offsets_reset", "retention_shrink"):
        assert target_problem(fault, "jobs.ready") is None
        assert target_problem(fault, "jobs.ready.emails.p2") is None
        assert "queue band's topic" in target_problem(fault, "jobs.dlq")
        assert "queue band's topic" in target_problem(fault, "worker-1")


def test_every_record_loss_scenario_has_an_unsafe_twin_that_must_lose_jobs():
    scenarios = {s.name: s for s in load_scenarios(Path(__file__).parents[2] / "scenarios")}
    record_faults = {"records_delete", "topic_recreate", "offsets_reset", "retention_shrink"}
    safe = [
        s
        for s in scenarios.values()
        if record_faults & set(s.fault_names) and not s.expect.expect_lost
    ]
    assert len(safe) >= 5
    for scenario in safe:
        twins = [
            t
            for t in scenarios.values()
            if t.expect.expect_lost
            and t.faults == scenario.faults
            and dataclasses.replace(t.workload, quiet_timeout=0)
            == dataclasses.replace(scenario.workload, quiet_timeout=0)
        ]
        assert twins, f"{scenario.name} has no unsafe twin"
        assert scenario.expect.max_lost == 0 and all(r.recovery for r in scenario.relays)
