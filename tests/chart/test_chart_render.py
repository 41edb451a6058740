"""The chart, rendered: lint, schema, and what the objects must (and must not) say.

No cluster here: ``helm lint --strict`` and ``helm template`` with every values set in
charts/proxymode-operator/ci/, then assertions on the parsed objects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxymode.api import crd, models
from tests.chart.conftest import (
    CHART,
    CI_VALUES,
    RELEASE,
    by_kind,
    helm_template,
    one,
    render,
    run,
)

PEERING_CRD_FILE = "kopf.dev_clusterkopfpeerings.yaml"
EXPECTED_CI = {"default", "crds-off", "monitoring-on", "networkpolicy-on", "peering-on"}


def test_every_ci_values_set_exists() -> None:
    assert {p.name.removesuffix("-values.yaml") for p in CI_VALUES} == EXPECTED_CI


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.stem if v else "no-values")
def test_helm_lint_strict(bins: Path, values: Path | None) -> None:
    argv: list[Any] = [bins / "helm", "lint", "--strict", CHART, "--kube-version", "1.37.2"]
    if values:
        argv += ["--values", values]
    result = run(argv)
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("replicaCount=two", "replicaCount"),
        ("replicaCount=6", "replicaCount"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("liveness.port=0", "port"),
        ("monitoring.prometheusRule.conntrackHigh.ratio=1.5", "ratio"),
        ("monitoring.prometheusRule.syncSlow.for=fifteen", "for"),
        ("typoedKey=true", "typoedKey"),
        ("labelGuard.enabled=maybe", "enabled"),
        ("labelGuard.allowedUsers=jane", "allowedUsers"),
        ("kubeProxy.namespace=Kube_System", "namespace"),
    ],
)
def test_schema_refuses_bad_values(bins: Path, setting: str, complaint: str) -> None:
    flag = "--set-string" if setting.startswith("replicaCount=two") else "--set"
    for argv in (
        [bins / "helm", "lint", "--strict", CHART, "--kube-version", "1.37.2", flag, setting],
        [bins / "helm", "template", RELEASE, CHART, "--kube-version", "1.37.2", flag, setting],
    ):
        result = run(argv, check=False)
        assert result.returncode != 0, f"{setting} was accepted by {argv[1]}"
        output = result.stdout + result.stderr
        assert "schema" in output.lower(), output
        assert complaint in output, output


def test_chart_crd_copy_is_what_the_models_generate() -> None:
    """files/crd.yaml must stay the generated CRD: `make crds` then copy it into the chart."""
    copy = (CHART / "files" / "crd.yaml").read_text()
    assert copy == crd.render(), (
        "charts/proxymode-operator/files/crd.yaml differs from `python -m proxymode.api.crd`;"
        " regenerate: .venv/bin/python -m proxymode.api.crd >"
        " charts/proxymode-operator/files/crd.yaml"
    )


def test_rendered_crd_is_the_generated_one_plus_helm_metadata(bins: Path) -> None:
    rendered = _policy_crd(render(bins))
    generated = yaml.safe_load(crd.render())
    assert rendered["spec"] == generated["spec"]
    assert rendered["metadata"]["name"] == generated["metadata"]["name"]
    assert rendered["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert rendered["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    unkept = _policy_crd(render(bins, set_values=["crds.keep=false"]))
    assert "helm.sh/resource-policy" not in (unkept["metadata"].get("annotations") or {})
    # crds.enabled leaves the ProxyModePolicy CRD out; kopf's peering CRD has its own switch
    # (peering.createCRD): the peering needs it whether or not the chart installs ours.
    left = by_kind(render(bins, set_values=["crds.enabled=false"]), "CustomResourceDefinition")
    assert [c["metadata"]["name"] for c in left] == ["clusterkopfpeerings.kopf.dev"]
    assert (
        by_kind(
            render(bins, set_values=["crds.enabled=false", "peering.createCRD=false"]),
            "CustomResourceDefinition",
        )
        == []
    )


def _policy_crd(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [
        c
        for c in by_kind(objects, "CustomResourceDefinition")
        if c["metadata"]["name"] == f"{models.PLURAL}.{models.GROUP}"
    ]
    return found


def test_deployment_is_two_restricted_peered_replicas_with_kopf_liveness(bins: Path) -> None:
    deployment = one(render(bins), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["runAsNonRoot"] is True
    assert container["resources"]["requests"] and container["resources"]["limits"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]  # noqa: S108 - a mount path, not a temp file
    # The probe asks exactly what --liveness serves.
    (liveness,) = [a for a in container["args"] if a.startswith("--liveness=")]
    assert liveness == "--liveness=http://0.0.0.0:8080/healthz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    assert ports[probe["port"]] == 8080
    assert "readinessProbe" not in container
    # Two replicas, so peering by default: exactly one of them acts (decision 0071).
    assert "--peering=proxymode" in container["args"]
    assert "--peering-lifetime=20" in container["args"]
    # The standby is spread to another node when the scheduler can.
    spread = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = spread["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"] == (spec["selector"]["matchLabels"])
    )
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_liveness_flag_follows_the_values(bins: Path) -> None:
    deployment = one(
        render(bins, set_values=["liveness.port=9191", "liveness.path=/live"]), "Deployment"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--liveness=http://0.0.0.0:9191/live" in container["args"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/live"
    assert container["ports"][0]["containerPort"] == 9191


def test_image_defaults_to_the_app_version_and_honours_a_digest(bins: Path) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (c,) = one(render(bins), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert c["image"] == f"proxymode/proxymode-operator:{chart['appVersion']}"
    digest = "sha256:" + "a" * 64
    (c,) = one(render(bins, set_values=[f"image.digest={digest}"]), "Deployment")["spec"][
        "template"
    ]["spec"]["containers"]
    assert c["image"] == f"proxymode/proxymode-operator@{digest}"


def _rules(objects: list[dict[str, Any]], kind: str = "ClusterRole") -> list[dict[str, Any]]:
    role = [o for o in by_kind(objects, kind) if "kube-state-metrics" not in o["metadata"]["name"]]
    assert len(role) == 1
    rules: list[dict[str, Any]] = role[0]["rules"]
    return rules


def _grants(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_cluster_role_is_exactly_what_the_operator_uses(bins: Path) -> None:
    rules = _rules(render(bins))
    grants = _grants(rules)
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "*" not in rule["apiGroups"], rule
        assert not rule.get("nonResourceURLs"), rule
    assert not [key for key in grants if key[1] == "secrets"], "no cluster-wide secrets"
    assert grants[("", "nodes")] == {"get", "list", "watch", "patch"}
    assert grants == {
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("proxymode.io", "proxymodepolicies"): {"get", "list", "watch", "patch"},
        ("proxymode.io", "proxymodepolicies/status"): {"patch"},
        ("", "events"): {"create"},
        ("", "nodes"): {"get", "list", "watch", "patch"},
        ("apps", "daemonsets"): {"list"},
        ("", "services"): {"list", "get"},  # get: the ClusterIP of spec.verify.service
        ("discovery.k8s.io", "endpointslices"): {"list"},
        # Peering, on by default (the two replicas' keep-alives; create: the object when missing).
        ("kopf.dev", "clusterkopfpeerings"): {"get", "list", "watch", "patch", "create"},
    }


KUBE_PROXY_GRANTS = {
    ("apps", "daemonsets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch", "delete"},
    ("batch", "jobs"): {"list", "watch", "create", "delete"},
    ("", "pods"): {"list", "watch"},
}


def _kube_proxy_roles(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["namespace"]: o
        for o in by_kind(objects, "Role")
        if o["metadata"]["name"].endswith("-kube-proxy")
    }


def test_kube_proxy_writes_only_in_kube_proxy_namespaces(bins: Path) -> None:
    """DaemonSet, ConfigMap and Job writes come from a Role in each kube-proxy namespace,
    bound to the operator's ServiceAccount, and from nowhere else."""
    objects = render(bins)
    roles = _kube_proxy_roles(objects)
    assert set(roles) == {"kube-system"}
    assert _grants(roles["kube-system"]["rules"]) == KUBE_PROXY_GRANTS
    (binding,) = [
        b for b in by_kind(objects, "RoleBinding") if b["metadata"]["namespace"] == "kube-system"
    ]
    assert binding["roleRef"]["name"] == roles["kube-system"]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pm-proxymode-operator", "namespace": "proxymode-system"}
    ]
    more = render(
        bins,
        set_values=["kubeProxy.namespace=kp", "rbac.extraKubeProxyNamespaces={kube-system,kp}"],
    )
    assert set(_kube_proxy_roles(more)) == {"kp", "kube-system"}, "listed once each"


