"""Before the first move, the adapter asks a real Prometheus which nodes have each check's series.

``proxymode.kube.series.coverage`` sends ``analysis.templates.series_query`` for every
template check through the operator's own Prometheus client to a real ``prometheus`` over
backfilled TSDB blocks (``tests.promql.backfill``), and preflight judges the answer. The
history is the shared one with two changes that a real cluster has: node ``b2``'s
node_exporter is not scraped (its conntrack gauges are missing), and the cluster has a node
``ghost`` that Prometheus never scraped at all. The decoy ``c10`` (a regex prefix trap for
``c1``) must neither hide a missing ``c1`` nor count for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from kubernetes import client

from proxymode.api.models import Analysis, ProxyModePolicy
from proxymode.engine.observed import NodeView, Observed
from proxymode.engine.preflight import run_preflight
from proxymode.kube import series
from proxymode.kube.rounds import Prometheus
from proxymode_sandbox.kubeadm_proxy import manifests
from proxymode_sandbox.process import free_port
from tests.promql.backfill import EVAL_TIME, NODES, backfill, openmetrics, serve

CHECKS = [
    {"name": "sync-p99", "template": "SyncLatencyP99", "maxSeconds": 1},
    {"name": "netprog", "template": "NetworkProgrammingP99", "maxSeconds": 5},
    {"name": "conntrack", "template": "ConntrackUsage", "maxRatio": 0.85},
    {"name": "failures", "template": "SyncFailures", "max": 0},
    {"name": "staleness", "template": "SyncStaleness", "maxSeconds": 30},
    {"name": "custom", "query": "sum(up{ {{nodes}} })", "min": 1},
]
WITHOUT_NODE_EXPORTER = "b2"
NEVER_SCRAPED = "ghost"


def _without_node_exporter(text: str, node: str) -> str:
    """The history with ``node``'s conntrack gauges left out (its node_exporter unscraped)."""
    return "\n".join(
        line
        for line in text.split("\n")
        if not (line.startswith("node_nf_conntrack") and f'instance="{node}"' in line)
    )


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("series")
    text = _without_node_exporter(openmetrics(), WITHOUT_NODE_EXPORTER)
    with serve(backfill(text, workdir), workdir) as url:
        yield url


def _policy(url: str) -> ProxyModePolicy:
    return ProxyModePolicy.model_validate(
        {
            "metadata": {"name": "to-nft", "generation": 1},
            "spec": {
                "targetMode": "nftables",
                "stages": [{"name": "all", "percent": 100}],
                "analysis": {"prometheus": {"url": url}, "checks": CHECKS},
            },
        }
    )


def _observed(names: list[str]) -> Observed:
    objects = {o["kind"]: o for o in manifests("https://10.0.0.1:6443", "v1.37.2", "iptables")}
    return Observed(
        now=datetime.fromtimestamp(EVAL_TIME, UTC),
        generation=1,
        nodes=tuple(
            NodeView(n, {"kubernetes.io/os": "linux"}, kernel="6.1.0-28-cloud-amd64") for n in names
        ),
        source_daemon_set=objects["DaemonSet"],
        source_config_map=objects["ConfigMap"],
    )


def _prom(policy: ProxyModePolicy) -> Prometheus:
    analysis = policy.spec.analysis
    assert isinstance(analysis, Analysis)
    return Prometheus(client.ApiClient(), analysis)


def test_coverage_names_each_checks_reporting_nodes(prometheus_url: str) -> None:
    policy = _policy(prometheus_url)
    names = [n.name for n in NODES] + [NEVER_SCRAPED]
    got = series.coverage(_prom(policy), policy, _observed(names), at=EVAL_TIME)
    by_check = {c.name: c for c in got.checks}
    assert "custom" not in by_check  # a valid custom query: only its syntax is asked
    scraped = {n.name for n in NODES}
    for name in ("sync-p99", "netprog", "failures", "staleness"):
        assert by_check[name].error == ""
        assert by_check[name].nodes == scraped, name
    assert by_check["conntrack"].nodes == scraped - {WITHOUT_NODE_EXPORTER}


