"""Loading chaos scenarios: TOML files with a workload, a fault schedule and expectations.

A scenario file (``scenarios/*.toml``)::

    name = "stalled-worker"
    description = "SIGSTOP a worker past its lease while it holds ledger jobs."
    fencing = true                 # false: the unsafe plain-TTL lease mode

    [workload]
    rate = 20.0                    # submits per second
    duration = 60.0                # seconds of submitting
    ledger_seconds = 3.0           # the ledger handler sleeps this long before its effect
                                   # (and the keyed handler)
    keys = 3                       # keyed and rated jobs' keys (at most 2 of a key run at
                                   # once; at most 5 of a key start per second)
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
    processes = ["relay", "relay-2"]  # optional: whom process faults hit (default: the stack's)

    [[relays]]                     # optional: relays beyond the stack's, or its own with options
    name = "relay-2"               # relay-2, relay-3: started for the run, stopped after it;
                                   # "relay": the stack's, restarted with these options
    clock_offset = 60              # its scheduler's clock runs 60 s fast (-3600 to 3600)
    unsafe_scheduler = false       # true: the fire pass without its guards (must double ticks)
    recovery = true                # false: no recovery of lost Kafka records (must lose jobs)

    [[schedules]]                  # optional: schedules ticking while the run lasts
    cron = "* * * * * *"           # six fields, seconds first: every second
    type = "ledger"                # ledger (one fenced effect) or noop
    seconds = 0.0                  # a ledger job's sleep before its effect
    overlap = "allow"              # allow, skip, buffer_one
    catch_up = "all"               # skip, latest, all
    catch_up_limit = 1000
    grace_seconds = 60
    timezone = "UTC"

    mail_guard = "fence"           # optional, with receipt submits: the shop's mail service
                                   # guards for the run (key,fence; key; fence; none)

    [unique]                       # optional: inserters fighting over unique keys
    inserters = 8                  # concurrent inserters, for the workload's duration
    keys = 3                       # new keys each generation, all inserters on each
    generation_seconds = 1.0
    doors = ["http", "batch", "enqueue", "enqueue_many", "sql"]
    rollback = 0.3                 # the harness's own transactions roll back this often
    hold_seconds = 0.2             # and hold their insert up to this long first
    timeout = 3.0                  # an HTTP insert's timeout (then its outcome is unknown)
    unsafe = false                 # true: check-then-insert without the index (must double)

    [expect]
    max_lost = 0
    max_doubled = 0
    recovery_seconds = 30
    alerts = ["LeaseworkFenceRejections"]
    expect_doubled = false         # true for the unsafe run: it must show duplicate effects
    expect_lost = false            # true with a relay's recovery = false: it must lose jobs
    min_redeliveries = 0           # evidence the fault hit running jobs (checked by the runner)
    min_unknown_landed = 0         # evidence of unknown submits that landed (ditto)
    min_duplicate_messages = 0     # evidence of outbox rows produced twice (ditto)
    max_missing_ticks = 0          # the schedules' ticks (chaos.ticks): none missing,
    max_doubled_ticks = 0          # none fired twice,
    max_lost_ticks = 0             # every fired tick's job finished
    expect_doubled_ticks = false   # true with an unsafe_scheduler relay: doubled ticks must show
    late_tick_seconds = 5.0        # fired later than this after its instant counts as late
    max_late_ticks = 10            # optional: without it late ticks are counted, never failed
    max_unique_violations = 0      # unique keys (chaos.unique_keys): doubled, dropped, ...
    expect_doubled_keys = false    # true with [unique] unsafe = true: a key must double
    min_unique_duplicates = 0      # evidence: committed answers of duplicate
    min_unique_handoffs = 0        # evidence: a waiter created the job after a rollback
    min_mail_refusals = 0          # evidence: the mail service refused a stale call

Loading is strict: an unknown key, a wrong type or a value out of range raises
:class:`ScenarioError` naming the file and the field (``faults[1].target``).

The faults, their targets and their params are the registry's (:mod:`chaos.nemeses`); a
``[random_faults]`` table is expanded here, by :func:`chaos.generator.random_schedule`. A
fault may hit ``relay-2`` or ``relay-3`` only in a scenario that runs it (``[[relays]]``), and
not through a private link (those restart the process, which the run then would not stop).
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from chaos import nemeses
from chaos.generator import random_faults
from chaos.nemeses.base import PROCESS_NAME, PROCESSES, WAIT_GAUGES, Fault, WaitFor, split_target
from chaos.scenario import (
    MIX_KINDS,
    RELAY_NAMES,
    SCHEDULE_TYPES,
    SHOP_KINDS,
    Expectations,
    FaultSpec,
    Mix,
    RandomFaults,
    RelaySpec,
    Scenario,
    ScheduleSpec,
    UniqueSpec,
    WorkloadSpec,
)
from chaos.unique_keys import DOORS
from devstack.layout import EXTRA_RELAYS
from examples.shop.guard import MailGuard
from leasework.schedules import ScheduleError


class ScenarioError(ValueError):
    """A scenario file is unusable; the message names the file and the field."""

    def __init__(self, source: str, where: str, message: str) -> None:
        super().__init__(f"{source}: {where}: {message}" if where else f"{source}: {message}")
        self.source = source
        self.field = where


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
        keys=table.number("keys", 3, integer=True, low=1, high=10_000),
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


def _params(fault_table: _Table, fault: Fault) -> dict[str, Any]:
    """The fault's params, as its :class:`~chaos.nemeses.base.Param` entries say."""
    table = fault_table.table("params") or _Table(
        {}, fault_table.path("params"), fault_table.source
    )
    if not fault.params and table.data:
        raise table.fail(sorted(table.data)[0], f"unknown field: {fault.name} takes no params")
    params: dict[str, Any] = {}
    for param in fault.params:
        value: Any
        if param.choices:
            value = table.string(param.name, required=param.required)
            if value is not None and value not in param.choices:
                raise table.fail(
                    param.name, f"must be one of {', '.join(param.choices)}, got {value!r}"
                )
        else:
            value = table.number(
                param.name, None, low=param.low, high=param.high, required=param.required
            )
            if value is not None and param.whole and float(value).is_integer():
                value = int(value)
        if value is not None:
            params[param.name] = value
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
    name = table.string("fault", required=True)
    if name not in nemeses.REGISTRY:
        raise table.fail("fault", f"{name!r} is not a fault; known: {', '.join(nemeses.FAULTS)}")
    fault = nemeses.lookup(name)
    at = table.number("at", required=True)
    duration = table.number("duration", None if fault.lasts else 0.0, required=fault.lasts)
    if not fault.instant and duration <= 0:
        raise table.fail("duration", f"{name} needs a duration > 0, got {duration!r}")
    target = table.string("target")
    if target is None:
        target = fault.default_target
    why = fault.target_problem(target)
    if why is not None:
        raise table.fail("target", f"is required for {name}" if target is None else why)
    params = _params(table, fault)
    wait_for = _wait_for(table)
    table.done()
    return FaultSpec(
        at=at, duration=duration, fault=name, target=target, params=params, wait_for=wait_for
    )