def test_every_rbac_rule_is_commented() -> None:
    for template in ("clusterrole.yaml", "kube-proxy-role.yaml"):
        _assert_commented(template)


def _assert_commented(template: str) -> None:
    text = (CHART / "templates" / template).read_text().splitlines()
    starts = [i for i, line in enumerate(text) if line.strip().startswith("- apiGroups:")]
    for i in starts:
        above = text[i - 1].strip()
        if above.startswith("- apiGroups:") or above.startswith("verbs:"):
            # a rule continuing the comment block of the rule before it (services, endpointslices)
            above = text[i - 4].strip()
        assert above.startswith("#") or above.startswith("verbs:"), text[i]


def test_secrets_only_by_name_in_the_release_namespace(bins: Path) -> None:
    objects = render(bins)
    (role,) = [o for o in by_kind(objects, "Role") if o["metadata"]["namespace"] != "kube-system"]
    assert role["metadata"]["namespace"] == "proxymode-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    (binding,) = [
        b
        for b in by_kind(objects, "RoleBinding")
        if b["metadata"]["namespace"] == "proxymode-system"
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["namespace"] == "proxymode-system"
    # Nowhere else does any rule name secrets.
    for other in by_kind(objects, "Role"):
        if other is not role:
            assert not [r for r in other["rules"] if "secrets" in r["resources"]], other


