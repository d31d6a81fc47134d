"""The monitoring artefacts are checked like code: the alert rules pass ``promtool check`` and
their ``promtool test rules`` cases, every PromQL expression in the rules and the Grafana
dashboards parses, and every metric they name is one leasework exports (leasework/metrics.py)
or a recording rule. No server is started; only promtool is needed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from devstack.services.alertmanager import WATCHDOG
from leasework import metrics

ROOT = Path(__file__).resolve().parents[2]
RULES_DIR = ROOT / "dashboards" / "rules"
RULES = RULES_DIR / "leasework.rules.yml"
RULE_TESTS = ROOT / "dashboards" / "tests" / "leasework.tests.yml"
DASHBOARDS = ROOT / "dashboards" / "grafana" / "dashboards"
RUNBOOK = ROOT / "docs" / "runbook.md"
SEVERITIES = {"page", "ticket", "info"}

PROMTOOL = os.environ.get("PROMTOOL") or shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not found on PATH (Debian package prometheus; `just up` provisions it)",
)


def promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *map(str, args)], capture_output=True, text=True, check=False, timeout=120
    )


# ------------------------------------------------------------------ what exists


def exported_series() -> set[str]:
    """Series names Prometheus sees from leasework: prometheus_client appends ``_total`` to
    counters and ``_bucket``/``_sum``/``_count`` to histograms, and exports when each
    counter, histogram and summary child was created (``_created``, Unix seconds)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("", "_sum", "_count", "_created"),
        "gauge": ("",),
    }
    names = set()
    for collector in vars(metrics).values():
        if not isinstance(collector, MetricWrapperBase):
            continue
        for family in collector.describe():
            names.update(family.name + s for s in suffixes[family.type])
    return names


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def rules() -> list[dict]:
    return [r for g in load_yaml(RULES)["groups"] for r in g["rules"]]


def recorded_names() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def alerting_rules() -> list[dict]:
    return [r for r in rules() if "alert" in r]


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: dict):
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # panels inside collapsed rows


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) for every rule and every dashboard panel target."""
    found = [(f"{RULES.name}: {r.get('alert') or r.get('record')}", r["expr"]) for r in rules()]
    for name, board in dashboards().items():
        for panel in panels(board):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    where = (
                        f"{name}: panel {panel.get('id')} {panel.get('title')!r}"
                        f" target {target.get('refId')}"
                    )
                    found.append((where, target["expr"]))
    return found


def grafana_to_promql(expr: str) -> str:
    """Replace Grafana's variables with values Prometheus accepts."""
    expr = re.sub(r"\$\{?__(rate_interval|interval|range)(_ms|_s)?\}?", "5m", expr)
    return re.sub(r"\$\{(\w+)(:\w+)?\}|\$(\w+)", "worker-1", expr)


def metric_names(expr: str) -> set[str]:
    """Identifiers starting with ``leasework`` outside string literals and comments."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`|#[^\n]*', " ", expr)
    return {m for m in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr) if m.startswith("leasework")}


def github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# ------------------------------------------------------------------ promtool


@needs_promtool
@pytest.mark.parametrize("path", sorted(RULES_DIR.glob("*.yml")), ids=lambda p: p.name)
def test_every_rule_file_passes_promtool_check(path: Path):
    # the local stack loads every dashboards/rules/*.yml: a test file there would break it
    result = promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_rule_unit_tests_pass():
    result = promtool("test", "rules", RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_every_expression_parses(tmp_path: Path):
    exprs = expressions()
    groups = [
        {
            "name": f"{i}: {where}",
            "rules": [{"record": f"check:expr_{i}", "expr": grafana_to_promql(e)}],
        }
        for i, (where, e) in enumerate(exprs)
    ]
    path = tmp_path / "exprs.yml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    result = promtool("check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(exprs)} rules found" in result.stdout


# ------------------------------------------------------------------ names and structure


def test_metric_names_are_known():
    exported = exported_series()
    recorded = recorded_names()
    assert exported, "no collectors found in leasework.metrics"
    unknown = []
    for where, expr in expressions():
        for name in sorted(metric_names(expr)):
            if name not in (recorded if ":" in name else exported):
                unknown.append(f"{where}: {name}")
    for name, board in dashboards().items():
        for var in board.get("templating", {}).get("list", []):
            query = var.get("definition") or ""
            for metric in sorted(metric_names(query)):
                if metric not in exported:
                    unknown.append(f"{name}: variable {var['name']}: {metric}")
    assert not unknown, "metrics that neither leasework nor a recording rule defines:\n" + (
        "\n".join(unknown)
    )


def test_metric_name_check_can_fail():
    exported = exported_series()
    assert "leasework_scheduling_delay_seconds_bucket" in exported
    assert "leasework_dead_letters_total" in exported
    assert "leasework_outbox_pending" in exported
    # a counter without _total, a gauge with _total, a made-up name
    for wrong in ("leasework_dead_letters", "leasework_outbox_pending_total", "leasework_bogus"):
        assert wrong not in exported
    assert metric_names('sum(leasework_x_total{job="leasework_y"}) # leasework_z') == {
        "leasework_x_total"
    }


def test_every_alert_is_labelled_and_points_at_its_runbook_section():
    anchors = {
        github_anchor(m) for m in re.findall(r"^#{1,6} (.+)$", RUNBOOK.read_text(), re.MULTILINE)
    }
    alerts = alerting_rules()
    assert alerts
    for rule in alerts:
        name = rule["alert"]
        assert rule.get("labels", {}).get("severity") in SEVERITIES, name
        annotations = rule.get("annotations", {})
        assert annotations.get("summary") and annotations.get("description"), name
        url = annotations.get("runbook_url", "")
        assert url == f"docs/runbook.md#{name.lower()}", (name, url)
        assert url.split("#", 1)[1] in anchors, f"{name}: no section {url} in {RUNBOOK}"


def test_every_alert_has_a_firing_and_a_quiet_promtool_case():
    cases: dict[str, set[bool]] = {}
    for group in load_yaml(RULE_TESTS)["tests"]:
        for case in group.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    for name in {r["alert"] for r in alerting_rules()}:
        # the deadman always fires: it has no quiet case
        wanted = {True} if name == WATCHDOG else {True, False}
        assert cases.get(name) == wanted, f"{name}: firing and quiet cases {cases.get(name)}"


@pytest.mark.parametrize("name", ["leasework-overview.json", "leasework-worker.json"])
def test_dashboard_is_well_formed(name: str):
    board = dashboards()[name]
    assert board["uid"] == name.removesuffix(".json")
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(board):
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), f"{panel['title']}: no query"
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
