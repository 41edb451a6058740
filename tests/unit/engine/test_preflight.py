"""Preflight and inventory (DESIGN §6): every finding, the eligibility rules, the baseline.

The source objects are the ones kubeadm creates (the sandbox's ``manifests``), so the checks
run on the shape real clusters have; each test changes only what it is about.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from proxymode.api.models import Finding, PolicySpec, Severity
from proxymode.engine.observed import MODE_LABEL, ClusterFacts, NodeView, Observed
from proxymode.engine.preflight import PreflightResult, eligible_nodes, run_preflight
from proxymode_sandbox.kubeadm_proxy import config_conf, manifests

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
VERSION = "v1.37.2"
NEW_KERNEL = "6.1.0-28-cloud-amd64"
OLD_KERNEL = "4.18.0-553.el8_10.x86_64"
OS = {"kubernetes.io/os": "linux"}


def kubeadm(
    mode: str = "iptables", version: str = VERSION
) -> tuple[dict[str, Any], dict[str, Any]]:
    """kubeadm's kube-proxy DaemonSet and ConfigMap, as the API would return them."""
    objects = {o["kind"]: o for o in manifests("https://10.0.0.1:6443", version, mode)}
    return copy.deepcopy(objects["DaemonSet"]), copy.deepcopy(objects["ConfigMap"])


def node(name: str, labels: Mapping[str, str] | None = None, **kw: Any) -> NodeView:
    kw.setdefault("kernel", NEW_KERNEL)
    return NodeView(name=name, labels={**OS, **(labels or {})}, **kw)


def nodes(count: int = 3, **kw: Any) -> tuple[NodeView, ...]:
    return tuple(node(f"node-{i}", zone="abc"[i % 3], **kw) for i in range(count))


def policy(**spec: Any) -> PolicySpec:
    spec.setdefault("targetMode", "nftables")
    spec.setdefault("stages", [{"name": "all", "percent": 100}])
    return PolicySpec.model_validate(spec)


_DEFAULT: Any = object()


def observe(
    *,
    cluster: Sequence[NodeView] | None = None,
    daemon_set: Any = _DEFAULT,
    config_map: Any = _DEFAULT,
    mode: str = "iptables",
    version: str = VERSION,
    **facts: Any,
) -> Observed:
    ds, cm = kubeadm(mode, version)
    facts.setdefault("kubernetes_version", version)
    return Observed(
        now=NOW,
        generation=1,
        nodes=tuple(nodes() if cluster is None else cluster),
        source_daemon_set=ds if daemon_set is _DEFAULT else daemon_set,
        source_config_map=cm if config_map is _DEFAULT else config_map,
        facts=ClusterFacts(**facts),
        service_ips={"default/kubernetes": "10.96.0.1"},  # as the adapter reads it
    )


def codes(result: PreflightResult) -> list[str]:
    return [f.code for f in result.findings]


def only(result: PreflightResult, code: str) -> Finding:
    found = [f for f in result.findings if f.code == code]
    assert len(found) == 1, f"expected one {code}, got {codes(result)}"
    return found[0]


def errors(result: PreflightResult) -> list[str]:
    return [f.code for f in result.findings if f.severity == Severity.ERROR]


# -- the happy path ----------------------------------------------------------------------------


def test_kubeadm_iptables_to_nftables_passes() -> None:
    result = run_preflight(policy(), observe())
    assert result.passed, result.findings
    assert errors(result) == []
    assert result.eligible == ("node-0", "node-1", "node-2")
    assert result.excluded == ()
    assert result.source_mode == "iptables"
    assert result.kube_proxy_version == "v1.37.2"
    assert result.target_config is not None
    assert result.target_config.data["mode"] == "nftables"
    assert result.target_config.data["nftables"]["syncPeriod"] == "30s"
    # The iptables -> nftables behaviour changes come through as notes.
    notes = [f.message for f in result.findings if f.code == "TargetConfigNote"]
    assert any("nodePortAddresses" in n for n in notes)
    assert all(f.severity == Severity.WARNING for f in result.findings)