def test_preflight_on_the_real_answer_refuses_naming_the_nodes(prometheus_url: str) -> None:
    policy = _policy(prometheus_url)
    names = ["c1", "c2", "b1", WITHOUT_NODE_EXPORTER, NEVER_SCRAPED]
    obs = _observed(names)
    got = series.coverage(_prom(policy), policy, obs, at=EVAL_TIME)
    result = run_preflight(policy.spec, replace(obs, series=got))
    missing = [f for f in result.findings if f.code == "MetricSeriesMissing"]
    assert not result.passed
    by_nodes = {tuple(f.nodes): f.message for f in missing}
    # The never-scraped node misses every template check's series; b2 only the conntrack one.
    # network-programming is not asked of anyone before the first move: a healthy kube-proxy
    # exports it only after it has programmed an endpoints change.
    assert set(by_nodes) == {(NEVER_SCRAPED,), (WITHOUT_NODE_EXPORTER, NEVER_SCRAPED)}
    assert "checks sync-p99, failures, staleness from" in by_nodes[(NEVER_SCRAPED,)]
    assert "netprog" not in " ".join(by_nodes.values())
    assert "check conntrack" in by_nodes[(WITHOUT_NODE_EXPORTER, NEVER_SCRAPED)]
    assert "node_exporter" in by_nodes[(WITHOUT_NODE_EXPORTER, NEVER_SCRAPED)]


def test_a_prefix_name_does_not_stand_in_for_a_missing_node(prometheus_url: str) -> None:
    """Only ``c10`` is scraped: ``c1`` must be missing, not matched by ``c1.*``."""
    policy = _policy(prometheus_url)
    got = series.coverage(_prom(policy), policy, _observed(["c10", "c1x"]), at=EVAL_TIME)
    assert all(c.nodes == frozenset({"c10"}) for c in got.checks)


def test_unreachable_prometheus_is_an_error_per_check() -> None:
    policy = _policy(f"http://127.0.0.1:{free_port()}")
    got = series.coverage(_prom(policy), policy, _observed(["c1"]))
    assert len(got.checks) == 5
    assert all("ConnectionError" in c.error for c in got.checks)
    result = run_preflight(policy.spec, replace(_observed(["c1"]), series=got))
    assert any("could not be asked" in f.message for f in result.findings)


def test_a_custom_query_prometheus_refuses_is_an_error_before_the_first_move(
    prometheus_url: str,
) -> None:
    """A review: a custom query with a syntax error passed preflight, the canaries moved,
    and every round was inconclusive (bad_data). Prometheus is asked whether it takes the
    query as PromQL; a query over series no node has yet (the target mode's) is not refused."""
    checks = [
        *CHECKS,
        {"name": "typo", "query": "sum(rate(up{ {{nodes}} }[5m]", "min": 1},
        {"name": "later", "query": "sum(kubeproxy_nft_only{ {{nodes}} })", "min": 0},
    ]
    policy = _policy(prometheus_url)
    spec = policy.spec.wire()
    spec["analysis"]["checks"] = checks
    policy = ProxyModePolicy.model_validate({"metadata": policy.metadata, "spec": spec})
    obs = _observed([n.name for n in NODES])
    got = series.coverage(_prom(policy), policy, obs, at=EVAL_TIME)
    by_check = {c.name: c for c in got.checks}
    assert "later" not in by_check and "custom" not in by_check
    assert "bad_data" in by_check["typo"].invalid, by_check["typo"]
    result = run_preflight(policy.spec, replace(obs, series=got))
    (finding,) = [f for f in result.findings if f.code == "QueryInvalid"]
    assert "Check typo's query" in finding.message and "parse error" in finding.message
    assert not result.passed
