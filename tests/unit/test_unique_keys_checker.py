"""The unique-keys checker (chaos/unique_keys.py) on hand-written inserts and jobs, its
expectations in the judge, the scenario's ``[unique]`` table, and the report's section."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from chaos.checker import UNKNOWN
from chaos.judge import EXPECTATIONS, HARNESS, Evidence, judge_run
from chaos.loader import ScenarioError, loads_scenario
from chaos.record import RunRecord
from chaos.report import part_summary_table, unique_summary_rows, write_report
from chaos.runner import summary_of_directory
from chaos.unique_keys import UniqueInsert, UniqueObservation, check_unique
from chaos.verdict import check
from chaos.workload import ClientView

BASE = 'name = "s"\n[workload]\nrate = 1\nduration = 30\n'
T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def insert(
    key: str,
    outcome: str,
    job: str | None = None,
    duplicate: bool | None = None,
    *,
    door: str = "enqueue",
    at: float = 0.0,
) -> dict[str, Any]:
    return {
        "key": key,
        "door": door,
        "outcome": outcome,
        "job_id": job,
        "duplicate": duplicate,
        "started": at,
        "ended": at + 0.1,
    }


def job(id_: str, key: str) -> dict[str, Any]:
    return {"id": id_, "key": key, "status": "succeeded"}


def kinds(inserts: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> list[str]:
    return [f.kind for f in check_unique(UniqueObservation.of(inserts, jobs)).findings]


def test_a_waiter_that_inserts_after_the_holder_rolled_back_and_one_told_duplicate_pass():
    inserts = [
        insert("a", "rolled_back", "j0", False, at=0.0),  # the first holder rolls back
        insert("a", "committed", "j1", False, at=0.05, door="http"),  # the waiter inserts
        insert("a", "committed", "j1", True, at=0.3, door="batch"),  # later: duplicate
        insert("a", "committed", "j1", None, at=0.4, door="sql"),  # the SQL door does not say
        insert("b", "failed", at=1.0),
        insert("b", "unknown", at=1.2, door="http"),  # may have landed: it did
    ]
    checked = check_unique(UniqueObservation.of(inserts, [job("j1", "a"), job("j2", "b")]))
    assert checked.findings == ()
    verdict = checked.measures["unique"]
    assert (verdict.keys, verdict.keys_committed, verdict.jobs) == (2, 1, 2)
    assert (verdict.created, verdict.duplicates, verdict.handoffs) == (1, 1, 1)
    assert verdict.violations == 0
    assert verdict.by_door["enqueue"] == {
        "committed": 0,
        "rolled_back": 1,
        "failed": 1,
        "unknown": 0,
    }
    assert list(verdict.by_door) == ["http", "batch", "enqueue", "sql"]


def test_two_jobs_for_one_key_are_doubled_and_two_creating_answers_created_twice():
    inserts = [insert("a", "committed", "j1", False), insert("a", "committed", "j2", False)]
    assert kinds(inserts, [job("j1", "a"), job("j2", "a")]) == [
        "unique_doubled",
        "unique_created_twice",
    ]


def test_a_waiter_told_duplicate_of_a_holder_that_rolled_back_is_dropped():
    """oban#1087: the holder rolls back, the waiter is answered with its id and writes nothing."""
    inserts = [
        insert("a", "rolled_back", "j0", False, at=0.0),
        insert("a", "committed", "j0", True, at=0.05),
    ]
    checked = check_unique(UniqueObservation.of(inserts, []))
    assert [f.kind for f in checked.findings] == ["unique_dropped"]
    assert checked.findings[0].valid is False and "a (1 committed)" in checked.findings[0].message


def test_a_committed_answer_naming_another_job_is_a_wrong_answer():
    inserts = [insert("a", "committed", "j1", False), insert("a", "committed", "jx", True)]
    assert kinds(inserts, [job("j1", "a")]) == ["unique_wrong_answer"]


def test_a_job_for_a_key_whose_inserts_all_rolled_back_is_a_phantom_unless_one_was_unknown():
    rolled = [insert("a", "rolled_back", "j1", False), insert("a", "failed")]
    assert kinds(rolled, [job("j1", "a")]) == ["unique_phantom", "unique_empty"]
    unknown = [*rolled, insert("a", "unknown", door="http")]
    assert kinds(unknown, [job("j1", "a")]) == ["unique_empty"]


def test_a_run_where_nothing_committed_shows_nothing():
    (finding,) = check_unique(UniqueObservation.of([insert("a", "failed")], [])).findings
    assert finding.kind == "unique_empty" and finding.valid == UNKNOWN


