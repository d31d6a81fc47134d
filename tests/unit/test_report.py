"""Reports: the three files are written, the SVG is well-formed XML with the fault windows
shaded, and the per-scenario summary table renders."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

from chaos.history import Op, nemesis_value, submit_ok_value, submit_value
from chaos.judge import judge
from chaos.loader import loads_scenario
from chaos.record import RunRecord
from chaos.report import (
    render_svg,
    summary_row,
    summary_row_from_report,
    summary_table,
    throughput,
    write_report,
)
from chaos.scenario import Scenario
from chaos.verdict import Verdict, check

SVG = "{http://www.w3.org/2000/svg}"
T0 = datetime(2026, 1, 5, 12, 0, 0, tzinfo=UTC)

SCENARIO = """
name = "kill-and-slow"
description = "A worker is killed, then Postgres slows down."
[workload]
rate = 2
duration = 10
[workload.mix]
noop = 1
ledger = 1
[[faults]]
at = 2
duration = 3
fault = "sigkill"
target = "worker-1"
[[faults]]
at = 6
duration = 2
fault = "latency"
target = "postgres"
params = { latency = 300 }
[expect]
recovery_seconds = 10
"""


def _run() -> tuple[Scenario, list[Op], Verdict]:
    scenario = loads_scenario(SCENARIO, source="kill-and-slow.toml")
    ops: list[Op] = []

    def add(t, process, type_, f, value, error=None):
        ops.append(Op(len(ops), t, process, type_, f, value, error))

    jobs, effects, attempts = [], [], []
    for i in range(20):
        t = i * 0.5
        for fault in scenario.faults:
            for action, when in (("start", fault.at), ("stop", fault.stop)):
                if when == t:
                    value = nemesis_value(fault.fault, action, fault.target)
                    add(t, "nemesis", "invoke", "nemesis", value)
                    add(t, "nemesis", "info", "nemesis", value)
        key, job_type = f"k{i}", "ledger" if i % 2 else "noop"
        value = submit_value(key, job_type, {})
        add(t, i % 3, "invoke", "submit", value)
        if i == 7:
            add(t + 0.4, i % 3, "info", "submit", value, "timeout")  # never landed
            continue
        add(t + 0.05, i % 3, "ok", "submit", submit_ok_value(value, f"id{i}", "queued"))
        finished = t + (4.0 if 2 <= t < 5 else 0.6)
        jobs.append(
            {
                "id": f"id{i}",
                "type": job_type,
                "status": "succeeded",
                "attempt": 1,
                "idempotency_key": key,
                "run_at": T0 + timedelta(seconds=t),
                "started_at": T0 + timedelta(seconds=t + 0.2),
                "finished_at": T0 + timedelta(seconds=finished),
                "created_at": T0 + timedelta(seconds=t),
            }
        )
        attempts.append((f"id{i}", 1, i + 1, "worker-2", T0, "succeeded"))
        if job_type == "ledger":
            effects.append((f"id{i}", i + 1, "ledger"))
    verdict = check(ops, jobs, effects, attempts, quiet_at=20.0, run_started_at=T0)
    return scenario, ops, verdict


def test_the_report_files_are_written(tmp_path):
    scenario, ops, verdict = _run()
    assert verdict.valid is True, verdict.problems
    judgement = judge(verdict, scenario.expect)
    files = write_report(tmp_path / "out", RunRecord(scenario, tuple(ops), verdict, judgement))
    assert files.json.exists() and files.markdown.exists() and files.svg.exists()

    data = json.loads(files.json.read_text())
    assert data["verdict"]["valid"] is True and data["verdict"]["accepted"] == 19
    assert data["judgement"] == {"passed": True, "problems": []}
    assert data["scenario"]["name"] == "kill-and-slow"
    assert [w["fault"] for w in data["fault_windows"]] == ["sigkill", "latency"]
    assert sum(data["throughput"]["submitted"]) == 20
    assert sum(data["throughput"]["finished"]) == 19

    md = files.markdown.read_text()
    assert md.startswith("# Chaos run: kill-and-slow")
    assert "**Checker: valid**" in md and "**Expectations: met**" in md
    assert "## Fault timeline" in md and "| 1 | sigkill | worker-1 |" in md
    assert "![throughput and fault windows](timeline.svg)" in md


def test_the_timeline_is_svg_with_shaded_fault_windows(tmp_path):
    scenario, ops, verdict = _run()
    files = write_report(tmp_path, RunRecord(scenario, tuple(ops), verdict))
    root = ET.parse(files.svg).getroot()
    assert root.tag == f"{SVG}svg"
    faults = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "fault"]
    assert [r.get("data-fault") for r in faults] == ["sigkill", "latency"]
    for rect in faults:
        assert float(rect.get("width")) > 0 and float(rect.get("fill-opacity")) < 1
    # the sigkill window (2 s to 5 s) lies left of the latency window (6 s to 8 s)
    assert float(faults[0].get("x")) < float(faults[1].get("x"))
    labels = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "fault-label"]
    assert labels == ["sigkill worker-1", "latency postgres"]
    lines = {p.get("class"): p.get("points") for p in root.iter(f"{SVG}polyline")}
    assert set(lines) == {"submitted", "finished"}
    assert len(lines["submitted"].split()) == len(throughput(verdict, ops).submitted)


def test_the_svg_escapes_text_and_draws_an_unhealed_fault_to_the_end():
    scenario, ops, verdict = _run()
    ops = [
        *ops,
        Op(len(ops), 15.0, "nemesis", "info", "nemesis", nemesis_value("x<&>", "start", None)),
    ]
    root = ET.fromstring(render_svg(verdict, ops, title="a <b> & c"))
    faults = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "fault"]
    assert faults[-1].get("data-fault") == "x<&>"
    assert float(faults[-1].get("x")) + float(faults[-1].get("width")) > 800


def test_summary_rows_render_as_markdown_and_plain(tmp_path):
    scenario, ops, verdict = _run()
    write_report(
        tmp_path / "a", RunRecord(scenario, tuple(ops), verdict, judge(verdict, scenario.expect))
    )
    row = summary_row_from_report(tmp_path / "a")
    assert row == summary_row(scenario, verdict, judge(verdict, scenario.expect))
    assert row.faults == "sigkill, latency" and row.accepted == 19
    assert row.recovery.startswith("max ") and row.result == "expectations met"

    md = summary_table([row, row])
    lines = md.splitlines()
    assert (
        lines[0]
        == "| scenario | faults | accepted | lost | doubled | executions | recovery | auditor "
        "| result |"
    )
    assert lines[1].startswith("|---|") and len(lines) == 4
    assert "| kill-and-slow | sigkill, latency | 19 | 0 | 0 |" in lines[2]

    plain = summary_table([row], fmt="plain").splitlines()
    assert plain[0].split()[:4] == ["scenario", "faults", "accepted", "lost"]
    assert set(plain[1].replace(" ", "")) == {"-"}
    assert plain[2].startswith("kill-and-slow")
