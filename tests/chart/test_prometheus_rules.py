"""The chart's PrometheusRule, checked by Prometheus' own promtool.

The rules are taken from ``helm template`` output (monitoring-on values), so what is checked is
exactly what the chart installs: ``promtool check rules`` on the full groups (expressions,
durations, annotation templates), then ``promtool test rules`` (data/rules-test.yaml) with input
series that make every alert fire and, just as important, not fire. Without promtool (`make
system-deps` installs it) each test fails saying so, as the tests/promql ones do.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from tests.chart.conftest import CHART, DATA, one, render, run
from tests.tools import required


@pytest.fixture(scope="module")
def groups(bins: Path) -> list[dict[str, object]]:
    rule = one(render(bins, CHART / "ci" / "monitoring-on-values.yaml"), "PrometheusRule")
    found: list[dict[str, object]] = rule["spec"]["groups"]
    return found


def test_promtool_check_rules(groups: list[dict[str, object]], tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    result = run([required("promtool"), "check", "rules", rules])
    assert "SUCCESS: 5 rules found" in result.stdout + result.stderr


def test_promtool_unit_tests_fire_and_hold(groups: list[dict[str, object]], tmp_path: Path) -> None:
    stripped = copy.deepcopy(groups)
    for group in stripped:
        for rule in group["rules"]:  # type: ignore[attr-defined]
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": stripped}, sort_keys=False))
    shutil.copy(DATA / "rules-test.yaml", tmp_path / "rules-test.yaml")
    result = run([required("promtool"), "test", "rules", tmp_path / "rules-test.yaml"])
    assert "SUCCESS" in result.stdout + result.stderr


def test_promtool_unit_tests_catch_a_wrong_threshold(bins: Path, tmp_path: Path) -> None:
    """The unit tests are not vacuous: a rule set with a 3s threshold fails them."""
    rule = one(
        render(
            bins,
            CHART / "ci" / "monitoring-on-values.yaml",
            set_values=["monitoring.prometheusRule.syncSlow.thresholdSeconds=3"],
        ),
        "PrometheusRule",
    )
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            r.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    shutil.copy(DATA / "rules-test.yaml", tmp_path / "rules-test.yaml")
    result = run([required("promtool"), "test", "rules", tmp_path / "rules-test.yaml"], check=False)
    assert result.returncode != 0
    assert "KubeProxyRuleSyncSlow" in result.stdout + result.stderr
