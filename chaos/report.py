"""Reports of a chaos run: ``report.json`` for machines, ``report.md`` for people and
``timeline.svg`` (:mod:`chaos.timeline`), written once from the run's record
(:class:`chaos.record.RunRecord`) by :func:`write_report`.

Also one summary row per scenario, as a Markdown or plain-text table, for a run of many.
Rendering is pure (strings from data); only :func:`write_report` touches the disk.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from chaos.checker import Validity
from chaos.history import Op, fault_windows
from chaos.judge import Judgement
from chaos.record import RecoveryRow, RunDetails, RunRecord
from chaos.scenario import Scenario
from chaos.tables import jsonable
from chaos.ticks import TickVerdict
from chaos.timeline import render_svg, throughput
from chaos.unique_keys import UniqueVerdict
from chaos.verdict import Verdict

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
TIMELINE_SVG = "timeline.svg"


def validity_text(valid: Validity) -> str:
    """``valid``, ``INVALID`` or ``unknown``."""
    return "valid" if valid is True else "INVALID" if valid is False else "unknown"


def passed_text(passed: Validity) -> str:
    """How a judgement against expectations reads: ``met``, ``NOT MET`` or ``unknown``."""
    return "met" if passed is True else "NOT MET" if passed is False else "unknown"


# ---------------------------------------------------------------- Markdown


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value else "0"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(
    verdict: Verdict,
    scenario: Scenario,
    history: Sequence[Op],
    *,
    judgement: Judgement | None = None,
    svg_name: str = TIMELINE_SVG,
    list_limit: int = 50,
) -> str:
    lines = [f"# Chaos run: {scenario.name}", ""]
    if scenario.description:
        lines += [scenario.description, ""]
    head = f"**Checker: {validity_text(verdict.valid)}**"
    if judgement is not None:
        head += f" · **Expectations: {passed_text(judgement.passed)}**"
    fencing = "on" if scenario.fencing else f"OFF ({scenario.lease_mode})"
    lines += [head, "", f"Fencing {fencing}; source `{scenario.source}`.", ""]

    lines += ["## Verdict", ""]
    lines += _table(
        ["measure", "value"],
        [
            ("submitted (distinct keys)", verdict.submitted),
            ("accepted", verdict.accepted),
            ("… acknowledged (2xx)", verdict.acknowledged),
            ("… unknown, landed", verdict.unknown_landed),
            ("unknown, never landed", verdict.unknown_not_landed),
            ("rejected (4xx)", verdict.rejected),
            ("succeeded", verdict.succeeded),
            ("dead", verdict.dead),
            ("cancelled", verdict.cancelled),
            ("**lost**", verdict.lost),
            ("**doubled** (more than one effect)", verdict.doubled),
            ("stray effects", verdict.stray_effects),
            ("executions (total)", verdict.total_executions),
            ("executions per job (max)", verdict.max_executions),
            ("redeliveries", verdict.redeliveries),
            ("fence rejections", verdict.fence_rejections),
            ("scheduling delay p50 (s)", verdict.scheduling_delay_p50),
            ("scheduling delay p99 (s)", verdict.scheduling_delay_p99),
            ("quiet at (s)", verdict.quiet_at),
            ("jobs not from this history", verdict.unmatched_jobs),
        ],
    )
    lines.append("")

    problems = list(verdict.problems)
    if judgement is not None:
        problems += [p for p in judgement.problems if p not in problems]
    lines += ["## Problems", ""]
    shown = problems[:list_limit]
    lines += [f"- {p}" for p in shown] if shown else ["None."]
    if len(problems) > len(shown):
        lines.append(f"- … and {len(problems) - len(shown)} more (see {REPORT_JSON})")
    lines.append("")

    if verdict.ticks is not None:
        lines += ticks_markdown(verdict.ticks)
    if verdict.unique is not None:
        lines += unique_markdown(verdict.unique)

    lines += ["## Fault timeline", ""]
    if verdict.recovery:
        lines += _table(
            ["#", "fault", "target", "start (s)", "healed (s)", "recovery (s)"],
            [
                (i + 1, r.fault, r.target, r.started, r.stopped, r.seconds)
                for i, r in enumerate(verdict.recovery)
            ],
        )
    else:
        lines.append("No faults were injected.")
    lines.append("")

    lines += ["## Figures", "", f"![throughput and fault windows]({svg_name})", ""]
    lines += ["### Executions per job", ""]
    lines += _table(["executions", "jobs"], sorted(verdict.executions.items()))
    lines.append("")

    for heading, issues in (
        ("Lost jobs", verdict.lost_jobs),
        ("Doubled jobs", verdict.doubled_jobs),
    ):
        if issues:
            lines += [f"## {heading}", ""]
            lines += _table(
                ["job", "key", "why"],
                [(j.job_id, j.key, j.reason) for j in issues[:list_limit]],
            )
            if len(issues) > list_limit:
                lines.append(f"\n… and {len(issues) - list_limit} more (see {REPORT_JSON})")
            lines.append("")

    w = scenario.workload
    mix = ", ".join(f"{k} {v:g}" for k, v in w.mix.weights() if v)
    e = scenario.expect
    lines += ["## Scenario", ""]
    lines += _table(
        ["setting", "value"],
        [
            ("rate (submits/s)", w.rate),
            ("duration (s)", w.duration),
            ("mix", mix),
            ("ledger sleep (s)", w.ledger_seconds),
            ("fail: times / max attempts", f"{w.fail_times} / {w.fail_max_attempts}"),
            ("history operations", len(history)),
            ("expect: max lost / max doubled", f"{e.max_lost} / {e.max_doubled}"),
            ("expect: duplicate effects", "yes" if e.expect_doubled else "no"),
            ("expect: lost jobs (recovery off)", "yes" if e.expect_lost else "no"),
            ("expect: recovery bound (s)", e.recovery_seconds),
            ("expect: alerts", ", ".join(e.alerts) or None),
            *scenario_schedule_rows(scenario),
        ],
    )
    lines.append("")
    return "\n".join(lines)


def scenario_schedule_rows(scenario: Scenario) -> list[tuple[str, Any]]:
    """The scenario table's rows of its relays and schedules (none without them)."""
    rows: list[tuple[str, Any]] = []
    for r in scenario.relays:
        options = [f"clock {r.clock_offset:+g}s"] if r.clock_offset else []
        options += ["UNSAFE scheduler"] if r.unsafe_scheduler else []
        started = "started for the run" if r.extra else "the stack's"
        rows.append((f"relay {r.name}", ", ".join([started, *options])))
    for i, spec in enumerate(scenario.schedules, 1):
        rows.append(
            (
                f"schedule {i}",
                f"{spec.cron} ({spec.timezone}), {spec.type} {spec.seconds:g}s, overlap "
                f"{spec.overlap}, catch-up {spec.catch_up} up to {spec.catch_up_limit}",
            )
        )
    if (u := scenario.unique) is not None:
        rows.append(
            (
                "unique load",
                f"{u.inserters} inserters, {u.keys} keys each {u.generation_seconds:g}s, doors "
                f"{', '.join(u.doors)}, rollback {u.rollback:g}, hold up to {u.hold_seconds:g}s"
                + (", UNSAFE check-then-insert" if u.unsafe else ""),
            )
        )
        e = scenario.expect
        doubled = "expected (unsafe)" if e.expect_doubled_keys else "counted"
        rows.append(
            (
                "expect: unique violations / doubled keys",
                f"≤ {e.max_unique_violations} / {doubled}",
            )
        )
    if scenario.schedules:
        e = scenario.expect
        doubled = "expected (unsafe)" if e.expect_doubled_ticks else f"≤ {e.max_doubled_ticks}"
        late = "counted" if e.max_late_ticks is None else f"≤ {e.max_late_ticks}"
        rows.append(
            (
                "expect: ticks missing / doubled / lost / late",
                f"≤ {e.max_missing_ticks} / {doubled} / ≤ {e.max_lost_ticks} / {late} "
                f"(late: > {e.late_tick_seconds:g}s)",
            )
        )
    return rows


