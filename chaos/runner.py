"""The chaos runner: one scenario from a healthy stack to a verdict and a report.

For each scenario:

1. **Baseline.** Toxics removed, the harness's private proxies deleted, every service
   running, un-paused and ready with its normal environment, Kafka's ISR complete.
2. **Setup.** Private proxies for per-process links; workers restarted in the unsafe lease
   mode when the scenario turns fencing off; processes restarted pointing at their private
   proxies.
3. **Run.** The workload (:mod:`chaos.workload`) and the fault schedule
   (:mod:`chaos.nemesis`) run side by side in one nursery, while the processes' counters are
   scraped every second. Whatever happens (an error, Ctrl-C), every fault is healed
   (``finally``, shielded from cancellation).
4. **Quiet.** Wait until every job of the run is terminal and no worker has a job in flight
   (twice in a row, one second apart), or the scenario's quiet timeout passes.
5. **Check.** Read ``jobs``, ``effects`` and ``attempts`` straight from Postgres (port 15433,
   not the proxy), plus the example shop's orders (each receipt recorded on an order is an
   effect of its job, :mod:`chaos.shop`) and mail ledger, and the run's messages straight
   from Kafka (inter-broker listeners), run the pure checker, judge against the scenario's
   expectations plus the harness's own checks: evidence that the fault hit (redeliveries,
   unknown submits that landed, messages produced twice), the backlog drain bound, faults
   that could not be injected or healed, an API that said "nothing was written" and had
   written, a leasework process that died with no fault killing it (a crash), and signs that
   something else drove the shared stack meanwhile (a restart no fault made, a process
   without the run's environment).
6. **Report** under ``reports/chaos/<timestamp>/<scenario>/``: ``report.json``,
   ``report.md``, ``timeline.svg``, ``history.jsonl``, and ``tables.json`` (the rows the
   checker saw, so a run can be checked again offline).
7. **Restore** (``finally``): processes back to their normal environment, private proxies
   deleted, toxics reset, every service up and ready.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import trio
from psycopg.rows import dict_row

from chaos import alerts, nemeses
from chaos.generator import plan_submits
from chaos.history import HistoryWriter, Op, Recorder
from chaos.judge import HARNESS, Evidence, Judgement, judge_run
from chaos.links import link_proxies, link_targets, process_envs
from chaos.loader import load_scenarios
from chaos.messages import message_view, topic_end_offsets, topic_messages
from chaos.metrics import COUNTERS, CounterTracker, MetricsSampler
from chaos.nemesis import Nemesis
from chaos.report import (
    REPORT_JSON,
    REPORT_MD,
    SummaryRow,
    passed_text,
    summary_row,
    summary_row_from_report,
    summary_table,
    validity_text,
    write_report,
)
from chaos.scenario import Scenario
from chaos.shop import ShopView, read_shop, receipt_effects, shop_view
from chaos.stack import UNSAFE_ENV, StackCalls, app_pids, baseline, interference, restart_with
from chaos.toxiproxy import ToxiproxyClient
from chaos.verdict import Verdict, check
from chaos.workload import Drain, WorkloadClient, backlog_drain, client_view
from devstack import Stack
from devstack.layout import API_URL, POSTGRES_DIRECT_DSN, SHOP_URL
from leasework.states import TERMINAL

REPO = Path(__file__).resolve().parents[1]
SCENARIOS_DIR = REPO / "scenarios"
REPORTS_DIR = REPO / "reports" / "chaos"
# the harness reads Postgres directly, never through Toxiproxy
DIRECT_DSN = POSTGRES_DIRECT_DSN
RETRY_GRACE = 45.0  # submits keep retrying this long after the last fault is healed
QUIET_POLL = 1.0
RESTORE_TIMEOUT = 300.0
# how long to wait, after quiet, for an expected alert that has not fired yet: SLO burn
# alerts fire only once the late jobs have started, then hold 1-2 min (`for:`)
ALERT_PATIENCE = 150.0

Say = Callable[[str], None]


def stderr_say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- results


@dataclass
class RunResult:
    scenario: Scenario
    directory: Path
    verdict: Verdict | None
    judgement: Judgement | None
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def passed(self) -> bool | str:
        if self.error is not None or self.judgement is None:
            return False
        return self.judgement.passed


# ---------------------------------------------------------------- Postgres, direct


def _like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "-%"


def pending_jobs(prefix: str) -> dict[str, int]:
    """Jobs of the run that are not terminal yet, by status (blocking)."""
    with psycopg.connect(DIRECT_DSN, autocommit=True, row_factory=dict_row) as conn:
        rows = conn.execute(
            "SELECT status, count(*) AS n FROM jobs WHERE idempotency_key LIKE %s GROUP BY status",
            (_like(prefix),),
        ).fetchall()
    return {r["status"]: r["n"] for r in rows if r["status"] not in TERMINAL}


def read_tables(prefix: str) -> dict[str, list[dict[str, Any]]]:
    """The run's rows of ``jobs``, ``effects`` and ``attempts``, and of the example shop's
    ``shop_orders`` and ``shop_mail`` (blocking). ``effects`` holds, after the rows of the
    ``effects`` table, one row of kind ``receipt`` per receipt recorded on an order of the
    run (:func:`chaos.shop.receipt_effects`), so a receipt recorded twice is a doubled
    effect."""
    like = _like(prefix)
    with psycopg.connect(DIRECT_DSN, autocommit=True, row_factory=dict_row) as conn:
        jobs = conn.execute(
            "SELECT id::text AS id, type, status, attempt, max_attempts, idempotency_key, "
            "run_at, started_at, finished_at, created_at, last_error "
            "FROM jobs WHERE idempotency_key LIKE %s ORDER BY created_at, id",
            (like,),
        ).fetchall()
        effects = conn.execute(
            "SELECT e.job_id::text AS job_id, e.fence, e.kind FROM effects e "
            "JOIN jobs j ON j.id = e.job_id WHERE j.idempotency_key LIKE %s ORDER BY e.id",
            (like,),
        ).fetchall()
        attempts = conn.execute(
            "SELECT a.job_id::text AS job_id, a.attempt, a.fence, a.worker, a.started_at, "
            "a.outcome FROM attempts a JOIN jobs j ON j.id = a.job_id "
            "WHERE j.idempotency_key LIKE %s ORDER BY a.id",
            (like,),
        ).fetchall()
        shop = read_shop(conn, like)
    effects += receipt_effects(shop["shop_orders"])
    return {"jobs": jobs, "effects": effects, "attempts": attempts, **shop}


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"not JSON serialisable: {value!r}")


def save_tables(path: Path, tables: Mapping[str, Any], run_started_at: datetime) -> None:
    data = {"run_started_at": run_started_at.isoformat(), **tables}
    path.write_text(json.dumps(data, default=_jsonable) + "\n", encoding="utf-8")


def load_tables(path: Path) -> dict[str, Any]:
    """``tables.json`` of a report directory: run_started_at, jobs, effects (receipts
    included), attempts, and the shop's shop_orders and shop_mail (absent in older reports)."""
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------- Prometheus alerts


