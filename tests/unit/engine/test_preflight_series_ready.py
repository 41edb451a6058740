"""The series check before the first move leaves NotReady nodes to the NodesNotReady warning."""

from __future__ import annotations

from dataclasses import replace

from proxymode.api.models import Severity
from proxymode.engine.preflight import run_preflight
from tests.unit.engine.test_distributions import ANALYSIS, coverage, kubeadm, observed
from tests.unit.engine.test_preflight import node, policy


def test_a_not_ready_node_is_a_warning_also_for_the_series_check() -> None:
    ds, cm = kubeadm()
    cm["data"]["config.conf"] = cm["data"]["config.conf"].replace(
        'metricsBindAddress: ""', "metricsBindAddress: 0.0.0.0:10249"
    )
    cluster = (node("node-0", ready=True), node("node-1", ready=True), node("node-2", ready=False))
    up = {"node-0", "node-1"}
    series = coverage(**{"sync-p99": up, "vs-baseline": up, "conntrack": up})
    obs = replace(observed(ds, cm, cluster), series=series)
    result = run_preflight(policy(analysis=ANALYSIS), obs)
    not_ready = [f for f in result.findings if f.code == "NodesNotReady"]
    assert not_ready and not_ready[0].severity == Severity.WARNING
    assert result.passed, [(f.code, f.severity, f.message) for f in result.findings]