def unique_markdown(unique: UniqueVerdict) -> list[str]:
    """The unique load's section of report.md: its keys, and its inserts by door."""
    lines = [
        "## Unique keys",
        "",
        "Every key the unique load fought over, against the jobs holding it "
        "(`chaos/unique_keys.py`): at most one job per key, one for every key an insert "
        "committed, every committed answer naming it, none for a key whose inserts all "
        "rolled back or failed.",
        "",
    ]
    lines += _table(
        ["keys", "committed", "jobs", "duplicates answered", "handoffs", "doubled", "dropped"]
        + ["wrong answer", "created twice", "phantom"],
        [
            (
                unique.keys,
                unique.keys_committed,
                unique.jobs,
                unique.duplicates,
                unique.handoffs,
                unique.doubled,
                unique.dropped,
                unique.wrong_answer,
                unique.created_twice,
                unique.phantom,
            )
        ],
    )
    lines.append("")
    lines += _table(
        ["door", "committed", "rolled back", "failed", "unknown"],
        [
            (door, c["committed"], c["rolled_back"], c["failed"], c["unknown"])
            for door, c in unique.by_door.items()
        ],
    )
    return [*lines, ""]


def _skips_text(skipped: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in skipped.items()) or "0"


def ticks_markdown(ticks: TickVerdict) -> list[str]:
    """The schedules' section of report.md: each schedule's ticks, and the run's total."""
    lines = ["## Schedule ticks", ""]
    lines.append(
        "Every nominal tick in each schedule's window: its row and its job "
        f"(`chaos/ticks.py`). Late: fired more than {ticks.late_seconds:g}s after its "
        "instant (the database's clock); counted, a failure only under the scenario's bound. "
        "Other: stray rows or jobs, skips against the policy, jobs dead, effects wrong."
    )
    lines.append("")
    headers = (
        "schedule",
        "window (UTC)",
        "expected",
        "fired",
        "skipped",
        "missing",
        "doubled",
        "lost",
        "late",
        "latest (s)",
        "other",
        "not due",
    )
    rows = []
    for s in ticks.schedules:
        window = f"{s.first:%H:%M:%S} to {s.last:%H:%M:%S}" if s.first and s.last else "(empty)"
        other = s.stray + s.bad_skips + s.dead + s.effects_wrong
        rows.append(
            (
                f"{s.name}: {s.policy}",
                window,
                s.expected,
                s.fired,
                _skips_text(s.skipped),
                s.missing,
                s.doubled,
                s.lost,
                s.late,
                s.latest_seconds,
                other,
                s.not_due,
            )
        )
    if len(ticks.schedules) > 1:
        t = ticks.total
        other = t("stray") + t("bad_skips") + t("dead") + t("effects_wrong")
        rows.append(
            (
                "**all**",
                "",
                t("expected"),
                t("fired"),
                _skips_text(ticks.skipped),
                t("missing"),
                t("doubled"),
                t("lost"),
                t("late"),
                None,
                other,
                t("not_due"),
            )
        )
    return [*lines, *_table(headers, rows), ""]