def test_findings_are_sorted_error_warning_info_then_code() -> None:
    cluster = (
        node("a", {"pool": "canary"}, kernel=OLD_KERNEL),
        node("b", {"pool": "canary"}, ready=False),
        node("c"),
    )
    spec = policy(stages=[{"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}}])
    result = run_preflight(spec, observe(cluster=cluster, other_policies=("other",)))
    severities = [f.severity for f in result.findings]
    rank = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
    keys = [(rank[Severity(f.severity)], f.code) for f in result.findings]
    assert keys == sorted(keys)
    assert {Severity.ERROR, Severity.WARNING, Severity.INFO} <= set(severities)
    assert errors(result) == ["AnotherPolicyInFlight", "KernelTooOld"]
    assert not result.passed


# -- no DaemonSet to drive -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kubelet", "static_pods", "config_map", "expected"),
    [
        pytest.param("v1.37.2", (), True, ["SourceDaemonSetMissing"], id="wrong-name"),
        pytest.param(
            "v1.37.2",
            (),
            False,
            ["SourceConfigMapMissing", "SourceDaemonSetMissing"],
            id="both-missing",
        ),
        pytest.param(
            "v1.37.2", ("kube-proxy-node-0", "kube-proxy-node-1"), False, ["StaticPodKubeProxy"]
        ),
        pytest.param("v1.30.4+k3s1", (), False, ["EmbeddedKubeProxy"], id="k3s"),
        # RKE2 runs kube-proxy as a static pod the agent writes, not inside the agent.
        pytest.param(
            "v1.30.4+rke2r1", ("kube-proxy-node-0",), False, ["StaticPodKubeProxy"], id="rke2"
        ),
    ],
)
def test_missing_daemon_set_says_why(
    kubelet: str, static_pods: tuple[str, ...], config_map: bool, expected: list[str]
) -> None:
    observed = observe(
        cluster=nodes(kubelet_version=kubelet),
        daemon_set=None,
        config_map=_DEFAULT if config_map else None,
        static_kube_proxy_pods=static_pods,
    )
    result = run_preflight(policy(), observed)
    assert sorted(errors(result)) == expected
    assert not result.passed
    assert result.eligible == ()
    assert result.baseline.nodes == 0


def test_static_pod_message_names_pods_and_nodes() -> None:
    observed = observe(
        daemon_set=None,
        config_map=None,
        static_kube_proxy_pods=("kube-proxy-node-0", "kube-proxy-node-2"),
    )
    finding = only(run_preflight(policy(), observed), "StaticPodKubeProxy")
    assert "static pods on 2 nodes (kube-proxy-node-0, kube-proxy-node-2)" in finding.message
    assert "DaemonSet-managed kube-proxy only" in finding.message
    assert finding.nodes == ["node-0", "node-2"]


def test_embedded_message_says_how_to_switch() -> None:
    observed = observe(cluster=nodes(kubelet_version="v1.31.1+k3s1"), daemon_set=None)
    finding = only(run_preflight(policy(targetMode="ipvs"), observed), "EmbeddedKubeProxy")
    assert "k3s" in finding.message
    assert "kube-proxy-arg" in finding.message and "proxy-mode=ipvs" in finding.message
    assert finding.nodes == ["node-0", "node-1", "node-2"]


# -- the source ConfigMap ----------------------------------------------------------------------


def test_config_map_missing() -> None:
    spec = policy(kubeProxy={"configMap": "kube-proxy-config"})
    result = run_preflight(spec, observe(config_map=None))
    finding = only(result, "SourceConfigMapMissing")
    assert "kube-system/kube-proxy-config" in finding.message
    assert result.source_mode is None and result.target_config is None


def test_config_key_missing_lists_the_keys() -> None:
    spec = policy(kubeProxy={"configKey": "config.yaml"})
    finding = only(run_preflight(spec, observe()), "ConfigKeyMissing")
    assert finding.severity == Severity.ERROR
    assert "'config.yaml'" in finding.message
    assert "config.conf, kubeconfig.conf" in finding.message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("mode: [", "not valid YAML"),
        ("apiVersion: v1\nkind: ConfigMap\n", "apiVersion"),
        (config_conf("userspace"), "userspace"),
    ],
)
def test_config_invalid(text: str, fragment: str) -> None:
    _, cm = kubeadm()
    cm["data"]["config.conf"] = text
    result = run_preflight(policy(), observe(config_map=cm))
    finding = only(result, "ConfigInvalid")
    assert fragment in finding.message
    assert result.target_config is None and not result.passed