def _relay_problem(process: str | None, relays: Collection[str]) -> str | None:
    """Why a fault may not hit ``process``: an extra relay the scenario does not run."""
    if process in EXTRA_RELAYS and process not in relays:
        return (
            f"{process} runs only in a scenario that asks for it: add [[relays]] with "
            f'name = "{process}"'
        )
    return None


def _random_faults(table: _Table, relays: Collection[str]) -> RandomFaults:
    seed = table.number("seed", required=True, integer=True, low=-(2**63), high=2**63)
    faults = table.strings("faults", nemeses.RANDOM_MIX)
    for fault in faults:
        if fault not in nemeses.REGISTRY:
            known = ", ".join(nemeses.FAULTS)
            raise table.fail("faults", f"{fault!r} is not a fault; known: {known}")
    if not faults:
        raise table.fail("faults", "must name at least one fault")
    processes = table.strings("processes", PROCESSES)
    for process in processes:
        why = _relay_problem(process, relays)
        if not PROCESS_NAME.match(process):
            why = f"{process!r} is not a leasework process; expected one of {', '.join(PROCESSES)}"
        if why is not None:
            raise table.fail("processes", why)
    spec = RandomFaults(
        seed=seed,
        faults=faults,
        min_duration=table.number("min_duration", 2.0, above=True),
        max_duration=table.number("max_duration", 10.0, above=True),
        min_gap=table.number("min_gap", 3.0),
        max_gap=table.number("max_gap", 10.0),
        start=table.number("start", 5.0),
        tail=table.number("tail", 10.0),
        processes=processes,
    )
    if spec.max_duration < spec.min_duration:
        raise table.fail("max_duration", "must be >= min_duration")
    if spec.max_gap < spec.min_gap:
        raise table.fail("max_gap", "must be >= min_gap")
    table.done()
    return spec


