"""plan and advise (pure): the engine's preflight and planner on a snapshot, and the advice."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
import yaml

from proxymode.api.models import PolicySpec, ProxyModePolicy
from proxymode.cli import advice, planning
from proxymode.engine.observed import NodeView
from tests.unit.engine.test_preflight import NEW_KERNEL, OLD_KERNEL, OS, observe

POOLS = {"canary": 2, "general": 3, "legacy": 1}


def cluster() -> tuple[NodeView, ...]:
    out = []
    i = 0
    for pool, count in POOLS.items():
        for n in range(1, count + 1):
            out.append(
                NodeView(
                    name=f"{pool}-{n}",
                    labels={**OS, "pool": pool},
                    zone=f"zone-{'abc'[i % 3]}",
                    kernel=OLD_KERNEL if pool == "legacy" else NEW_KERNEL,
                )
            )
            i += 1
    return tuple(out)


def spec(**extra: Any) -> PolicySpec:
    body: dict[str, Any] = {
        "targetMode": "nftables",
        "incompatibleNodes": "Exclude",
        "stages": [
            {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}},
            {"name": "all", "percent": 100},
        ],
    }
    body.update(extra)
    return PolicySpec.model_validate(body)


def test_plan_takes_the_engine_s_nodes_in_order_and_says_why_others_are_left_out() -> None:
    v = planning.plan_view(spec(), observe(cluster=cluster()), "p")
    assert v["wouldStart"] is True
    assert planning.stage_nodes(v) == [
        ["canary-1", "canary-2"],
        ["general-1", "general-2", "general-3"],
    ]
    assert v["stages"][0]["zones"] == {"zone-a": 1, "zone-b": 1}
    assert v["leftOut"] == [
        {"name": "legacy-1", "zone": "zone-c", "reason": v["leftOut"][0]["reason"]}
    ]
    assert v["leftOut"][0]["reason"].startswith("KernelTooOld")
    text = planning.render(v)
    assert "passed, the run would start" in text
    assert "legacy-1" in text.split("Left out")[1]
    assert "canary       2 nodes" in text and "all          3 nodes" in text, text
    one = planning.plan_view(
        spec(stages=[{"name": "first", "maxNodes": 1, "percent": 100}]),
        observe(cluster=cluster()),
        "p",
    )
    assert "first        1 node (" in planning.render(one), planning.render(one)


def test_plan_names_nodes_no_stage_takes_and_nodes_the_selector_leaves_out() -> None:
    s = spec(
        nodeSelector={
            "matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["legacy"]}]
        },
        stages=[{"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}}],
    )
    v = planning.plan_view(s, observe(cluster=cluster()))
    reasons = {n["name"]: n["reason"] for n in v["leftOut"]}
    assert reasons["legacy-1"] == planning.NOT_SELECTED
    assert reasons["general-1"] == planning.NO_STAGE


def test_plan_of_a_refused_policy_says_it_would_not_start() -> None:
    v = planning.plan_view(spec(incompatibleNodes="Refuse"), observe(cluster=cluster()))
    assert v["wouldStart"] is False
    assert any(f["code"] == "KernelTooOld" and f["severity"] == "Error" for f in v["findings"])
    assert "REFUSED" in planning.render(v)


def test_plan_of_a_running_policy_does_not_call_its_own_moves_a_person_s_labels() -> None:
    """A review: ``plan -f`` of an edit of a running policy said REFUSED,
    NodesAlreadyLabelled, "remove the label": the policy's own moved canaries. With its
    snapshot there, they are its moves (as the engine reads them), and the plan says so."""
    nodes = tuple(
        replace(n, labels={**n.labels, "proxymode.io/mode": "nftables"})
        if n.name.startswith("canary")
        else n
        for n in cluster()
    )
    fresh = planning.plan_view(spec(), observe(cluster=nodes), "p")
    assert "NodesAlreadyLabelled" in [f["code"] for f in fresh["findings"]]
    running = planning.plan_view(spec(), replace(observe(cluster=nodes), backup={"run": "1"}), "p")
    assert "NodesAlreadyLabelled" not in [f["code"] for f in running["findings"]]
    assert running["wouldStart"] is True and running["running"] is True
    assert "ProxyModePolicy p exists and has changed the cluster" in planning.render(running)


def test_plan_beside_another_policy_in_flight_does_not_say_remove_its_labels() -> None:
    """A review: ``plan -f`` of a second policy while one was running said
    AnotherPolicyInFlight and also NodesAlreadyLabelled, "remove the label": the running
    policy's moved nodes. The operator's own preflight says only the first."""
    nodes = tuple(
        replace(n, labels={**n.labels, "proxymode.io/mode": "nftables"})
        if n.name.startswith("canary")
        else n
        for n in cluster()
    )
    v = planning.plan_view(spec(), observe(cluster=nodes, other_policies=("pr",)), "p")
    codes = [f["code"] for f in v["findings"]]
    assert "AnotherPolicyInFlight" in codes and "NodesAlreadyLabelled" not in codes
    assert v["wouldStart"] is False


def _node(name: str, pool: str, kernel: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"pool": pool}},
        "status": {"nodeInfo": {"kernelVersion": kernel}},
    }


def inventory(**kw: Any) -> advice.Inventory:
    nodes = [
        _node("canary-1", "canary", NEW_KERNEL),
        _node("general-1", "general", NEW_KERNEL),
        _node("legacy-1", "legacy", OLD_KERNEL),
    ]
    kw.setdefault("kubernetes_version", "v1.37.2")
    kw.setdefault("kube_proxy_version", "v1.37.2")
    kw.setdefault("current_mode", "iptables")
    kw.setdefault("pools", advice.pools_of(nodes))
    kw.setdefault("services_by_type", {"ClusterIP": 10, "NodePort": 1})
    kw.setdefault("metrics", advice.Metrics(sync_p99=0.2, localhost_nodeport_packets=0.0))
    return advice.Inventory(**kw)


def test_advice_moves_to_nftables_and_keeps_the_old_kernel_pool_on_iptables() -> None:
    a = advice.advise(inventory())
    assert a.recommendation == "nftables"
    assert [p["pool"] for p in a.leave_out] == ["legacy"]
    assert "kernel older than 5.13" in a.leave_out[0]["reason"]
    correctness = a.dimensions[0]
    assert any("legacy" in r and "keep it on iptables" in r for r in correctness.reasons)
    assert [d.name for d in a.dimensions] == [
        "correctness and semantics",
        "rule convergence",
        "operations",
        "evolution",
    ]
    assert all(d.reasons for d in a.dimensions)
    # The starter policy is valid, and leaves the legacy pool out.
    assert a.policy is not None
    policy = ProxyModePolicy.model_validate(yaml.safe_load(yaml.safe_dump(a.policy)))
    assert policy.spec.target_mode == "nftables"
    assert policy.spec.node_selector is not None
    expression = policy.spec.node_selector.match_expressions[0]  # type: ignore[index]
    assert (expression.key, expression.operator, expression.values) == ("pool", "NotIn", ["legacy"])
    assert policy.spec.stages[0].node_selector.match_labels == {"pool": "canary"}  # type: ignore[union-attr]
    assert "leaving legacy on iptables" in a.summary


@pytest.mark.parametrize(
    ("read", "named"),
    [
        (None, advice.IN_CLUSTER_PROMETHEUS),
        ("http://127.0.0.1:9090", advice.IN_CLUSTER_PROMETHEUS),
        ("http://localhost:9090/prom", advice.IN_CLUSTER_PROMETHEUS),
        ("http://[::1]:9090", advice.IN_CLUSTER_PROMETHEUS),
        ("http://thanos-query.obs.svc:9090", "http://thanos-query.obs.svc:9090"),
        ("https://prom.example.com", "https://prom.example.com"),
    ],
)
def test_the_starter_policy_names_prometheus_as_the_operator_s_pod_reaches_it(
    read: str | None, named: str
) -> None:
    """advise may read Prometheus through a port-forward or ``$PROMETHEUS_URL`` on loopback:
    in the policy that address would be the operator pod's own loopback."""
    a = advice.advise(inventory(prometheus_url=read))
    assert a.policy is not None
    assert a.policy["spec"]["analysis"]["prometheus"]["url"] == named