def test_daemon_set_must_mount_the_config_map() -> None:
    ds, _ = kubeadm()
    ds["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] = "kube-proxy-other"
    finding = only(run_preflight(policy(), observe(daemon_set=ds)), "DaemonSetDoesNotUseConfigMap")
    assert "kube-system/kube-proxy" in finding.message
    assert "It mounts kube-proxy-other" in finding.message


def test_projected_config_map_counts_as_mounted() -> None:
    ds, _ = kubeadm()
    volumes = ds["spec"]["template"]["spec"]["volumes"]
    volumes[0] = {
        "name": "kube-proxy",
        "projected": {"sources": [{"configMap": {"name": "kube-proxy"}}]},
    }
    assert "DaemonSetDoesNotUseConfigMap" not in codes(
        run_preflight(policy(), observe(daemon_set=ds))
    )


# -- the target mode and config ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "target"),
    [("nftables", "nftables"), ("ipvs", "ipvs"), ("", "iptables"), ("iptables", "iptables")],
)
def test_already_in_target_mode(source: str, target: str) -> None:
    result = run_preflight(policy(targetMode=target), observe(mode=source))
    finding = only(result, "AlreadyInTargetMode")
    assert finding.severity == Severity.ERROR
    assert f"already runs in {target} mode" in finding.message
    assert result.source_mode == target
    assert result.target_config is None


@pytest.mark.parametrize(
    ("target", "version", "overrides", "fragment"),
    [
        ("nftables", "v1.28.5", None, "appeared in 1.29"),
        ("ipvs", "v1.41.0", None, "KubeProxyIPVS"),
        ("ipvs", "v1.43.1", {"featureGates": {"KubeProxyIPVS": True}}, "removed in 1.43"),
    ],
)
def test_mode_unsupported(
    target: str, version: str, overrides: dict[str, Any] | None, fragment: str
) -> None:
    spec = policy(targetMode=target, configOverrides=overrides)
    result = run_preflight(spec, observe(version=version))
    finding = only(result, "ModeUnsupported")
    assert fragment in finding.message
    assert version in finding.message
    assert ("1.29 or later" in finding.message) is (target == "nftables")
    assert result.target_config is None
    assert "ConfigOverridesInvalid" not in codes(result)


def test_ipvs_opt_in_gate_from_overrides_makes_it_supported() -> None:
    spec = policy(targetMode="ipvs", configOverrides={"featureGates": {"KubeProxyIPVS": True}})
    result = run_preflight(spec, observe(version="v1.41.0"))
    assert "ModeUnsupported" not in codes(result)
    assert only(result, "ModeDeprecated").severity == Severity.WARNING
    assert result.target_config is not None
    assert result.target_config.data["featureGates"] == {"KubeProxyIPVS": True}


def test_ipvs_deprecated_is_said_once() -> None:
    result = run_preflight(policy(targetMode="ipvs"), observe(version="v1.36.0"))
    deprecated = only(result, "ModeDeprecated")
    assert "deprecated since 1.35" in deprecated.message
    notes = [f.message for f in result.findings if f.code == "TargetConfigNote"]
    assert not any("deprecated since 1.35" in n for n in notes)
    assert any("strictARP" in n for n in notes)
    assert result.passed


def test_feature_gate_added_for_alpha_nftables() -> None:
    result = run_preflight(policy(), observe(version="v1.30.4"))
    finding = only(result, "FeatureGateAdded")
    assert finding.severity == Severity.INFO
    assert "NFTablesProxyMode: true" in finding.message
    assert result.target_config is not None
    assert result.target_config.data["featureGates"] == {"NFTablesProxyMode": True}
    assert result.passed


def test_no_feature_gate_finding_when_none_needed() -> None:
    assert "FeatureGateAdded" not in codes(run_preflight(policy(), observe()))


def test_config_overrides_invalid() -> None:
    spec = policy(configOverrides={"nftables": {"syncPeriodd": "10s"}})
    result = run_preflight(spec, observe())
    finding = only(result, "ConfigOverridesInvalid")
    assert "spec.configOverrides" in finding.message
    assert "syncPeriod" in finding.message  # the "did you mean" hint
    assert result.target_config is None and not result.passed


def test_overrides_are_applied_to_the_target_config() -> None:
    spec = policy(configOverrides={"nftables": {"syncPeriod": "10s"}})
    result = run_preflight(spec, observe())
    assert result.target_config is not None
    assert result.target_config.data["nftables"]["syncPeriod"] == "10s"
    assert result.passed


def test_target_config_invalid_when_the_source_cannot_be_derived() -> None:
    _, cm = kubeadm()
    # A gate kube-proxy 1.36 does not know: the derivation refuses with or without overrides.
    cm["data"]["config.conf"] += "featureGates:\n  KubeProxyIPVS: true\n"
    spec = policy(configOverrides={"nftables": {"syncPeriod": "10s"}})
    result = run_preflight(spec, observe(config_map=cm, version="v1.36.1"))
    finding = only(result, "TargetConfigInvalid")
    assert "KubeProxyIPVS" in finding.message
    assert "ConfigOverridesInvalid" not in codes(result)