class RunPrometheus:
    """A Prometheus of the run's own (``Stack.scratch_prometheus``): empty TSDB, the stack's
    targets and rules, started before the workload and stopped after the check. Alerts are
    judged on it, not on the stack's long-lived Prometheus, whose 10-minute to 3-day windows
    still hold earlier runs' faults: there, an alert already firing from the previous scenario
    could not be credited to this one, and a slow SLO burn left by it would show up here.
    ``url`` is None when it could not start; the alert checks then say so (UNKNOWN)."""

    def __init__(self, calls: StackCalls, say: Say) -> None:
        self._calls = calls
        self._say = say
        self._workdir = tempfile.TemporaryDirectory(prefix="leasework-chaos-prometheus-")
        self._context: contextlib.AbstractContextManager[str] | None = None
        self.url: str | None = None

    async def start(self) -> None:
        context = self._calls.stack.scratch_prometheus(Path(self._workdir.name))
        try:
            self.url = await self._calls(context.__enter__)
        except Exception as exc:  # the run goes on; its alert expectations become UNKNOWN
            self._say(f"prometheus: the run's own Prometheus did not start ({exc})")
            return
        self._context = context
        self._say(f"prometheus: the run's alerts are judged on {self.url} (empty TSDB)")

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            if self._context is not None:
                await self._calls(self._context.__exit__, None, None, None)
                self._context = None
            self._workdir.cleanup()

    async def firing_now(self) -> set[str] | None:
        if self.url is None:
            return None
        try:
            return await trio.to_thread.run_sync(functools.partial(alerts.firing_now, url=self.url))
        except (httpx.HTTPError, ValueError, KeyError):
            return None

    async def fired_during(
        self, expected: Sequence[str], start_epoch: float
    ) -> dict[str, float] | None:
        """Alert name -> first Unix time it was firing since ``start_epoch``; waits up to
        ALERT_PATIENCE for the expected ones. None when Prometheus cannot be asked."""
        if self.url is None:
            return None
        try:
            if expected:
                wait = functools.partial(
                    alerts.wait_for_alerts, set(expected), start_epoch, ALERT_PATIENCE, url=self.url
                )
            else:
                wait = functools.partial(
                    alerts.fired_between, start_epoch, time.time(), url=self.url
                )
            return await trio.to_thread.run_sync(wait)
        except (httpx.HTTPError, ValueError, KeyError):
            return None


