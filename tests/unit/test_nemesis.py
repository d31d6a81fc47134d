"""Nemeses without a stack: the toxics and private links a fault needs, the counters that
survive restarts, and every fault's start and heal against a fake stack and Toxiproxy
(recorded in the history, healed at the end even after a failure)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from chaos.checker import UNKNOWN
from chaos.history import Recorder, fault_windows
from chaos.judge import Evidence, harness_findings
from chaos.links import PRIVATE_LINK_PORTS, Link, link_env, link_targets, process_envs
from chaos.loader import load_scenarios
from chaos.metrics import CounterTracker, parse_metrics, worker_gauges
from chaos.nemeses.base import NemesisError, WaitFor
from chaos.nemeses.signals import MID_JOB_WAIT
from chaos.nemeses.toxics import toxic_bodies
from chaos.nemesis import Injection, Nemesis, affected, wait_condition
from chaos.report import busy_cell
from chaos.runner import make_unsafe, select
from chaos.scenario import Expectations, FaultSpec
from chaos.stack import UNSAFE_ENV, StackCalls
from chaos.verdict import check
from devstack.layout import SHOP_MAIL_PORT

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def spec(
    fault: str, target: str | None, at=0.0, duration=1.0, wait_for=None, **params
) -> FaultSpec:
    return FaultSpec(at, duration, fault, target, params, wait_for)


# ---------------------------------------------------------------- pure helpers


def test_toxic_bodies_one_per_stream():
    both = toxic_bodies("latency", {"latency": 300, "jitter": 50, "stream": "both"}, "s")
    assert [(b["name"], b["stream"]) for b in both] == [
        ("s-upstream", "upstream"),
        ("s-downstream", "downstream"),
    ]
    assert all(b["type"] == "latency" and b["toxicity"] == 1.0 for b in both)
    assert both[0]["attributes"] == {"latency": 300, "jitter": 50}
    (one,) = toxic_bodies("reset_peer", {"timeout": 0, "toxicity": 0.5}, "t")
    assert one["stream"] == "downstream"  # toxiproxy's default
    assert one["toxicity"] == 0.5 and one["attributes"] == {"timeout": 0}


def test_per_process_links_and_their_environment():
    faults = [
        spec("latency", "api/postgres", latency=100),
        spec("link_down", "worker-1/redis"),
        spec("timeout", "worker-1/redis"),
        spec("latency", "postgres", latency=1),  # shared: no private proxy
        spec("sigkill", "worker-2"),
    ]
    assert link_targets(faults) == [("api", "postgres"), ("worker-1", "redis")]
    with pytest.raises(NemesisError, match="advertise"):
        link_targets([spec("latency", "worker-1/kafka-1", latency=1)])
    assert link_env("redis", 40001) == {"LEASEWORK_REDIS_ADDR": "127.0.0.1:40001"}
    assert link_env("postgres", 40002)["LEASEWORK_POSTGRES_DSN"].endswith(
        "@127.0.0.1:40002/leasework"
    )
    # a worker's calls to the example shop's mail service: a link with no shared proxy
    assert link_targets([spec("latency", "worker-1/mail", latency=1000)]) == [("worker-1", "mail")]
    assert link_env("mail", 40003) == {"SHOP_MAIL_URL": "http://127.0.0.1:40003"}
    assert PRIVATE_LINK_PORTS["mail"] == SHOP_MAIL_PORT
    with pytest.raises(NemesisError, match="only postgres, redis and mail"):
        link_env("kafka-1", 40004)
    envs = process_envs(
        [Link("worker-1", "redis", 40001)], fencing=False, unsafe_env={"MODE": "unsafe"}
    )
    assert envs == {
        "worker-1": {"MODE": "unsafe", "LEASEWORK_REDIS_ADDR": "127.0.0.1:40001"},
        "worker-2": {"MODE": "unsafe"},
    }
    assert process_envs([], fencing=True, unsafe_env=UNSAFE_ENV) == {}
    assert process_envs([], fencing=True, unsafe_env=UNSAFE_ENV, mail_guard="none") == {
        "shop": {"SHOP_MAIL_GUARD": "none"}
    }


def test_the_shop_scenario_without_fencing_keeps_the_slow_mail_link():
    (scenario,) = select(load_scenarios(SCENARIOS), ["b-shop-sigstop"])
    unsafe = make_unsafe(scenario)
    assert not unsafe.fencing and unsafe.uses_shop and unsafe.faults == scenario.faults
    links = [Link(p, proxy, 40005) for p, proxy in link_targets(unsafe.faults)]
    envs = process_envs(links, fencing=unsafe.fencing, unsafe_env=UNSAFE_ENV)
    assert envs["worker-1"] == {**UNSAFE_ENV, "SHOP_MAIL_URL": "http://127.0.0.1:40005"}
    assert envs["worker-2"] == UNSAFE_ENV


def test_affected_names_every_process_a_shared_link_carries():
    assert all(p in affected("latency", "postgres") for p in ("api", "relay", "worker-1"))
    assert "only workers" in affected("link_down", "redis")
    assert affected("reset_peer", "kafka-2").startswith("relay")
    assert "offset commits" in affected("reset_peer", "kafka-2-worker-1")
    assert affected("reset_peer", "kafka-2-worker-1").startswith("worker-1 only")
    assert affected("link_down", "kafka-3-worker-2").startswith("worker-2 only")
    assert "worker-1" not in affected("reset_peer", "kafka-2")
    assert affected("latency", "worker-1/redis").startswith("worker-1 only")
    assert affected("sigstop", "api") == "api only"


def test_parse_metrics_sums_labels():
    text = (
        "# TYPE leasework_fence_rejections counter\n"
        "leasework_fence_rejections_total 3.0\n"
        "# TYPE leasework_messages_skipped counter\n"
        'leasework_messages_skipped_total{reason="succeeded"} 2.0\n'
        'leasework_messages_skipped_total{reason="running"} 5.0\n'
    )
    values = parse_metrics(text)
    assert values["leasework_fence_rejections_total"] == 3.0
    assert values["leasework_messages_skipped_total"] == 7.0


def test_counter_tracker_survives_restarts():
    tracker = CounterTracker(run_started_epoch=1000.0)
    name = "leasework_fence_rejections_total"
    tracker.observe("worker-1", 900.0, {name: 10.0})  # running before the run: baseline 10
    tracker.observe("worker-1", 900.0, {name: 14.0})
    tracker.observe("worker-1", 1020.0, {name: 2.0})  # restarted during the run: from zero
    tracker.observe("worker-1", 1020.0, {name: 3.0})
    tracker.observe("worker-2", 950.0, {name: 5.0})
    assert tracker.per_process() == {"worker-1": {name: 7.0}, "worker-2": {name: 0.0}}
    assert tracker.totals() == {name: 7.0}
    assert tracker.incarnations("worker-1") == 2


# ---------------------------------------------------------------- the nemesis with fakes


class FakeStack:
    def __init__(self, fail: set[str] | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail = fail or set()
        self.paused: set[str] = set()

    def _do(self, *call):
        self.calls.append(call)
        if call[0] in self.fail:
            raise RuntimeError(f"{call[0]} failed")

    def pause(self, name):
        self._do("pause", name)

    def resume(self, name):
        self._do("resume", name)

    def kill(self, name, sig=signal.SIGKILL):
        self._do("kill", name, sig)

    def stop(self, name, timeout=20.0):
        self._do("stop", name)

    def start(self, name, extra_env=None, wait=True, timeout=None):
        self._do("start", name, extra_env)

    def is_running(self, name):
        return True

    def redis_flushall(self):
        self._do("flushall")

    def wait_kafka_cluster(self, timeout=120.0):
        self._do("wait_kafka_cluster")


class FakeToxiproxy:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def add_toxic(self, proxy, toxic):
        self.calls.append(("add", proxy, toxic["name"], toxic["stream"]))

    async def remove_toxic(self, proxy, name):
        self.calls.append(("remove", proxy, name))

    async def set_enabled(self, proxy, enabled):
        self.calls.append(("enabled", proxy, enabled))


def evidence(injections) -> Evidence:
    """What the harness's checks see of a run with these injections and nothing else."""
    return Evidence(check([], [], [], [], quiet_at=0.0), Expectations(), injections=injections)


