"""The sandbox's simulated kube-proxy metrics and its real Prometheus.

Every node serves kube-proxy's own metric families for the mode it runs now, Prometheus
scrapes them all, and the node annotation ``sandbox.proxymode.io/fault`` injects the four
faults the metric gates must catch.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from proxymode_sandbox import Sandbox
from proxymode_sandbox.kube_proxy_metrics import FAULT_ANNOTATION, SYNC_BUCKETS
from tests.sandbox.conftest import eventually


def prom(sandbox: Sandbox, query: str) -> dict[str, float]:
    """An instant query by POST; one value per ``instance``."""
    data = urllib.parse.urlencode({"query": query}).encode()
    url = f"{sandbox.prometheus_url}/api/v1/query"
    with urllib.request.urlopen(url, data=data, timeout=5) as resp:  # noqa: S310 - loopback
        body: dict[str, Any] = json.loads(resp.read())
    assert body["status"] == "success", body
    return {r["metric"].get("instance", ""): float(r["value"][1]) for r in body["data"]["result"]}


def scrape(ip: str, port: int = 10249) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=3) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def node_ip(core: client.CoreV1Api, name: str) -> str:
    node = core.read_node(name)
    return next(a.address for a in node.status.addresses if a.type == "InternalIP")


def test_every_node_serves_kube_proxy_metrics_and_prometheus_scrapes_them(
    sandbox: Sandbox, core: client.CoreV1Api
) -> None:
    assert sandbox.prometheus_url.startswith("http://127.0.0.1:")
    assert f"export PROMETHEUS_URL={sandbox.prometheus_url}" in sandbox.env_file.read_text()
    nodes = sorted(n.metadata.name for n in core.list_node().items)
    # The node serves the metrics of the mode it runs now: an earlier test on this worker
    # may have finalized a migration in a namespace still going away, whose kube-proxy runs
    # nftables there. This case is about kube-system's own kube-proxy (iptables), so it
    # waits for the node to run only that one, then for the simulator to follow it.
    eventually(
        lambda: all(
            p.metadata.namespace == "kube-system"
            for p in core.list_pod_for_all_namespaces(
                label_selector="k8s-app=kube-proxy", field_selector=f"spec.nodeName={nodes[0]}"
            ).items
        ),
        timeout=180,
        what=f"only kube-system's kube-proxy on {nodes[0]}",
    )
    iptables = "# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures_total counter"
    code, text = eventually(
        lambda: (got := scrape(node_ip(core, nodes[0])))[0] == 200 and iptables in got[1] and got,
        timeout=30,
        what=f"{nodes[0]} to serve kube-system's iptables kube-proxy metrics",
    )
    for family in (
        "# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram",
        "# TYPE kubeproxy_network_programming_duration_seconds histogram",
        "# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge",
        "# TYPE kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds gauge",
        "# TYPE kubeproxy_sync_proxy_rules_iptables_restore_failures_total counter",
        "# TYPE kubeproxy_sync_full_proxy_rules_duration_seconds histogram",
    ):
        assert family in text, family
    bounds = [
        line.split('le="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("kubeproxy_sync_proxy_rules_duration_seconds_bucket")
    ]
    assert [float(b) for b in bounds[:-1]] == pytest.approx(list(SYNC_BUCKETS))
    assert bounds[-1] == "+Inf" and float(bounds[-2]) == pytest.approx(16.384)
    assert 'ip_family="IPv4"' in text
    code, text = scrape(node_ip(core, nodes[0]), 9100)
    assert code == 200 and "node_nf_conntrack_entries_limit 131072" in text
    up = eventually(
        lambda: (u := prom(sandbox, 'up{job="kube-proxy"}')) and set(u) == set(nodes) and u,
        what="Prometheus to scrape every node",
    )
    assert all(v == 1.0 for v in up.values())


def test_faults_and_modes_show_in_prometheus(
    sandbox: Sandbox, core: client.CoreV1Api, namespace: str, faults: dict[str, str]
) -> None:
    faults.update(
        {
            "general-1": "slow-sync",
            "general-2": "conntrack-high",
            "general-3": "sync-failures",
            "canary-2": "no-metrics",
        }
    )
    for node, fault in faults.items():
        core.patch_node(node, {"metadata": {"annotations": {FAULT_ANNOTATION: fault}}})
    # A kube-proxy pod in nftables mode on canary-1 (the newest proxy pod on a node decides).
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": "nft",
                "labels": {"k8s-app": "kube-proxy", "proxymode.io/mode": "nftables"},
            },
            "spec": {
                "nodeName": "canary-1",
                "hostNetwork": True,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "kube-proxy", "image": "kube-proxy"}],
            },
        },
    )
    eventually(
        lambda: "nftables_sync_failures_total" in scrape(node_ip(core, "canary-1"))[1],
        what="canary-1 to serve nftables-mode families",
    )
    text = scrape(node_ip(core, "canary-1"))[1]
    assert "kubeproxy_sync_full_proxy_rules_duration_seconds" not in text, "iptables-only family"
    assert "iptables_restore_failures_total" not in text

    p99 = (
        "histogram_quantile(0.99, sum by (le, instance)"
        " (rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket[20s])))"
    )
    seen: dict[str, float] = {}

    def slow_and_ordered() -> bool:
        seen.update(prom(sandbox, p99))
        nft, ipt = seen.get("canary-1", 99.0), seen.get("legacy-1", 0.0)
        return seen.get("general-1", 0.0) > 1.0 and nft < ipt < 1.0

    try:
        eventually(slow_and_ordered, timeout=120, interval=1, what="p99 by node")
    except AssertionError as e:
        raise AssertionError(
            f"want general-1 > 1s and canary-1 (nft) < legacy-1 < 1s: {seen}"
        ) from e
    # Its own wait: the p99 above can pass before general-2's node_exporter target is scraped
    # again after the fault (each target every 2 s, at its own offset; seen in a rehearsal).
    ratio = "node_nf_conntrack_entries / node_nf_conntrack_entries_limit"
    usage: dict[str, float] = {}

    def conntrack_high_on_general_2() -> bool:
        usage.update(prom(sandbox, ratio))
        return usage.get("general-2", 0.0) > 0.9

    try:
        eventually(conntrack_high_on_general_2, timeout=30, interval=1, what="conntrack")
    except AssertionError as e:
        raise AssertionError(f"want general-2's conntrack above 90%: {usage}") from e
    assert usage["legacy-1"] < 0.2
    failures = "increase(kubeproxy_sync_proxy_rules_iptables_restore_failures_total[20s])"
    eventually(
        lambda: prom(sandbox, failures).get("general-3", 0) > 0,
        timeout=30,
        what="sync failures to rise",
    )
    assert prom(sandbox, failures).get("legacy-1", 1) == 0
    eventually(
        lambda: prom(sandbox, 'up{job="kube-proxy"}').get("canary-2") == 0.0,
        what="no-metrics to fail canary-2's scrape",
    )
    assert scrape(node_ip(core, "canary-2"))[0] == 503