# ---------------------------------------------------------------- quiet


@dataclass
class Quiet:
    reached: bool
    at: float  # history time
    waited: float
    pending: dict[str, int]
    in_flight: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


async def wait_quiet(
    recorder_now: Callable[[], float],
    prefix: str,
    sampler: MetricsSampler,
    patience: float,
) -> Quiet:
    """Until every job of the run is terminal and no worker runs a job, seen twice in a
    row; or ``patience`` seconds."""
    started = trio.current_time()
    stable = 0
    pending: dict[str, int] = {}
    in_flight = 0.0
    while True:
        try:
            pending = await trio.to_thread.run_sync(pending_jobs, prefix)
        except psycopg.Error as exc:
            pending = {f"unreadable: {exc}"[:80]: 1}
        in_flight, _silent = await sampler.in_flight()
        stable = stable + 1 if not pending and in_flight == 0 else 0
        waited = trio.current_time() - started
        if stable >= 2:
            return Quiet(True, recorder_now(), round(waited, 3), {}, 0.0)
        if waited >= patience:
            return Quiet(False, recorder_now(), round(waited, 3), pending, in_flight)
        await trio.sleep(QUIET_POLL)


# ---------------------------------------------------------------- the report's run section


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value).replace("|", "\\|")


def details_markdown(details: Mapping[str, Any]) -> str:
    """The harness's section of report.md: what was done and what the system did."""
    lines = ["## What the harness did", ""]
    setup = details["setup"]
    lines.append(
        f"Key prefix `{details['key_prefix']}`, workload seed {details['seed']}, "
        f"lease mode {details['lease_mode']}."
    )
    for action in setup["baseline"]:
        lines.append(f"- baseline: {action}")
    for name, env in setup["process_env"].items():
        lines.append(f"- {name} started with {', '.join(f'{k}={v}' for k, v in env.items())}")
    for link in setup["links"]:
        lines.append(
            f"- private proxy `{link['name']}` on port {link['port']} for {link['process']}'s "
            f"{link['proxy']} link"
        )
    lines += ["", "### Faults", ""]
    lines.append(
        "| # | fault | target | params | started (s) | healed (s) | affects | busy when hit "
        "| errors |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for i, inj in enumerate(details["faults"], start=1):
        params = ", ".join(f"{k}={v}" for k, v in inj["params"].items()) or "–"
        errors = "; ".join(e for e in (inj["start_error"], inj["stop_error"]) if e) or "–"
        retried = len(inj.get("heal_failures") or ()) - (1 if inj["stop_error"] else 0)
        if retried > 0:
            errors += f" (heal retried {retried}x: {inj['heal_failures'][0].splitlines()[0]})"
        busy = busy_cell(inj)
        lines.append(
            f"| {i} | {inj['fault']} | {_fmt(inj['target'])} | {_fmt(params)} | "
            f"{_fmt(inj['started_at'])} | {_fmt(inj['healed_at'])} | {_fmt(inj['affects'])} | "
            f"{busy} | {_fmt(errors)} |"
        )
    if not details["faults"]:
        lines.append("| – | none | | | | | | | |")
    client = details["client"]
    view = details["client_view"]
    lines += ["", "### The client", ""]
    lines.append("| measure | value |")
    lines.append("|---|---|")
    rows = [
        ("submits planned", client["planned"]),
        ("keys submitted", client["keys_invoked"]),
        ("HTTP attempts", client["attempts"]),
        ("keys acknowledged (2xx)", client["acknowledged"]),
        ("keys retried", view["retried_keys"]),
        ("keys with an unknown (info) attempt", view["unknown_keys"]),
        ("… which landed (job in the table)", view["unknown_landed"]),
        ("… … proven by an idempotent replay", view["unknown_replayed"]),
        ("… which never landed", view["unknown_not_landed"]),
        ("most jobs under one key", view["jobs_per_key_max"]),
        ("503 'nothing was written' that had written", len(view["failed_then_replayed"])),
        ("keys given up (still unresolved)", client["given_up"]),
        ("worst submit lag behind schedule (s)", client["late_start"]),
    ]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in rows]
    lines += [
        "",
        "Attempt outcomes: "
        + (", ".join(f"{k}: {v}" for k, v in client["by_reason"].items()) or "none"),
        "",
    ]
    lines += ["### The system", ""]
    lines.append("| counter (sum over processes and restarts, lower bound) | value |")
    lines.append("|---|---|")
    for name, value in details["counters"].items():
        lines.append(f"| `{name}` | {value:g} |")
    kafka = details.get("kafka")
    lines.append("")
    if kafka:
        lines.append(
            f"Kafka `jobs.ready` (read directly after the run): {kafka['messages']} message(s) "
            f"for this run's jobs, {kafka['duplicate_messages']} produced more than once "
            f"({kafka['jobs_with_duplicates']} job(s))."
        )
    else:
        lines.append("Kafka `jobs.ready` could not be read; no message count.")
    shop = details.get("shop")
    if shop:
        lines.append(
            f"Example shop (read directly after the run): {shop['orders']} order(s), "
            f"{shop['receipts_recorded']} receipt(s) recorded through the fence "
            f"({shop['orders_doubled']} order(s) recorded more than once, "
            f"{shop['orders_without_receipt']} with none); the mail service sent "
            f"{shop['emails']} email(s) for {shop['mail_calls']} call(s) "
            f"({shop['emails_called_again']} asked for again under the same idempotency key)."
        )
    alert_info = details.get("alerts") or {}
    fired_alerts = alert_info.get("fired")
    if fired_alerts is None:
        lines.append("Prometheus alerts could not be read.")
    else:
        shown = ", ".join(f"{n} (t={t:g}s)" for n, t in fired_alerts.items()) or "none"
        already = ", ".join(alert_info.get("firing_at_start") or []) or "none"
        lines.append(
            f"Prometheus alerts firing during the run: {shown}; already firing when it "
            f"started: {already}."
        )
    lines += ["", "### Recovery", ""]
    lines.append(
        "First finish: the checker's time from the heal to the first job finished after it. "
        "Drained: the harness's time from the heal until every job created and due before it "
        "had finished."
    )
    lines += ["", "| fault | target | healed (s) | first finish (s) | drained (s) | jobs |"]
    lines.append("|---|---|---|---|---|---|")
    for r in details["recovery"]:
        lines.append(
            f"| {r['fault']} | {_fmt(r['target'])} | {_fmt(r['stopped'])} | "
            f"{_fmt(r['first_finish'])} | {_fmt(r['drained'])} | {_fmt(r['jobs'])} |"
        )
    quiet = details["quiet"]
    lines += [""]
    for line in details.get("crashed") or ():
        lines.append(f"**Crashed:** {line}")
    for line in details.get("interference") or ():
        lines.append(f"**Interference:** {line}")
    if quiet["reached"]:
        lines.append(f"Quiet at t={quiet['at']:.1f}s after waiting {quiet['waited']:.1f}s.")
    else:
        lines.append(
            f"NOT quiet after {quiet['waited']:.1f}s: pending {quiet['pending']}, "
            f"{quiet['in_flight']:g} job(s) in flight; the tables were read anyway."
        )
    lines.append(
        f"Run took {details['seconds']:.0f}s (workload {details['workload_seconds']:.0f}s)."
    )
    return "\n".join(lines) + "\n"