def nemesis(stack=None, env_for=None) -> tuple[Nemesis, FakeStack, FakeToxiproxy, Recorder]:
    stack = stack or FakeStack()
    toxiproxy = FakeToxiproxy()
    recorder = Recorder()
    n = Nemesis(StackCalls(stack), toxiproxy, recorder, env_for=env_for or {})  # type: ignore[arg-type]
    return n, stack, toxiproxy, recorder


async def test_every_fault_starts_and_heals_and_is_recorded():
    n, stack, toxiproxy, recorder = nemesis(
        env_for={"worker-1": {"MODE": "unsafe"}, "relay-3": {"LEASEWORK_FAKE_CLOCK_OFFSET": "60"}}
    )
    faults = [
        spec("latency", "postgres", latency=300, stream="both"),
        spec("link_down", "redis"),
        spec("timeout", "api/postgres", timeout=0),
        spec("sigstop", "worker-2"),
        spec("sigkill", "worker-1"),
        spec("restart", "relay"),
        spec("kafka_kill", "kafka-2"),
        spec("redis_restart", "redis"),
        spec("redis_flushall", "redis", duration=0.0),
        spec("postgres_restart", "postgres"),
        spec("sigkill", "relay-3"),  # a relay the run started, with its clock 60 s fast
    ]
    for fault in faults:
        await n.heal(await n.inject(fault))
    assert all(i.healed and not i.start_error for i in n.injections)
    assert toxiproxy.calls == [
        ("add", "postgres", "chaos-0-latency-upstream", "upstream"),
        ("add", "postgres", "chaos-0-latency-downstream", "downstream"),
        ("remove", "postgres", "chaos-0-latency-upstream"),
        ("remove", "postgres", "chaos-0-latency-downstream"),
        ("enabled", "redis", False),
        ("enabled", "redis", True),
        ("add", "chaos-api-postgres", "chaos-2-timeout-downstream", "downstream"),
        ("remove", "chaos-api-postgres", "chaos-2-timeout-downstream"),
    ]
    assert stack.calls == [
        ("pause", "worker-2"),
        ("resume", "worker-2"),
        ("kill", "worker-1", signal.SIGKILL),
        ("start", "worker-1", {"MODE": "unsafe"}),  # restarted with the run's environment
        ("stop", "relay"),
        ("start", "relay", None),
        ("kill", "kafka-2", signal.SIGKILL),
        ("start", "kafka-2", None),
        ("wait_kafka_cluster",),
        ("kill", "redis", signal.SIGKILL),
        ("start", "redis", None),
        ("flushall",),
        ("stop", "postgres"),
        ("start", "postgres", None),
        ("kill", "relay-3", signal.SIGKILL),
        ("start", "relay-3", {"LEASEWORK_FAKE_CLOCK_OFFSET": "60"}),
    ]
    ops = recorder.ops
    assert all(op.f == "nemesis" and op.process == "nemesis" for op in ops)
    assert [op.type for op in ops] == ["invoke", "ok"] * (2 * len(faults))
    windows = fault_windows(ops)
    assert [(w.fault, w.target) for w in windows] == [(f.fault, f.target) for f in faults]
    assert all(w.stop is not None for w in windows)


