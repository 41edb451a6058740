"""Preflight on each distribution's real kube-proxy manifests (issue 15 item 1).

The objects come from ``tests/data/distributions`` (``SOURCES.md`` there says which project,
file and commit each is from). Each test is what a platform engineer on that distribution
would meet: the finding names the case and the fix that distribution documents, and
nothing is refused that could run.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxymode.api.models import Severity
from proxymode.engine.actions import EmitEvent
from proxymode.engine.observed import (
    CheckSeries,
    ClusterFacts,
    NodeView,
    Observed,
    SeriesCoverage,
)
from proxymode.engine.planner import PlanNode, plan_stages
from proxymode.engine.preflight import PreflightResult, run_preflight
from proxymode.kubeproxy import ConfigError, parse_config, render_target_config
from tests.unit.engine.seq import ANALYSIS as SEQ_ANALYSIS
from tests.unit.engine.seq import Run, make_policy
from tests.unit.engine.sim import T0, Sim
from tests.unit.engine.test_preflight import NOW, codes, errors, node, nodes, only, policy

DATA = Path(__file__).parents[2] / "data" / "distributions"
CHECKS = [
    {"name": "sync-p99", "template": "SyncLatencyP99", "maxSeconds": 1},
    {"name": "vs-baseline", "template": "SyncLatencyP99", "maxRatioToBaseline": 1.5},
    {"name": "conntrack", "template": "ConntrackUsage", "maxRatio": 0.85},
]
ANALYSIS = {"prometheus": {"url": "http://prometheus.monitoring:9090"}, "checks": CHECKS}


def load(name: str) -> list[dict[str, Any]]:
    text = (DATA / name).read_text()
    if name.endswith(".json"):
        return [json.loads(text)]
    return [d for d in yaml.safe_load_all(text) if d]


def one(name: str, kind: str, obj_name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in load(name)
        if d["kind"] == kind and (obj_name is None or d["metadata"]["name"] == obj_name)
    ]
    assert len(found) == 1, (name, kind, obj_name)
    return copy.deepcopy(found[0])


def config_map(config_key: str, text: str, name: str = "kube-proxy") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "kube-system"}, "data": {config_key: text}}


def observed(
    daemon_set: dict[str, Any] | None,
    cm: dict[str, Any] | None,
    cluster: tuple[NodeView, ...] | None = None,
    version: str = "v1.37.2",
    **facts: Any,
) -> Observed:
    facts.setdefault("kubernetes_version", version)
    return Observed(
        now=NOW,
        generation=1,
        nodes=cluster if cluster is not None else nodes(),
        source_daemon_set=daemon_set,
        source_config_map=cm,
        facts=ClusterFacts(**facts),
        service_ips={"default/kubernetes": "10.96.0.1"},  # as the adapter reads it
    )


def messages(result: PreflightResult, code: str) -> str:
    return " | ".join(f.message for f in result.findings if f.code == code)


# -- kubeadm -------------------------------------------------------------------------------------


def kubeadm() -> tuple[dict[str, Any], dict[str, Any]]:
    return one("kubeadm-daemonset.yaml", "DaemonSet"), one("kubeadm-configmap.yaml", "ConfigMap")


def test_kubeadm_as_shipped_passes() -> None:
    ds, cm = kubeadm()
    result = run_preflight(policy(), observed(ds, cm))
    assert result.passed, result.findings
    assert result.source_mode == "iptables"
    assert "DaemonSetDoesNotUseConfigMap" not in codes(result)


def test_kubeadm_empty_metrics_address_is_said_with_the_fix() -> None:
    ds, cm = kubeadm()
    result = run_preflight(policy(analysis=ANALYSIS), observed(ds, cm))
    finding = only(result, "MetricsNotScraped")
    assert finding.severity == Severity.WARNING
    assert "sync-p99, vs-baseline" in finding.message  # kube-proxy checks, not conntrack
    assert "leaves metricsBindAddress empty" in finding.message
    assert "127.0.0.1:10249" in finding.message
    assert (
        "metricsBindAddress: 0.0.0.0:10249 in ConfigMap kube-system/kube-proxy" in finding.message
    )
    assert 'configOverrides: {metricsBindAddress: "0.0.0.0:10249"}' in finding.message


def test_kubeadm_metrics_fixed_for_the_target_only_names_the_baseline_checks() -> None:
    ds, cm = kubeadm()
    spec = policy(analysis=ANALYSIS, configOverrides={"metricsBindAddress": "0.0.0.0:10249"})
    result = run_preflight(spec, observed(ds, cm))
    assert result.target_config is not None
    assert result.target_config.data["metricsBindAddress"] == "0.0.0.0:10249"
    message = only(result, "MetricsNotScraped").message
    assert "the canaries are measured" in message
    assert "vs-baseline (compared with the baseline group) cannot be judged" in message


def test_no_metrics_finding_without_kube_proxy_checks() -> None:
    ds, cm = kubeadm()
    only_conntrack = {**ANALYSIS, "checks": [CHECKS[2]]}
    result = run_preflight(policy(analysis=only_conntrack), observed(ds, cm))
    assert "MetricsNotScraped" not in codes(result)


# -- EKS ------------------------------------------------------------------------------------------


def eks() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    ds = one("eks-daemonset.json", "DaemonSet")
    return (
        ds,
        one("eks-configmaps.yaml", "ConfigMap", "kube-proxy"),
        one("eks-configmaps.yaml", "ConfigMap", "kube-proxy-config"),
    )


def test_eks_default_names_say_exactly_which_spec_kube_proxy_fields_to_set() -> None:
    ds, kubeconfig_cm, _ = eks()
    # A policy with kubeadm's names: ConfigMap kube-proxy exists on EKS, but holds only the
    # kubeconfig; kube-proxy reads --config=/var/lib/kube-proxy-config/config.
    result = run_preflight(policy(), observed(ds, kubeconfig_cm, version="v1.25.6"))
    finding = only(result, "DaemonSetDoesNotUseConfigMap")
    assert "--config=/var/lib/kube-proxy-config/config" in finding.message
    assert "key 'config' of ConfigMap kube-system/kube-proxy-config (volume 'config')" in (
        finding.message
    )
    assert (
        "Set spec.kubeProxy.configMap: kube-proxy-config and spec.kubeProxy.configKey: config"
        in finding.message
    )
    # The old misleading "has no key 'config.conf'" is not said about a ConfigMap kube-proxy
    # does not read.
    assert "ConfigKeyMissing" not in codes(result)


def eks_nodes() -> tuple[NodeView, ...]:
    """EKS's DaemonSet runs on linux amd64/arm64 nodes that are not Fargate."""
    arch = {"kubernetes.io/arch": "amd64", "eks.amazonaws.com/nodegroup": "ng-1"}
    return tuple(node(f"ip-10-0-0-{i}.ec2.internal", arch) for i in range(3))