# ---------------------------------------------------------------- the ticks' summary


@dataclass(frozen=True)
class TickSummaryRow:
    """One scenario's schedule ticks in the summary of a run of many."""

    scenario: str
    expected: int
    fired: int
    skipped: str
    missing: int
    doubled: int
    lost: int
    late: int
    result: str

    @classmethod
    def of(cls, scenario: str, ticks: Mapping[str, Any], result: str) -> TickSummaryRow:
        """From a verdict's ``ticks`` as report.json holds it (``TickVerdict.to_dict``)."""
        t = ticks["totals"]
        return cls(
            scenario,
            t["expected"],
            t["fired"],
            _skips_text(t["skipped"]),
            t["missing"],
            t["doubled"],
            t["lost"],
            t["late"],
            result,
        )


@dataclass(frozen=True)
class UniqueSummaryRow:
    """One scenario's unique keys in the summary of a run of many: keys, keys with an
    insert committed, jobs holding them, committed answers of duplicate, keys a waiter
    created after a rollback, and the violations (``other``: wrong answers, created twice,
    phantoms)."""

    scenario: str
    keys: int
    committed: int
    jobs: int
    duplicates: int
    handoffs: int
    doubled: int
    dropped: int
    other: int
    result: str

    @classmethod
    def of(cls, scenario: str, unique: Mapping[str, Any], result: str) -> UniqueSummaryRow:
        """From a verdict's ``unique`` as report.json holds it (``UniqueVerdict.to_dict``)."""
        return cls(
            scenario,
            unique["keys"],
            unique["keys_committed"],
            unique["jobs"],
            unique["duplicates"],
            unique["handoffs"],
            unique["doubled"],
            unique["dropped"],
            unique["wrong_answer"] + unique["created_twice"] + unique["phantom"],
            result,
        )