def busy_cell(inj: Mapping[str, Any]) -> str:
    """The faults table's "busy when hit" cell: the gauges the fault's wait saw (summed over
    the workers it hits), how long it waited, and the target's gauges just before its signal."""
    wait = inj.get("wait_for")
    if not wait:  # reports from before wait_for: the in-flight count alone
        if inj.get("in_flight") is None:
            return "–"
        return f"{inj['in_flight']:g} in flight (waited {inj['waited_for_a_job']:.1f}s)"
    seen = inj.get("gauges_seen") or {}
    text = ", ".join(f"{k} {v:g}" for k, v in seen.items()) or "no gauge readable"
    text += f" (waited {inj['waited_for_a_job']:.1f}s for {wait['gauge']} ≥ {wait['at_least']:g}"
    if wait.get("met") is False:
        text += f"; patience ran out, at most {wait.get('peak') or 0:g} seen)"
    else:
        text += ")"
    at_signal = inj.get("gauges_at_signal") or {}
    if at_signal:
        text += "; at the signal: " + ", ".join(f"{k} {v:g}" for k, v in at_signal.items())
    return text


def recovery_rows(verdict: Verdict, drains: Sequence[Drain]) -> list[dict[str, Any]]:
    rows = []
    drain_by = {(d.fault, d.target, d.stopped): d for d in drains}
    for r in verdict.recovery:
        d = drain_by.get((r.fault, r.target, r.stopped)) if r.stopped is not None else None
        rows.append(
            {
                "fault": r.fault,
                "target": r.target,
                "stopped": r.stopped,
                "first_finish": r.seconds,
                "drained": d.seconds if d else None,
                "jobs": d.jobs if d else None,
            }
        )
    return rows