def test_version_from_image_tag_wins_over_cluster_version() -> None:
    result = run_preflight(policy(), observe(version="v1.30.4", kubernetes_version="v1.31.0"))
    assert result.kube_proxy_version == "v1.30.4"
    assert "FeatureGateAdded" in codes(result)  # judged on 1.30, not the cluster's 1.31
    assert result.baseline.kubernetes_version == "v1.31.0"
    assert result.baseline.kube_proxy_image == "registry.k8s.io/kube-proxy:v1.30.4"


@pytest.mark.parametrize(
    ("image", "cluster", "expected"),
    [
        ("registry.k8s.io/kube-proxy:latest", "v1.33.1", "v1.33.1"),
        ("registry.k8s.io/kube-proxy@sha256:abc", "v1.30.4-eks-1234", "v1.30.4"),
        ("602401143452.dkr.ecr.aws/eks/kube-proxy:v1.32.0-eksbuild.2", None, "v1.32.0"),
        ("registry.k8s.io/kube-proxy:latest", None, None),
    ],
)
def test_kube_proxy_version_sources(image: str, cluster: str | None, expected: str | None) -> None:
    ds, _ = kubeadm()
    ds["spec"]["template"]["spec"]["containers"][0]["image"] = image
    result = run_preflight(policy(), observe(daemon_set=ds, kubernetes_version=cluster))
    assert result.kube_proxy_version == expected
    assert result.baseline.kube_proxy_version == expected


def test_unknown_version_is_noted_not_refused() -> None:
    ds, _ = kubeadm()
    ds["spec"]["template"]["spec"]["containers"][0]["image"] = "kube-proxy:latest"
    result = run_preflight(policy(), observe(daemon_set=ds, kubernetes_version="garbage"))
    assert result.kube_proxy_version is None
    assert "ModeUnsupported" not in codes(result)
    notes = [f.message for f in result.findings if f.code == "TargetConfigNote"]
    assert any("version is unknown" in n for n in notes)


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        pytest.param(
            [
                {"name": "sidecar", "image": "registry.k8s.io/kube-proxy-tools:v1.99.0"},
                {"name": "kube-proxy", "image": "example.com/custom/proxy:v1.36.1"},
            ],
            "v1.36.1",
            id="by-name",
        ),
        pytest.param(
            [
                {"name": "conntrack-fix", "image": "example.com/conntrack:v1.99.0"},
                {"name": "proxy", "image": "registry.k8s.io/kube-proxy:v1.35.0"},
            ],
            "v1.35.0",
            id="by-image",
        ),
        pytest.param(
            [{"name": "proxy", "image": "example.com/proxy:v1.34.2"}], "v1.34.2", id="first"
        ),
    ],
)
def test_kube_proxy_container_choice(containers: list[dict[str, Any]], expected: str) -> None:
    ds, _ = kubeadm()
    ds["spec"]["template"]["spec"]["containers"] = containers
    result = run_preflight(policy(), observe(daemon_set=ds))
    assert result.kube_proxy_version == expected


# -- eligibility -------------------------------------------------------------------------------


def _affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]
            }
        }
    }


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        out["values"] = list(values)
    return out


POOLS = (
    node("a1", {"pool": "a", "zone": "x", "cpus": "8"}),
    node("a2", {"pool": "a", "zone": "y", "cpus": "64"}),
    node("b1", {"pool": "b", "zone": "x"}),
    node("b2", {"pool": "b", "zone": "y", MODE_LABEL: "nftables"}),
    node("w1", {"pool": "w", "kubernetes.io/os": "windows"}),
    node("gone", {"pool": "a"}, deleting=True),
)