Row = TypeVar("Row", TickSummaryRow, UniqueSummaryRow)


def _verdict_rows(
    directory: str | os.PathLike[str],
    part: str,
    of: Callable[[str, Mapping[str, Any], str], Row],
) -> list[Row]:
    rows = []
    for path in sorted(Path(directory).glob(f"*/{REPORT_JSON}")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if found := data["verdict"].get(part):
            rows.append(of(data["scenario"]["name"], found, data["summary"]["result"]))
    return rows


def tick_summary_rows(directory: str | os.PathLike[str]) -> list[TickSummaryRow]:
    """The tick rows of every report under ``directory`` that ran schedules."""
    return _verdict_rows(directory, "ticks", TickSummaryRow.of)


def unique_summary_rows(directory: str | os.PathLike[str]) -> list[UniqueSummaryRow]:
    """The unique-key rows of every report under ``directory`` that ran a unique load."""
    return _verdict_rows(directory, "unique", UniqueSummaryRow.of)


def part_summary_table(rows: Sequence[TickSummaryRow | UniqueSummaryRow]) -> str:
    """The schedules' ticks, or the unique keys, of a run of many, as a Markdown table
    (empty without any)."""
    if not rows:
        return ""
    headers = tuple(f.name for f in dataclasses.fields(rows[0]))
    cells = [[getattr(row, h) for h in headers] for row in rows]
    return "\n".join(_table(headers, cells)) + "\n"


# ---------------------------------------------------------------- summary rows


@dataclass(frozen=True)
class SummaryRow:
    scenario: str
    faults: str
    accepted: int
    lost: int
    doubled: int
    executions: str
    recovery: str
    result: str
    auditor: str = "–"  # what the relay's auditor found among the run's jobs


def summary_row(
    scenario: Scenario, verdict: Verdict, judgement: Judgement | None = None
) -> SummaryRow:
    accepted = max(verdict.accepted, 1)
    executions = (
        f"{verdict.total_executions} ({verdict.total_executions / accepted:.2f}/job, "
        f"max {verdict.max_executions})"
    )
    worst = verdict.max_recovery
    unmeasured = sum(1 for r in verdict.recovery if r.seconds is None)
    recovery = "–" if worst is None else f"max {worst:.1f}s"
    if unmeasured:
        recovery += f" ({unmeasured} unmeasured)"
    result = (
        f"expectations {passed_text(judgement.passed)}"
        if judgement is not None
        else f"checker {validity_text(verdict.valid)}"
    )
    return SummaryRow(
        scenario=scenario.name,
        faults=", ".join(scenario.fault_names) or "none",
        accepted=verdict.accepted,
        lost=verdict.lost,
        doubled=verdict.doubled,
        executions=executions,
        recovery=recovery,
        result=result,
    )


def summary_row_from_report(directory: str | os.PathLike[str]) -> SummaryRow:
    """The summary row stored in a report directory's ``report.json``."""
    data = json.loads((Path(directory) / REPORT_JSON).read_text(encoding="utf-8"))
    return SummaryRow(**data["summary"])


SUMMARY_HEADERS = (
    "scenario",
    "faults",
    "accepted",
    "lost",
    "doubled",
    "executions",
    "recovery",
    "auditor",
    "result",
)


def summary_table(
    rows: Sequence[SummaryRow], *, fmt: Literal["markdown", "plain"] = "markdown"
) -> str:
    """One row per scenario, as a Markdown table or as aligned plain text."""
    cells = [[str(getattr(row, h)) for h in SUMMARY_HEADERS] for row in rows]
    if fmt == "markdown":
        return "\n".join(_table(SUMMARY_HEADERS, cells)) + "\n"
    if fmt != "plain":
        raise ValueError(f"fmt must be 'markdown' or 'plain', got {fmt!r}")
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(SUMMARY_HEADERS)]
    numeric = {"accepted", "lost", "doubled"}

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if h in numeric else v.ljust(w)
            for v, w, h in zip(values, widths, SUMMARY_HEADERS, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(SUMMARY_HEADERS), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- the harness's section


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value).replace("|", "\\|")


