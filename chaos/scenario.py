"""Declarative chaos scenarios: TOML files with a workload, a fault schedule and expectations.

A scenario file (``scenarios/*.toml``)::

    name = "stalled-worker"
    description = "SIGSTOP a worker past its lease while it holds ledger jobs."
    fencing = true                 # false: the unsafe plain-TTL lease mode

    [workload]
    rate = 20.0                    # submits per second
    duration = 60.0                # seconds of submitting
    ledger_seconds = 3.0           # the ledger handler sleeps this long before its effect
    [workload.mix]                 # relative weights
    noop = 4
    delayed = 2
    fail = 2
    ledger = 2
    receipt = 0                    # an order placed through the example shop's POST /orders

    [[faults]]
    at = 10.0                      # seconds after the run started
    duration = 20.0
    fault = "sigstop"
    target = "worker-1"

    [[faults]]
    at = 40.0
    duration = 5.0
    fault = "latency"
    target = "postgres"
    params = { latency = 500, jitter = 100 }

    [[faults]]
    at = 50.0
    duration = 5.0
    fault = "sigkill"
    target = "worker-2"
    # optional, any fault: start only once the workers it hits are this busy (a gauge of
    # theirs, summed), or after ``patience`` seconds; without it, sigstop, sigkill and
    # restart of a worker wait for one job in flight (up to 15 s)
    wait_for = { gauge = "completer_waiting", at_least = 20, patience = 20 }

    [random_faults]                # optional: a seeded mix appended to [[faults]]
    seed = 7
    faults = ["latency", "sigkill", "redis_flushall"]

    [expect]
    max_lost = 0
    max_doubled = 0
    recovery_seconds = 30
    alerts = ["LeaseworkFenceRejections"]
    expect_doubled = false         # true for the unsafe run: it must show duplicate effects
    min_redeliveries = 0           # evidence the fault hit running jobs (checked by the runner)
    min_unknown_landed = 0         # evidence of unknown submits that landed (ditto)
    min_duplicate_messages = 0     # evidence of outbox rows produced twice (ditto)

Loading is strict: an unknown key, a wrong type or a value out of range raises
:class:`ScenarioError` naming the file and the field (``faults[1].target``).

Everything here is pure: :func:`random_schedule` and :func:`plan_submits` are functions of
their arguments and a seed.
"""

from __future__ import annotations

import math
import os
import random
import re
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos.history import submit_value
from devstack.layout import PROXIES as STACK_PROXIES
from leasework.config import UNSAFE_LEASE_MODE

# ---------------------------------------------------------------- the fault vocabulary

TOXIC_FAULTS: tuple[str, ...] = (
    "latency",
    "timeout",
    "reset_peer",
    "bandwidth",
    "slicer",
    "limit_data",
    "link_down",
)
PROCESS_FAULTS: tuple[str, ...] = ("sigstop", "sigkill", "restart")
KAFKA_FAULTS: tuple[str, ...] = ("kafka_kill",)
REDIS_FAULTS: tuple[str, ...] = ("redis_restart", "redis_flushall")
FAULTS: tuple[str, ...] = TOXIC_FAULTS + PROCESS_FAULTS + KAFKA_FAULTS + REDIS_FAULTS

# toxiproxy proxies (devstack/layout.py, toxiproxy/proxies.json) and the leasework
# processes of the local stack
# kafka-N carries the api's and the relay's Kafka traffic, kafka-N-worker-M worker-M's (each
# broker advertises the proxy of the listener a client came in through)
PROXIES: tuple[str, ...] = tuple(STACK_PROXIES)  # the order seeds the random mix's targets
# links with no shared proxy, offered only as one worker's private link (worker-N/mail):
# ``mail`` is the worker's calls to the example shop's mail service (send_receipt's third
# party); a latency toxic on it is a slow third party
PRIVATE_LINKS: tuple[str, ...] = ("mail",)
PROCESSES: tuple[str, ...] = ("worker-1", "worker-2", "relay", "api")
KAFKA_NODES: tuple[str, ...] = ("kafka-1", "kafka-2", "kafka-3")
# a kafka_kill target resolved when the fault starts: the workers' group coordinator
KAFKA_COORDINATOR = "coordinator"