def result_text(verdict: Verdict, judgement: Judgement | None) -> str:
    """The summary's result cell: the checker's verdict and the scenario's expectations
    (they differ for the unsafe run, whose expectations require an invalid history)."""
    text = f"checker {validity_text(verdict.valid)}"
    if judgement is not None:
        text += f"; expectations {passed_text(judgement.passed)}"
    return text


def recovery_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The summary table's recovery cell: worst first finish, worst drain."""
    if not rows:
        return "–"
    first = [r["first_finish"] for r in rows if r["first_finish"] is not None]
    drained = [r["drained"] for r in rows if r["drained"] is not None]
    unmeasured = sum(1 for r in rows if r["drained"] is None)
    text = f"first ≤{max(first):.1f}s" if first else "first –"
    text += f", drained ≤{max(drained):.1f}s" if drained else ", drained –"
    if unmeasured:
        text += f" ({unmeasured} undrained)"
    return text


def write_details(
    directory: Path, details: Mapping[str, Any], verdict: Verdict, judgement: Judgement
) -> None:
    """Add the harness's section to report.json (key ``run``) and report.md."""
    report_json = directory / REPORT_JSON
    data = json.loads(report_json.read_text(encoding="utf-8"))
    data["run"] = details
    data["summary"]["recovery"] = recovery_text(details["recovery"])
    data["summary"]["result"] = result_text(verdict, judgement)
    report_json.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n", encoding="utf-8")
    report_md = directory / REPORT_MD
    text = report_md.read_text(encoding="utf-8").rstrip("\n") + "\n\n" + details_markdown(details)
    findings = details.get("harness_problems") or []
    if findings:
        # the harness's own findings (a crash, missing evidence) go on top: among hundreds
        # of lost jobs they are the cause
        block = "**Harness findings:**\n\n" + "".join(f"- {p}\n" for p in findings) + "\n"
        text = text.replace("## Verdict\n", block + "## Verdict\n", 1)
    report_md.write_text(text, encoding="utf-8")


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
    calls = StackCalls(stack)
    toxiproxy = ToxiproxyClient()
    envs: dict[str, dict[str, str]] = {}
    try:
        with trio.CancelScope(shield=True):
            log("baseline: every service up, ready and normal; no toxics")
            await toxiproxy.reset()
            await toxiproxy.delete_runtime_proxies()
            done = await calls(baseline, stack, shop=scenario.uses_shop)
        links = await link_proxies(toxiproxy, pairs)
        envs = process_envs(links, fencing=scenario.fencing, unsafe_env=UNSAFE_ENV)
        for name, env in envs.items():
            log(f"setup: restarting {name} with {env}")
            await calls(restart_with, stack, name, env)
        setup = {
            "baseline": done,
            "process_env": envs,
            "links": [dict(dataclasses.asdict(link), name=link.name) for link in links],
        }
        # started before the run's clock, so the fault schedule is not shifted by its start-up
        prometheus = RunPrometheus(calls, log)
        await prometheus.start()
        try:
            return await _run(
                scenario, calls, toxiproxy, envs, setup, directory, prefix, seed, log, prometheus
            )
        finally:
            await prometheus.aclose()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(RESTORE_TIMEOUT):
            log("restore: processes back to normal, private proxies gone, toxics reset")
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


