"""The chaos harness against the real stack, and proof that it can fail.

Scenario b (a worker frozen past its lease while it runs ledger jobs) runs twice: with the
workers in the unsafe plain-TTL lease mode it must report duplicate effects, a FAIL verdict
from the checker; as built (fenced) it must pass. Then the checker is fed the fenced run's
real history and tables with one job's effect removed from the ledger, and must say FAIL.
Each run takes about a minute.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from chaos import runner
from chaos.history import read_history
from chaos.judge import judge
from chaos.report import REPORT_JSON, REPORT_MD, TIMELINE_SVG
from chaos.stack import env_deviations
from chaos.tables import TABLES_JSON, load_tables
from chaos.verdict import check
from devstack import Stack


def _run(stack: Stack, name: str, out: Path) -> runner.RunResult:
    (scenario,) = runner.select(runner.load(), [name])
    return trio.run(lambda: runner.run_scenario(scenario, stack, out))


@pytest.fixture(scope="module")
def unsafe_run(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> runner.RunResult:
    return _run(stack, "b-unsafe", tmp_path_factory.mktemp("chaos"))


@pytest.fixture(scope="module")
def fenced_run(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> runner.RunResult:
    return _run(stack, "b-worker-sigstop", tmp_path_factory.mktemp("chaos"))


def test_unsafe_lease_mode_reports_doubled_effects(unsafe_run: runner.RunResult):
    verdict = unsafe_run.verdict
    assert unsafe_run.error is None
    assert verdict is not None and unsafe_run.judgement is not None
    assert verdict.accepted > 100
    assert verdict.doubled > 0, "a stalled worker without the fence must apply effects twice"
    assert verdict.valid is False
    assert any(p.startswith("doubled:") for p in verdict.problems)
    # the scenario expects the doubling, so its expectations are met...
    assert unsafe_run.judgement.passed is True
    # ...and the same run held to the fenced scenario's expectations fails
    fenced = runner.select(runner.load(), ["b-worker-sigstop"])[0]
    assert judge(verdict, fenced.expect).passed is False
    # the workers were put back in the fenced mode afterwards
    stack = Stack.from_env()
    for worker in ("worker-1", "worker-2"):
        pid = stack.pid(worker)
        assert pid is not None
        assert env_deviations(stack, worker, pid) == []


def test_fenced_stalled_worker_passes(fenced_run: runner.RunResult):
    verdict, judgement = fenced_run.verdict, fenced_run.judgement
    assert fenced_run.error is None
    assert verdict is not None and judgement is not None
    assert verdict.accepted > 100
    assert (verdict.lost, verdict.doubled, verdict.stray_effects) == (0, 0, 0)
    assert verdict.valid is True
    assert judgement.passed is True, judgement.problems
    # the freeze really hit running jobs: they ran again, and the frozen worker's late
    # writes were refused by the fence or cancelled at the lease deadline
    assert verdict.redeliveries >= 1
    assert fenced_run.details is not None
    counters = fenced_run.details.counters
    assert (
        counters["leasework_fence_rejections_total"]
        + counters["leasework_lease_loss_cancellations_total"]
        >= 1
    )
    for name in (REPORT_JSON, REPORT_MD, TIMELINE_SVG, "history.jsonl", "tables.json"):
        assert (fenced_run.directory / name).is_file(), name


def test_checker_fails_a_real_run_with_one_effect_removed(fenced_run: runner.RunResult):
    history = read_history(fenced_run.directory / "history.jsonl")
    tables = load_tables(fenced_run.directory / TABLES_JSON)
    assert fenced_run.details is not None
    quiet_at = fenced_run.details.quiet.at

    def verdict(effects):
        return check(
            history,
            tables["jobs"],
            effects,
            tables["attempts"],
            quiet_at=quiet_at,
            run_started_at=tables["run_started_at"],
        )

    assert verdict(tables["effects"]).valid is True  # the saved run checks the same offline
    victim = next(j for j in tables["jobs"] if j["type"] == "ledger" and j["status"] == "succeeded")
    without = [e for e in tables["effects"] if e["job_id"] != victim["id"]]
    assert len(without) == len(tables["effects"]) - 1
    broken = verdict(without)
    assert broken.valid is False
    assert broken.lost == 1
    assert victim["id"] in broken.problems[0]
    assert "without its effect" in broken.problems[0]