def _tables(top: _Table, name: str) -> list[_Table]:
    """An array of tables (``[[name]]``), each for strict reading; none when absent."""
    raw = top.get(name)
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise top.fail(name, f"must be an array of tables ([[{name}]])")
    return [_Table(item, f"{name}[{i}]", top.source) for i, item in enumerate(raw)]


def _relays(top: _Table) -> tuple[RelaySpec, ...]:
    relays: list[RelaySpec] = []
    for table in _tables(top, "relays"):
        name = table.string("name", required=True)
        if name not in RELAY_NAMES:
            raise table.fail("name", f"{name!r} is not a relay; one of {', '.join(RELAY_NAMES)}")
        if any(r.name == name for r in relays):
            raise table.fail("name", f"{name!r} is named twice")
        relays.append(
            RelaySpec(
                name=name,
                clock_offset=table.number("clock_offset", 0.0, low=-3600, high=3600),
                unsafe_scheduler=table.boolean("unsafe_scheduler", False),
                recovery=table.boolean("recovery", True),
            )
        )
        table.done()
    return tuple(relays)


def _schedules(top: _Table) -> tuple[ScheduleSpec, ...]:
    schedules = []
    for table in _tables(top, "schedules"):
        kind = table.string("type", "ledger")
        if kind not in SCHEDULE_TYPES:
            raise table.fail("type", f"must be one of {', '.join(SCHEDULE_TYPES)}, got {kind!r}")
        spec = ScheduleSpec(
            cron=table.string("cron", required=True),
            type=kind,
            seconds=table.number("seconds", 0.0, high=3600),
            overlap=table.string("overlap", "allow"),
            catch_up=table.string("catch_up", "all"),
            catch_up_limit=table.number("catch_up_limit", 1000, integer=True, low=1, high=1000),
            grace_seconds=table.number("grace_seconds", 60, integer=True, high=86_400),
            timezone=table.string("timezone", "UTC"),
        )
        table.done()
        try:
            spec.definition("check")
        except ScheduleError as exc:
            raise ScenarioError(table.source, table.where, str(exc)) from None
        schedules.append(spec)
    return tuple(schedules)