def test_advice_names_a_migration_in_flight_and_offers_no_second_policy() -> None:
    """With a policy migrating the cluster now, the inventory still reads the source mode:
    the advice says so, and offers no starter policy (preflight would refuse a second)."""
    a = advice.advise(inventory())
    policies = [
        {
            "metadata": {"name": "done"},
            "spec": {"targetMode": "nftables"},
            "status": {"phase": "RolledBack"},
        },
        {
            "metadata": {"name": "to-nft"},
            "spec": {"targetMode": "nftables"},
            "status": {"phase": "Analyzing", "nodeProgress": "5/6"},
        },
    ]
    told = advice.with_policies(a, policies)
    assert told.policy is None and [p["name"] for p in told.in_flight] == ["to-nft"]
    text = advice.render(told)
    assert "policy to-nft is migrating this cluster to nftables now (Analyzing, 5/6" in text
    assert told.wire()["inFlight"][0]["phase"] == "Analyzing"
    assert advice.with_policies(a, policies[:1]) == a  # a finished one changes nothing


def test_advice_names_a_completed_mixed_mode_policy_as_driving_the_nodes() -> None:
    """A review: every node on nftables through a Completed ``finalize: false`` policy, and
    advise said "move to nftables" with a starter policy that preflight would refuse."""
    a = advice.advise(inventory())
    mixed = {
        "metadata": {"name": "ph"},
        "spec": {"targetMode": "nftables", "finalize": False},
        "status": {"phase": "Completed", "finalized": False, "nodeProgress": "6/6"},
    }
    finalized = {**mixed, "status": {"phase": "Completed", "finalized": True}}
    told = advice.with_policies(a, [mixed])
    assert told.policy is None and [p["name"] for p in told.in_flight] == ["ph"]
    text = advice.render(told)
    assert "policy ph is Completed in mixed mode: its nodes (6/6 nodes moved) run nftables" in (
        text
    )
    assert "Set finalize: true on it" in text
    assert advice.with_policies(a, [finalized]) == a
    partial = {**mixed, "spec": {"targetMode": "nftables", "finalize": True}}
    text = advice.render(advice.with_policies(a, [partial]))
    assert "Its stages do not cover every node, so it cannot finalize" in text