def test_eks_add_on_is_refused_by_default_with_the_add_on_way() -> None:
    ds, _, config = eks()
    # kube-proxy 1.25 has no nftables mode: this cluster's migration is to ipvs.
    spec = policy(
        targetMode="ipvs", kubeProxy={"configMap": "kube-proxy-config", "configKey": "config"}
    )
    result = run_preflight(spec, observed(ds, config, eks_nodes(), version="v1.25.6"))
    finding = only(result, "ManagedAddon")
    assert finding.severity == Severity.ERROR and not result.passed
    assert "eks.amazonaws.com/component=kube-proxy" in finding.message
    assert "aws eks update-addon" in finding.message
    assert '--configuration-values \'{"mode": "ipvs"}\'' in finding.message
    assert "spec.managedAddon: Proceed" in finding.message
    assert errors(result) == ["ManagedAddon"]


def test_eks_with_proceed_runs_and_says_what_kube_proxy_ignores() -> None:
    ds, _, config = eks()
    spec = policy(
        targetMode="ipvs",
        kubeProxy={"configMap": "kube-proxy-config", "configKey": "config"},
        managedAddon="Proceed",
        analysis=ANALYSIS,
    )
    obs = observed(ds, config, eks_nodes(), version="v1.25.6", cni="aws-vpc-cni")
    result = run_preflight(spec, obs)
    assert result.eligible == tuple(n.name for n in eks_nodes())
    assert result.passed, errors(result)
    assert only(result, "ManagedAddon").severity == Severity.WARNING
    ignored = only(result, "ConfigFieldIgnored").message
    assert "resourceContainer" in ignored and "udpIdleTimeout" in ignored
    assert "falls back to lenient decoding" in ignored
    # EKS binds metrics to 0.0.0.0: nothing to say about scraping.
    assert "MetricsNotScraped" not in codes(result)
    # Kept in the target, never dropped silently (the finding above says so).
    assert result.target_config is not None
    assert result.target_config.data["udpIdleTimeout"] == "250ms"


