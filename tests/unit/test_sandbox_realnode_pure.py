"""Pure parts of the real nodes: names, addresses, Service objects, pod materialisation."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from proxymode_sandbox import kubeadm_proxy, netns, services
from proxymode_sandbox.cluster import _third_octet
from proxymode_sandbox.podspec import (
    NodeInfo,
    PodSpecError,
    prepare,
    termination_log,
    termination_message,
)


def test_names_are_unique_per_sandbox_and_fit_the_kernel_limit(tmp_path: Path) -> None:
    a, b = netns.sandbox_id(tmp_path / "a"), netns.sandbox_id(tmp_path / "b")
    assert a != b and len(a) == 5
    assert netns.sandbox_id(tmp_path / "a") == a  # stable: `down` finds them after a crash
    bridge = netns.Bridge(a, 24)
    for name in (bridge.name, bridge.veth("n", 99), bridge.veth("b", 99)):
        assert len(name) <= 15, name
    assert bridge.netns("general-1") == f"pm-{a}-general-1"
    assert (bridge.host_ip, bridge.address(11)) == ("10.250.24.1", "10.250.24.11")
    assert str(bridge.network) == "10.250.24.0/24"


def test_the_real_nodes_net_follows_the_node_net_prefix() -> None:
    assert _third_octet("127.0.24.") == 24
    assert _third_octet("weird") is None


def test_echo_and_extra_services_have_slices_to_the_backends() -> None:
    objs = list(services.objects(["10.250.24.101", "10.250.24.102"], extra=3))
    kinds = [o["kind"] for o in objs]
    assert kinds[0] == "Namespace" and kinds.count("Service") == 4
    assert kinds.count("EndpointSlice") == 4
    echo = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "echo")
    assert echo["spec"]["clusterIP"] == services.ECHO_CLUSTER_IP
    slice_ = next(o for o in objs if o["metadata"]["name"] == "svc-00003-real")
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "svc-00003"
    assert [e["addresses"] for e in slice_["endpoints"]] == [["10.250.24.101"], ["10.250.24.102"]]


def test_node_kubeconfig_names_a_san_and_config_suits_a_namespace() -> None:
    objs = kubeadm_proxy.manifests("https://10.250.24.1:6443", "v1.37.2", "iptables", "kubernetes")
    cm = next(o for o in objs if o["kind"] == "ConfigMap")
    kc = yaml.safe_load(cm["data"]["kubeconfig.conf"])
    assert kc["clusters"][0]["cluster"]["tls-server-name"] == "kubernetes"
    conf = yaml.safe_load(cm["data"]["config.conf"])
    assert conf["metricsBindAddress"] == "0.0.0.0:10249"
    assert conf["conntrack"]["maxPerCore"] == 0  # nf_conntrack_max is read-only in a netns


class _Core:
    """Answers the two reads ``prepare`` makes (a ConfigMap, a token): pure plumbing."""

    def read_namespaced_config_map(self, name: str, ns: str) -> Any:
        return SimpleNamespace(data={"config.conf": f"{ns}/{name}"})

    def create_namespaced_service_account_token(self, sa: str, ns: str, body: Any) -> Any:
        assert body["spec"]["boundObjectRef"]["kind"] == "Pod"
        return SimpleNamespace(status=SimpleNamespace(token=f"token-for-{ns}/{sa}"))


def _pod(**container: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "kube-proxy-x", "namespace": "kube-system", "uid": "u-1"},
        "spec": {
            "nodeName": "general-1",
            "serviceAccountName": "kube-proxy",
            "containers": [{"name": "kube-proxy", **container}],
            "volumes": [
                {"name": "kube-proxy", "configMap": {"name": "kube-proxy"}},
                {"name": "lock", "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}},
                {
                    "name": "api",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}
                        ]
                    },
                },
            ],
        },
    }


def test_prepare_materialises_volumes_and_maps_the_binary(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "kube-proxy").write_text("")
    node = NodeInfo("general-1", "pm-abcde-general-1", "10.250.24.11", tmp_path / "node")
    pod = _pod(
        command=["/usr/local/bin/kube-proxy", "--hostname-override=$(NODE_NAME)"],
        env=[{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        volumeMounts=[
            {"name": "kube-proxy", "mountPath": "/var/lib/kube-proxy"},
            {"name": "lock", "mountPath": "/run/xtables.lock"},
            {"name": "api", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
        ],
    )
    launch = prepare(_Core(), pod, node, tmp_path / "pod", tmp_path / "bin")
    assert launch.argv[:4] == ["ip", "netns", "exec", "pm-abcde-general-1"]
    assert launch.argv[-2:] == [
        str(tmp_path / "bin" / "kube-proxy"),
        "--hostname-override=general-1",
    ]
    script = launch.argv[launch.argv.index("-c") + 1]
    assert f"mount --bind {tmp_path}/pod/volumes/kube-proxy /var/lib/kube-proxy" in script
    assert f"{tmp_path}/node/host/run/xtables.lock /run/xtables.lock" in script  # per node
    volumes = tmp_path / "pod" / "volumes"
    assert (volumes / "kube-proxy" / "config.conf").read_text() == "kube-system/kube-proxy"
    assert (volumes / "api" / "token").read_text() == "token-for-kube-system/kube-proxy"


def test_prepare_refuses_what_it_cannot_run(tmp_path: Path) -> None:
    node = NodeInfo("n", "ns", "10.250.24.11", tmp_path)
    with pytest.raises(PodSpecError, match="no command"):
        prepare(_Core(), _pod(), node, tmp_path / "pod", tmp_path)


def test_the_verification_job_runs_from_the_venv_and_reports_a_termination_message(
    tmp_path: Path,
) -> None:
    """issue 11: ``proxymode`` (not a sandbox binary) runs from the project's venv; the
    container's termination-message path is the pod's own file, read back on exit."""
    (tmp_path / "bin").mkdir()
    node = NodeInfo("general-1", "pm-abcde-general-1", "10.250.24.11", tmp_path / "node")
    pod = _pod(command=["proxymode", "verify-node", "--mode=nftables"])
    launch = prepare(_Core(), pod, node, tmp_path / "pod", tmp_path / "bin")
    assert launch.argv[-3:] == [str(Path(sys.executable).parent / "proxymode"), "verify-node",
                                "--mode=nftables"]  # fmt: skip
    script = launch.argv[launch.argv.index("-c") + 1]
    assert f"mount --bind {termination_log(tmp_path / 'pod')} /dev/termination-log" in script
    container: dict[str, Any] = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    assert termination_message(tmp_path / "pod", container, 1) == ""  # no file, no log yet
    (tmp_path / "pod" / "container.log").write_text("Traceback: boom\n")
    assert termination_message(tmp_path / "pod", container, 1) == "Traceback: boom\n"
    assert termination_message(tmp_path / "pod", {}, 1) == ""  # File policy: the file only
    termination_log(tmp_path / "pod").write_text('{"v":1,"ok":true}' + "x" * 5000)
    assert len(termination_message(tmp_path / "pod", container, 0)) == 4096
