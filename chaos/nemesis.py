"""Nemeses: the faults of a chaos run, each with its healing step, recorded in the history.

Every fault of :data:`chaos.scenario.FAULTS` has a start and a stop (the heal); the stop is
idempotent and derived from the fault alone, so :meth:`Nemesis.heal_all` can always undo
whatever was started, also after an error or Ctrl-C:

================  ==========================================  ===============================
fault             start                                       stop (heal)
================  ==========================================  ===============================
latency, ...      add the toxic(s) on the proxy (Toxiproxy    remove them
                  HTTP API, 127.0.0.1:8474)
link_down         disable the proxy (connections refused,     enable it
                  open ones closed)
sigstop           SIGSTOP every process of the service        SIGCONT
sigkill           SIGKILL the process                         start it again, wait until ready
restart           stop it gracefully (SIGTERM, drain)         start it again, wait until ready
kafka_kill        SIGKILL one broker                          start it, wait for ISR >= 2
redis_restart     SIGKILL redis (AOF: up to 1 s of writes     start it
                  may be lost, so the fence counter may
                  go back: the Postgres guard's job)
redis_flushall    FLUSHALL (leases and fence counter gone)    nothing to undo
================  ==========================================  ===============================

The shared proxies carry the traffic of several leasework processes: see :func:`affected`
(``postgres`` every process's, ``redis`` the workers', ``kafka-N`` the relay's,
``kafka-N-worker-M`` worker-M's). A toxic on one process's link (``worker-1/redis``,
``api/postgres``) uses a proxy of its own, added for the run (:func:`link_proxies`), with
the process restarted pointing at it (:func:`link_env`). A single process's Kafka link is
not offered: a broker advertises the proxy of the listener a client came in through, and a
client follows the advertised address after bootstrap. ``worker-N/mail`` is a link with no
shared proxy: the worker's calls to the example shop's mail service (``SHOP_MAIL_URL``).

A fault may wait before it starts until the workers it hits are busy (a scenario's
``wait_for``: a gauge of theirs, summed, at least some value, within a patience); a sigstop,
sigkill or restart of a worker waits by default for one job in flight. The injection records
what the wait saw, and the target's gauges at the last scrape before its signal
(:func:`wait_condition`, :meth:`Nemesis._wait_until_busy`).

Blocking stack calls run in a worker thread, one at a time (:class:`StackCalls`).
"""

from __future__ import annotations

import functools
import logging
import re
import signal
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from chaos.history import NEMESIS, NEMESIS_PROCESS, Recorder, nemesis_value
from chaos.scenario import KAFKA_COORDINATOR, WAIT_GAUGES, FaultSpec, WaitFor, fault_workers
from devstack import Stack
from devstack.layout import (
    APPS,
    HOST,
    KAFKA_DIRECT_BOOTSTRAP,
    PG_DATABASE,
    PG_PASSWORD,
    PG_USER,
    SHOP_MAIL_PORT,
    TOXIPROXY_URL,
    WORKER_PORTS,
)
from devstack.layout import PROXIES as PROXY_PORTS

log = logging.getLogger("chaos.nemesis")

T = TypeVar("T")

RUNTIME_PREFIX = "chaos-"  # runtime proxies and toxics the harness adds, and only those
# every leasework process's ops port (its /metrics)
OPS_PORTS: dict[str, int] = {name: port for name, (_role, port) in APPS.items()}
KAFKA_HEAL_TIMEOUT = 90.0
START_TIMEOUT = 90.0
# a worker is hit mid-job: its fault waits (up to this long) until it runs at least one job
MID_JOB_PATIENCE = 15.0
MID_JOB_FAULTS = frozenset({"sigstop", "sigkill", "restart"})
MID_JOB_WAIT = WaitFor("jobs_in_flight", 1.0, MID_JOB_PATIENCE)
# seconds between scrapes while a fault waits for busy workers (a completer batch lives for
# tens of milliseconds)
WAIT_POLL = 0.05
# upstream ports of the private links that have no shared proxy (chaos.scenario.PRIVATE_LINKS)
PRIVATE_LINK_PORTS: dict[str, int] = {"mail": SHOP_MAIL_PORT}
HEAL_ATTEMPTS = 3
HEAL_RETRY_PAUSE = 1.0