_PROCESS = re.compile(r"^(worker|relay|api)(-[1-9][0-9]*)?$")

# toxic attributes (toxiproxy's names and units): name -> (low, high, required)
_TOXIC_ATTRIBUTES: dict[str, dict[str, tuple[float, float, bool]]] = {
    "latency": {"latency": (0, 600_000, True), "jitter": (0, 600_000, False)},  # ms
    "timeout": {"timeout": (0, 3_600_000, False)},  # ms; 0 holds data until the toxic goes
    "reset_peer": {"timeout": (0, 3_600_000, False)},  # ms before the reset
    "bandwidth": {"rate": (0, 10_000_000, True)},  # KB/s
    "slicer": {
        "average_size": (1, 1_000_000, True),  # bytes
        "size_variation": (0, 1_000_000, False),  # bytes
        "delay": (0, 60_000_000, False),  # microseconds between slices
    },
    "limit_data": {"bytes": (0, 1 << 40, True)},  # close after this many bytes
    "link_down": {},  # the proxy is disabled: connections refused
}
_STREAMS = ("upstream", "downstream", "both")
# gauges of a worker a fault may wait for (``wait_for``): short name -> metric name
WAIT_GAUGES: dict[str, str] = {
    # handlers running now
    "jobs_in_flight": "leasework_jobs_in_flight",
    # outcomes handed to the completer and not yet durable (waiting for, or in, a batch)
    "completer_waiting": "leasework_completer_waiting",
}
WORKERS: tuple[str, ...] = ("worker-1", "worker-2")  # the local stack's workers
_WORKER = re.compile(r"worker-[1-9][0-9]*")
# faults that are a single instant: their duration may be zero
_INSTANT_FAULTS = frozenset({"redis_flushall", "sigkill", "restart", "kafka_kill", "redis_restart"})

# new kinds go last: with a zero weight they leave the draws of an existing mix unchanged
MIX_KINDS: tuple[str, ...] = ("noop", "delayed", "fail", "ledger", "receipt")
# kinds submitted through the example shop (examples/shop/web.py: the order and its
# send_receipt job in one transaction) instead of leasework's POST /jobs
SHOP_KINDS: frozenset[str] = frozenset({"receipt"})
# the shop's policy for send_receipt (examples/shop/jobs.py); its endpoint takes no options
RECEIPT_JOB_TYPE = "send_receipt"
RECEIPT_MAX_ATTEMPTS = 5
RECEIPT_TIMEOUT_SECONDS = 30


class ScenarioError(ValueError):
    """A scenario file is unusable; the message names the file and the field."""

    def __init__(self, source: str, where: str, message: str) -> None:
        super().__init__(f"{source}: {where}: {message}" if where else f"{source}: {message}")
        self.source = source
        self.field = where


def fault_kind(fault: str) -> str:
    """``toxic``, ``process``, ``kafka`` or ``redis``."""
    if fault in TOXIC_FAULTS:
        return "toxic"
    if fault in PROCESS_FAULTS:
        return "process"
    if fault in KAFKA_FAULTS:
        return "kafka"
    if fault in REDIS_FAULTS:
        return "redis"
    raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS)}")