# -- AKS ------------------------------------------------------------------------------------------


def aks_nodes() -> tuple[NodeView, ...]:
    return tuple(
        node(f"aks-nodepool1-{i}", {"kubernetes.azure.com/cluster": "MC_rg_aks_westeurope"})
        for i in range(3)
    )


def test_aks_reconciled_add_on_is_refused_with_az_aks_update() -> None:
    ds = one("aks-engine.yaml", "DaemonSet")
    cm = one("aks-engine.yaml", "ConfigMap")
    spec = policy(kubeProxy={"configMap": "kube-proxy-config", "configKey": "config.yaml"})
    result = run_preflight(spec, observed(ds, cm, aks_nodes(), version="v1.33.2"))
    finding = only(result, "ManagedAddon")
    assert finding.severity == Severity.ERROR
    assert "addonmanager.kubernetes.io/mode=Reconcile" in finding.message
    assert "az aks update" in finding.message and "--kube-proxy-config" in finding.message
    assert '"mode": "NFTABLES"' in finding.message
    # The subPath mount resolves: the policy's names are right, the config is read.
    assert "DaemonSetDoesNotUseConfigMap" not in codes(result)
    assert result.source_mode == "iptables"


def test_aks_subpath_mount_names_the_key() -> None:
    ds = one("aks-engine.yaml", "DaemonSet")
    finding = only(
        run_preflight(policy(), observed(ds, None, aks_nodes())), "DaemonSetDoesNotUseConfigMap"
    )
    assert (
        "Set spec.kubeProxy.configMap: kube-proxy-config and spec.kubeProxy.configKey: config.yaml"
        in finding.message
    )


def test_addon_manager_without_aks_names_the_addon_manifest() -> None:
    ds = one("aks-engine.yaml", "DaemonSet")
    cm = one("aks-engine.yaml", "ConfigMap")
    spec = policy(kubeProxy={"configMap": "kube-proxy-config", "configKey": "config.yaml"})
    finding = only(run_preflight(spec, observed(ds, cm, version="v1.33.2")), "ManagedAddon")
    assert "addon manager" in finding.message and "az aks" not in finding.message


# -- kubespray ------------------------------------------------------------------------------------


def test_kubespray_ipvs_to_nftables() -> None:
    ds, _ = kubeadm()
    cm = config_map("config.conf", (DATA / "kubespray-ipvs.conf").read_text())
    result = run_preflight(policy(analysis=ANALYSIS), observed(ds, cm))
    assert result.passed, errors(result)
    assert result.source_mode == "ipvs"
    assert result.target_config is not None
    assert result.target_config.data["nftables"]["syncPeriod"] == "30s"
    assert "ConfigFieldIgnored" not in codes(result)  # every field is where kube-proxy reads it
    assert "sets metricsBindAddress: 127.0.0.1:10249" in only(result, "MetricsNotScraped").message


# -- static pods and embedded kube-proxies ------------------------------------------------------


def mirror_pods(manifest: str, cluster: tuple[NodeView, ...]) -> tuple[str, ...]:
    pod = one(manifest, "Pod")
    assert pod["metadata"]["namespace"] == "kube-system"
    return tuple(f"{pod['metadata']['name']}-{n.name}" for n in cluster)


def test_kops_static_pods_name_the_kops_way() -> None:
    cluster = tuple(node(f"i-0{i}", {"kops.k8s.io/instancegroup": "nodes"}) for i in range(3))
    static = mirror_pods("kops-static-pod.yaml", cluster)
    result = run_preflight(policy(), observed(None, None, cluster, static_kube_proxy_pods=static))
    finding = only(result, "StaticPodKubeProxy")
    assert "kops" in finding.message
    assert "spec.kubeProxy.proxyMode: nftables" in finding.message
    assert "kops rolling-update cluster --yes" in finding.message
    assert "mode: nftables in the kube-proxy config" not in finding.message
    assert finding.nodes == ["i-00", "i-01", "i-02"]