class NemesisError(RuntimeError):
    """A fault cannot be set up as asked (the message says why and what to do)."""


# ---------------------------------------------------------------- pure helpers


def affected(fault: str, target: str | None) -> str:
    """Which leasework processes a fault hits, in words (for the report)."""
    if target and "/" in target:
        process, proxy = target.split("/", 1)
        return f"{process} only: its own {proxy} proxy, added for this run"
    if target == "postgres":
        return (
            "api, relay, worker-1, worker-2: the shared proxy carries every leasework "
            "process's Postgres traffic (the harness reads Postgres directly)"
        )
    if target == "redis" and fault in ("redis_restart", "redis_flushall"):
        return "worker-1, worker-2 (only workers use Redis: leases and the fence counter)"
    if target == "redis":
        return "worker-1, worker-2: the shared proxy; only workers use Redis"
    if fault == "kafka_kill" and target:
        return (
            f"broker {target}: its partition leaders fail over; the relay's producer and the "
            "workers' consumers reconnect to the other brokers"
        )
    if target and (match := re.fullmatch(r"(kafka-\d+)-(worker-\d+)", target)):
        broker, worker = match.groups()
        return (
            f"{worker} only (fetches, group coordinator, offset commits) whenever it talks to "
            f"{broker}: its own proxy; the other worker's and the relay's links and "
            "replication between brokers are untouched"
        )
    if target and target.startswith("kafka-"):
        return (
            f"relay (the producer; the api does not use Kafka) whenever it talks to {target}; "
            f"the workers use {target}-worker-N, replication between brokers is direct"
        )
    if fault in ("sigstop", "sigkill", "restart"):
        return f"{target} only"
    return str(target)


def wait_condition(spec: FaultSpec) -> WaitFor | None:
    """What a fault waits for before it starts: its own ``wait_for``; else, for a sigstop,
    sigkill or restart of a worker, one job in flight; else nothing."""
    if spec.wait_for is not None:
        return spec.wait_for
    if spec.fault in MID_JOB_FAULTS and spec.target in WORKER_PORTS:
        return MID_JOB_WAIT
    return None


def worker_gauges(values: Mapping[str, float]) -> dict[str, float]:
    """The :data:`chaos.scenario.WAIT_GAUGES` of one scrape, by short name."""
    return {name: values[metric] for name, metric in WAIT_GAUGES.items() if metric in values}


def split_target(target: str | None) -> tuple[str | None, str | None]:
    """``worker-1/redis`` -> (``worker-1``, ``redis``); ``redis`` -> (None, ``redis``)."""
    if target and "/" in target:
        process, proxy = target.split("/", 1)
        return process, proxy
    return None, target


def runtime_proxy_name(process: str, proxy: str) -> str:
    return f"{RUNTIME_PREFIX}{process}-{proxy}"


def link_targets(faults: Iterable[FaultSpec]) -> list[tuple[str, str]]:
    """The (process, proxy) pairs that need a proxy of their own, in a stable order."""
    found: set[tuple[str, str]] = set()
    for spec in faults:
        if spec.kind != "toxic":
            continue
        process, proxy = split_target(spec.target)
        if process is not None and proxy is not None:
            if proxy.startswith("kafka"):
                raise NemesisError(
                    f"{spec.target}: a single process's Kafka link is not offered (a broker "
                    "advertises the proxy of the listener a client came in through, so a "
                    "client would leave a private proxy after bootstrap); target kafka-N for "
                    "the relay's links or kafka-N-worker-M for one worker's"
                )
            found.add((process, proxy))
    return sorted(found)


def link_env(proxy: str, port: int) -> dict[str, str]:
    """The environment that points a leasework process at a private proxy on ``port``."""
    if proxy == "postgres":
        return {
            "LEASEWORK_POSTGRES_DSN": (
                f"postgresql://{PG_USER}:{PG_PASSWORD}@{HOST}:{port}/{PG_DATABASE}"
            )
        }
    if proxy == "redis":
        return {"LEASEWORK_REDIS_ADDR": f"{HOST}:{port}"}
    if proxy == "mail":  # read by the example shop's send_receipt (examples/shop/jobs.py)
        return {"SHOP_MAIL_URL": f"http://{HOST}:{port}"}
    raise NemesisError(f"no per-process link for {proxy!r}; only postgres, redis and mail")