def target_problem(fault: str, target: str | None) -> str | None:
    """Why ``target`` does not fit ``fault``, or None when it does."""
    kind = fault_kind(fault)
    if kind == "toxic":
        if target in PROXIES:
            return None
        if target and "/" in target:
            process, proxy = target.split("/", 1)
            if _PROCESS.match(process) and proxy in PROXIES:
                return None
            if proxy in PRIVATE_LINKS and re.fullmatch(r"worker-[1-9][0-9]*", process):
                return None
        return (
            f"{target!r} is not a toxiproxy proxy; expected one of {', '.join(PROXIES)}, "
            "or PROCESS/PROXY for one process's link (e.g. 'worker-1/postgres'), or "
            f"worker-N/LINK for one worker's link to {', '.join(PRIVATE_LINKS)} "
            "(the example shop's mail service)"
        )
    if kind == "process":
        if target and _PROCESS.match(target):
            return None
        return f"{target!r} is not a leasework process; expected one of {', '.join(PROCESSES)}"
    if kind == "kafka":
        if target in KAFKA_NODES or target == KAFKA_COORDINATOR:
            return None
        return (
            f"{target!r} is not a Kafka node; expected one of {', '.join(KAFKA_NODES)}, or "
            f"{KAFKA_COORDINATOR!r} for the broker coordinating the workers' consumer group"
        )
    if target in (None, "redis"):
        return None
    return f"{target!r}: {fault} acts on Redis itself; leave target out or write 'redis'"


def fault_workers(target: str | None) -> tuple[str, ...]:
    """The workers whose gauges a fault's ``wait_for`` reads: the worker its target names
    (``worker-1``, ``worker-1/postgres``, ``kafka-2-worker-1``), else every worker of the
    stack (a shared link, Redis, a broker, the relay or the api: the workers' state is what
    the fault meets)."""
    named = _WORKER.findall(target or "")
    return (named[-1],) if named else WORKERS


# ---------------------------------------------------------------- the model


@dataclass(frozen=True)
class WaitFor:
    """A fault's precondition: it starts once ``gauge`` (a key of :data:`WAIT_GAUGES`),
    summed over the workers it hits (:func:`fault_workers`), is at least ``at_least``, or
    once ``patience`` seconds have passed (the injection records which, and what it saw)."""

    gauge: str
    at_least: float = 1.0
    patience: float = 15.0

    @property
    def metric(self) -> str:
        return WAIT_GAUGES[self.gauge]

    @property
    def label(self) -> str:
        return f"{self.gauge} >= {self.at_least:g}"


@dataclass(frozen=True)
class FaultSpec:
    """One scheduled fault: started ``at`` seconds into the run, healed ``duration`` later;
    with ``wait_for``, the start waits for the workers to be busy that way first."""

    at: float
    duration: float
    fault: str
    target: str | None
    params: dict[str, Any] = field(default_factory=dict)
    wait_for: WaitFor | None = None

    @property
    def stop(self) -> float:
        return self.at + self.duration

    @property
    def kind(self) -> str:
        return fault_kind(self.fault)

    @property
    def label(self) -> str:
        return f"{self.fault} {self.target}" if self.target else self.fault


@dataclass(frozen=True)
class Mix:
    """Relative weights of the kinds of submit: ``noop`` due now, ``delayed`` (a noop due
    later), ``fail`` (fails ``fail_times`` attempts, then succeeds), ``ledger`` (one fenced
    effect), ``receipt`` (an order placed through the example shop, whose ``send_receipt``
    job emails the receipt and records it on the order through the fence)."""

    noop: float = 1.0
    delayed: float = 0.0
    fail: float = 0.0
    ledger: float = 0.0
    receipt: float = 0.0

    def weights(self) -> list[tuple[str, float]]:
        return [(kind, getattr(self, kind)) for kind in MIX_KINDS]


@dataclass(frozen=True)
class WorkloadSpec:
    rate: float  # submits per second
    duration: float  # seconds of submitting
    mix: Mix = field(default_factory=Mix)
    ledger_seconds: float = 0.0  # the ledger handler's sleep before it writes its effect
    delay_seconds: float = 5.0  # delayed jobs are due up to this long after their submit
    fail_times: int = 1  # a fail job fails this many attempts, then succeeds
    fail_max_attempts: int = 5  # max_attempts of fail jobs; <= fail_times: they may die
    max_attempts: int = 5  # max_attempts of every other job
    timeout_seconds: int = 30  # the jobs' own timeout
    clients: int = 4  # concurrent client processes
    submit_timeout: float = 5.0  # seconds before a submit becomes unknown (info) and is retried
    quiet_timeout: float = 120.0  # how long to wait for the system to go quiet afterwards

    @property
    def fail_may_die(self) -> bool:
        """Whether a ``fail`` job may legitimately end ``dead``: it has no attempt to spare."""
        return self.fail_max_attempts <= self.fail_times