def test_peering_is_on_by_default_and_brings_its_own_rbac(bins: Path) -> None:
    off = render(bins, set_values=["peering.enabled=false", "replicaCount=1"])
    assert not [k for k in _grants(_rules(off)) if k[0] in {"kopf.dev", "zalando.org"}]
    assert by_kind(off, "ClusterKopfPeering") == []  # never rendered: the operator makes it
    (standalone,) = one(off, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert not [a for a in standalone["args"] if a.startswith("--peering")]
    for on in (render(bins), render(bins, CHART / "ci" / "peering-on-values.yaml")):
        grants = _grants(_rules(on))
        # create: the operator makes the peering object when it is missing; it is no Helm
        # hook, which every upgrade and Argo CD sync would recreate empty (both replicas act).
        assert grants[("kopf.dev", "clusterkopfpeerings")] == {
            "get",
            "list",
            "watch",
            "patch",
            "create",
        }
        assert by_kind(on, "ClusterKopfPeering") == []
        (container,) = one(on, "Deployment")["spec"]["template"]["spec"]["containers"]
        assert "--peering=proxymode" in container["args"]
        crds = {c["metadata"]["name"] for c in by_kind(on, "CustomResourceDefinition")}
        assert "clusterkopfpeerings.kopf.dev" in crds
        assert one(on, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}


def test_two_replicas_without_peering_are_refused(bins: Path) -> None:
    result = helm_template(bins, set_values=["peering.enabled=false"], check=False)
    assert result.returncode != 0
    assert "replicaCount above 1 needs peering.enabled" in result.stderr


def test_peering_crd_in_crds_is_the_charts(bins: Path) -> None:
    """`kubectl apply -f crds/` (crds.enabled=false) installs the same peering CRD."""
    (rendered,) = [
        c
        for c in by_kind(render(bins), "CustomResourceDefinition")
        if c["metadata"]["name"] == "clusterkopfpeerings.kopf.dev"
    ]
    plain = yaml.safe_load((CHART.parent.parent / "crds" / PEERING_CRD_FILE).read_text())
    assert plain["spec"] == rendered["spec"]
    assert plain["metadata"]["name"] == rendered["metadata"]["name"]


def test_monitoring_objects_are_off_by_default(bins: Path) -> None:
    kinds = {o["kind"] for o in render(bins)}
    assert kinds == {
        "ServiceAccount",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",  # the operator's own /metrics
        "ValidatingAdmissionPolicy",  # the label guard, on by default
        "ValidatingAdmissionPolicyBinding",
    }
    (service,) = by_kind(render(bins), "Service")
    assert service["metadata"]["name"] == "pm-proxymode-operator-metrics"


def test_operator_metrics_are_served_and_scraped(bins: Path) -> None:
    objects = render(bins, CHART / "ci" / "monitoring-on-values.yaml")
    (c,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--metrics-address=0.0.0.0:8000" in c["args"]
    assert {"name": "metrics", "containerPort": 8000, "protocol": "TCP"} in c["ports"]
    (service,) = [
        o for o in by_kind(objects, "Service") if o["metadata"]["name"].endswith("-metrics")
    ]
    (monitor,) = [
        m for m in by_kind(objects, "ServiceMonitor") if "kube-proxy" not in m["metadata"]["name"]
    ]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert all(service["metadata"]["labels"][k] == v for k, v in selector.items())
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in service["spec"]["selector"].items())
    off = render(bins, set_values=["metrics.enabled=false"])
    (c,) = one(off, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert not [a for a in c["args"] if a.startswith("--metrics-address")]
    assert not by_kind(off, "Service")


def test_service_monitor_labels_kube_proxy_series_by_node_mode_and_pool(bins: Path) -> None:
    objects = render(bins, CHART / "ci" / "monitoring-on-values.yaml")
    (monitor,) = [
        m for m in by_kind(objects, "ServiceMonitor") if "kube-proxy" in m["metadata"]["name"]
    ]
    (service,) = [o for o in by_kind(objects, "Service") if "kube-proxy" in o["metadata"]["name"]]
    assert service["metadata"]["namespace"] == "kube-system"
    assert service["spec"]["selector"] == {"k8s-app": "kube-proxy"}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["kube-system"]}
    labels = service["metadata"]["labels"]
    assert all(labels[k] == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    assert labels[monitor["spec"]["jobLabel"]] == "kube-proxy"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    targets = {r["targetLabel"] for r in endpoint["relabelings"]}
    assert {"instance", "node", "proxymode_mode", "pool"} <= targets
    assert monitor["spec"]["attachMetadata"] == {"node": True}


def test_prometheus_rule_has_the_four_seeded_alerts_and_failed(bins: Path) -> None:
    rule = one(render(bins, CHART / "ci" / "monitoring-on-values.yaml"), "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts == {
        "KubeProxyRuleSyncSlow",
        "ConntrackUsageHigh",
        "ProxyModeMigrationRolledBack",
        "ProxyModeMigrationFailed",
        "ProxyModeMigrationStalled",
    }
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            assert r["labels"]["severity"] in {"warning", "critical"}
            assert r["annotations"]["summary"] and r["annotations"]["description"]
    only_seeds = one(
        render(
            bins,
            CHART / "ci" / "monitoring-on-values.yaml",
            set_values=[
                "monitoring.prometheusRule.rolledBack.enabled=false",
                "monitoring.prometheusRule.failed.enabled=false",
                "monitoring.prometheusRule.stalled.enabled=false",
            ],
        ),
        "PrometheusRule",
    )
    assert [g["name"] for g in only_seeds["spec"]["groups"]] == ["proxymode.kube-proxy"]


def test_dashboard_is_valid_grafana_json_with_the_promised_panels(bins: Path) -> None:
    cm = one(
        [
            o
            for o in render(bins, CHART / "ci" / "monitoring-on-values.yaml")
            if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")
        ],
        "ConfigMap",
    )
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["proxymode.json"])
    titles = {p["title"] for p in dashboard["panels"]}
    assert {
        "Sync latency p99 by mode",
        "Sync latency p99 by pool",
        "Conntrack usage by node",
        "Nodes moved per stage",
        "Policy phase",
    } <= titles
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    assert "by (proxymode_mode, le)" in exprs and "by (pool, le)" in exprs
    assert "node_nf_conntrack_entries_limit" in exprs
    assert "kube_customresource_proxymodepolicy_stage_nodes_done" in exprs
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_kube_state_metrics_config_matches_the_status_fields(bins: Path) -> None:
    objects = render(bins, CHART / "ci" / "monitoring-on-values.yaml")
    (cm,) = [
        o
        for o in by_kind(objects, "ConfigMap")
        if o["metadata"]["name"].endswith("-kube-state-metrics")
    ]
    config = yaml.safe_load(cm["data"]["proxymodepolicy.yaml"])
    (resource,) = config["spec"]["resources"]
    assert resource["groupVersionKind"] == {
        "group": "proxymode.io",
        "version": "v1alpha1",
        "kind": "ProxyModePolicy",
    }
    from proxymode.api.models import Phase, PolicyStatus, StageStatus  # noqa: PLC0415

    metrics = {m["name"]: m["each"] for m in resource["metrics"]}
    assert metrics["proxymodepolicy_phase"]["stateSet"]["list"] == [p.value for p in Phase]
    status_fields = set(PolicyStatus.model_json_schema(by_alias=True)["properties"])
    stage_fields = set(StageStatus.model_json_schema(by_alias=True)["properties"])
    assert metrics["proxymodepolicy_current_stage"]["gauge"]["path"][1] in status_fields
    assert metrics["proxymodepolicy_stage_nodes_done"]["gauge"]["valueFrom"][0] in stage_fields
    assert metrics["proxymodepolicy_stage_nodes_done"]["gauge"]["path"][1] in status_fields
    role = [
        o
        for o in by_kind(objects, "ClusterRole")
        if o["metadata"]["name"].endswith("-kube-state-metrics")
    ]
    assert role[0]["rules"] == [
        {
            "apiGroups": ["proxymode.io"],
            "resources": ["proxymodepolicies"],
            "verbs": ["list", "watch"],
        }
    ]


def test_network_policy_allows_only_dns_api_server_and_prometheus(bins: Path) -> None:
    policy = one(render(bins, CHART / "ci" / "networkpolicy-on-values.yaml"), "NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    # In: only Prometheus, only to the metrics port.
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    assert rule["from"][0]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "prometheus"}
    }
    off = one(
        render(
            bins,
            CHART / "ci" / "networkpolicy-on-values.yaml",
            set_values=["metrics.enabled=false"],
        ),
        "NetworkPolicy",
    )
    assert off["spec"]["ingress"] == []
    ports = [sorted(p["port"] for p in rule["ports"]) for rule in spec["egress"]]
    assert ports == [[53, 53], [443, 6443], [9090]]
    assert [b["ipBlock"]["cidr"] for b in spec["egress"][1]["to"]] == [
        "10.0.0.0/8",
        "192.168.0.0/16",
    ]
    deployment = one(render(bins), "Deployment")
    assert spec["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def _documented_paths(lines: list[str]) -> set[tuple[str, ...]]:
    """Key paths in values.yaml whose line has a `# --` comment block right above it."""
    documented: set[tuple[str, ...]] = set()
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, stripped.split(":", 1)[0].strip('"')))
        j = i - 1
        while (
            j >= 0 and lines[j].strip().startswith("#") and not lines[j].strip().startswith("# --")
        ):
            j -= 1
        if j >= 0 and lines[j].strip().startswith("# --"):
            documented.add(tuple(k for _, k in stack))
    return documented