def details_markdown(record: RunDetails) -> str:
    """The harness's section of report.md: what was done and what the system did. Rendered
    from ``record.to_dict()``, the report's ``run`` section, so the two always agree."""
    details = record.to_dict()
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
            f"{shop['orders_without_receipt']} with none); the mail service "
            f"(guard {shop.get('guard', 'key,fence')}) sent {shop['emails']} "
            f"email(s), {shop.get('jobs_emailed_twice', 0)} job(s) emailed more than once "
            f"({shop.get('stale_emails', 0)} email(s) sent for a fence lower than one already "
            f"sent), refused {shop.get('mail_refusals', 0)} stale call(s), and under its "
            f"idempotency keys got {shop['mail_calls']} call(s) for "
            f"{shop.get('keyed_emails', shop['emails'])} key(s) "
            f"({shop['emails_called_again']} asked for again and sent once)."
        )
    lines += alerts_markdown(details.get("alerts") or {})
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


def alerts_markdown(alerts: Mapping[str, Any]) -> list[str]:
    """The alerts that fired in the run's Prometheus, and those that reached the api's
    webhook through Alertmanager, with their times."""
    fired = alerts.get("fired")
    if fired is None:
        return ["Prometheus alerts could not be read."]
    shown = ", ".join(f"{n} (t={t:g}s)" for n, t in fired.items()) or "none"
    already = ", ".join(alerts.get("firing_at_start") or []) or "none"
    lines = [
        f"Prometheus alerts firing during the run: {shown}; already firing when it "
        f"started: {already}.",
        "",
    ]
    delivered = alerts.get("delivered")
    if delivered is None:
        return [*lines, "Alert notifications (`alert_notifications`) could not be read."]
    lines.append(
        "Alerts delivered through Alertmanager: the first firing notification of each, from "
        "this run's Prometheus, that the api's webhook recorded (receiver `leasework-api`):"
    )
    rows = [
        (n, d["fired"], d["starts_at"], d["received_at"], d["received"], d["after_fault"])
        for n, d in delivered.items()
    ]
    headers = ("alert", "fired in Prometheus (t, s)", "startsAt", "received (UTC)")
    lines += ["", *_table((*headers, "received (t, s)", "after fault start (s)"), rows)]
    missing = [n for n in alerts.get("expected", ()) if n not in delivered]
    if missing:
        lines += ["", f"Expected and **not delivered**: {', '.join(missing)}."]
    return lines


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