@dataclass(frozen=True)
class RandomFaults:
    """A seeded random mix of faults, generated by :func:`random_schedule`."""

    seed: int
    faults: tuple[str, ...] = FAULTS
    min_duration: float = 2.0
    max_duration: float = 10.0
    min_gap: float = 3.0
    max_gap: float = 10.0
    start: float = 5.0  # no fault before this
    tail: float = 10.0  # the last seconds of the workload stay fault-free


@dataclass(frozen=True)
class Expectations:
    max_lost: int = 0
    max_doubled: int = 0
    recovery_seconds: float | None = None  # bound on every fault's recovery time
    alerts: tuple[str, ...] = ()  # Prometheus alerts that must fire during the run
    expect_doubled: bool = False  # the unsafe run must show at least one duplicate effect
    # evidence that the fault really hit (checked by the runner, so no run passes vacuously):
    min_redeliveries: int = 0  # jobs run again after an attempt that did not fail by itself
    min_unknown_landed: int = 0  # submits whose outcome was unknown yet created their job
    min_duplicate_messages: int = 0  # outbox rows produced to Kafka more than once


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    workload: WorkloadSpec
    faults: tuple[FaultSpec, ...]  # explicit and generated, by start time
    expect: Expectations
    fencing: bool = True
    random_faults: RandomFaults | None = None
    source: str = "<memory>"

    @property
    def lease_mode(self) -> str:
        """The workers' ``LEASEWORK_LEASE_MODE`` for this scenario."""
        return "fenced" if self.fencing else UNSAFE_LEASE_MODE

    @property
    def uses_shop(self) -> bool:
        """Whether the workload places orders through the example shop."""
        return any(getattr(self.workload.mix, kind) > 0 for kind in SHOP_KINDS)

    @property
    def fault_names(self) -> tuple[str, ...]:
        """Distinct faults, in order of first use."""
        return tuple(dict.fromkeys(f.fault for f in self.faults))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["lease_mode"] = self.lease_mode
        return data


# ---------------------------------------------------------------- the loader