class BusyLater:
    """A sampler whose worker runs its first job on the third scrape."""

    def __init__(self) -> None:
        self.scrapes = 0

    async def scrape(self, process):
        self.scrapes += 1
        return {"leasework_jobs_in_flight": 2.0 if self.scrapes >= 3 else 0.0}

    async def sample(self, process):
        return await self.scrape(process)


async def test_a_heal_that_fails_once_is_retried(monkeypatch):
    monkeypatch.setattr("chaos.nemesis.HEAL_RETRY_PAUSE", 0.0)

    class Flaky(FakeStack):
        def start(self, name, extra_env=None, wait=True, timeout=None):
            self._do("start", name, extra_env)
            if sum(1 for c in self.calls if c[0] == "start") == 1:
                raise RuntimeError("redis: not running")

    n, stack, _, recorder = nemesis(Flaky())
    injection = await n.inject(spec("redis_restart", "redis", duration=0.0))
    await n.heal(injection)
    assert injection.healed and injection.stop_error is None
    assert injection.heal_failures == ["RuntimeError: redis: not running"]
    assert [op.type for op in recorder.ops] == ["invoke", "ok", "invoke", "ok"]


async def test_a_worker_is_hit_mid_job():
    n, stack, _, _ = nemesis()
    n.sampler = BusyLater()  # type: ignore[assignment]
    injection = await n.inject(spec("sigkill", "worker-2"))
    assert injection.in_flight == 2.0 and injection.waited > 0
    assert stack.calls == [("kill", "worker-2", signal.SIGKILL)]
    relay = await n.inject(spec("sigkill", "relay"))  # not a worker: no waiting
    assert relay.in_flight is None and relay.waited == 0.0


