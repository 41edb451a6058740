"""Fixtures for the tests that apply examples/ to a real API server and run them to the end.

One sandbox serves the whole module (``scope="module"``), and the four migration examples run
in it AT THE SAME TIME, each in its own "world": its own kubeadm-shaped kube-proxy (DaemonSet,
ConfigMap, ServiceAccount, as ``tests.sandbox.harness.install_kube_proxy`` makes them) in its
own namespace, whose DaemonSet runs on a disjoint set of nodes (node affinity on the
hostname), with a canary pool and a general pool of its own. Why:

- A migration takes one to three minutes even with seconds of bake (each stage waits out the
  analysis warm-up, nodes move one at a time, finalize hands every node back). One after the
  other the four would take about ten minutes; side by side, as long as the longest.
- Separate kube-proxies reset nothing between tests: each starts from a fresh iptables
  kube-proxy, and the sandbox's own kube-system one is never touched.
- Disjoint nodes keep them apart: a node's ``proxymode.io/mode`` label, its pods and its
  simulated metrics belong to one world only. The invariant sampler of each world counts
  only its own nodes (``Sampler(..., nodes=...)``).

Everything started here is stopped in a ``finally``, also on failure: the policies are deleted
and waited for (a mixed-mode one is rolled back first), then the namespaces, the operator and
the sandbox go.

The sandbox's pools are its topology's (label ``pool``): ``canary``, ``general`` and ``legacy``
(RHEL 8, kernel 4.18, which nftables mode refuses).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from proxymode_sandbox import Sandbox, SandboxConfig, kubeadm_proxy
from proxymode_sandbox.process import log_tail
from tests.sandbox.harness import KubeProxy, eventually, raw

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DATA = Path(__file__).resolve().parent / "data"
POLICY_CRD = ROOT / "crds" / "proxymode.io_proxymodepolicies.yaml"
ARGOCD_CRDS = DATA / "argocd-crds.yaml"
ARGOCD_NAMESPACE = "argocd"


def _names(pool: str, first: int, last: int) -> tuple[str, ...]:
    return tuple(f"{pool}-{i}" for i in range(first, last + 1))


WORLD_NODES: Mapping[str, tuple[str, ...]] = {
    # 9 nodes: every percent stage (25%, 50%, 100%) selects at least one node more than the
    # stage before (25% of 9 is 3, one more than the canary pool); an empty stage would be a
    # preflight Warning and prove nothing.
    "iptables-to-nftables-canary.yaml": _names("canary", 1, 2) + _names("general", 1, 7),
    # 5 nodes: canary 2, half 3, all 5. ipvs runs on any kernel; cleanup Jobs on every node.
    "iptables-to-ipvs-metallb.yaml": _names("canary", 3, 4) + _names("general", 8, 10),
    # Both pools the policy moves, plus the legacy node it must leave on iptables.
    "partial-pools-mixed-mode.yaml": (
        _names("canary", 5, 6) + _names("general", 11, 12) + ("legacy-1",)
    ),
    # 5 nodes: canary 2, then the other 3.
    "custom-success-rate-check.yaml": _names("canary", 7, 8) + _names("general", 13, 15),
}
"""Which sandbox nodes each migration example's kube-proxy runs on."""


def _pool_size(pool: str) -> int:
    return sum(1 for nodes in WORLD_NODES.values() for n in nodes if n.startswith(f"{pool}-"))


CANARY_NODES, LEGACY_NODES = _pool_size("canary"), _pool_size("legacy")
NODES = CANARY_NODES + LEGACY_NODES + _pool_size("general")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A real control plane, kwok nodes in three pools, simulated kube-proxy metrics and a real
    Prometheus scraping them; stopped however the module ends."""
    state = tmp_path_factory.mktemp("examples-sandbox")
    box = Sandbox(
        SandboxConfig(
            state_dir=state / "state",
            nodes=NODES,
            canary_nodes=CANARY_NODES,
            legacy_nodes=LEGACY_NODES,
        )
    )
    try:
        box.up()
        assert set(box.node_names()) == {n for ns in WORLD_NODES.values() for n in ns}
        yield box
    finally:
        box.down()


@pytest.fixture(scope="module")
def api(sandbox: Sandbox) -> client.ApiClient:
    """An admin API client for the sandbox."""
    return config.new_client_from_config(config_file=str(sandbox.kubeconfig))


@pytest.fixture(scope="module")
def cluster(sandbox: Sandbox, api: client.ApiClient) -> Sandbox:
    """The sandbox with every CRD the examples' kinds need (Established) and the argocd
    namespace (argocd-cm-patch.yaml and the Applications are namespaced there)."""
    for crd in (POLICY_CRD, ARGOCD_CRDS):
        sandbox.kubectl("apply", "--server-side", "-f", str(crd))
    sandbox.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/proxymodepolicies.proxymode.io",
        "crd/applications.argoproj.io",
    )
    core = client.CoreV1Api(api)
    try:
        core.create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=ARGOCD_NAMESPACE))
        )
    except ApiException as e:
        if e.status != 409:
            raise
    return sandbox


@pytest.fixture(scope="module")
def operator(cluster: Sandbox) -> Iterator[Sandbox]:
    """The proxymode operator running as its own process against the sandbox."""
    record = cluster.start_operator()
    try:
        yield cluster
    finally:
        cluster.stop_operator()
        # Shown by pytest only when something failed: what the operator said last.
        print(f"--- last lines of {record.log} ---\n{log_tail(record.log, 40)}")
        kubelet = cluster.dir / "logs" / "kubelet.log"
        if kubelet.is_file():  # a real kube-proxy's exit, with what it said
            print([line for line in kubelet.read_text().splitlines() if " exited with " in line])


def install_kube_proxy_on(api: client.ApiClient, namespace: str, nodes: Sequence[str]) -> KubeProxy:
    """kube-proxy as kubeadm installs it (``install_kube_proxy``'s objects), in ``namespace``,
    with its DaemonSet placed on exactly ``nodes`` by a required hostname affinity (as a
    DaemonSet with a node selector would be); returns once it is Ready on all of them."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    on_nodes = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": sorted(nodes),
                            }
                        ]
                    }
                ]
            }
        }
    }
    kubeadm_proxy.install_in(api, namespace, affinity=on_nodes)
    eventually(
        lambda: (
            (d := apps.read_namespaced_daemon_set("kube-proxy", namespace).status)
            and d.number_ready == len(nodes) == d.desired_number_scheduled
        ),
        what=f"the kube-proxy in {namespace} to be Ready on {len(nodes)} nodes",
    )
    proxy = KubeProxy(namespace, sorted(nodes))
    proxy.ds_spec = raw(apps.read_namespaced_daemon_set, "kube-proxy", namespace)["spec"]
    proxy.cm_data = core.read_namespaced_config_map("kube-proxy", namespace).data
    return proxy


def node_labels(core: client.CoreV1Api, nodes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The labels of ``nodes``, by name."""
    wanted = set(nodes)
    return {
        n.metadata.name: dict(n.metadata.labels or {})
        for n in core.list_node().items
        if n.metadata.name in wanted
    }


def delete_namespace_quietly(core: client.CoreV1Api, name: str) -> None:
    with contextlib.suppress(ApiException):
        core.delete_namespace(name)