@pytest.mark.parametrize("version", ["v1.35.0", "v1.36.3", "v1.37.2"])
@pytest.mark.parametrize("mode", ["iptables", "ipvs", "nftables"])
def test_advice_never_recommends_ipvs_where_it_is_deprecated(version: str, mode: str) -> None:
    for kernel in (NEW_KERNEL, OLD_KERNEL):
        pools = advice.pools_of([_node("n", "p", kernel)])
        a = advice.advise(inventory(kube_proxy_version=version, current_mode=mode, pools=pools))
        assert a.recommendation != "ipvs"
        if mode == "ipvs":
            assert a.recommendation == ("nftables" if kernel == NEW_KERNEL else "iptables")


def test_advice_stays_on_nftables_and_warns_about_localhost_nodeports() -> None:
    assert advice.advise(inventory(current_mode="nftables")).recommendation == "stay"
    a = advice.advise(inventory(metrics=advice.Metrics(localhost_nodeport_packets=42)))
    assert a.dimensions[0].leaning == "against"
    assert any("42 packets reached NodePorts on localhost" in r for r in a.dimensions[0].reasons)


def test_advice_with_only_old_kernels_stays() -> None:
    pools = advice.pools_of([_node("a", "old", OLD_KERNEL), _node("b", "old", OLD_KERNEL)])
    a = advice.advise(inventory(pools=pools))
    assert a.recommendation == "stay" and a.policy is None


def test_the_pure_modules_import_no_kubernetes_client() -> None:
    code = (
        "import sys\n"
        "import proxymode.cli.tree, proxymode.cli.planning, proxymode.cli.advice\n"
        "import proxymode.cli.document, proxymode.cli.charts\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'kopf', 'requests')"
        " or m == 'proxymode.kube' or m.startswith('proxymode.kube.')]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