class Gauges:
    """A sampler whose workers report ``series[worker][i]`` at their i-th scrape (the last
    value repeats), as a worker's /metrics would; a worker absent from ``series`` is silent."""

    def __init__(self, series: dict[str, list[dict[str, float]]]) -> None:
        self.series = series
        self.scrapes: dict[str, int] = {}

    async def scrape(self, process):
        if process not in self.series:
            return None
        i = self.scrapes.get(process, 0)
        self.scrapes[process] = i + 1
        values = self.series[process]
        return dict(values[min(i, len(values) - 1)])

    async def sample(self, process):
        return await self.scrape(process)


def waiting(n: float, in_flight: float = 0.0) -> dict[str, float]:
    return {"leasework_completer_waiting": n, "leasework_jobs_in_flight": in_flight}


def test_what_a_fault_waits_for():
    completer = WaitFor("completer_waiting", 20.0, 5.0)
    assert wait_condition(spec("sigkill", "worker-1", wait_for=completer)) == completer
    assert wait_condition(spec("reset_peer", "worker-1/postgres", wait_for=completer)) == completer
    # by default a worker's sigstop, sigkill or restart waits for one job in flight
    for fault in ("sigstop", "sigkill", "restart"):
        assert wait_condition(spec(fault, "worker-2")) == MID_JOB_WAIT
    assert MID_JOB_WAIT == WaitFor("jobs_in_flight", 1.0, 15.0)
    assert wait_condition(spec("sigkill", "relay")) is None
    assert wait_condition(spec("reset_peer", "worker-1/postgres", timeout=0)) is None
    assert worker_gauges({**waiting(3, 1), "process_start_time_seconds": 1.0}) == {
        "jobs_in_flight": 1,
        "completer_waiting": 3,
    }