@pytest.mark.parametrize(
    ("affinity", "expected"),
    [
        pytest.param(None, ["a1", "a2", "b1", "b2"], id="kubeadm-nodeSelector-only"),
        pytest.param(_affinity([_expr("pool", "In", "a")]), ["a1", "a2"], id="in"),
        pytest.param(_affinity([_expr("pool", "NotIn", "a")]), ["b1", "b2"], id="not-in"),
        pytest.param(_affinity([_expr("cpus", "Exists")]), ["a1", "a2"], id="exists"),
        pytest.param(_affinity([_expr("cpus", "DoesNotExist")]), ["b1", "b2"], id="not-exists"),
        pytest.param(_affinity([_expr("cpus", "Gt", "16")]), ["a2"], id="gt"),
        pytest.param(_affinity([_expr("cpus", "Lt", "16")]), ["a1"], id="lt"),
        pytest.param(_affinity([_expr("cpus", "Gt", "x")]), [], id="gt-not-a-number"),
        pytest.param(
            _affinity([_expr("pool", "In", "a"), _expr("zone", "In", "x")]), ["a1"], id="and"
        ),
        pytest.param(
            _affinity(
                [_expr("pool", "In", "a"), _expr("zone", "In", "x")], [_expr("pool", "In", "b")]
            ),
            ["a1", "b1", "b2"],
            id="or-of-ands",
        ),
        pytest.param(
            _affinity([_expr(MODE_LABEL, "NotIn", "nftables", "switching")]),
            ["a1", "a2", "b1", "b2"],
            id="operator-source-affinity-ignored",
        ),
        pytest.param(
            _affinity([_expr(MODE_LABEL, "In", "nftables")]),
            ["a1", "a2", "b1", "b2"],
            id="operator-target-affinity-ignored",
        ),
        pytest.param(
            _affinity(
                [_expr("pool", "In", "b"), _expr(MODE_LABEL, "NotIn", "nftables", "switching")]
            ),
            ["b1", "b2"],
            id="mode-ignored-rest-kept",
        ),
        pytest.param(_affinity([]), [], id="empty-term-matches-nothing"),
        pytest.param(
            {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": ["b1"]}
                                ]
                            }
                        ]
                    }
                }
            },
            ["b1"],
            id="match-fields",
        ),
        pytest.param(
            {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
            ["a1", "a2", "b1", "b2"],
            id="preferred-only",
        ),
    ],
)
def test_eligible_follows_the_daemon_set(
    affinity: dict[str, Any] | None, expected: list[str]
) -> None:
    ds, _ = kubeadm()
    if affinity is not None:
        ds["spec"]["template"]["spec"]["affinity"] = affinity
    assert [n.name for n in eligible_nodes(policy(), ds, POOLS)] == expected


@pytest.mark.parametrize(
    ("operator", "value", "matches"),
    [("Gt", "15", True), ("Gt", "16", False), ("Lt", "17", True), ("Lt", "16", False)],
)
def test_numeric_operators_are_strict(operator: str, value: str, matches: bool) -> None:
    ds, _ = kubeadm()
    ds["spec"]["template"]["spec"]["affinity"] = _affinity([_expr("cpus", operator, value)])
    eligible = eligible_nodes(policy(), ds, [node("n", {"cpus": "16"})])
    assert bool(eligible) is matches


def test_daemon_set_node_selector_is_anded() -> None:
    ds, _ = kubeadm()
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/os": "linux", "pool": "b"}
    assert [n.name for n in eligible_nodes(policy(), ds, POOLS)] == ["b1", "b2"]
    del ds["spec"]["template"]["spec"]["nodeSelector"]
    assert [n.name for n in eligible_nodes(policy(), ds, POOLS)] == ["a1", "a2", "b1", "b2", "w1"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        (None, ["a1", "a2", "b1", "b2"]),
        ({}, ["a1", "a2", "b1", "b2"]),
        ({"matchLabels": {"pool": "a"}}, ["a1", "a2"]),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["y"]}]}, ["a2", "b2"]),
        ({"matchLabels": {"pool": "w"}}, []),  # the DaemonSet does not run on Windows
    ],
)
def test_policy_node_selector_narrows(selector: dict[str, Any] | None, expected: list[str]) -> None:
    ds, _ = kubeadm()
    spec = policy(nodeSelector=selector) if selector is not None else policy()
    assert [n.name for n in eligible_nodes(spec, ds, POOLS)] == expected


def test_deleting_nodes_and_taints_in_run_preflight() -> None:
    result = run_preflight(policy(), observe(cluster=POOLS))
    assert result.eligible == ("a1", "a2", "b1", "b2")
    assert "gone" not in result.eligible and "w1" not in result.eligible


def test_eligible_is_sorted_whatever_the_input_order() -> None:
    ds, _ = kubeadm()
    shuffled = [POOLS[3], POOLS[0], POOLS[2], POOLS[1]]
    assert [n.name for n in eligible_nodes(policy(), ds, shuffled)] == ["a1", "a2", "b1", "b2"]


# -- kernels -----------------------------------------------------------------------------------

KERNEL_CLUSTER = (
    node("new-1", kernel="5.15.0-1051-azure"),
    node("new-2", kernel="5.13.0"),
    node("old-1", kernel=OLD_KERNEL),
    node("old-2", kernel="5.4.0-1103-aws"),
    node("odd", kernel="weird-build"),
)