def test_gke_static_pods_say_the_mode_is_not_a_gke_setting() -> None:
    cluster = tuple(
        node(f"gke-pool-{i}", {"cloud.google.com/gke-nodepool": "pool"}) for i in range(2)
    )
    static = mirror_pods("gke-static-pod.yaml", cluster)
    result = run_preflight(policy(), observed(None, None, cluster, static_kube_proxy_pods=static))
    finding = only(result, "StaticPodKubeProxy")
    assert "GKE" in finding.message and "not a setting GKE offers" in finding.message
    assert "Dataplane V2" in finding.message


def test_rke2_is_a_static_pod_configured_through_the_agent() -> None:
    cluster = nodes(kubelet_version="v1.31.4+rke2r1")
    static = tuple(f"kube-proxy-{n.name}" for n in cluster)
    result = run_preflight(policy(), observed(None, None, cluster, static_kube_proxy_pods=static))
    finding = only(result, "StaticPodKubeProxy")
    assert "RKE2" in finding.message and "static pod" in finding.message
    assert "kube-proxy-arg: [proxy-mode=nftables]" in finding.message
    assert "/etc/rancher/rke2/config.yaml" in finding.message
    assert "inside the agent" not in finding.message
    assert "EmbeddedKubeProxy" not in codes(result)


def test_k3s_is_embedded() -> None:
    cluster = nodes(kubelet_version="v1.31.4+k3s1")
    finding = only(run_preflight(policy(), observed(None, None, cluster)), "EmbeddedKubeProxy")
    assert "inside the k3s process" in finding.message
    assert "/etc/rancher/k3s/config.yaml" in finding.message


def test_cilium_kube_proxy_free_cluster_says_so() -> None:
    result = run_preflight(policy(), observed(None, None, cni="cilium"))
    finding = only(result, "KubeProxyFree")
    assert "No kube-proxy runs in this cluster" in finding.message
    assert "kube-proxy replacement" in finding.message
    assert "SourceDaemonSetMissing" not in codes(result)


def test_a_missing_daemon_set_with_another_cni_is_still_a_wrong_name() -> None:
    assert errors(run_preflight(policy(), observed(None, None, cni="calico"))) == [
        "SourceConfigMapMissing",
        "SourceDaemonSetMissing",
    ]


# -- the seed's IPVS config: fields kube-proxy does not read ------------------------------------


def seed() -> tuple[dict[str, Any], dict[str, Any]]:
    ds, _ = kubeadm()
    return ds, config_map("config.conf", (DATA / "seed-ipvs.conf").read_text())


def test_seed_top_level_fields_are_a_finding_with_their_places() -> None:
    ds, cm = seed()
    result = run_preflight(policy(), observed(ds, cm))
    assert result.passed, errors(result)
    message = only(result, "ConfigFieldIgnored").message
    assert "strictARP: true (set ipvs.strictARP instead)" in message
    assert "minSyncPeriod: 2s (set nftables.minSyncPeriod instead)" in message
    assert "syncPeriod: 30s (set nftables.syncPeriod instead)" in message
    # Never carried into the target silently: kept as they are (no effect there either), and
    # not moved into nftables.* behind the user's back.
    assert result.target_config is not None
    data = result.target_config.data
    assert data["strictARP"] is True and data["minSyncPeriod"] == "2s"
    assert "minSyncPeriod" not in (data.get("nftables") or {})


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"strictARP": True}, "configOverrides.strictARP is not a KubeProxyConfiguration field"),
        ({"minSyncPeriod": "2s"}, "set configOverrides.nftables.minSyncPeriod instead"),
        ({"syncPeriod": "30s"}, "set configOverrides.nftables.syncPeriod instead"),
        ({"udpIdleTimeout": "250ms"}, "removed with it in 1.26"),
        ({"ipvs": {"masqueradeAll": True}}, "ipvs mode reads iptables.masqueradeAll"),
    ],
)
def test_config_overrides_refuse_a_non_field_even_when_the_source_has_it(
    overrides: dict[str, Any], fragment: str
) -> None:
    ds, cm = seed()
    result = run_preflight(policy(configOverrides=overrides), observed(ds, cm))
    finding = only(result, "ConfigOverridesInvalid")
    assert fragment in finding.message
    source = parse_config((DATA / "seed-ipvs.conf").read_text())
    with pytest.raises(ConfigError, match="not a KubeProxyConfiguration field kube-proxy reads"):
        render_target_config(source, "nftables", overrides=overrides)