async def test_a_kill_waits_until_the_completer_holds_a_batch(monkeypatch):
    monkeypatch.setattr("chaos.nemesis.WAIT_POLL", 0.001)
    n, stack, _, _ = nemesis()
    # worker-1's handlers have all returned (nothing in flight): only the completer is busy;
    # the last scrape, just before the signal, sees the batch still there
    n.sampler = Gauges(  # type: ignore[assignment]
        {"worker-1": [waiting(0, 3), waiting(7), waiting(25), waiting(31)]}
    )
    wait = WaitFor("completer_waiting", 20.0, 5.0)
    injection = await n.inject(spec("sigkill", "worker-1", wait_for=wait))
    assert stack.calls == [("kill", "worker-1", signal.SIGKILL)]
    assert injection.wait == wait and injection.wait_met is True
    assert injection.seen == {"completer_waiting": 25.0, "jobs_in_flight": 0.0}
    assert injection.in_flight == 0.0
    assert injection.at_signal == {"completer_waiting": 31.0, "jobs_in_flight": 0.0}
    assert n.sampler.scrapes["worker-1"] == 4  # type: ignore[attr-defined]
    record = injection.to_dict()
    assert record["wait_for"] == {
        "gauge": "completer_waiting",
        "at_least": 20.0,
        "patience": 5.0,
        "met": True,
        "peak": 25.0,
        "workers": ["worker-1"],
    }
    assert record["gauges_seen"]["completer_waiting"] == 25.0
    assert record["gauges_at_signal"]["completer_waiting"] == 31.0
    text = busy_cell(record)
    assert "completer_waiting 25" in text and "≥ 20" in text
    assert "at the signal: " in text and "completer_waiting 31" in text
    assert "completer_waiting 25" in injection.busy_text()


async def test_a_toxic_waits_for_the_workers_it_hits():
    n, _, toxiproxy, _ = nemesis()
    n.sampler = Gauges(  # type: ignore[assignment]
        {"worker-1": [waiting(0), waiting(4)], "worker-2": [waiting(50)]}
    )
    # one worker's private link: only that worker's gauge counts
    wait = WaitFor("completer_waiting", 10.0, 5.0)
    own = await n.inject(spec("reset_peer", "worker-2/postgres", wait_for=wait, timeout=0))
    assert own.wait_met is True and own.seen["completer_waiting"] == 50.0
    assert n.sampler.scrapes == {"worker-2": 1}  # type: ignore[attr-defined]
    assert own.at_signal == {}  # a toxic sends no signal
    assert toxiproxy.calls == [
        ("add", "chaos-worker-2-postgres", "chaos-0-reset_peer-downstream", "downstream")
    ]
    # the shared link: summed over both workers
    shared = await n.inject(
        spec("reset_peer", "postgres", wait_for=WaitFor("completer_waiting", 54.0))
    )
    assert shared.wait_met is True and shared.seen["completer_waiting"] == 54.0
    # a toxic without wait_for starts at once, as before
    plain = await n.inject(spec("latency", "worker-1/postgres", latency=1))
    assert plain.wait is None and plain.wait_met is None and plain.to_dict()["wait_for"] is None


async def test_a_wait_whose_patience_runs_out_starts_anyway_and_says_so(monkeypatch):
    monkeypatch.setattr("chaos.nemesis.WAIT_POLL", 0.001)
    n, stack, _, _ = nemesis()
    n.sampler = Gauges({"worker-2": [waiting(5), waiting(2)]})  # type: ignore[assignment]
    wait = WaitFor("completer_waiting", 20.0, 0.05)
    injection = await n.inject(spec("sigkill", "worker-2", at=12.0, wait_for=wait))
    assert stack.calls == [("kill", "worker-2", signal.SIGKILL)]
    assert injection.wait_met is False and injection.waited >= 0.05
    assert injection.seen == {"completer_waiting": 2.0, "jobs_in_flight": 0.0}
    assert "patience ran out, at most 5 seen" in busy_cell(injection.to_dict())
    await n.heal(injection)
    (problem,) = harness_findings(evidence([injection]))
    assert problem.kind == "evidence" and problem.valid == UNKNOWN
    assert injection.peak == 5.0
    assert "completer_waiting >= 20" in problem.message and "at most 5" in problem.message
    # a silent worker: nothing seen, still started once patience ran out
    n.sampler = Gauges({})  # type: ignore[assignment]
    silent = await n.inject(spec("sigkill", "worker-1", wait_for=wait))
    assert silent.wait_met is False and silent.seen == {}
    await n.heal(silent)
    (problem,) = harness_findings(evidence([silent]))
    assert "nothing readable" in problem.message
    # a relay kill that waits for the workers: their gauges, not the relay's, are recorded
    n.sampler = Gauges({"worker-1": [waiting(9)], "worker-2": [waiting(8)], "relay": [waiting(0)]})  # type: ignore[assignment]
    relay = await n.inject(spec("sigkill", "relay", wait_for=WaitFor("completer_waiting", 17.0)))
    assert relay.wait_met is True and relay.seen["completer_waiting"] == 17.0
    assert relay.at_signal == {}
    # the default mid-job wait is best effort: running out of patience is no problem
    default = Injection(0, spec("sigkill", "worker-1"), wait=MID_JOB_WAIT, wait_met=False)
    assert harness_findings(evidence([default])) == ()