async def _run(
    scenario: Scenario,
    calls: StackCalls,
    toxiproxy: ToxiproxyClient,
    envs: Mapping[str, Mapping[str, str]],
    setup: dict[str, Any],
    directory: Path,
    prefix: str,
    seed: int,
    log: Say,
    prometheus: RunPrometheus,
) -> RunResult:
    t_start = time.monotonic()
    workload_spec = scenario.workload
    plan = list(plan_submits(workload_spec, seed=seed, key_prefix=prefix))
    history_path = directory / "history.jsonl"
    history_path.unlink(missing_ok=True)
    writer = HistoryWriter(history_path)
    recorder = Recorder(writer)
    origin = trio.current_time()
    run_started_at = datetime.now(UTC)
    tracker = CounterTracker(time.time())
    sampler = MetricsSampler(tracker)
    nemesis = Nemesis(calls, toxiproxy, recorder, env_for=envs, sampler=sampler, say=log)
    retry_until = max(workload_spec.duration, _last_fault_stop(scenario)) + RETRY_GRACE
    workload = WorkloadClient(
        recorder,
        plan,
        base_url=API_URL,
        shop_url=SHOP_URL,
        clients=workload_spec.clients,
        submit_timeout=workload_spec.submit_timeout,
        retry_until=retry_until,
    )
    log(
        f"run: {len(plan)} submits at {workload_spec.rate:g}/s for {workload_spec.duration:g}s, "
        f"{len(scenario.faults)} fault(s), fencing {'on' if scenario.fencing else 'OFF'}"
    )
    start_epoch = time.time()
    try:
        await sampler.sample_all()
        firing_at_start = await prometheus.firing_now()
        pids_before = await calls(app_pids, calls.stack)
        try:
            offsets: dict[int, int] | None = await trio.to_thread.run_sync(topic_end_offsets)
        except Exception as exc:  # the run does not depend on it; the report says so
            log(f"kafka: cannot read the topic's offsets ({exc}); no message count")
            offsets = None
        try:
            async with trio.open_nursery() as outer:
                outer.start_soon(sampler.run)
                async with trio.open_nursery() as inner:
                    inner.start_soon(workload.run)
                    inner.start_soon(nemesis.run_schedule, scenario.faults, origin)
                outer.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(RESTORE_TIMEOUT):
                unhealed = await nemesis.heal_all()
                if unhealed:
                    log(f"heal: {len(unhealed)} fault(s) would not heal; restore will retry")
        workload_seconds = recorder.now()
        log(
            f"load done at t={workload_seconds:.1f}s: {workload.stats.acknowledged} acknowledged, "
            f"{dict(workload.stats.by_outcome)}; waiting for quiet "
            f"(up to {workload_spec.quiet_timeout:g}s)"
        )
        quiet = await wait_quiet(recorder.now, prefix, sampler, workload_spec.quiet_timeout)
        await sampler.sample_all()
        tables = await trio.to_thread.run_sync(read_tables, prefix)
        kafka_messages: list[dict[str, Any]] | None = None
        if offsets is not None:
            try:
                kafka_messages = await trio.to_thread.run_sync(topic_messages, offsets)
            except Exception as exc:
                log(f"kafka: cannot read the run's messages ({exc}); no message count")
        fired = await prometheus.fired_during(scenario.expect.alerts, start_epoch)
        restarted = {
            i.spec.target
            for i in nemesis.injections
            if nemeses.lookup(i.spec.fault).restarts_target and i.spec.target
        }
        crashed, meddling = await calls(interference, calls.stack, pids_before, envs, restarted)
        for line in crashed:
            log(f"CRASH: {line}")
    finally:
        writer.close()
        await sampler.aclose()
    save_tables(directory / "tables.json", tables, run_started_at)
    counters = {name: tracker.totals().get(name, 0.0) for name in COUNTERS}
    history: list[Op] = list(recorder.ops)
    verdict = check(
        history,
        tables["jobs"],
        tables["effects"],
        tables["attempts"],
        quiet_at=quiet.at,
        run_started_at=run_started_at,
        fence_rejections=int(counters["leasework_fence_rejections_total"]),
    )
    view = client_view(history, tables["jobs"])
    drains = backlog_drain(history, tables["jobs"], run_started_at)
    messages = (
        message_view(kafka_messages, (j["id"] for j in tables["jobs"]))
        if kafka_messages is not None
        else None
    )
    shop: ShopView | None = (
        shop_view(tables["shop_orders"], tables["shop_mail"]) if scenario.uses_shop else None
    )
    judgement = judge_run(
        Evidence(
            verdict,
            scenario.expect,
            alerts_fired=None if fired is None else set(fired),
            firing_at_start=firing_at_start,
            view=view,
            drains=drains,
            injections=nemesis.injections,
            messages=messages,
            meddling=meddling,
            crashed=crashed,
        )
    )
    write_report(directory, verdict, scenario, history, judgement=judgement)
    details: dict[str, Any] = {
        "key_prefix": prefix,
        "seed": seed,
        "lease_mode": scenario.lease_mode,
        "run_started_at": run_started_at.isoformat(),
        "setup": setup,
        "faults": [i.to_dict() for i in nemesis.injections],
        "client": workload.stats.to_dict(),
        "client_view": view.to_dict(),
        "counters": counters,
        "kafka": messages.to_dict() if messages is not None else None,
        "shop": shop.to_dict() if shop is not None else None,
        "alerts": {
            "expected": list(scenario.expect.alerts),
            "firing_at_start": sorted(firing_at_start) if firing_at_start is not None else None,
            "fired": (
                {name: round(t - start_epoch, 1) for name, t in sorted(fired.items())}
                if fired is not None
                else None
            ),
        },
        "counters_per_process": tracker.per_process(),
        "scrape_failures": dict(sampler.failures),
        "recovery": recovery_rows(verdict, drains),
        "quiet": quiet.to_dict(),
        "harness_problems": [f.message for f in judgement.findings_of(HARNESS)],
        "interference": meddling,
        "crashed": crashed,
        "seconds": round(time.monotonic() - t_start, 1),
        "workload_seconds": round(workload_seconds, 1),
    }
    write_details(directory, details, verdict, judgement)
    log(
        f"verdict: accepted {verdict.accepted}, lost {verdict.lost}, doubled {verdict.doubled}, "
        f"executions {verdict.total_executions}, unknown landed {view.unknown_landed}; "
        f"expectations {judgement.passed} -> {directory}"
    )
    return RunResult(scenario, directory, verdict, judgement, time.monotonic() - t_start, details)


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
    rows = []
    for result in results:
        if result.verdict is None:
            continue
        row = dataclasses.replace(
            summary_row(result.scenario, result.verdict, result.judgement),
            recovery=recovery_text(result.details.get("recovery", ())),
            result=result_text(result.verdict, result.judgement),
        )
        rows.append(_short_faults(row) if fmt == "plain" else row)
    text = summary_table(rows, fmt=fmt) if rows else ""  # type: ignore[arg-type]
    for result in results:
        if result.error is not None:
            text += f"{result.scenario.name}: ERROR {result.error}\n"
    return text


def summary_of_directory(directory: Path, *, fmt: str = "plain") -> str:
    """The summary table of every report under ``directory`` (one run, possibly made by
    several invocations with the same ``--out``), in scenario order."""
    rows = [
        summary_row_from_report(path.parent) for path in sorted(directory.glob(f"*/{REPORT_JSON}"))
    ]
    if fmt == "plain":
        rows = [_short_faults(row) for row in rows]
    return summary_table(rows, fmt=fmt) if rows else ""  # type: ignore[arg-type]


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
                    scenario,
                    out_dir / scenario.name,
                    None,
                    None,
                    time.monotonic() - started,
                    error=error,
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