def _leaves(tree: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(tree, dict) and tree:
        return [leaf for k, v in tree.items() for leaf in _leaves(v, (*path, str(k)))]
    return [path]


def test_every_value_is_documented() -> None:
    """Every value (or the map it belongs to) has a helm-docs `# --` comment."""
    text = (CHART / "values.yaml").read_text()
    documented = _documented_paths(text.splitlines())
    undocumented = [
        ".".join(leaf)
        for leaf in _leaves(yaml.safe_load(text))
        if not any(leaf[:n] in documented for n in range(1, len(leaf) + 1))
    ]
    assert undocumented == []


def test_values_schema_covers_every_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], tree: Any, path: str) -> None:
        if node.get("type") != "object" or "properties" not in node:
            return
        assert node.get("additionalProperties") is False, f"{path or '.'}: open object"
        for key, value in tree.items():
            assert key in node["properties"], f"{path}.{key} is not in values.schema.json"
            walk(node["properties"][key], value, f"{path}.{key}")

    walk(schema, values, "")


def test_template_fails_cleanly_without_a_service_account_name(bins: Path) -> None:
    result = helm_template(bins, set_values=["serviceAccount.create=false"], check=False)
    assert result.returncode != 0
    assert "serviceAccount.name is required" in result.stderr


OPERATOR_USER = "system:serviceaccount:proxymode-system:pm-proxymode-operator"


