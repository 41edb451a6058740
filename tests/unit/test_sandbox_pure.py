"""Pure parts of the sandbox: topology, kubeadm config rendering, certificates."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from proxymode_sandbox.certs import CertificateAuthority
from proxymode_sandbox.cluster import (
    Sandbox,
    SandboxConfig,
    node_net_candidates,
    node_net_lock,
)
from proxymode_sandbox.kubeadm_proxy import config_conf, manifests
from proxymode_sandbox.topology import Topology, node_manifest


def test_topology_splits_nodes_into_pools() -> None:
    t = Topology.sized(6, canary=2, legacy=1)
    assert [(p.name, p.count) for p in t.pools] == [("canary", 2), ("general", 3), ("legacy", 1)]
    assert t.node_names() == [
        "canary-1",
        "canary-2",
        "general-1",
        "general-2",
        "general-3",
        "legacy-1",
    ]
    assert [p.name for p in Topology.sized(6).pools] == ["canary", "general"]
    with pytest.raises(ValueError, match="cannot split"):
        Topology.sized(2, canary=2, legacy=1)


def test_nodes_spread_over_zones_and_carry_kernel_info() -> None:
    pool = Topology.sized(6).pool("general")
    zones = [
        node_manifest(f"general-{i}", pool, i, "v1.37.2")["metadata"]["labels"][
            "topology.kubernetes.io/zone"
        ]
        for i in range(1, 5)
    ]
    assert zones == ["zone-a", "zone-b", "zone-c", "zone-a"]
    info = node_manifest("general-1", pool, 1, "v1.37.2")["status"]["nodeInfo"]
    assert info["kernelVersion"] == pool.kernel and info["kubeletVersion"] == "v1.37.2"


@pytest.mark.parametrize("mode", ["iptables", "ipvs", "nftables", ""])
def test_config_conf_is_a_kube_proxy_configuration_in_the_mode(mode: str) -> None:
    conf = yaml.safe_load(config_conf(mode))
    assert conf["apiVersion"] == "kubeproxy.config.k8s.io/v1alpha1"
    assert conf["kind"] == "KubeProxyConfiguration"
    assert conf["mode"] == mode
    assert conf["clientConnection"]["kubeconfig"] == "/var/lib/kube-proxy/kubeconfig.conf"


def test_manifests_are_kubeadms_objects_in_order() -> None:
    kinds = [
        (o["kind"], o["metadata"]["name"]) for o in manifests("https://127.0.0.1:6443", "v1.37.2")
    ]
    assert kinds == [
        ("ServiceAccount", "kube-proxy"),
        ("ClusterRoleBinding", "kubeadm:node-proxier"),
        ("Role", "kube-proxy"),
        ("RoleBinding", "kube-proxy"),
        ("ConfigMap", "kube-proxy"),
        ("DaemonSet", "kube-proxy"),
    ]


def test_certificates_chain_to_the_ca() -> None:
    ca = CertificateAuthority()
    leaf = ca.issue("admin", organizations=("system:masters",), client=True)
    cert = x509.load_pem_x509_certificate(leaf.cert_pem)
    ca_cert = x509.load_pem_x509_certificate(ca.pair.cert_pem)
    cert.verify_directly_issued_by(ca_cert)
    orgs = [a.value for a in cert.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)]
    assert orgs == ["system:masters"]


def test_a_sandbox_picks_a_node_network_nobody_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node addresses whose metrics port is taken (another sandbox) are skipped, and the
    choice is kept for the sandbox's life."""
    # Three networks outside the default fifty (127.0.10.-127.0.59.): the sandboxes other
    # test workers start at the same time pick from those and would take ``first`` under us.
    monkeypatch.setenv("PROXYMODE_SANDBOX_NODE_NET", "127.0.210.-127.0.212.")
    for d in "abc":
        (tmp_path / d).mkdir()
    first = Sandbox(SandboxConfig(state_dir=tmp_path / "a"))._node_net()
    with socket.socket() as taken:
        taken.bind((f"{first}1", 10249))
        assert first == "127.0.210."
        taken.listen()
        box = Sandbox(SandboxConfig(state_dir=tmp_path / "b"))
        second = box._node_net()
        assert second != first
        assert Sandbox(SandboxConfig(state_dir=tmp_path / "b"))._node_net() == second, "kept"
    monkeypatch.setenv("PROXYMODE_SANDBOX_NODE_NET", "127.0.42.")
    assert Sandbox(SandboxConfig(state_dir=tmp_path / "c"))._node_net() == "127.0.42."


def test_node_networks_come_from_one_prefix_a_range_or_the_default() -> None:
    assert node_net_candidates("127.0.42.") == ["127.0.42."]
    assert node_net_candidates("127.0.42") == ["127.0.42."]
    assert node_net_candidates("127.0.30.-127.0.33.") == [
        "127.0.30.",
        "127.0.31.",
        "127.0.32.",
        "127.0.33.",
    ]
    default = node_net_candidates("")
    assert default[0] == "127.0.10." and len(default) == 50


def test_two_sandboxes_started_at_once_never_share_a_node_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parallel test workers pick at the same instant, before any simulator listens: the
    lock, not the port probe, keeps them apart; it goes with the sandbox. Networks outside
    the default fifty, which other workers' sandboxes use."""
    monkeypatch.setenv("PROXYMODE_SANDBOX_NODE_NET", "127.0.220.-127.0.221.")
    for d in "abc":
        (tmp_path / d).mkdir()
    a = Sandbox(SandboxConfig(state_dir=tmp_path / "a"))
    b = Sandbox(SandboxConfig(state_dir=tmp_path / "b"))
    assert {a._node_net(), b._node_net()} == {"127.0.220.", "127.0.221."}
    held = node_net_lock(a._node_net())
    assert held is None, "another process's (or object's) lock is exclusive"
    a.down()
    again = Sandbox(SandboxConfig(state_dir=tmp_path / "c"))._node_net()
    assert again == "127.0.220.", "down() hands the network back"