def test_an_insert_with_an_unknown_outcome_or_door_is_refused():
    with pytest.raises(ValueError, match="outcome 'maybe'"):
        UniqueInsert("a", "enqueue", "maybe")
    with pytest.raises(ValueError, match="door 'grpc'"):
        UniqueInsert("a", "grpc", "committed")


def unique_scenario(extra: str = "", expect: str = ""):
    return loads_scenario(BASE + "[unique]\n" + extra + "[expect]\n" + expect)


def judged(inserts, jobs, *, extra: str = "", expect: str = ""):
    scenario = unique_scenario(extra, expect)
    verdict = check([], [], [], [], quiet_at=1.0, unique=UniqueObservation.of(inserts, jobs))
    view = ClientView(0, 0, 0, 0, 0, 0, 0, ())
    return judge_run(Evidence(verdict, scenario.expect, view=view))


DOUBLED = (
    [insert("a", "committed", "j1", False), insert("a", "committed", "j2", False)],
    [job("j1", "a"), job("j2", "a")],
)
CLEAN = (
    [insert("a", "committed", "j1", False), insert("a", "committed", "j1", True)],
    [job("j1", "a")],
)


def test_the_judge_fails_a_violation_and_passes_a_clean_run_on_its_unique_findings():
    assert "EXPECTATIONS" and "unique" in EXPECTATIONS and "unique_contention" in HARNESS
    failed = judged(*DOUBLED)
    assert failed.passed is False
    assert any("1 doubled, 1 created twice; at most 0 allowed" in p for p in failed.problems)
    clean = judged(*CLEAN)
    assert not [p for p in clean.problems if "unique" in p]


def test_the_unsafe_load_must_double_a_key_and_may_not_drop_one():
    unsafe = "unsafe = true\n"
    expect = "expect_doubled_keys = true\n"
    assert not [p for p in judged(*DOUBLED, extra=unsafe, expect=expect).problems if "unique" in p]
    (none,) = [p for p in judged(*CLEAN, extra=unsafe, expect=expect).problems if "unique" in p]
    assert "could not have failed" in none
    dropped = [*DOUBLED[0], insert("b", "committed", "j9", True)]
    problems = judged(dropped, DOUBLED[1], extra=unsafe, expect=expect).problems
    assert any("1 dropped; at most 0" in p for p in problems)


def test_the_judge_asks_for_evidence_that_the_inserters_contended():
    problems = judged(
        *CLEAN, expect="min_unique_duplicates = 2\nmin_unique_handoffs = 1\n"
    ).problems
    assert any("1 committed answer(s) of duplicate, at least 2" in p for p in problems)
    assert any("0 key(s) created by a waiter after a rollback, at least 1" in p for p in problems)


def test_the_unique_table_loads_strictly():
    spec = unique_scenario('inserters = 4\ndoors = ["http", "sql"]\nrollback = 0.5\n').unique
    assert spec is not None and (spec.inserters, spec.doors, spec.rollback) == (
        4,
        ("http", "sql"),
        0.5,
    )
    assert loads_scenario(BASE).unique is None
    with pytest.raises(ScenarioError, match="are not doors"):
        unique_scenario('doors = ["http", "grpc"]\n')
    with pytest.raises(ScenarioError, match="unique.rollback"):
        unique_scenario("rollback = 2\n")
    with pytest.raises(ScenarioError, match="only makes sense with \\[unique\\] unsafe"):
        unique_scenario(expect="expect_doubled_keys = true\n")


def test_the_keys_are_in_the_report_and_the_summary(tmp_path: Path):
    scenario = unique_scenario()
    inserts, jobs = DOUBLED
    verdict = check([], [], [], [], quiet_at=1.0, unique=UniqueObservation.of(inserts, jobs))
    write_report(tmp_path / scenario.name, RunRecord(scenario, (), verdict))
    md = (tmp_path / scenario.name / "report.md").read_text()
    assert "## Unique keys" in md
    assert "| 1 | 1 | 2 | 0 | 0 | 1 | 0 | 0 | 1 | 0 |" in md
    assert "| enqueue | 2 | 0 | 0 | 0 |" in md
    assert "| unique load | 8 inserters, 3 keys each 1s" in md
    report = json.loads((tmp_path / scenario.name / "report.json").read_text())
    assert report["verdict"]["unique"]["doubled"] == 1
    (row,) = unique_summary_rows(tmp_path)
    assert (row.scenario, row.keys, row.jobs, row.doubled, row.other) == ("s", 1, 2, 1, 1)
    assert part_summary_table([row]).splitlines()[0].startswith("| scenario | keys | committed |")
    assert "Unique keys:" in summary_of_directory(tmp_path, fmt="markdown")