def result_text(verdict: Verdict, judgement: Judgement | None) -> str:
    """The summary's result cell: the checker's verdict and the scenario's expectations
    (they differ for the unsafe run, whose expectations require an invalid history)."""
    text = f"checker {validity_text(verdict.valid)}"
    if judgement is not None:
        text += f"; expectations {passed_text(judgement.passed)}"
    return text


def recovery_text(rows: Sequence[RecoveryRow]) -> str:
    """The summary table's recovery cell: worst first finish, worst drain."""
    if not rows:
        return "–"
    first = [r.first_finish for r in rows if r.first_finish is not None]
    drained = [r.drained for r in rows if r.drained is not None]
    unmeasured = sum(1 for r in rows if r.drained is None)
    text = f"first ≤{max(first):.1f}s" if first else "first –"
    text += f", drained ≤{max(drained):.1f}s" if drained else ", drained –"
    if unmeasured:
        text += f" ({unmeasured} undrained)"
    return text


# ---------------------------------------------------------------- writing


@dataclass(frozen=True)
class ReportFiles:
    json: Path
    markdown: Path
    svg: Path


def record_summary_row(record: RunRecord) -> SummaryRow:
    """The run's row of the summary table; with the harness's details, its recovery cell is
    the drains' and its result cell shows both the checker and the expectations."""
    row = summary_row(record.scenario, record.verdict, record.judgement)
    if record.details is None:
        return row
    auditor = record.details.auditor
    return dataclasses.replace(
        row,
        recovery=recovery_text(record.details.recovery),
        result=result_text(record.verdict, record.judgement),
        auditor=auditor.cell() if auditor is not None else "–",
    )


def report_data(record: RunRecord) -> dict[str, Any]:
    """What ``report.json`` holds."""
    verdict, history = record.verdict, record.history
    series = throughput(verdict, history)
    data: dict[str, Any] = {
        "scenario": record.scenario.to_dict(),
        "verdict": verdict.to_dict(),
        "judgement": record.judgement.to_dict() if record.judgement is not None else None,
        "fault_windows": [asdict(w) for w in fault_windows(history)],
        "throughput": {
            "bucket_seconds": series.bucket,
            "submitted": list(series.submitted),
            "finished": list(series.finished),
        },
        "history_ops": len(history),
        "summary": asdict(record_summary_row(record)),
    }
    if record.details is not None:
        data["run"] = record.details.to_dict()
    return data


def report_markdown(record: RunRecord) -> str:
    """``report.md``: the verdict and the scenario, then what the harness did, with the
    harness's own findings (a crash, missing evidence) on top: among hundreds of lost jobs
    they are the cause."""
    text = render_markdown(
        record.verdict, record.scenario, record.history, judgement=record.judgement
    )
    if record.details is None:
        return text
    text = text.rstrip("\n") + "\n\n" + details_markdown(record.details)
    findings = record.details.harness_problems
    if findings:
        block = "**Harness findings:**\n\n" + "".join(f"- {p}\n" for p in findings) + "\n"
        text = text.replace("## Verdict\n", block + "## Verdict\n", 1)
    return text


def write_report(directory: str | os.PathLike[str], record: RunRecord) -> ReportFiles:
    """Write ``report.json``, ``report.md`` and ``timeline.svg`` of one run into
    ``directory``, once, from its record."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out / REPORT_JSON, out / REPORT_MD, out / TIMELINE_SVG)
    data = report_data(record)
    files.json.write_text(json.dumps(data, indent=2, default=jsonable) + "\n", encoding="utf-8")
    files.markdown.write_text(report_markdown(record), encoding="utf-8")
    title = f"{record.scenario.name}: submitted and finished jobs"
    files.svg.write_text(render_svg(record.verdict, record.history, title=title), encoding="utf-8")
    return files
