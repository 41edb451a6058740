"""The sandbox is a real control plane: pinned version, TLS, RBAC, kubeadm's kube-proxy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from proxymode_sandbox import Sandbox
from proxymode_sandbox.kubeconfig import write_kubeconfig
from tests.sandbox.conftest import pods_by_node

REPO = Path(__file__).resolve().parents[2]


def pinned_kubernetes_version() -> str:
    text = (REPO / "sandbox/k8sbin/go.mod").read_text()
    match = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v1\.\d+\.\d+)", text, re.M)
    assert match, "k8sbin/go.mod pins no k8s.io/kubernetes version"
    return match.group(1)


def test_api_serves_the_pinned_version(api: client.ApiClient) -> None:
    info = client.VersionApi(api).get_code()
    assert info.git_version == pinned_kubernetes_version()
    assert info.major == "1"
    assert info.minor == pinned_kubernetes_version().split(".")[1]


def test_every_component_is_running(sandbox: Sandbox) -> None:
    status = sandbox.status()
    names = {c.name for c in status.components}
    assert names >= {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
    assert names <= {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "kube-proxy-metrics",
        "prometheus",
        # Prometheus on the bridge, for monitoring/prometheus-operated (decision 0032)
        "prometheus-forwarder",
        "operator",
    }
    assert status.healthy, [c for c in status.components if not c.running]


def test_rbac_refuses_an_unprivileged_service_account(
    sandbox: Sandbox, core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
    )
    token = core.create_namespaced_service_account_token(
        "nobody",
        namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
        ),
    ).status.token
    ca = (sandbox.pki / "ca.crt").read_bytes()
    kc = write_kubeconfig(tmp_path / "nobody", sandbox.server, ca, user="nobody", token=token)
    weak = client.CoreV1Api(config.new_client_from_config(config_file=str(kc)))
    with pytest.raises(ApiException) as refused:
        weak.list_namespaced_config_map("kube-system")
    assert refused.value.status == 403
    assert f"system:serviceaccount:{namespace}:nobody" in refused.value.body
    with pytest.raises(ApiException) as refused_nodes:
        weak.patch_node("canary-1", {"metadata": {"labels": {"x": "y"}}})
    assert refused_nodes.value.status == 403
    # Authenticated, so it may ask who it is: the token itself is valid, only RBAC says no.
    review = client.AuthenticationV1Api(weak.api_client).create_self_subject_review(
        client.V1SelfSubjectReview()
    )
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:nobody"


def test_an_anonymous_client_cannot_read_objects(sandbox: Sandbox) -> None:
    anon = client.Configuration()
    anon.host = sandbox.server
    anon.ssl_ca_cert = str(sandbox.pki / "ca.crt")
    with pytest.raises(ApiException) as refused:
        client.CoreV1Api(client.ApiClient(anon)).list_node()
    assert refused.value.status == 403


def test_nodes_look_like_a_real_cluster(core: client.CoreV1Api) -> None:
    nodes = {n.metadata.name: n for n in core.list_node().items}
    pools = {name: n.metadata.labels["pool"] for name, n in nodes.items()}
    assert sorted(pools.values()).count("canary") == 2
    assert sorted(pools.values()).count("legacy") == 1
    zones = {n.metadata.labels["topology.kubernetes.io/zone"] for n in nodes.values()}
    assert len(zones) == 3
    for n in nodes.values():
        assert any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)
        assert n.status.node_info.kubelet_version == pinned_kubernetes_version()
        internal = [a.address for a in n.status.addresses if a.type == "InternalIP"]
        assert internal and internal[0].startswith("127.")
    kernels = {n.metadata.labels["pool"]: n.status.node_info.kernel_version for n in nodes.values()}
    assert kernels["legacy"].startswith("4.18"), "the legacy pool runs a pre-5.13 kernel"
    assert kernels["canary"] != kernels["general"]


def test_kube_proxy_is_installed_the_kubeadm_way(
    core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    ds = apps.read_namespaced_daemon_set("kube-proxy", "kube-system")
    assert ds.spec.selector.match_labels == {"k8s-app": "kube-proxy"}
    pod = ds.spec.template.spec
    assert pod.host_network is True
    assert pod.priority_class_name == "system-node-critical"
    assert pod.service_account_name == "kube-proxy"
    assert pod.containers[0].command == [
        "/usr/local/bin/kube-proxy",
        "--config=/var/lib/kube-proxy/config.conf",
        "--hostname-override=$(NODE_NAME)",
    ]
    assert pod.volumes[0].config_map.name == "kube-proxy"
    cm = core.read_namespaced_config_map("kube-proxy", "kube-system")
    assert set(cm.data) == {"config.conf", "kubeconfig.conf"}
    conf = yaml.safe_load(cm.data["config.conf"])
    assert conf["kind"] == "KubeProxyConfiguration"
    assert conf["mode"] == "iptables"
    assert conf["iptables"]["syncPeriod"] == "30s"
    binding = client.RbacAuthorizationV1Api(core.api_client).read_cluster_role_binding(
        "kubeadm:node-proxier"
    )
    assert binding.role_ref.name == "system:node-proxier"


def test_kube_proxy_runs_ready_on_every_node(
    core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    nodes = {n.metadata.name for n in core.list_node().items}
    ds = apps.read_namespaced_daemon_set("kube-proxy", "kube-system")
    assert ds.status.desired_number_scheduled == len(nodes)
    assert ds.status.number_ready == len(nodes)
    pods = pods_by_node(core, "kube-system", "k8s-app=kube-proxy")
    assert set(pods) == nodes, "exactly one kube-proxy pod per node"
    for node, pod in pods.items():
        assert pod.status.phase == "Running", node
        assert pod.status.pod_ip.startswith("127."), "hostNetwork pods take the node's IP"