def test_the_busy_cell_of_an_older_report():
    assert busy_cell({"in_flight": None}) == "–"
    assert busy_cell({"in_flight": 2.0, "waited_for_a_job": 0.3}) == "2 in flight (waited 0.3s)"


async def test_the_coordinator_target_is_resolved_when_the_fault_starts(monkeypatch):
    monkeypatch.setattr("chaos.nemeses.kafka.coordinator_broker", lambda: "kafka-3")
    n, stack, _, recorder = nemesis()
    injection = await n.inject(spec("kafka_kill", "coordinator"))
    await n.heal(injection)
    assert injection.target == "kafka-3" and injection.to_dict()["planned_target"] == "coordinator"
    assert stack.calls[:2] == [("kill", "kafka-3", signal.SIGKILL), ("start", "kafka-3", None)]
    (window,) = fault_windows(recorder.ops)
    assert (window.target, window.stop is not None) == ("kafka-3", True)


async def test_a_fault_that_fails_to_start_is_recorded_info_and_still_healed():
    stack = FakeStack(fail={"kill"})
    n, stack, _, recorder = nemesis(stack)
    injection = await n.inject(spec("sigkill", "worker-1"))
    assert injection.start_error == "RuntimeError: kill failed"
    assert [op.type for op in recorder.ops] == ["invoke", "info"]
    assert recorder.ops[-1].error == "RuntimeError: kill failed"
    assert await n.heal_all() == []
    assert stack.calls[-1] == ("start", "worker-1", None)


async def test_heal_all_heals_what_is_left_newest_first_and_reports_what_would_not_heal(
    monkeypatch,
):
    monkeypatch.setattr("chaos.nemesis.HEAL_RETRY_PAUSE", 0.0)
    stack = FakeStack(fail={"resume"})
    n, stack, toxiproxy, _ = nemesis(stack)
    await n.inject(spec("sigstop", "worker-1"))
    await n.inject(spec("latency", "redis", latency=10))
    done = await n.inject(spec("link_down", "postgres"))
    await n.heal(done)
    left = await n.heal_all()
    assert [i.spec.fault for i in left] == ["sigstop"]
    assert "resume failed" in (left[0].stop_error or "")
    assert toxiproxy.calls[-1] == ("remove", "redis", "chaos-1-latency-downstream")
    assert stack.calls[-1] == ("resume", "worker-1")


async def test_the_schedule_runs_faults_at_their_times():
    n, stack, _, recorder = nemesis()
    faults = [
        spec("sigstop", "worker-1", at=0.05, duration=0.2),
        spec("sigkill", "relay", at=0.4, duration=0.05),
    ]
    await n.run_schedule(faults, trio.current_time())
    assert [c[0] for c in stack.calls] == ["pause", "resume", "kill", "start"]
    (stop, kill) = fault_windows(recorder.ops)
    assert 0.05 <= stop.start < stop.stop < kill.start
    assert kill.start >= 0.4
