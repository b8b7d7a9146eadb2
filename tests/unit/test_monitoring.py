"""examples/monitoring/: the rules pass promtool, every alert is unit-tested both ways and
has a runbook, and the rules and dashboard use only families the plugin exports.

The promtool tests are marked `monitoring` (they need Debian's prometheus package); the
others read files only. The live check of every rule and panel is tests/e2e/test_prometheus.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prometheus_tools import DASHBOARD, MONITORING, ROOT, RULE_TESTS, RULES, binary

ALERTS_DOC = ROOT / "docs" / "alerts.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
#: A family's name in an expression (ours, or the library's process families); not the middle
#: of a recording rule's level:name:ops.
FAMILY = re.compile(r"(?<![:\w])(?:nri_midbatch|process|python)_\w+(?![\w:])")
#: The plugin's DaemonSet and the webhook's Deployment, whose memory limit the alert knows.
MANIFESTS = (
    ROOT / "examples" / "kubernetes" / "daemonset.yaml",
    ROOT / "examples" / "kubernetes" / "webhook" / "deployment.yaml",
)
#: A recording rule's name.
RECORDED = re.compile(r"\w+:\w+:\w+")


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alert_names() -> list[str]:
    return [rule["alert"] for rule in rules() if "alert" in rule]


def dashboard_queries() -> Iterator[tuple[str, str]]:
    """(panel title, expression) for every target of every panel."""
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target["expr"]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading made of letters, digits and spaces."""
    return re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-")


@pytest.mark.monitoring
def test_promtool_checks_the_rules() -> None:
    res = subprocess.run(
        [binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules())} rules found" in res.stdout


@pytest.mark.monitoring
def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    res = subprocess.run(
        [binary("promtool"), "test", "rules", RULE_TESTS.name],
        cwd=MONITORING,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


@pytest.mark.monitoring
def test_promtool_unit_tests_fail_for_an_alert_that_does_not_fire(tmp_path: Path) -> None:
    # The unit tests are worth something only if a broken rule fails them: raise one
    # threshold out of reach and promtool must report that alert.
    broken = RULES.read_text().replace(
        "job_instance_reason:nri_midbatch_invalid_inputs:increase10m > 0",
        "job_instance_reason:nri_midbatch_invalid_inputs:increase10m > 1000",
    )
    assert broken != RULES.read_text()
    (tmp_path / RULES.name).write_text(broken)
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())
    res = subprocess.run(
        [binary("promtool"), "test", "rules", RULE_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0
    assert "alertname: NriMidbatchInvalidAnnotations" in res.stdout + res.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = set(alert_names())
    assert alerts, RULES
    assert alerts - firing == set(), "never tested firing"
    assert alerts - quiet == set(), "never tested not firing"
    assert (firing | quiet) - alerts == set(), "tests of alerts that do not exist"


def test_every_alert_has_a_runbook_section() -> None:
    doc = ALERTS_DOC.read_text()
    sections = {anchor(h) for h in re.findall(r"^### (.+)$", doc, flags=re.MULTILINE)}
    for rule in rules():
        if "alert" not in rule:
            continue
        name = rule["alert"]
        assert rule["annotations"]["runbook"] == f"docs/alerts.md#{name.lower()}", name
        assert name.lower() in sections, f"no '### {name}' in {ALERTS_DOC.name}"
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name


def test_rules_and_dashboard_use_only_exported_families() -> None:
    # A misspelt family makes a query return nothing, silently: an alert that never fires.
    documented = set(
        re.findall(r"^\| `((?:nri_midbatch|process|python)_\w+)` \|", METRICS_DOC.read_text(), re.M)
    )
    assert "nri_midbatch_events_total" in documented
    expressions = [rule["expr"] for rule in rules()]
    expressions += [expr for _, expr in dashboard_queries()]
    used = {name for e in expressions for name in FAMILY.findall(e)}
    assert used
    unknown = {
        name
        for name in used
        if name not in documented
        and not any(name.endswith(s) and name[: -len(s)] in documented for s in HISTOGRAM_SUFFIXES)
    }
    assert unknown == set()
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    assert {name for e in expressions for name in RECORDED.findall(e)} <= recorded


def memory_limit_bytes(manifest: Path) -> int:
    """The memory limit of the manifest's one container, in bytes (Mi only, as they are)."""
    documents = yaml.safe_load_all(manifest.read_text())
    (document,) = [d for d in documents if d["kind"] in ("DaemonSet", "Deployment")]
    (container,) = document["spec"]["template"]["spec"]["containers"]
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi"), limit
    return int(limit[:-2]) * 2**20


def test_the_memory_alert_knows_the_manifests_memory_limit() -> None:
    # The alert takes the limit as a number: it must follow the manifests.
    (rule,) = [r for r in rules() if r.get("alert") == "NriMidbatchMemoryNearLimit"]
    for manifest in MANIFESTS:
        limit = memory_limit_bytes(manifest)
        assert f"process_resident_memory_bytes > 0.8 * {limit} " in rule["expr"], manifest
        assert f"{limit // 2**20} MiB memory limit" in rule["annotations"]["summary"]


def test_dashboard_queries_select_by_the_dashboards_variables() -> None:
    board = json.loads(DASHBOARD.read_text())
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= variables
    queries = list(dashboard_queries())
    assert len(queries) >= 15
    for title, expr in queries:
        for name in FAMILY.findall(expr):
            # Every family in a query is narrowed to the chosen job and instances.
            assert re.search(rf'{name}\{{[^}}]*job=~"\$job", instance=~"\$instance"', expr), (
                title,
                name,
            )
