"""The chaos runner: one scenario from a healthy stack to a verdict and a report.

For each scenario:

1. **Baseline.** Toxics removed, the harness's private proxies deleted, every service
   running, un-paused and ready with its normal environment, Kafka's ISR complete.
2. **Setup.** Private proxies for per-process links; workers restarted in the unsafe lease
   mode when the scenario turns fencing off; processes restarted pointing at their private
   proxies; the stack's relay restarted with the scenario's options for it, and the extra
   relays it asks for (``relay-2``, ``relay-3``) started.
3. **Run.** The scenario's schedules are created (:mod:`chaos.schedules`); the workload
   (:mod:`chaos.workload`), its unique load if it has one (:mod:`chaos.unique_load`) and
   the fault schedule (:mod:`chaos.nemesis`) run side by side in
   one nursery, while the processes' counters are scraped every second. Whatever happens (an
   error, Ctrl-C), every fault is healed (``finally``, shielded from cancellation). The
   schedules are paused once the tick due when the load ended has been handled.
4. **Quiet.** Wait until every job of the run (its schedules' too) is terminal and no
   worker has a job in flight (twice in a row, one second apart), or the scenario's quiet
   timeout passes.
5. **Check.** Read ``jobs``, ``effects`` and ``attempts`` straight from Postgres (port 15433,
   not the proxy), plus the example shop's orders (each receipt recorded on an order is an
   effect of its job, :mod:`chaos.shop`) and mail ledger, and the run's messages straight
   from Kafka (inter-broker listeners), and the schedules' windows, tick rows, jobs and
   effects (deleting the schedules after), run the history checkers (:mod:`chaos.verdict`,
   the tick checker :mod:`chaos.ticks` and the unique-keys checker
   :mod:`chaos.unique_keys` among them, the latter on the unique load's inserts and the jobs
   holding their keys),
   judge against the scenario's expectations plus the harness's own checks
   (:mod:`chaos.judge`): evidence that the fault hit (redeliveries,
   unknown submits that landed, messages produced twice), the backlog drain bound, faults
   that could not be injected or healed, an API that said "nothing was written" and had
   written, a leasework process that died with no fault killing it (a crash), and signs that
   something else drove the shared stack meanwhile (a restart no fault made, a process
   without the run's environment).
6. **Report** under ``reports/chaos/<timestamp>/<scenario>/``: ``history.jsonl`` (written
   as the run goes) and ``tables.json`` (the rows the checker saw, written as soon as they
   are read, so a run can be checked again offline); then ``report.json``, ``report.md`` and
   ``timeline.svg``, written once from the run's record (:mod:`chaos.record`,
   :mod:`chaos.report`).
7. **Restore** (``finally``): the extra relays stopped, processes back to their normal
   environment, private proxies deleted, toxics reset, every service up and ready.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from chaos import nemeses
from chaos.alerts import AlertArrival, RunPrometheus
from chaos.auditor import AuditorView, read_auditor
from chaos.generator import plan_submits
from chaos.history import HistoryWriter, Recorder
from chaos.judge import HARNESS, Evidence, Judgement, judge_run
from chaos.limits import LimitView, RateView, read_limits, read_rates
from chaos.links import extra_relay_envs, link_proxies, link_targets, process_envs
from chaos.loader import load_scenarios
from chaos.messages import message_view, topic_end_offsets, topic_messages
from chaos.metrics import COUNTERS, OPS_PORTS, CounterTracker, MetricsSampler
from chaos.nemeses.base import NemesisError
from chaos.nemesis import Nemesis
from chaos.pauses import PauseView, read_pauses
from chaos.quiet import Quiet, wait_quiet
from chaos.record import AlertsSeen, RunDetails, RunRecord, Setup, recovery_rows
from chaos.report import (
    REPORT_JSON,
    SummaryRow,
    TickSummaryRow,
    UniqueSummaryRow,
    part_summary_table,
    record_summary_row,
    summary_row_from_report,
    summary_table,
    tick_summary_rows,
    unique_summary_rows,
    write_report,
)
from chaos.scenario import Scenario
from chaos.schedules import RunSchedules
from chaos.shop import shop_view
from chaos.stack import (
    UNSAFE_ENV,
    StackCalls,
    app_pids,
    baseline,
    interference,
    restart_with,
    start_extra_relay,
    stop_extra_relays,
)
from chaos.tables import TABLES_JSON, read_tables, save_tables
from chaos.ticks import TickObservation
from chaos.toxiproxy import ToxiproxyClient
from chaos.unique_keys import UniqueObservation
from chaos.unique_load import UniqueLoad, read_unique_jobs
from chaos.verdict import Verdict, check
from chaos.workload import WorkloadClient, backlog_drain, client_view
from devstack import Stack
from devstack.layout import API_URL, EXTRA_RELAYS, SHOP_URL

REPO = Path(__file__).resolve().parents[1]
SCENARIOS_DIR = REPO / "scenarios"
REPORTS_DIR = REPO / "reports" / "chaos"
HISTORY_JSONL = "history.jsonl"
RETRY_GRACE = 45.0  # submits keep retrying this long after the last fault is healed
RESTORE_TIMEOUT = 300.0

Say = Callable[[str], None]


def stderr_say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- results


@dataclass
class RunResult:
    """One scenario as the runner ended it: its record (None when the harness failed to run
    it, ``error`` saying why) and how long it took."""

    scenario: Scenario
    directory: Path
    seconds: float
    record: RunRecord | None = None
    error: str | None = None

    @property
    def verdict(self) -> Verdict | None:
        return self.record.verdict if self.record is not None else None

    @property
    def judgement(self) -> Judgement | None:
        return self.record.judgement if self.record is not None else None

    @property
    def details(self) -> RunDetails | None:
        return self.record.details if self.record is not None else None

    @property
    def passed(self) -> bool | str:
        if self.error is not None or self.judgement is None:
            return False
        return self.judgement.passed


# ---------------------------------------------------------------- one scenario


def key_prefix(scenario: Scenario) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return f"chaos-{scenario.name}-{stamp}-{uuid.uuid4().hex[:6]}"


def default_seed(scenario: Scenario) -> int:
    return zlib.crc32(scenario.name.encode())


def _last_fault_stop(scenario: Scenario) -> float:
    return max((f.stop for f in scenario.faults), default=0.0)


async def run_scenario(
    scenario: Scenario,
    stack: Stack,
    out_dir: Path,
    *,
    seed: int | None = None,
    say: Say = stderr_say,
) -> RunResult:
    """Run one scenario against the stack and write its report under ``out_dir/<name>``."""
    t_start = time.monotonic()
    directory = out_dir / scenario.name
    directory.mkdir(parents=True, exist_ok=True)
    seed = default_seed(scenario) if seed is None else seed
    prefix = key_prefix(scenario)

    def log(line: str) -> None:
        say(f"[{scenario.name} +{time.monotonic() - t_start:5.1f}s] {line}")

    pairs = link_targets(scenario.faults)  # fails early on an impossible link
    if pairs and stack.layout.mode() == "secure":
        own = ", ".join("/".join(pair) for pair in pairs)
        raise NemesisError(
            f"{scenario.name} cuts a link of one process's own ({own}); the harness builds "
            "those on the plain listeners only: run it after `just up --plain`"
        )
    log(f"stack: leasework's processes on the {stack.layout.mode()} listeners")
    calls = StackCalls(stack)
    toxiproxy = ToxiproxyClient()
    envs: dict[str, dict[str, str]] = {}
    extra = extra_relay_envs(scenario.relays)
    try:
        with trio.CancelScope(shield=True):
            log("baseline: every service up, ready and normal; no toxics")
            await toxiproxy.reset()
            await toxiproxy.delete_runtime_proxies()
            done = await calls(baseline, stack, shop=scenario.uses_shop)
        links = await link_proxies(toxiproxy, pairs)
        envs = process_envs(
            links,
            fencing=scenario.fencing,
            unsafe_env=UNSAFE_ENV,
            relays=scenario.relays,
            mail_guard=scenario.mail_guard,
        )
        for name, env in envs.items():
            log(f"setup: restarting {name} with {env}")
            await calls(restart_with, stack, name, env)
        for name, env in extra.items():
            log(f"setup: starting {name} for the run with {env or 'the stack environment'}")
            await calls(start_extra_relay, stack, name, env)
            done.append(f"started {name} for the run")
        setup = Setup(tuple(done), {**envs, **{n: e for n, e in extra.items() if e}}, tuple(links))
        # started before the run's clock, so the fault schedule is not shifted by its start-up
        prometheus = RunPrometheus(calls, log, run=prefix)
        await prometheus.start()
        try:
            run = _Run(scenario, calls, toxiproxy, {**envs, **extra}, directory, prefix, seed, log)
            return await run.run(setup, prometheus)
        finally:
            await prometheus.aclose()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(RESTORE_TIMEOUT):
            log("restore: processes back to normal, private proxies gone, toxics reset")
            try:
                stopped = await calls(stop_extra_relays, stack)
                if stopped:
                    log(f"restore: stopped {', '.join(stopped)}")
            except Exception as exc:  # the baseline below stops them too
                log(f"restore: stopping the extra relays FAILED: {type(exc).__name__}: {exc}")
            try:
                await toxiproxy.reset()
                await toxiproxy.delete_runtime_proxies()
                for name in envs:
                    await calls(restart_with, stack, name, {})
                await calls(baseline, stack, shop=scenario.uses_shop)
            except Exception as exc:  # reported; the next scenario's baseline tries again
                log(f"restore FAILED: {type(exc).__name__}: {exc}")
            await toxiproxy.aclose()
        log(f"done in {time.monotonic() - t_start:.0f}s")


@dataclass
class _Seen:
    """What the run saw of the system, gathered while it ran and once it was quiet."""

    firing_at_start: set[str] | None
    workload_seconds: float
    quiet: Quiet
    tables: dict[str, Any]
    kafka_messages: list[dict[str, Any]] | None
    fired: dict[str, float] | None
    delivered: dict[str, AlertArrival] | None  # notifications through Alertmanager, by alert
    fault_epoch: float | None  # when the first fault started (None: none did)
    crashed: list[str]
    meddling: list[str]
    auditor: AuditorView | None = None  # the relay's auditor on the run's jobs
    pauses: PauseView | None = None  # the queue_pause faults' windows and what started inside
    limits: LimitView | None = None  # the keyed jobs' effects in flight per key
    rates: RateView | None = None  # the rated jobs' starts per key


class _Run:
    """One scenario's run from its setup on: load and faults side by side, quiet, the tables
    read, then the record judged and written."""

    def __init__(
        self,
        scenario: Scenario,
        calls: StackCalls,
        toxiproxy: ToxiproxyClient,
        envs: Mapping[str, Mapping[str, str]],
        directory: Path,
        prefix: str,
        seed: int,
        log: Say,
    ) -> None:
        self.scenario, self.calls, self.envs, self.log = scenario, calls, envs, log
        self.directory, self.prefix, self.seed = directory, prefix, seed
        spec = scenario.workload
        self.plan = list(plan_submits(spec, seed=seed, key_prefix=prefix))
        history_path = directory / HISTORY_JSONL
        history_path.unlink(missing_ok=True)
        self.writer = HistoryWriter(history_path)
        self.recorder = Recorder(self.writer)
        # history time zero, on the trio clock (the fault schedule's) and the wall clock
        self.origin = trio.current_time()
        self.run_started_at = datetime.now(UTC)
        self.tracker = CounterTracker(time.time())
        self.extra = scenario.extra_relays
        ports = {**OPS_PORTS, **{name: EXTRA_RELAYS[name][1] for name in self.extra}}
        self.sampler = MetricsSampler(self.tracker, ports)
        self.schedules = RunSchedules(scenario.schedules, prefix)
        self.nemesis = Nemesis(
            calls, toxiproxy, self.recorder, env_for=envs, sampler=self.sampler, say=log
        )
        self.workload = WorkloadClient(
            self.recorder,
            self.plan,
            base_url=API_URL,
            shop_url=SHOP_URL,
            clients=spec.clients,
            submit_timeout=spec.submit_timeout,
            retry_until=max(spec.duration, _last_fault_stop(scenario)) + RETRY_GRACE,
        )
        self.unique = (
            UniqueLoad(
                scenario.unique,
                prefix=prefix,
                duration=spec.duration,
                now=self.recorder.now,
                seed=seed,
                base_url=API_URL,
            )
            if scenario.unique is not None
            else None
        )

    async def run(self, setup: Setup, prometheus: RunPrometheus) -> RunResult:
        t_start = time.monotonic()
        spec, run_started_at = self.scenario.workload, self.run_started_at
        self.log(
            f"run: {len(self.plan)} submits at {spec.rate:g}/s for {spec.duration:g}s, "
            f"{len(self.scenario.faults)} fault(s), "
            f"fencing {'on' if self.scenario.fencing else 'OFF'}"
        )
        start_epoch = time.time()
        try:
            seen = await self._drive(prometheus, start_epoch)
        finally:
            self.writer.close()
            await self.sampler.aclose()
        save_tables(self.directory / TABLES_JSON, seen.tables, run_started_at)
        record = self._record(seen, setup, run_started_at, start_epoch, t_start)
        write_report(self.directory, record)
        verdict, judgement = record.verdict, record.judgement
        assert judgement is not None and record.details is not None
        ticks = verdict.ticks
        tick_text = (
            f"ticks expected {ticks.total('expected')}, fired {ticks.total('fired')}, "
            f"skipped {ticks.skipped or 0}, missing {ticks.total('missing')}, doubled "
            f"{ticks.total('doubled')}, lost {ticks.total('lost')}, late {ticks.total('late')}; "
            if ticks is not None
            else ""
        )
        unique = verdict.unique
        unique_text = (
            f"unique keys {unique.keys}, committed {unique.keys_committed}, jobs {unique.jobs}, "
            f"duplicates answered {unique.duplicates}, handoffs {unique.handoffs}, "
            f"doubled {unique.doubled}, dropped {unique.dropped}, other violations "
            f"{unique.violations - unique.doubled - unique.dropped}; "
            if unique is not None
            else ""
        )
        self.log(
            f"verdict: accepted {verdict.accepted}, lost {verdict.lost}, "
            f"doubled {verdict.doubled}, executions {verdict.total_executions}, "
            f"unknown landed {record.details.client_view.unknown_landed}; {tick_text}"
            f"{unique_text}"
            f"expectations {judgement.passed} -> {self.directory}"
        )
        return RunResult(self.scenario, self.directory, time.monotonic() - t_start, record)

    async def _drive(self, prometheus: RunPrometheus, start_epoch: float) -> _Seen:
        """The schedules made, the load and the faults, every fault healed, the schedules
        paused, then quiet, tables, messages, alerts and what else happened to the
        processes; the schedules deleted whatever happens."""
        try:
            return await self._run_and_read(prometheus, start_epoch)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(RESTORE_TIMEOUT):
                try:
                    await trio.to_thread.run_sync(self.schedules.delete)
                except Exception as exc:  # reported; the run's tables were read already
                    self.log(f"schedules: delete FAILED: {type(exc).__name__}: {exc}")

    async def _run_and_read(self, prometheus: RunPrometheus, start_epoch: float) -> _Seen:
        calls, log, sampler, nemesis = self.calls, self.log, self.sampler, self.nemesis
        await sampler.sample_all()
        firing_at_start = await prometheus.firing_now()
        pids_before = await calls(app_pids, calls.stack, self.extra)
        if self.schedules.specs:
            for line in await trio.to_thread.run_sync(self.schedules.create):
                log(line)
        try:
            offsets: dict[int, int] | None = await trio.to_thread.run_sync(topic_end_offsets)
        except Exception as exc:  # the run does not depend on it; the report says so
            log(f"kafka: cannot read the topic's offsets ({exc}); no message count")
            offsets = None
        try:
            async with trio.open_nursery() as outer:
                outer.start_soon(sampler.run)
                async with trio.open_nursery() as inner:
                    inner.start_soon(self.workload.run)
                    if self.unique is not None:
                        inner.start_soon(self.unique.run)
                    inner.start_soon(nemesis.run_schedule, self.scenario.faults, self.origin)
                outer.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(RESTORE_TIMEOUT):
                unhealed = await nemesis.heal_all()
                if unhealed:
                    log(f"heal: {len(unhealed)} fault(s) would not heal; restore will retry")
        workload_seconds = self.recorder.now()
        if self.schedules.made:
            ended = datetime.now(UTC)
            for line in await trio.to_thread.run_sync(self.schedules.settle_and_pause, ended):
                log(line)
        stats, patience = self.workload.stats, self.scenario.workload.quiet_timeout
        log(
            f"load done at t={workload_seconds:.1f}s: {stats.acknowledged} acknowledged, "
            f"{dict(stats.by_outcome)}; waiting for quiet (up to {patience:g}s)"
        )
        quiet = await wait_quiet(
            self.recorder.now, self.prefix, sampler, patience, self.schedules.names
        )
        await sampler.sample_all()
        tables = await trio.to_thread.run_sync(read_tables, self.prefix)
        auditor = await trio.to_thread.run_sync(read_auditor, self.prefix)
        log(
            f"auditor: {auditor.cell()} among the run's jobs "
            f"(its watermark {'passed' if auditor.reached else 'did NOT pass'} the run's last "
            f"finish after {auditor.waited:.1f}s)"
        )
        pauses = None
        if any(i.spec.fault == "queue_pause" for i in self.nemesis.injections):
            since = datetime.fromtimestamp(start_epoch, UTC)
            pauses = await trio.to_thread.run_sync(read_pauses, self.prefix, since)
            log(f"pauses: {pauses.cell()}")
        limits = None
        if self.scenario.workload.mix.keyed > 0:
            limits = await trio.to_thread.run_sync(read_limits, self.prefix)
            log(f"limits: {limits.cell()}")
        rates = None
        if self.scenario.workload.mix.rated > 0:
            rates = await trio.to_thread.run_sync(read_rates, self.prefix)
            log(f"rates: {rates.cell()}")
        tables.update(await trio.to_thread.run_sync(self.schedules.read))
        if self.unique is not None:
            tables["unique_inserts"] = [i.to_dict() for i in self.unique.inserts]
            tables["unique_jobs"] = await trio.to_thread.run_sync(read_unique_jobs, self.prefix)
            log(
                f"unique: {len(self.unique.inserts)} insert item(s) over "
                f"{len({i.key for i in self.unique.inserts})} key(s)"
            )
        kafka_messages: list[dict[str, Any]] | None = None
        if offsets is not None:
            try:
                kafka_messages = await trio.to_thread.run_sync(topic_messages, offsets)
            except Exception as exc:
                log(f"kafka: cannot read the run's messages ({exc}); no message count")
        fired = await prometheus.fired_during(self.scenario.expect.alerts, start_epoch)
        # since the run's start, not its first fault's: a workload can trip an expected alert
        # by itself (k's dead letters fire before the relay is killed); the run's label and
        # the check that none was firing at the start tie each notification to this run
        delivered = await prometheus.delivered(
            [name for name in self.scenario.expect.alerts if name in (fired or {})], start_epoch
        )
        if delivered is not None:
            shown = [f"{n} (t={d.received_at - start_epoch:.1f}s)" for n, d in delivered.items()]
            log(f"alerts: delivered through Alertmanager: {', '.join(shown) or 'none'}")
        restarted = {
            i.spec.target
            for i in nemesis.injections
            if nemeses.lookup(i.spec.fault).restarts_target and i.spec.target
        }
        crashed, meddling = await calls(
            interference, calls.stack, pids_before, self.envs, restarted, self.extra
        )
        for line in crashed:
            log(f"CRASH: {line}")
        return _Seen(
            firing_at_start,
            workload_seconds,
            quiet,
            tables,
            kafka_messages,
            fired,
            delivered,
            self._first_fault_epoch(),
            crashed,
            meddling,
            auditor,
            pauses,
            limits,
            rates,
        )

    def _first_fault_epoch(self) -> float | None:
        """Unix time the first fault of the run started (history time is since its start)."""
        starts = [i.started_at for i in self.nemesis.injections if i.started_at is not None]
        return self.run_started_at.timestamp() + min(starts) if starts else None

    def _record(
        self,
        seen: _Seen,
        setup: Setup,
        run_started_at: datetime,
        start_epoch: float,
        t_start: float,
    ) -> RunRecord:
        """Check the history against the tables, judge the run, and record it whole."""
        scenario, tables, tracker = self.scenario, seen.tables, self.tracker
        counters = {name: tracker.totals().get(name, 0.0) for name in COUNTERS}
        history = tuple(self.recorder.ops)
        verdict = check(
            history,
            tables["jobs"],
            tables["effects"],
            tables["attempts"],
            quiet_at=seen.quiet.at,
            run_started_at=run_started_at,
            fence_rejections=int(counters["leasework_fence_rejections_total"]),
            ticks=TickObservation.from_tables(
                tables, late_seconds=scenario.expect.late_tick_seconds
            ),
            unique=UniqueObservation.from_tables(tables),
        )
        view = client_view(history, tables["jobs"])
        drains = backlog_drain(history, tables["jobs"], run_started_at)
        messages = (
            message_view(seen.kafka_messages, (j["id"] for j in tables["jobs"]))
            if seen.kafka_messages is not None
            else None
        )
        shop = (
            shop_view(
                tables["shop_orders"],
                tables["shop_mail"],
                tables.get("shop_emails", ()),
                tables.get("shop_mail_refused", ()),
                scenario.mail_guard,
            )
            if scenario.uses_shop
            else None
        )
        judgement = judge_run(
            Evidence(
                verdict,
                scenario.expect,
                alerts_fired=None if seen.fired is None else set(seen.fired),
                alerts_delivered=None if seen.delivered is None else set(seen.delivered),
                firing_at_start=seen.firing_at_start,
                view=view,
                drains=drains,
                injections=self.nemesis.injections,
                messages=messages,
                meddling=seen.meddling,
                crashed=seen.crashed,
                shop=shop,
                auditor=seen.auditor,
                fencing=scenario.fencing,
                pauses=seen.pauses,
                limits=seen.limits,
                rates=seen.rates,
            )
        )
        details = RunDetails(
            key_prefix=self.prefix,
            seed=self.seed,
            lease_mode=scenario.lease_mode,
            run_started_at=run_started_at,
            setup=setup,
            faults=tuple(self.nemesis.injections),
            client=self.workload.stats,
            client_view=view,
            counters=counters,
            kafka=messages,
            shop=shop,
            auditor=seen.auditor,
            alerts=AlertsSeen.of(
                scenario.expect.alerts,
                seen.firing_at_start,
                seen.fired,
                start_epoch,
                seen.delivered,
                seen.fault_epoch,
            ),
            counters_per_process=tracker.per_process(),
            scrape_failures=dict(self.sampler.failures),
            recovery=recovery_rows(verdict, drains),
            quiet=seen.quiet,
            harness_problems=tuple(f.message for f in judgement.findings_of(HARNESS)),
            interference=tuple(seen.meddling),
            crashed=tuple(seen.crashed),
            seconds=time.monotonic() - t_start,
            workload_seconds=seen.workload_seconds,
        )
        return RunRecord(scenario, history, verdict, judgement, tables, details)


# ---------------------------------------------------------------- many scenarios


def select(scenarios: Sequence[Scenario], names: Sequence[str]) -> list[Scenario]:
    """The scenarios named, in the order given: an exact name or a unique prefix of one.
    No names: all of them."""
    if not names:
        return list(scenarios)
    by_name = {s.name: s for s in scenarios}
    chosen = []
    for name in names:
        if name in by_name:
            chosen.append(by_name[name])
            continue
        matches = [s for s in scenarios if s.name.startswith(name)]
        if len(matches) != 1:
            known = ", ".join(by_name)
            why = "matches several" if matches else "matches none"
            raise ValueError(f"scenario {name!r} {why} of: {known}")
        chosen.append(matches[0])
    return chosen


def _short_faults(row: SummaryRow, limit: int = 48) -> SummaryRow:
    if len(row.faults) <= limit:
        return row
    kinds = row.faults.count(",") + 1
    return dataclasses.replace(row, faults=f"{kinds} kinds (see report)")


def summary(results: Sequence[RunResult], *, fmt: str = "plain") -> str:
    """One row per scenario run; then, for the scenarios with schedules, their ticks, and
    for those with a unique load, their keys."""
    rows, tick_rows, unique_rows = [], [], []
    for result in results:
        if result.record is None:
            continue
        row = record_summary_row(result.record)
        rows.append(_short_faults(row) if fmt == "plain" else row)
        verdict = result.record.verdict
        if verdict.ticks is not None:
            tick_rows.append(TickSummaryRow.of(row.scenario, verdict.ticks.to_dict(), row.result))
        if verdict.unique is not None:
            unique = verdict.unique.to_dict()
            unique_rows.append(UniqueSummaryRow.of(row.scenario, unique, row.result))
    text = summary_table(rows, fmt=fmt) if rows else ""  # type: ignore[arg-type]
    text += _parts(part_summary_table(tick_rows), part_summary_table(unique_rows))
    for result in results:
        if result.error is not None:
            text += f"{result.scenario.name}: ERROR {result.error}\n"
    return text


def _parts(ticks: str, unique: str) -> str:
    text = "\nSchedule ticks:\n\n" + ticks if ticks else ""
    return text + ("\nUnique keys:\n\n" + unique if unique else "")


def summary_of_directory(directory: Path, *, fmt: str = "plain") -> str:
    """The summary table of every report under ``directory`` (one run, possibly made by
    several invocations with the same ``--out``), in scenario order."""
    rows = [
        summary_row_from_report(path.parent) for path in sorted(directory.glob(f"*/{REPORT_JSON}"))
    ]
    if fmt == "plain":
        rows = [_short_faults(row) for row in rows]
    text = summary_table(rows, fmt=fmt) if rows else ""  # type: ignore[arg-type]
    ticks = part_summary_table(tick_summary_rows(directory))
    return text + _parts(ticks, part_summary_table(unique_summary_rows(directory)))


def exit_code(results: Sequence[RunResult]) -> int:
    """0: every expectation met; 1: one violated; 2: none violated but one unknown (e.g. a
    vacuous run); 3: the harness failed to run a scenario."""
    if any(r.error is not None for r in results):
        return 3
    if any(r.passed is False for r in results):
        return 1
    if any(r.passed is not True for r in results):
        return 2
    return 0


async def run_all(
    scenarios: Sequence[Scenario],
    *,
    stack: Stack | None = None,
    out_dir: Path | None = None,
    seed: int | None = None,
    say: Say = stderr_say,
) -> list[RunResult]:
    stack = stack or Stack.from_env()
    out_dir = out_dir or REPORTS_DIR / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir.mkdir(parents=True, exist_ok=True)
    say(f"chaos: {len(scenarios)} scenario(s), reports in {out_dir}")
    results: list[RunResult] = []
    for scenario in scenarios:
        started = time.monotonic()
        try:
            results.append(await run_scenario(scenario, stack, out_dir, seed=seed, say=say))
        except Exception as exc:  # one scenario's harness failure does not stop the others
            error = f"{type(exc).__name__}: {exc}"
            say(f"[{scenario.name}] ERROR {error}")
            results.append(
                RunResult(
                    scenario, out_dir / scenario.name, time.monotonic() - started, error=error
                )
            )
        (out_dir / "summary.md").write_text(
            summary_of_directory(out_dir, fmt="markdown"), encoding="utf-8"
        )
    return results


def load(directory: Path = SCENARIOS_DIR) -> list[Scenario]:
    return load_scenarios(directory)


def make_unsafe(scenario: Scenario) -> Scenario:
    """The same scenario with the workers in the plain-TTL lease mode and the same
    expectations: a run that should now fail."""
    return dataclasses.replace(scenario, name=f"{scenario.name}+unsafe", fencing=False)


def seconds_estimate(scenario: Scenario) -> float:
    """A rough upper bound of a scenario's wall time without its quiet wait."""
    return max(scenario.workload.duration, _last_fault_stop(scenario)) + 20.0