def test_old_kernels_refuse_the_run_by_default() -> None:
    result = run_preflight(policy(), observe(cluster=KERNEL_CLUSTER))
    finding = only(result, "KernelTooOld")
    assert finding.severity == Severity.ERROR
    assert finding.nodes == ["old-1", "old-2"]
    assert "5.13" in finding.message and OLD_KERNEL in finding.message
    assert "incompatibleNodes: Exclude" in finding.message
    assert not result.passed
    assert result.excluded == ()
    assert "old-1" in result.eligible


def test_old_kernels_are_excluded_on_request() -> None:
    spec = policy(incompatibleNodes="Exclude")
    result = run_preflight(spec, observe(cluster=KERNEL_CLUSTER))
    finding = only(result, "KernelTooOld")
    assert finding.severity == Severity.WARNING
    assert result.excluded == ("old-1", "old-2")
    assert result.eligible == ("new-1", "new-2", "odd")
    assert result.baseline.nodes == 3
    assert result.passed


def test_unparseable_kernels_warn_and_stay() -> None:
    result = run_preflight(policy(incompatibleNodes="Exclude"), observe(cluster=KERNEL_CLUSTER))
    finding = only(result, "KernelUnknown")
    assert finding.severity == Severity.WARNING
    assert finding.nodes == ["odd"]
    assert "weird-build" in finding.message
    assert "odd" in result.eligible


@pytest.mark.parametrize("target", ["iptables", "ipvs"])
def test_kernels_do_not_matter_for_other_modes(target: str) -> None:
    result = run_preflight(
        policy(targetMode=target), observe(cluster=KERNEL_CLUSTER, mode="nftables")
    )
    assert "KernelTooOld" not in codes(result)
    assert "KernelUnknown" not in codes(result)
    assert len(result.eligible) == 5


def test_only_eligible_nodes_are_kernel_checked() -> None:
    cluster = (node("ok"), node("old-win", {"kubernetes.io/os": "windows"}, kernel=OLD_KERNEL))
    result = run_preflight(policy(), observe(cluster=cluster))
    assert "KernelTooOld" not in codes(result)


def test_excluding_every_node_leaves_none_eligible() -> None:
    cluster = (node("old-1", kernel=OLD_KERNEL), node("old-2", kernel="5.10.0"))
    result = run_preflight(policy(incompatibleNodes="Exclude"), observe(cluster=cluster))
    finding = only(result, "NoEligibleNodes")
    assert "excluded" in finding.message
    assert result.eligible == () and result.excluded == ("old-1", "old-2")
    assert not result.passed


# -- nodes, stages, coverage -------------------------------------------------------------------


def test_no_eligible_nodes() -> None:
    spec = policy(nodeSelector={"matchLabels": {"pool": "nowhere"}})
    result = run_preflight(spec, observe())
    finding = only(result, "NoEligibleNodes")
    assert "none of the 3 nodes" in finding.message
    assert "StageSelectsNothing" not in codes(result)
    assert "PartialCoverage" not in codes(result)


CANARY_AND_REST = (
    node("c1", {"pool": "canary"}, zone="a"),
    node("c2", {"pool": "canary"}, zone="b"),
    node("g1", {"pool": "general"}, zone="a"),
    node("g2", {"pool": "general"}, zone="b"),
    node("g3", {"pool": "general"}, zone="c"),
)


def test_a_later_stage_that_selects_nothing_warns() -> None:
    spec = policy(
        stages=[
            {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}},
            {"name": "gpu", "nodeSelector": {"matchLabels": {"pool": "gpu"}}},
            {"name": "tenth", "percent": 10},  # the canary already covers 10%
            {"name": "all", "percent": 100},
        ]
    )
    result = run_preflight(spec, observe(cluster=CANARY_AND_REST))
    found = [f for f in result.findings if f.code == "StageSelectsNothing"]
    assert [f.severity for f in found] == [Severity.WARNING, Severity.WARNING]
    assert "'gpu'" in found[0].message and "'tenth'" in found[1].message
    assert "still bakes" in found[1].message  # not "completes at once": it bakes and is judged
    assert "PartialCoverage" not in codes(result)
    assert result.passed