class _Table:
    """Typed, strict access to one TOML table; every read names ``where.name`` on error."""

    def __init__(self, data: Any, where: str, source: str) -> None:
        self.source = source
        self.where = where
        if not isinstance(data, Mapping):
            raise ScenarioError(source, where or "(top level)", f"must be a table, got {data!r}")
        self.data = data
        self.seen: set[str] = set()

    def path(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def fail(self, name: str, message: str) -> ScenarioError:
        return ScenarioError(self.source, self.path(name), message)

    def get(self, name: str) -> Any:
        self.seen.add(name)
        return self.data.get(name)

    def has(self, name: str) -> bool:
        return name in self.data

    def string(self, name: str, default: str | None = None, *, required: bool = False) -> Any:
        value = self.get(name)
        if value is None:
            if required:
                raise self.fail(name, "is required")
            return default
        if not isinstance(value, str) or not value.strip():
            raise self.fail(name, f"must be a non-empty string, got {value!r}")
        return value

    def number(
        self,
        name: str,
        default: float | None = None,
        *,
        low: float = 0.0,
        high: float = math.inf,
        above: bool = False,
        integer: bool = False,
        required: bool = False,
    ) -> Any:
        value = self.get(name)
        if value is None:
            if required:
                raise self.fail(name, "is required")
            return default
        kind = "an integer" if integer else "a number"
        ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not ok_type or not math.isfinite(value):
            raise self.fail(name, f"must be {kind}, got {value!r}")
        if (value <= low if above else value < low) or value > high:
            lower = f"> {low:g}" if above else f">= {low:g}"
            upper = "" if high == math.inf else f" and <= {high:g}"
            raise self.fail(name, f"must be {kind} {lower}{upper}, got {value!r}")
        return value if integer else float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, got {value!r}")
        return value

    def strings(self, name: str, default: tuple[str, ...] = ()) -> tuple[str, ...]:
        value = self.get(name)
        if value is None:
            return default
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.fail(name, f"must be a list of non-empty strings, got {value!r}")
        return tuple(value)

    def table(self, name: str) -> _Table | None:
        value = self.get(name)
        return None if value is None else _Table(value, self.path(name), self.source)

    def done(self) -> None:
        """Reject keys nobody read: they are typos or options that do not exist."""
        extra = sorted(set(self.data) - self.seen)
        if extra:
            raise self.fail(
                extra[0],
                "unknown field"
                + (f" (also unknown: {', '.join(extra[1:])})" if len(extra) > 1 else "")
                + f"; known here: {', '.join(sorted(self.seen))}",
            )


def _workload(table: _Table | None, source: str) -> WorkloadSpec:
    if table is None:
        raise ScenarioError(source, "workload", "is required")
    mix_table = table.table("mix")
    mix = Mix()
    if mix_table is not None:
        weights = {k: mix_table.number(k, 0.0) for k in MIX_KINDS}
        mix_table.done()
        if sum(weights.values()) <= 0:
            raise mix_table.fail(MIX_KINDS[0], "at least one weight of the mix must be positive")
        mix = Mix(**weights)
    workload = WorkloadSpec(
        rate=table.number("rate", required=True, above=True, high=10_000),
        duration=table.number("duration", required=True, above=True, high=86_400),
        mix=mix,
        ledger_seconds=table.number("ledger_seconds", 0.0, high=3600),
        delay_seconds=table.number("delay_seconds", 5.0, high=86_400),
        fail_times=table.number("fail_times", 1, integer=True, high=1000),
        fail_max_attempts=table.number("fail_max_attempts", 5, integer=True, low=1, high=100),
        max_attempts=table.number("max_attempts", 5, integer=True, low=1, high=100),
        timeout_seconds=table.number("timeout_seconds", 30, integer=True, low=1, high=86_400),
        clients=table.number("clients", 4, integer=True, low=1, high=1000),
        submit_timeout=table.number("submit_timeout", 5.0, above=True, high=600),
        quiet_timeout=table.number("quiet_timeout", 120.0, above=True, high=86_400),
    )
    table.done()
    return workload


def _params(fault_table: _Table, fault: str) -> dict[str, Any]:
    table = fault_table.table("params") or _Table(
        {}, fault_table.path("params"), fault_table.source
    )
    params: dict[str, Any] = {}
    if fault in _TOXIC_ATTRIBUTES:
        for name, (low, high, required) in _TOXIC_ATTRIBUTES[fault].items():
            value = table.number(name, None, low=low, high=high, required=required)
            if value is not None:
                params[name] = int(value) if float(value).is_integer() else value
        stream = table.string("stream")
        if stream is not None:
            if stream not in _STREAMS:
                raise table.fail("stream", f"must be one of {', '.join(_STREAMS)}, got {stream!r}")
            params["stream"] = stream
        toxicity = table.number("toxicity", None, high=1.0)
        if toxicity is not None:
            params["toxicity"] = toxicity
    elif table.data:
        raise table.fail(sorted(table.data)[0], f"unknown field: {fault} takes no params")
    table.done()
    return params


def _wait_for(fault_table: _Table) -> WaitFor | None:
    """``wait_for = { gauge = "...", at_least = N, patience = S }``, or just the gauge's name
    (at least 1, 15 s of patience)."""
    value = fault_table.data.get("wait_for")
    if isinstance(value, str):
        value = {"gauge": value}
    elif value is None or not isinstance(value, Mapping):
        fault_table.table("wait_for")  # None, or the error naming the field
        return None
    fault_table.seen.add("wait_for")
    table = _Table(value, fault_table.path("wait_for"), fault_table.source)
    gauge = table.string("gauge", required=True)
    if gauge not in WAIT_GAUGES:
        raise table.fail(
            "gauge", f"{gauge!r} is not a worker gauge to wait for; known: {', '.join(WAIT_GAUGES)}"
        )
    wait = WaitFor(
        gauge=gauge,
        at_least=table.number("at_least", 1.0, above=True, high=1_000_000),
        patience=table.number("patience", 15.0, above=True, high=600),
    )
    table.done()
    return wait


def _fault(table: _Table) -> FaultSpec:
    fault = table.string("fault", required=True)
    if fault not in FAULTS:
        raise table.fail("fault", f"{fault!r} is not a fault; known: {', '.join(FAULTS)}")
    at = table.number("at", required=True)
    flush = fault == "redis_flushall"
    duration = table.number("duration", 0.0 if flush else None, required=not flush)
    if fault not in _INSTANT_FAULTS and duration <= 0:
        raise table.fail("duration", f"{fault} needs a duration > 0, got {duration!r}")
    target = table.string("target")
    if fault in REDIS_FAULTS and target is None:
        target = "redis"
    why = target_problem(fault, target)
    if why is not None:
        raise table.fail("target", f"is required for {fault}" if target is None else why)
    params = _params(table, fault)
    wait_for = _wait_for(table)
    table.done()
    return FaultSpec(
        at=at, duration=duration, fault=fault, target=target, params=params, wait_for=wait_for
    )


def _random_faults(table: _Table) -> RandomFaults:
    seed = table.number("seed", required=True, integer=True, low=-(2**63), high=2**63)
    faults = table.strings("faults", FAULTS)
    for fault in faults:
        if fault not in FAULTS:
            raise table.fail("faults", f"{fault!r} is not a fault; known: {', '.join(FAULTS)}")
    if not faults:
        raise table.fail("faults", "must name at least one fault")
    spec = RandomFaults(
        seed=seed,
        faults=faults,
        min_duration=table.number("min_duration", 2.0, above=True),
        max_duration=table.number("max_duration", 10.0, above=True),
        min_gap=table.number("min_gap", 3.0),
        max_gap=table.number("max_gap", 10.0),
        start=table.number("start", 5.0),
        tail=table.number("tail", 10.0),
    )
    if spec.max_duration < spec.min_duration:
        raise table.fail("max_duration", "must be >= min_duration")
    if spec.max_gap < spec.min_gap:
        raise table.fail("max_gap", "must be >= min_gap")
    table.done()
    return spec


def _expectations(table: _Table | None) -> Expectations:
    if table is None:
        return Expectations()
    expect = Expectations(
        max_lost=table.number("max_lost", 0, integer=True),
        max_doubled=table.number("max_doubled", 0, integer=True),
        recovery_seconds=table.number("recovery_seconds", None, above=True),
        alerts=table.strings("alerts"),
        expect_doubled=table.boolean("expect_doubled", False),
        min_redeliveries=table.number("min_redeliveries", 0, integer=True),
        min_unknown_landed=table.number("min_unknown_landed", 0, integer=True),
        min_duplicate_messages=table.number("min_duplicate_messages", 0, integer=True),
    )
    table.done()
    return expect


def parse_scenario(data: Mapping[str, Any], *, source: str = "<memory>") -> Scenario:
    """A :class:`Scenario` from parsed TOML; ``source`` names the file in errors."""
    top = _Table(data, "", source)
    name = top.string("name", required=True)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise top.fail("name", f"{name!r} must be letters, digits, '-', '_' or '.'")
    description = top.string("description", "")
    fencing = top.boolean("fencing", True)
    workload = _workload(top.table("workload"), source)

    faults: list[FaultSpec] = []
    raw_faults = top.get("faults")
    if raw_faults is not None:
        if not isinstance(raw_faults, list):
            raise top.fail("faults", "must be an array of tables ([[faults]])")
        for i, raw in enumerate(raw_faults):
            faults.append(_fault(_Table(raw, f"faults[{i}]", source)))

    random_table = top.table("random_faults")
    random_spec = _random_faults(random_table) if random_table is not None else None
    if random_spec is not None:
        faults.extend(
            random_schedule(
                random_spec.seed,
                workload.duration,
                faults=random_spec.faults,
                min_duration=random_spec.min_duration,
                max_duration=random_spec.max_duration,
                min_gap=random_spec.min_gap,
                max_gap=random_spec.max_gap,
                start=random_spec.start,
                tail=random_spec.tail,
            )
        )

    expect = _expectations(top.table("expect"))
    if expect.expect_doubled and fencing:
        raise ScenarioError(
            source,
            "expect.expect_doubled",
            "true only makes sense with fencing = false: with the fence on, duplicate effects "
            "are exactly what must not happen",
        )
    top.done()
    return Scenario(
        name=name,
        description=description,
        workload=workload,
        faults=tuple(sorted(faults, key=lambda f: (f.at, f.fault, str(f.target)))),
        expect=expect,
        fencing=fencing,
        random_faults=random_spec,
        source=source,
    )


def loads_scenario(text: str, *, source: str = "<string>") -> Scenario:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(source, "", f"not valid TOML: {exc}") from None
    return parse_scenario(data, source=source)


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Load and validate one scenario file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(str(path), "", f"cannot read: {exc.strerror or exc}") from None
    return loads_scenario(text, source=str(path))


def load_scenarios(directory: str | os.PathLike[str]) -> list[Scenario]:
    """Every ``*.toml`` under ``directory``, by file name; names must be unique."""
    scenarios: list[Scenario] = []
    names: dict[str, str] = {}
    for path in sorted(Path(directory).glob("*.toml")):
        scenario = load_scenario(path)
        if scenario.name in names:
            raise ScenarioError(
                str(path), "name", f"{scenario.name!r} is already used by {names[scenario.name]}"
            )
        names[scenario.name] = str(path)
        scenarios.append(scenario)
    return scenarios


# ---------------------------------------------------------------- the random nemesis mix


def _random_params(rng: random.Random, fault: str) -> dict[str, Any]:
    if fault == "latency":
        latency = rng.choice([100, 250, 500, 1000, 2000])
        return {"latency": latency, "jitter": latency // 4}
    if fault == "timeout":
        return {"timeout": rng.choice([0, 500, 2000])}
    if fault == "reset_peer":
        return {"timeout": rng.choice([0, 100, 1000])}
    if fault == "bandwidth":
        return {"rate": rng.choice([1, 8, 64])}
    if fault == "slicer":
        size = rng.choice([1, 8, 64])
        return {"average_size": size, "size_variation": size // 2, "delay": rng.choice([10, 1000])}
    if fault == "limit_data":
        return {"bytes": rng.choice([64, 1024, 65536])}
    return {}


def _random_target(
    rng: random.Random, fault: str, processes: Sequence[str], proxies: Sequence[str]
) -> str:
    kind = fault_kind(fault)
    if kind == "toxic":
        return rng.choice(list(proxies))
    if kind == "process":
        return rng.choice(list(processes))
    if kind == "kafka":
        return rng.choice(list(KAFKA_NODES))
    return "redis"


def random_schedule(
    seed: int,
    duration: float,
    *,
    faults: Sequence[str] = FAULTS,
    min_duration: float = 2.0,
    max_duration: float = 10.0,
    min_gap: float = 3.0,
    max_gap: float = 10.0,
    start: float = 5.0,
    tail: float = 10.0,
    processes: Sequence[str] = PROCESSES,
    proxies: Sequence[str] = PROXIES,
) -> tuple[FaultSpec, ...]:
    """A seeded fault schedule over a workload of ``duration`` seconds: one fault at a time,
    from ``start`` until ``tail`` seconds before the end, separated by quiet gaps. The same
    arguments always give the same schedule. Times are rounded to 0.1 s."""
    unknown = [f for f in faults if f not in FAULTS]
    if unknown or not faults:
        raise ValueError(f"faults must be a non-empty subset of {FAULTS}, got {list(faults)}")
    if not 0 < min_duration <= max_duration or not 0 <= min_gap <= max_gap:
        raise ValueError("need 0 < min_duration <= max_duration and 0 <= min_gap <= max_gap")
    rng = random.Random(seed)
    end = duration - tail
    schedule: list[FaultSpec] = []
    at = round(start, 1)
    while True:
        fault = rng.choice(list(faults))
        length = (
            0.0 if fault == "redis_flushall" else round(rng.uniform(min_duration, max_duration), 1)
        )
        if at + length > end:
            break
        target = _random_target(rng, fault, processes, proxies)
        schedule.append(FaultSpec(at, length, fault, target, _random_params(rng, fault)))
        at = round(at + length + rng.uniform(min_gap, max_gap), 1)
    return tuple(schedule)


# ---------------------------------------------------------------- the workload's plan


@dataclass(frozen=True)
class PlannedSubmit:
    """One submit of the workload: when to send it (seconds after the start) and what."""

    at: float
    key: str
    kind: str  # one of MIX_KINDS
    job_type: str
    payload: dict[str, Any]  # the job's payload; for a shop kind, the order's body
    delay: float
    max_attempts: int
    timeout_seconds: int
    may_die: bool

    @property
    def via_shop(self) -> bool:
        """Sent to the example shop's ``POST /orders``, not to leasework's ``POST /jobs``."""
        return self.kind in SHOP_KINDS

    def value(self) -> dict[str, Any]:
        """The history value of its invocation."""
        return submit_value(
            self.key,
            self.job_type,
            self.payload,
            delay=self.delay,
            max_attempts=self.max_attempts,
            may_die=self.may_die,
        )


def plan_submits(workload: WorkloadSpec, *, seed: int, key_prefix: str) -> Iterator[PlannedSubmit]:
    """The workload's submits at a steady ``rate`` for ``duration`` seconds, kinds drawn by
    the mix's weights. Pure given the arguments; ``key_prefix`` makes the Idempotency-Keys
    unique to the run."""
    rng = random.Random(seed)
    kinds, weights = zip(*workload.mix.weights(), strict=True)
    count = int(workload.rate * workload.duration)
    for i in range(count):
        kind = rng.choices(kinds, weights)[0]
        delay, payload, job_type = 0.0, {}, "noop"
        max_attempts, may_die = workload.max_attempts, False
        timeout_seconds = workload.timeout_seconds
        if kind == "delayed":
            delay = round(rng.uniform(0.0, workload.delay_seconds), 3)
        elif kind == "fail":
            job_type, payload = "fail", {"times": workload.fail_times}
            max_attempts, may_die = workload.fail_max_attempts, workload.fail_may_die
        elif kind == "ledger":
            job_type, payload = "ledger", {"seconds": workload.ledger_seconds}
        elif kind == "receipt":
            # the order's body; the job's options are the shop's policy for send_receipt
            job_type = RECEIPT_JOB_TYPE
            amount = rng.randint(100, 99_999)
            payload = {"email": f"buyer-{i:06d}@shop.test", "amount_cents": amount}
            max_attempts, timeout_seconds = RECEIPT_MAX_ATTEMPTS, RECEIPT_TIMEOUT_SECONDS
        yield PlannedSubmit(
            at=round(i / workload.rate, 6),
            key=f"{key_prefix}-{i:06d}",
            kind=kind,
            job_type=job_type,
            payload=payload,
            delay=delay,
            max_attempts=max_attempts,
            timeout_seconds=timeout_seconds,
            may_die=may_die,
        )