def test_config_overrides_put_the_seed_values_where_they_count() -> None:
    ds, cm = seed()
    spec = policy(configOverrides={"nftables": {"minSyncPeriod": "2s", "syncPeriod": "30s"}})
    result = run_preflight(spec, observed(ds, cm))
    assert result.passed, errors(result)
    assert result.target_config is not None
    assert result.target_config.data["nftables"] == {"minSyncPeriod": "2s", "syncPeriod": "30s"}


# -- control-plane nodes -------------------------------------------------------------------------

CONTROL_PLANE = {"node-role.kubernetes.io/control-plane": ""}


def test_control_plane_nodes_are_never_the_first_canary_of_a_percent_stage() -> None:
    ds, cm = kubeadm()
    # "a-cp-*" sort before every worker by name, and sit in the first zone.
    cluster = (
        *(node(f"a-cp-{i}", CONTROL_PLANE, zone="a") for i in range(3)),
        *(node(f"w-{i}", zone="abc"[i % 3]) for i in range(6)),
    )
    stages = [
        {"name": "first", "percent": 10},
        {"name": "half", "percent": 50},
        {"name": "all", "percent": 100},
    ]
    result = run_preflight(policy(stages=stages), observed(ds, cm, cluster))
    assert result.passed
    finding = next(f for f in result.findings if f.code == "ControlPlaneLast")
    assert finding.severity == Severity.INFO
    assert finding.nodes == ["a-cp-0", "a-cp-1", "a-cp-2"]
    plan = plan_stages(
        policy(stages=stages).stages, [PlanNode(n.name, n.labels, n.zone) for n in cluster]
    )
    assert plan[0] == ["w-0"]
    assert not any(n.startswith("a-cp") for n in plan[0] + plan[1])
    assert plan[2][-3:] == ["a-cp-0", "a-cp-1", "a-cp-2"]


def test_a_control_plane_only_first_stage_warns() -> None:
    ds, cm = kubeadm()
    cluster = (node("cp-0", {**CONTROL_PLANE, "pool": "cp"}), node("w-0"))
    stages = [
        {"name": "cp", "nodeSelector": {"matchLabels": {"pool": "cp"}}},
        {"name": "all", "percent": 100},
    ]
    result = run_preflight(policy(stages=stages), observed(ds, cm, cluster))
    warnings = [
        f for f in result.findings if f.code == "ControlPlaneLast" and f.severity == "Warning"
    ]
    assert len(warnings) == 1 and warnings[0].nodes == ["cp-0"]


# -- Prometheus's series, before the first move --------------------------------------------------


def coverage(**reporting: set[str] | str) -> SeriesCoverage:
    checks = tuple(
        CheckSeries(name, error=value)
        if isinstance(value, str)
        else CheckSeries(name, frozenset(value))
        for name, value in reporting.items()
    )
    return SeriesCoverage(time=NOW, checks=checks)


def with_series(obs: Observed, series: SeriesCoverage) -> Observed:
    return replace(obs, series=series)


def test_missing_series_for_an_eligible_node_refuses_naming_check_and_node() -> None:
    ds, cm = kubeadm()
    cm["data"]["config.conf"] = cm["data"]["config.conf"].replace(
        'metricsBindAddress: ""', "metricsBindAddress: 0.0.0.0:10249"
    )
    all_three = {"node-0", "node-1", "node-2"}
    series = coverage(
        **{
            "sync-p99": {"node-0", "node-2"},
            "vs-baseline": {"node-0", "node-2"},
            "conntrack": all_three,
        }
    )
    result = run_preflight(policy(analysis=ANALYSIS), with_series(observed(ds, cm), series))
    finding = only(result, "MetricSeriesMissing")
    assert finding.severity == Severity.ERROR and not result.passed
    assert finding.nodes == ["node-1"]
    assert "checks sync-p99, vs-baseline" in finding.message
    assert "1 eligible node (node-1) of 3" in finding.message
    assert "label 'instance'" in finding.message
    assert "MetricsNotScraped" not in codes(result)