def toxic_bodies(spec: FaultSpec, name: str) -> list[dict[str, Any]]:
    """Toxiproxy toxic definitions for a toxic fault (one per stream; ``both`` is two).
    ``name`` is the injection's unique stem."""
    if spec.fault == "link_down":
        return []
    params = dict(spec.params)
    stream = params.pop("stream", "downstream")
    toxicity = float(params.pop("toxicity", 1.0))
    streams = ("upstream", "downstream") if stream == "both" else (stream,)
    return [
        {
            "name": f"{name}-{s}",
            "type": spec.fault,
            "stream": s,
            "toxicity": toxicity,
            "attributes": dict(params),
        }
        for s in streams
    ]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def coordinator_broker(group: str = "leasework-workers", timeout: float = 10.0) -> str:
    """The stack name (``kafka-N``) of the broker coordinating ``group`` (blocking; asks
    the cluster through the direct inter-broker listeners)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": KAFKA_DIRECT_BOOTSTRAP, "log_level": 0})
    described = admin.describe_consumer_groups([group], request_timeout=timeout)
    return f"kafka-{described[group].result(timeout=timeout).coordinator.id}"


# ---------------------------------------------------------------- toxiproxy


class ToxiproxyError(RuntimeError):
    pass


class ToxiproxyClient:
    """Toxiproxy's HTTP API, spoken directly with httpx (Trio-friendly)."""

    def __init__(self, url: str = TOXIPROXY_URL, *, timeout: float = 5.0) -> None:
        self.http = httpx.AsyncClient(base_url=url, timeout=timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> ToxiproxyClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(
        self, method: str, path: str, body: Any = None, *, missing_ok: bool = False
    ) -> Any:
        response = await self.http.request(method, path, json=body)
        if missing_ok and response.status_code == 404:
            return None
        if not response.is_success:
            raise ToxiproxyError(
                f"toxiproxy {method} {path} -> {response.status_code} {response.text.strip()}"
            )
        return response.json() if response.content else None

    async def proxies(self) -> dict[str, Any]:
        return await self._call("GET", "/proxies")

    async def create_proxy(self, name: str, listen: str, upstream: str) -> None:
        await self._call(
            "POST",
            "/proxies",
            {"name": name, "listen": listen, "upstream": upstream, "enabled": True},
        )

    async def delete_proxy(self, name: str) -> None:
        await self._call("DELETE", f"/proxies/{name}", missing_ok=True)

    async def set_enabled(self, name: str, enabled: bool) -> None:
        await self._call("POST", f"/proxies/{name}", {"enabled": enabled})

    async def add_toxic(self, proxy: str, toxic: Mapping[str, Any]) -> None:
        await self._call("POST", f"/proxies/{proxy}/toxics", dict(toxic))

    async def remove_toxic(self, proxy: str, name: str) -> None:
        await self._call("DELETE", f"/proxies/{proxy}/toxics/{name}", missing_ok=True)

    async def reset(self) -> None:
        """Remove every toxic and enable every proxy."""
        await self._call("POST", "/reset")

    async def delete_runtime_proxies(self) -> list[str]:
        """Delete the proxies this harness added (names starting ``chaos-``)."""
        names = [n for n in await self.proxies() if n.startswith(RUNTIME_PREFIX)]
        for name in names:
            await self.delete_proxy(name)
        return names


# ---------------------------------------------------------------- metrics


def parse_metrics(text: str) -> dict[str, float]:
    """Sum of every sample by sample name (labels summed away)."""
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    return sums


class CounterTracker:
    """Counters of processes that may restart during a run (a restart resets them to 0).

    Each observation is keyed by the process and its ``process_start_time_seconds``: one
    incarnation. The run's total is, over all incarnations, the last value seen minus the
    first value seen for an incarnation that was already running when the run started (a
    later one started from zero). Increments between an incarnation's last scrape and its
    death are missed: the totals are lower bounds (the nemesis scrapes just before it kills
    or stops a process to keep that gap small).
    """

    def __init__(self, run_started_epoch: float) -> None:
        self.run_started_epoch = run_started_epoch
        self._first: dict[tuple[str, float], dict[str, float]] = {}
        self._last: dict[tuple[str, float], dict[str, float]] = {}

    def observe(self, process: str, started: float, values: Mapping[str, float]) -> None:
        key = (process, started)
        if key not in self._first:
            self._first[key] = dict(values) if started < self.run_started_epoch else {}
        self._last[key] = dict(values)

    def incarnations(self, process: str) -> int:
        return sum(1 for p, _ in self._last if p == process)

    def per_process(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for key, last in self._last.items():
            first = self._first.get(key, {})
            totals = out.setdefault(key[0], {})
            for name, value in last.items():
                totals[name] = totals.get(name, 0.0) + max(0.0, value - first.get(name, 0.0))
        return out

    def totals(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for values in self.per_process().values():
            for name, value in values.items():
                out[name] = out.get(name, 0.0) + value
        return out


COUNTERS: tuple[str, ...] = (
    "leasework_fence_rejections_total",
    "leasework_lease_loss_cancellations_total",
    "leasework_fence_reseeds_total",
    "leasework_messages_skipped_total",
    "leasework_lease_conflicts_total",
    "leasework_lease_expirations_total",
    "leasework_relay_published_total",
    "leasework_relay_publish_failures_total",
    "leasework_retries_total",
)


class MetricsSampler:
    """Scrapes the leasework processes' /metrics every ``interval`` into a tracker."""

    def __init__(
        self,
        tracker: CounterTracker,
        ports: Mapping[str, int] = OPS_PORTS,
        names: Sequence[str] = COUNTERS,
        *,
        timeout: float = 1.0,
    ) -> None:
        self.tracker = tracker
        self.ports = dict(ports)
        self.names = tuple(names)
        self.http = httpx.AsyncClient(timeout=timeout)
        self.failures: dict[str, int] = {}

    async def aclose(self) -> None:
        await self.http.aclose()

    async def scrape(self, process: str) -> dict[str, float] | None:
        try:
            response = await self.http.get(f"http://{HOST}:{self.ports[process]}/metrics")
            response.raise_for_status()
            return parse_metrics(response.text)
        except (httpx.HTTPError, ValueError):
            self.failures[process] = self.failures.get(process, 0) + 1
            return None

    async def sample(self, process: str) -> dict[str, float] | None:
        """Scrape one process now and record its counters; None if it did not answer."""
        if process not in self.ports:
            return None
        values = await self.scrape(process)
        if values is None or "process_start_time_seconds" not in values:
            return values
        self.tracker.observe(
            process,
            values["process_start_time_seconds"],
            {n: values.get(n, 0.0) for n in self.names},
        )
        return values

    async def sample_all(self) -> None:
        async with trio.open_nursery() as nursery:
            for process in self.ports:
                nursery.start_soon(self.sample, process)

    async def run(self, interval: float = 1.0) -> None:
        while True:
            await self.sample_all()
            await trio.sleep(interval)

    async def in_flight(self) -> tuple[float, list[str]]:
        """Jobs running on the workers now, and the workers that did not answer."""
        total, silent = 0.0, []
        for worker in WORKER_PORTS:
            values = await self.scrape(worker)
            if values is None:
                silent.append(worker)
            else:
                total += values.get("leasework_jobs_in_flight", 0.0)
        return total, silent


# ---------------------------------------------------------------- the stack


class StackCalls:
    """Blocking :class:`Stack` calls in a worker thread, one at a time."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.limiter = trio.CapacityLimiter(1)

    async def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await trio.to_thread.run_sync(
            functools.partial(fn, *args, **kwargs), limiter=self.limiter
        )


# ---------------------------------------------------------------- the nemesis


@dataclass
class Injection:
    """One fault as injected: its spec, a unique stem for toxic names, and its state."""

    number: int
    spec: FaultSpec
    target: str | None = None  # the spec's target, resolved ("coordinator" -> "kafka-3")
    started: bool = False  # the start was attempted (it may have half-worked)
    healed: bool = False
    start_error: str | None = None
    stop_error: str | None = None
    started_at: float | None = None  # history time
    healed_at: float | None = None
    in_flight: float | None = None  # jobs the target worker ran when it was hit
    heal_failures: list[str] = field(default_factory=list)  # failed heal attempts, retried
    waited: float = 0.0  # seconds the fault waited for busy workers (see ``wait``)
    wait: WaitFor | None = None  # what the start waited for (None: nothing)
    wait_met: bool | None = None  # whether it came (False: patience ran out first)
    peak: float | None = None  # the largest value of the awaited gauge seen while waiting
    # the workers' gauges (summed over the workers the fault hits) at the scrape that ended
    # the wait, and at the nemesis's last scrape of the target just before its signal
    seen: dict[str, float] = field(default_factory=dict)
    at_signal: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.target is None:
            self.target = self.spec.target

    @property
    def label(self) -> str:
        return f"{self.spec.fault} {self.target}" if self.target else self.spec.fault

    @property
    def stem(self) -> str:
        return f"{RUNTIME_PREFIX}{self.number}-{self.spec.fault}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "fault": self.spec.fault,
            "target": self.target,
            "planned_target": self.spec.target,
            "params": dict(self.spec.params),
            "planned_at": self.spec.at,
            "planned_duration": self.spec.duration,
            "started_at": self.started_at,
            "healed_at": self.healed_at,
            "start_error": self.start_error,
            "stop_error": self.stop_error,
            "affects": affected(self.spec.fault, self.target),
            "in_flight": self.in_flight,
            "waited_for_a_job": round(self.waited, 2),
            "wait_for": (
                None
                if self.wait is None
                else {
                    "gauge": self.wait.gauge,
                    "at_least": self.wait.at_least,
                    "patience": self.wait.patience,
                    "met": self.wait_met,
                    "peak": self.peak,
                    "workers": list(fault_workers(self.target)),
                }
            ),
            "gauges_seen": dict(self.seen),
            "gauges_at_signal": dict(self.at_signal),
            "heal_failures": list(self.heal_failures),
        }

    def busy_text(self) -> str:
        """What the fault met, for the run's log line (empty when it waited for nothing)."""
        if self.wait is None:
            return ""
        seen = ", ".join(f"{k} {v:g}" for k, v in self.seen.items()) or "no gauge readable"
        text = f"{seen} after waiting {self.waited:.1f}s"
        if self.wait_met is False:
            text += (
                f" (wanted {self.wait.label}: patience ran out, at most {self.peak or 0:g} seen)"
            )
        if self.at_signal:
            text += "; just before the signal: " + ", ".join(
                f"{k} {v:g}" for k, v in self.at_signal.items()
            )
        return text


@dataclass
class Nemesis:
    """Injects and heals faults, recording each start and stop in the history.

    ``env_for`` gives the ``extra_env`` a leasework process is (re)started with during this
    run (the unsafe lease mode, a private proxy address). ``proxy_for`` maps a toxic's
    target to the Toxiproxy proxy name. ``sampler`` is scraped before a process is killed.
    """

    calls: StackCalls
    toxiproxy: ToxiproxyClient
    recorder: Recorder
    env_for: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    sampler: MetricsSampler | None = None
    say: Callable[[str], None] = lambda line: None
    injections: list[Injection] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = trio.Lock()  # one nemesis operation at a time (process "nemesis")

    @property
    def stack(self) -> Stack:
        return self.calls.stack

    def proxy_for(self, target: str | None) -> str:
        process, proxy = split_target(target)
        if proxy is None:
            raise NemesisError("a toxic needs a proxy as its target")
        return proxy if process is None else runtime_proxy_name(process, proxy)

    # -------------------------------------------------------- schedule

    async def run_schedule(self, faults: Sequence[FaultSpec], origin: float) -> None:
        """Run every fault at ``origin + at`` (trio clock), heal it ``duration`` later."""
        async with trio.open_nursery() as nursery:
            for spec in faults:
                nursery.start_soon(self._one, spec, origin)

    async def _one(self, spec: FaultSpec, origin: float) -> None:
        await trio.sleep_until(origin + spec.at)
        injection = await self.inject(spec)
        await trio.sleep(spec.duration)
        await self.heal(injection)

    # -------------------------------------------------------- start and stop

    async def _busy(self, workers: Sequence[str]) -> dict[str, float] | None:
        """The wait gauges summed over ``workers`` (scraped now), or None if none answered."""
        assert self.sampler is not None
        total: dict[str, float] = {}
        answered = False
        for worker in workers:
            values = await self.sampler.scrape(worker)
            if values is None:
                continue
            answered = True
            for name, value in worker_gauges(values).items():
                total[name] = total.get(name, 0.0) + value
        return total if answered else None

    async def _wait_until_busy(self, injection: Injection) -> None:
        """A fault waits until the workers it hits are busy as its :func:`wait_condition`
        says (by default a sigstop, sigkill or restart of a worker waits for a job in
        flight), or until its patience runs out, so that it hits work instead of, by bad
        luck, an idle worker. What it saw is recorded in the injection."""
        wait = wait_condition(injection.spec)
        if self.sampler is None or wait is None:
            return
        workers = [w for w in fault_workers(injection.target) if w in WORKER_PORTS]
        if not workers:
            return
        injection.wait = wait
        injection.wait_met = False
        started = trio.current_time()
        with trio.move_on_after(wait.patience):
            while True:
                seen = await self._busy(workers)
                if seen is not None:
                    injection.seen = seen
                    if "jobs_in_flight" in seen:
                        injection.in_flight = seen["jobs_in_flight"]
                    value = seen.get(wait.gauge, 0.0)
                    injection.peak = max(value, injection.peak or 0.0)
                    if value >= wait.at_least:
                        injection.wait_met = True
                        break
                await trio.sleep(WAIT_POLL)
        injection.waited = trio.current_time() - started

    async def inject(self, spec: FaultSpec) -> Injection:
        injection = Injection(len(self.injections), spec)
        self.injections.append(injection)
        await self._wait_until_busy(injection)
        async with self._lock:
            if spec.fault == "kafka_kill" and spec.target == KAFKA_COORDINATOR:
                try:
                    injection.target = await self.calls(coordinator_broker)
                except Exception as exc:  # the start below fails on the unresolved name
                    self.say(f"nemesis: cannot find the group coordinator: {exc}")
            value = nemesis_value(spec.fault, "start", injection.target, **spec.params)
            op = self.recorder.invoke(NEMESIS_PROCESS, NEMESIS, value)
            injection.started = True
            try:
                await self._start(injection)
            except Exception as exc:  # the run goes on; the report shows it
                injection.start_error = f"{type(exc).__name__}: {exc}"[:500]
                self.recorder.complete(op, "info", error=injection.start_error)
                self.say(f"nemesis: {injection.label} start FAILED: {injection.start_error}")
            else:
                self.recorder.complete(op, "ok")
                busy = injection.busy_text()
                busy = f", {busy}" if busy else ""
                self.say(
                    f"nemesis: {injection.label} started "
                    f"({affected(spec.fault, injection.target)}{busy})"
                )
            injection.started_at = self.recorder.now()
        return injection

    async def heal(self, injection: Injection) -> None:
        """Undo one fault; a heal is idempotent, so a failed one is tried HEAL_ATTEMPTS
        times before it is recorded as failed (heal_all tries again at the end)."""
        if injection.healed or not injection.started:
            return
        spec = injection.spec
        async with self._lock:
            value = nemesis_value(spec.fault, "stop", injection.target, **spec.params)
            op = self.recorder.invoke(NEMESIS_PROCESS, NEMESIS, value)
            failure: str | None = None
            for attempt in range(HEAL_ATTEMPTS):
                if attempt:
                    await trio.sleep(HEAL_RETRY_PAUSE)
                try:
                    await self._stop(injection)
                except Exception as exc:
                    failure = f"{type(exc).__name__}: {exc}"[:500]
                    injection.heal_failures.append(failure)
                    self.say(
                        f"nemesis: {injection.label} heal attempt {attempt + 1} failed: {failure}"
                    )
                else:
                    failure = None
                    break
            if failure is not None:
                injection.stop_error = failure
                self.recorder.complete(op, "info", error=injection.stop_error)
                self.say(f"nemesis: {injection.label} heal FAILED: {injection.stop_error}")
            else:
                injection.healed = True
                injection.healed_at = self.recorder.now()
                self.recorder.complete(op, "ok")
                self.say(f"nemesis: {injection.label} healed")

    async def heal_all(self) -> list[Injection]:
        """Heal every injection not yet healed, newest first; returns those that would not
        heal (the caller restores the whole stack after this)."""
        for injection in reversed(self.injections):
            if injection.started and not injection.healed:
                await self.heal(injection)
        return [i for i in self.injections if i.started and not i.healed]

    async def _bank(self, injection: Injection) -> None:
        """Scrape the target just before its signal: its counters (a kill loses what the
        last scrape did not see) and, for a worker, how busy it was."""
        if self.sampler is None or injection.target is None:
            return
        values = await self.sampler.sample(injection.target)
        if values is not None and injection.wait is not None and injection.target in WORKER_PORTS:
            injection.at_signal = worker_gauges(values)

    async def _restart(self, name: str) -> None:
        env = dict(self.env_for.get(name, {}))
        await self.calls(self.stack.start, name, extra_env=env or None, timeout=START_TIMEOUT)

    async def _start(self, injection: Injection) -> None:
        spec = injection.spec
        kind, target = spec.kind, injection.target
        assert target is not None
        if kind == "toxic":
            proxy = self.proxy_for(target)
            if spec.fault == "link_down":
                await self.toxiproxy.set_enabled(proxy, False)
                return
            for body in toxic_bodies(spec, injection.stem):
                await self.toxiproxy.add_toxic(proxy, body)
            return
        if spec.fault == "sigstop":
            await self._bank(injection)
            await self.calls(self.stack.pause, target)
            return
        if spec.fault in ("sigkill", "kafka_kill"):
            await self._bank(injection)
            await self.calls(self.stack.kill, target, signal.SIGKILL)
            return
        if spec.fault == "restart":
            await self._bank(injection)
            await self.calls(self.stack.stop, target)
            return
        if spec.fault == "redis_restart":
            await self.calls(self.stack.kill, "redis", signal.SIGKILL)
            return
        if spec.fault == "redis_flushall":
            await self.calls(self.stack.redis_flushall)
            return
        raise NemesisError(f"no nemesis for fault {spec.fault!r}")

    async def _stop(self, injection: Injection) -> None:
        spec = injection.spec
        kind, target = spec.kind, injection.target
        assert target is not None
        if kind == "toxic":
            proxy = self.proxy_for(target)
            if spec.fault == "link_down":
                await self.toxiproxy.set_enabled(proxy, True)
                return
            for body in toxic_bodies(spec, injection.stem):
                await self.toxiproxy.remove_toxic(proxy, body["name"])
            return
        if spec.fault == "sigstop":
            if await self.calls(self.stack.is_running, target):
                await self.calls(self.stack.resume, target)
            return
        if spec.fault in ("sigkill", "restart"):
            await self._restart(target)
            return
        if spec.fault == "kafka_kill":
            await self.calls(self.stack.start, target, timeout=START_TIMEOUT)
            await self.calls(self.stack.wait_kafka_cluster, KAFKA_HEAL_TIMEOUT)
            return
        if spec.fault == "redis_restart":
            await self.calls(self.stack.start, "redis", timeout=START_TIMEOUT)
            return
        if spec.fault == "redis_flushall":
            return
        raise NemesisError(f"no nemesis for fault {spec.fault!r}")


# ---------------------------------------------------------------- private links


@dataclass(frozen=True)
class Link:
    process: str
    proxy: str
    port: int

    @property
    def name(self) -> str:
        return runtime_proxy_name(self.process, self.proxy)


async def link_proxies(toxiproxy: ToxiproxyClient, pairs: Sequence[tuple[str, str]]) -> list[Link]:
    """Add a private proxy for each (process, proxy) pair, in front of the same upstream as
    the shared one. The caller restarts each process with :func:`link_env`."""
    links = []
    for process, proxy in pairs:
        link = Link(process, proxy, free_port())
        port = PRIVATE_LINK_PORTS[proxy] if proxy in PRIVATE_LINK_PORTS else PROXY_PORTS[proxy][1]
        upstream = f"{HOST}:{port}"
        await toxiproxy.delete_proxy(link.name)
        await toxiproxy.create_proxy(link.name, f"{HOST}:{link.port}", upstream)
        links.append(link)
    return links


def process_envs(
    links: Sequence[Link], *, fencing: bool, unsafe_env: Mapping[str, str]
) -> dict[str, dict[str, str]]:
    """The extra environment of each leasework process for a run: the unsafe lease mode on
    the workers when fencing is off, and the private proxy addresses."""
    envs: dict[str, dict[str, str]] = {}
    if not fencing:
        for worker in WORKER_PORTS:
            envs.setdefault(worker, {}).update(unsafe_env)
    for link in links:
        envs.setdefault(link.process, {}).update(link_env(link.proxy, link.port))
    return envs