def test_label_guard_is_on_by_default_for_the_operators_service_account(bins: Path) -> None:
    """Decision 0063: Node CREATE/UPDATE only (never nodes/status), the operator's user
    skipped by a matchCondition, a denial that says why and what to do, every node bound."""
    objects = render(bins)
    policy = one(objects, "ValidatingAdmissionPolicy")
    binding = one(objects, "ValidatingAdmissionPolicyBinding")
    spec = policy["spec"]
    assert policy["metadata"]["name"] == "pm-proxymode-operator-label-guard"
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["nodes"],
        }
    ]
    users, groups = (c["expression"] for c in spec["matchConditions"])
    assert users == f'!(request.userInfo.username in ["{OPERATOR_USER}"])'
    assert groups == "!request.userInfo.groups.exists(g, g in [])"
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["guarded"] == '["proxymode.io/mode"]'
    (validation,) = spec["validations"]
    assert validation["expression"] == "size(variables.changed) == 0"
    for text in (validation["message"], validation["messageExpression"]):
        assert f"changed only by the proxymode operator ({OPERATOR_USER})" in text
        assert "skips the switching step and can run two kube-proxies" in text
        assert "use a ProxyModePolicy" in text and "labelGuard.allowedUsers" in text
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }


def test_label_guard_follows_its_values(bins: Path) -> None:
    objects = render(
        bins,
        set_values=[
            "serviceAccount.name=ops",
            "labelGuard.allowedUsers={jane@example.com,ci}",
            "labelGuard.allowedGroups={platform-admins}",
            "labelGuard.nodeSelector.matchLabels.pool=canary",
        ],
    )
    spec = one(objects, "ValidatingAdmissionPolicy")["spec"]
    users, groups = (c["expression"] for c in spec["matchConditions"])
    operator = "system:serviceaccount:proxymode-system:ops"
    assert users == f'!(request.userInfo.username in ["{operator}","jane@example.com","ci"])'
    assert groups == '!request.userInfo.groups.exists(g, g in ["platform-admins"])'
    assert f"({operator})" in spec["validations"][0]["message"]
    binding = one(objects, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["matchResources"] == {
        "objectSelector": {"matchLabels": {"pool": "canary"}}
    }
    off = render(bins, set_values=["labelGuard.enabled=false"])
    assert not by_kind(off, "ValidatingAdmissionPolicy")
    assert not by_kind(off, "ValidatingAdmissionPolicyBinding")


def test_label_guard_is_left_out_before_kubernetes_1_30(bins: Path) -> None:
    """ValidatingAdmissionPolicy v1 is GA from 1.30; the chart still installs on 1.29."""
    argv: list[Any] = [bins / "helm", "template", RELEASE, CHART, "--kube-version", "1.29.4"]
    objects = [o for o in yaml.safe_load_all(run(argv).stdout) if o]
    assert "Deployment" in {o["kind"] for o in objects}
    assert not by_kind(objects, "ValidatingAdmissionPolicy")
    assert not by_kind(objects, "ValidatingAdmissionPolicyBinding")