def test_all_series_present_passes_and_custom_queries_are_not_asked() -> None:
    ds, cm = kubeadm()
    cm["data"]["config.conf"] = cm["data"]["config.conf"].replace(
        'metricsBindAddress: ""', "metricsBindAddress: 0.0.0.0:10249"
    )
    custom = {"name": "custom", "query": "sum(up{ {{nodes}} })", "min": 1}
    spec = policy(analysis={**ANALYSIS, "checks": [*CHECKS, custom]})
    everyone = {"node-0", "node-1", "node-2"}
    series = coverage(**{"sync-p99": everyone, "vs-baseline": everyone, "conntrack": everyone})
    result = run_preflight(spec, with_series(observed(ds, cm), series))
    assert result.passed, errors(result)


def test_prometheus_unreachable_before_the_first_move_refuses() -> None:
    ds, cm = kubeadm()
    series = coverage(**{"sync-p99": "ConnectionError: refused"})
    result = run_preflight(policy(analysis=ANALYSIS), with_series(observed(ds, cm), series))
    finding = only(result, "MetricSeriesMissing")
    assert "could not be asked" in finding.message and "ConnectionError" in finding.message


def test_source_on_loopback_with_a_target_override_waits_for_the_canary() -> None:
    ds, cm = kubeadm()  # metricsBindAddress "": loopback
    checks = [CHECKS[0]]  # absolute: needs no baseline
    spec = policy(
        analysis={**ANALYSIS, "checks": checks},
        configOverrides={"metricsBindAddress": "0.0.0.0:10249"},
    )
    result = run_preflight(spec, with_series(observed(ds, cm), coverage(**{"sync-p99": set()})))
    assert result.passed, errors(result)
    finding = only(result, "MetricSeriesMissing")
    assert finding.severity == Severity.WARNING
    assert "only once a node runs the target kube-proxy" in finding.message


# -- the engine holds preflight while only series are missing, then refuses -------------------


def _series_run(missing: set[str]) -> tuple[Run, SeriesCoverage]:
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy(analysis=SEQ_ANALYSIS))
    reporting = frozenset(sim.nodes) - missing
    return run, SeriesCoverage(time=sim.now, checks=(CheckSeries("sync-latency", reporting),))


def test_preflight_waits_for_series_then_starts_when_they_appear() -> None:
    run, series = _series_run({"general-2"})
    decision = run.step(observed=replace(run.observe(), series=series))
    assert run.policy.status.phase == "Preflight"
    assert "waiting for Prometheus" in (run.policy.status.message or "")
    assert "nothing changed" in (run.policy.status.message or "")
    assert [a for a in decision.actions if not isinstance(a, EmitEvent)] == []
    assert run.sim.get("ConfigMap", "kube-proxy-nftables") is None  # no setup yet
    everyone = SeriesCoverage(
        time=run.sim.now, checks=(CheckSeries("sync-latency", frozenset(run.sim.nodes)),)
    )
    run.step(observed=replace(run.observe(), series=everyone))
    assert run.policy.status.phase == "Progressing"


def test_preflight_refuses_when_series_stay_missing_past_the_grace() -> None:
    run, series = _series_run({"general-2"})
    for _ in range(20):  # 5 s ticks: past max(30 s, 2 x intervalSeconds)
        run.step(observed=replace(run.observe(), series=series))
        if run.policy.status.phase == "Failed":
            break
    assert run.policy.status.phase == "Failed"
    assert "general-2" in (run.policy.status.message or "")
    assert (run.sim.now - T0).total_seconds() >= 30
    assert run.sim.get("ConfigMap", "kube-proxy-nftables") is None


def test_any_other_error_refuses_at_once_even_with_series_missing() -> None:
    run, series = _series_run({"general-2"})
    run.sim.get("ConfigMap", "kube-proxy")["data"]["config.conf"] = "mode: [broken"
    run.step(observed=replace(run.observe(), series=series))
    assert run.policy.status.phase == "Failed"