def _unique(table: _Table | None) -> UniqueSpec | None:
    if table is None:
        return None
    doors = table.strings("doors", DOORS)
    if unknown := [d for d in doors if d not in DOORS]:
        raise table.fail("doors", f"{unknown} are not doors; give some of {', '.join(DOORS)}")
    spec = UniqueSpec(
        inserters=table.number("inserters", 8, integer=True, low=1, high=64),
        keys=table.number("keys", 3, integer=True, low=1, high=1000),
        generation_seconds=table.number("generation_seconds", 1.0, above=True, high=3600),
        doors=doors,
        rollback=table.number("rollback", 0.3, high=1.0),
        hold_seconds=table.number("hold_seconds", 0.2, high=10.0),
        timeout=table.number("timeout", 3.0, above=True, high=60.0),
        unsafe=table.boolean("unsafe", False),
    )
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
        expect_lost=table.boolean("expect_lost", False),
        min_redeliveries=table.number("min_redeliveries", 0, integer=True),
        min_unknown_landed=table.number("min_unknown_landed", 0, integer=True),
        min_duplicate_messages=table.number("min_duplicate_messages", 0, integer=True),
        max_missing_ticks=table.number("max_missing_ticks", 0, integer=True),
        max_doubled_ticks=table.number("max_doubled_ticks", 0, integer=True),
        max_lost_ticks=table.number("max_lost_ticks", 0, integer=True),
        expect_doubled_ticks=table.boolean("expect_doubled_ticks", False),
        late_tick_seconds=table.number("late_tick_seconds", 5.0, high=86_400),
        max_late_ticks=table.number("max_late_ticks", None, integer=True),
        max_unique_violations=table.number("max_unique_violations", 0, integer=True),
        expect_doubled_keys=table.boolean("expect_doubled_keys", False),
        min_unique_duplicates=table.number("min_unique_duplicates", 0, integer=True),
        min_unique_handoffs=table.number("min_unique_handoffs", 0, integer=True),
        min_mail_refusals=table.number("min_mail_refusals", 0, integer=True),
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
    relays = _relays(top)
    running = {r.name for r in relays}
    schedules = _schedules(top)
    unique = _unique(top.table("unique"))
    mail_guard = _mail_guard(top, workload)

    faults: list[FaultSpec] = []
    for table in _tables(top, "faults"):
        fault = _fault(table)
        process, proxy = split_target(fault.target)
        why = _relay_problem(process or proxy, running)
        if why is None and process in EXTRA_RELAYS:
            why = f"{process} has no private links (a link restarts its process)"
        if why is not None:
            raise table.fail("target", why)
        faults.append(fault)

    random_table = top.table("random_faults")
    random_spec = _random_faults(random_table, running) if random_table is not None else None
    if random_spec is not None:
        faults.extend(random_faults(random_spec, workload.duration))

    expect = _expectations(top.table("expect"))
    mail_fenced = mail_guard is None or "fence" in mail_guard.split(",")
    if expect.expect_doubled and fencing and mail_fenced:
        raise ScenarioError(
            source,
            "expect.expect_doubled",
            "true only makes sense with fencing = false (or a mail_guard without fence): "
            "with the fence on, duplicate effects are exactly what must not happen",
        )
    if expect.expect_doubled_ticks and not (schedules and any(r.unsafe_scheduler for r in relays)):
        raise ScenarioError(
            source,
            "expect.expect_doubled_ticks",
            "true only makes sense with [[schedules]] and a relay with unsafe_scheduler = "
            "true: with the scheduler's guards on, a doubled tick is exactly what must not "
            "happen",
        )
    if expect.expect_lost and not any(not r.recovery for r in relays):
        raise ScenarioError(
            source,
            "expect.expect_lost",
            "true only makes sense with a relay whose recovery = false: with the recovery of "
            "lost records on, a lost job is exactly what must not happen",
        )
    if expect.expect_lost and expect.max_lost:
        raise ScenarioError(
            source,
            "expect.max_lost",
            "expect_lost = true needs lost jobs, so it takes no max_lost; leave it out",
        )
    if expect.expect_doubled_keys and not (unique and unique.unsafe):
        raise ScenarioError(
            source,
            "expect.expect_doubled_keys",
            "true only makes sense with [unique] unsafe = true: with the unique index, a "
            "doubled key is exactly what must not happen",
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
        relays=relays,
        schedules=schedules,
        unique=unique,
        mail_guard=mail_guard,
    )


def _mail_guard(top: _Table, workload: WorkloadSpec) -> str | None:
    text = top.string("mail_guard", None)
    if text is None:
        return None
    try:
        guard = str(MailGuard.parse(text))
    except ValueError as exc:
        raise top.fail("mail_guard", str(exc).removeprefix("SHOP_MAIL_GUARD=")) from None
    if not any(getattr(workload.mix, kind) > 0 for kind in SHOP_KINDS):
        raise top.fail("mail_guard", "the workload places no orders (mix.receipt = 0)")
    return guard


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