def test_a_first_stage_that_selects_nothing_says_what_moves_first() -> None:
    """A typo in the canary's label (``pool: canry``) lets the next stage, here the whole
    fleet, move first with no canary (a review saw exactly that). The empty first stage
    completes at once (issue 9, item 20: a shared policy may name a pool a cluster lacks),
    so the Warning says plainly what moves first and how to stop it."""
    typo = {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canry"}}}
    rest = {"name": "all", "percent": 100}
    result = run_preflight(policy(stages=[typo, rest]), observe(cluster=CANARY_AND_REST))
    finding = next(f for f in result.findings if f.code == "StageSelectsNothing")
    assert finding.severity == Severity.WARNING
    assert "'canary' (the canary)" in finding.message
    assert "the next stage's 5 nodes" in finding.message
    assert "spec.paused" in finding.message and "kubectl proxymode plan" in finding.message


def test_stages_that_select_nothing_at_all_are_refused() -> None:
    """A review: every stage empty (``pool: nosuch``), the run patched the source (OnDelete,
    so its image bumps stopped rolling), kept an empty target pair and "completed" in mixed
    mode, for as long as the policy lived. Refused before anything changes."""
    typo = {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canry"}}}
    gpu = {"name": "gpu", "nodeSelector": {"matchLabels": {"pool": "gpu"}}}
    result = run_preflight(policy(stages=[typo, gpu]), observe(cluster=CANARY_AND_REST))
    finding = only(result, "StageSelectsNothing")
    assert finding.severity == Severity.ERROR
    assert "No stage selects a node" in finding.message and "5 eligible nodes" in finding.message
    assert not result.passed


def test_partial_coverage_is_reported() -> None:
    spec = policy(stages=[{"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}}])
    result = run_preflight(spec, observe(cluster=CANARY_AND_REST))
    finding = only(result, "PartialCoverage")
    assert finding.severity == Severity.INFO
    assert finding.nodes == ["g1", "g2", "g3"]
    assert "cover 2 of 5" in finding.message
    assert "3 nodes" in finding.message
    assert "both DaemonSets" in finding.message and "not finalize" in finding.message
    assert result.passed


def test_max_nodes_cap_leaves_partial_coverage() -> None:
    spec = policy(stages=[{"name": "all", "percent": 100, "maxNodes": 4}])
    finding = only(run_preflight(spec, observe(cluster=CANARY_AND_REST)), "PartialCoverage")
    assert len(finding.nodes) == 1


def test_nodes_not_ready_warns() -> None:
    cluster = (node("r1"), node("nr1", ready=False), node("nr2", ready=False))
    finding = only(run_preflight(policy(), observe(cluster=cluster)), "NodesNotReady")
    assert finding.severity == Severity.WARNING
    assert finding.nodes == ["nr1", "nr2"]
    assert "nr1, nr2" in finding.message


def test_not_ready_only_counts_eligible_nodes() -> None:
    cluster = (node("r1"), node("nr-win", {"kubernetes.io/os": "windows"}, ready=False))
    assert "NodesNotReady" not in codes(run_preflight(policy(), observe(cluster=cluster)))


def test_long_node_lists_are_shortened_in_messages() -> None:
    cluster = tuple(node(f"n{i:02d}", ready=False) for i in range(25))
    finding = only(run_preflight(policy(), observe(cluster=cluster)), "NodesNotReady")
    assert len(finding.nodes) == 25
    assert "and 15 more" in finding.message


# -- tools and policies that would fight the operator ------------------------------------------


@pytest.mark.parametrize(
    ("kind", "labels", "annotations", "tools"),
    [
        ("DaemonSet", {"app.kubernetes.io/managed-by": "Helm"}, {}, ["Helm"]),
        ("ConfigMap", {}, {"meta.helm.sh/release-name": "kp"}, ["Helm"]),
        ("DaemonSet", {}, {"argocd.argoproj.io/tracking-id": "infra:apps/DaemonSet:x/y"}, ["Argo"]),
        ("ConfigMap", {"app.kubernetes.io/instance": "infra"}, {}, ["Argo"]),
        (
            "DaemonSet",
            {"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": "kp"},
            {"meta.helm.sh/release-name": "kp"},
            ["Helm"],
        ),
        (
            "DaemonSet",
            {"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": "infra"},
            {},
            ["Argo", "Helm"],
        ),
        ("DaemonSet", {"app.kubernetes.io/managed-by": "kubeadm"}, {}, []),
    ],
)
def test_managed_by_gitops(
    kind: str, labels: dict[str, str], annotations: dict[str, str], tools: list[str]
) -> None:
    ds, cm = kubeadm()
    obj = ds if kind == "DaemonSet" else cm
    obj["metadata"].setdefault("labels", {}).update(labels)
    obj["metadata"]["annotations"] = annotations
    result = run_preflight(policy(), observe(daemon_set=ds, config_map=cm))
    found = [f for f in result.findings if f.code == "ManagedByGitOps"]
    assert all(f.severity == Severity.WARNING for f in found)
    marks = {"Helm": "Helm's marks", "Argo": "Argo CD's marks"}
    said = sorted(tool for f in found for tool, mark in marks.items() if mark in f.message)
    assert said == tools
    for f in found:
        assert f"{kind} kube-system/kube-proxy" in f.message
    argo = [f for f in found if "Argo CD's marks" in f.message]
    for f in argo:
        assert "ignoreDifferences" in f.message and "managedFieldsManagers" in f.message
    helm = [f for f in found if "Helm's marks" in f.message]
    for f in helm:
        assert "mid-migration" in f.message
    assert result.passed


def test_argo_application_is_named() -> None:
    ds, _ = kubeadm()
    ds["metadata"]["annotations"] = {"argocd.argoproj.io/tracking-id": "infra:apps/DaemonSet:a/b"}
    finding = only(run_preflight(policy(), observe(daemon_set=ds)), "ManagedByGitOps")
    assert "application infra" in finding.message


def test_another_policy_in_flight() -> None:
    result = run_preflight(policy(), observe(other_policies=("to-ipvs", "legacy")))
    finding = only(result, "AnotherPolicyInFlight")
    assert finding.severity == Severity.ERROR
    assert "legacy, to-ipvs" in finding.message
    assert "kube-system/kube-proxy" in finding.message
    assert not result.passed


# -- baseline ----------------------------------------------------------------------------------


def test_baseline_inventory() -> None:
    cluster = (
        node("a", kernel=NEW_KERNEL, os_image="Debian 12", container_runtime="containerd://1.7"),
        node("b", kernel=NEW_KERNEL, os_image="Debian 12", container_runtime="containerd://2.0"),
        node("c", kernel="5.15.0", os_image="Ubuntu 22.04", container_runtime="containerd://1.7"),
        node("win", {"kubernetes.io/os": "windows"}, kernel="10.0.20348", os_image="Windows"),
        node("gone", kernel=NEW_KERNEL, os_image="Debian 12", deleting=True),
    )
    observed = observe(
        cluster=cluster,
        services=120,
        endpoint_slices=140,
        cni="cilium",
        kubernetes_version="v1.37.3",
    )
    baseline = run_preflight(policy(), observed).baseline
    assert baseline.kubernetes_version == "v1.37.3"
    assert baseline.kube_proxy_version == "v1.37.2"
    assert baseline.kube_proxy_image == "registry.k8s.io/kube-proxy:v1.37.2"
    assert baseline.source_mode == "iptables"
    assert [(c.value, c.count) for c in baseline.kernels] == [
        ("10.0.20348", 1),
        ("5.15.0", 1),
        (NEW_KERNEL, 3),
    ]
    assert [(c.value, c.count) for c in baseline.os_images] == [
        ("Debian 12", 3),
        ("Ubuntu 22.04", 1),
        ("Windows", 1),
    ]
    assert [(c.value, c.count) for c in baseline.container_runtimes] == [
        ("containerd://1.7", 2),
        ("containerd://2.0", 1),
        ("unknown", 2),
    ]
    assert baseline.cni == "cilium"
    assert baseline.services == 120 and baseline.endpoint_slices == 140
    assert baseline.nodes == 3  # eligible only: not Windows, not the node being deleted
    assert baseline.recorded_time == NOW
    assert baseline.metrics == {}


def test_baseline_survives_a_failed_preflight() -> None:
    result = run_preflight(policy(), observe(daemon_set=None, config_map=None, cni="calico"))
    assert not result.passed
    assert result.baseline.cni == "calico"
    assert result.baseline.kube_proxy_version == VERSION  # from the cluster version
    assert result.baseline.kube_proxy_image is None
    assert result.baseline.source_mode is None
    assert sum(c.count for c in result.baseline.kernels) == 3


def test_result_is_deterministic() -> None:
    spec = policy(incompatibleNodes="Exclude")
    first = run_preflight(spec, observe(cluster=KERNEL_CLUSTER))
    second = run_preflight(spec, observe(cluster=tuple(reversed(KERNEL_CLUSTER))))
    assert first.findings == second.findings
    assert first.eligible == second.eligible and first.excluded == second.excluded


def test_inputs_are_not_modified() -> None:
    ds, cm = kubeadm()
    before = (copy.deepcopy(ds), copy.deepcopy(cm))
    spec = policy(configOverrides={"nftables": {"syncPeriod": "10s"}})
    run_preflight(spec, observe(daemon_set=ds, config_map=cm))
    assert (ds, cm) == before
