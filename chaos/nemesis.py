"""The nemesis: the interpreter of a run's fault schedule, recording each start and heal in
the history.

What a fault does lives with the fault, in the registry (:mod:`chaos.nemeses`): its start and
its heal. The nemesis runs each fault of the schedule at its time and heals it ``duration``
later, one nemesis operation at a time (process ``nemesis`` in the history), and lends the
faults its :class:`~chaos.nemeses.base.Hands`: the stack (blocking calls in a worker thread,
:class:`~chaos.stack.StackCalls`), Toxiproxy, the run's environment for a process it starts
again, and a scrape just before a signal. A heal is idempotent and derived from the injection
alone, so :meth:`Nemesis.heal_all` can always undo whatever was started, also after an error
or Ctrl-C.

A fault may wait before it starts until the workers it hits are busy (a scenario's
``wait_for``: a gauge of theirs, summed, at least some value, within a patience); a sigstop,
sigkill or restart of a worker waits by default for one job in flight. The injection records
what the wait saw, and the target's gauges at the last scrape before its signal
(:func:`wait_condition`, :meth:`Nemesis._wait_until_busy`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from chaos import nemeses
from chaos.history import NEMESIS, NEMESIS_PROCESS, Recorder, nemesis_value
from chaos.links import runtime_proxy_name
from chaos.metrics import MetricsSampler, worker_gauges
from chaos.nemeses.base import START_TIMEOUT, NemesisError, WaitFor, fault_workers, split_target
from chaos.scenario import FaultSpec
from chaos.stack import StackCalls
from chaos.toxiproxy import RUNTIME_PREFIX, ToxiproxyClient
from devstack import Stack
from devstack.layout import WORKER_PORTS

# seconds between scrapes while a fault waits for busy workers (a completer batch lives for
# tens of milliseconds)
WAIT_POLL = 0.05
HEAL_ATTEMPTS = 3
HEAL_RETRY_PAUSE = 1.0


def wait_condition(spec: FaultSpec) -> WaitFor | None:
    """What a fault waits for before it starts: its own ``wait_for``; else its fault's
    default (a sigstop, sigkill or restart of a worker: one job in flight); else nothing."""
    if spec.wait_for is not None:
        return spec.wait_for
    return nemeses.lookup(spec.fault).default_wait(spec.target)


def affected(fault: str, target: str | None) -> str:
    """Which leasework processes a fault hits, in words (for the report)."""
    return nemeses.lookup(fault).affected(target)


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
        fault = nemeses.lookup(spec.fault)
        injection = Injection(len(self.injections), spec)
        self.injections.append(injection)
        await self._wait_until_busy(injection)
        async with self._lock:
            injection.target = await fault.resolve(self, injection.target)
            value = nemesis_value(spec.fault, "start", injection.target, **spec.params)
            op = self.recorder.invoke(NEMESIS_PROCESS, NEMESIS, value)
            injection.started = True
            try:
                assert injection.target is not None
                await fault.start(self, injection)
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
        fault = nemeses.lookup(spec.fault)
        async with self._lock:
            value = nemesis_value(spec.fault, "stop", injection.target, **spec.params)
            op = self.recorder.invoke(NEMESIS_PROCESS, NEMESIS, value)
            failure: str | None = None
            for attempt in range(HEAL_ATTEMPTS):
                if attempt:
                    await trio.sleep(HEAL_RETRY_PAUSE)
                try:
                    assert injection.target is not None
                    await fault.heal(self, injection)
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

    async def bank(self, injection: Injection) -> None:
        """Scrape the target just before its signal: its counters (a kill loses what the
        last scrape did not see) and, for a worker, how busy it was."""
        if self.sampler is None or injection.target is None:
            return
        values = await self.sampler.sample(injection.target)
        if values is not None and injection.wait is not None and injection.target in WORKER_PORTS:
            injection.at_signal = worker_gauges(values)

    async def restart(self, name: str) -> None:
        env = dict(self.env_for.get(name, {}))
        await self.calls(self.stack.start, name, extra_env=env or None, timeout=START_TIMEOUT)
