"""The fault matrix's worlds: one kubeadm-shaped kube-proxy per case, on nodes of its own.

As in tests/examples: each case's kube-proxy (DaemonSet, ConfigMap, ServiceAccount) lives in
its own namespace and runs on a disjoint set of sandbox nodes (a required hostname affinity),
so the cases run side by side in one sandbox and a node's ``proxymode.io/mode`` label, its
pods and its simulated metrics belong to one case only. Beside the real objects each world
has decoys the operator must never touch: a ``kube-proxy-windows`` DaemonSet (kubeadm ships
one; it schedules nowhere here) and a ``kube-proxy-extra`` ConfigMap.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Sequence
from typing import Any

from kubernetes import client

from proxymode_sandbox import kubeadm_proxy
from tests.sandbox.harness import KubeProxy, eventually, raw
from tests.sandbox.invariants import World, decoy_identities

DECOY_DS, DECOY_CM = "kube-proxy-windows", "kube-proxy-extra"
STAGES = [
    {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}, "bakeSeconds": 2},
    {"name": "half", "percent": 50, "bakeSeconds": 2},
    {"name": "all", "percent": 100, "bakeSeconds": 2},
]


def names(pool: str, first: int, last: int) -> list[str]:
    return [f"{pool}-{i}" for i in range(first, last + 1)]


def _on_nodes(nodes: Sequence[str]) -> dict[str, Any]:
    term = {"key": "kubernetes.io/hostname", "operator": "In", "values": sorted(nodes)}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [term]}]
            }
        }
    }


def install(api: client.ApiClient, case: str, nodes: Sequence[str]) -> tuple[KubeProxy, World]:
    """A fresh namespace with kube-proxy on exactly ``nodes`` (Ready there) and the decoys."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    namespace = f"f-{case}-{uuid.uuid4().hex[:5]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    objs = kubeadm_proxy.install_in(api, namespace, affinity=_on_nodes(nodes))
    extra = copy.deepcopy(objs["ConfigMap"])
    extra["metadata"]["name"] = DECOY_CM
    core.create_namespaced_config_map(namespace, extra)
    windows = copy.deepcopy(objs["DaemonSet"])
    windows["metadata"]["name"] = DECOY_DS
    windows["metadata"]["labels"] = {"k8s-app": DECOY_DS}
    windows["spec"]["selector"] = {"matchLabels": {"k8s-app": DECOY_DS}}
    windows["spec"]["template"]["metadata"]["labels"] = {"k8s-app": DECOY_DS}
    windows["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/os": "windows"}
    apps.create_namespaced_daemon_set(namespace, windows)
    eventually(
        lambda: (
            (d := apps.read_namespaced_daemon_set("kube-proxy", namespace).status)
            and d.number_ready == len(nodes) == d.desired_number_scheduled
        ),
        timeout=120,
        what=f"the kube-proxy of {case} to be Ready on {len(nodes)} nodes",
    )
    proxy = KubeProxy(namespace, sorted(nodes))
    proxy.ds_spec = raw(apps.read_namespaced_daemon_set, "kube-proxy", namespace)["spec"]
    proxy.cm_data = core.read_namespaced_config_map("kube-proxy", namespace).data
    world = World(
        name=case,
        namespace=namespace,
        nodes=set(nodes),
        source_spec=copy.deepcopy(proxy.ds_spec),
        decoys=decoy_identities(api, namespace, [DECOY_DS], [DECOY_CM]),
    )
    return proxy, world


def bump_image(api: client.ApiClient, world: World, image: str) -> None:
    """A person moves the source kube-proxy to another image (a patch release) mid-run."""
    container = world.source_spec["template"]["spec"]["containers"][0]["name"]
    patch = {"spec": {"template": {"spec": {"containers": [{"name": container, "image": image}]}}}}

    def edit(spec: dict[str, Any]) -> None:
        spec["template"]["spec"]["containers"][0]["image"] = image

    with world.edited(edit):  # the sampler must never see the person's edit as a violation
        client.AppsV1Api(api).patch_namespaced_daemon_set("kube-proxy", world.namespace, patch)


def source_image(api: client.ApiClient, namespace: str) -> str:
    ds = client.AppsV1Api(api).read_namespaced_daemon_set("kube-proxy", namespace)
    return str(ds.spec.template.spec.containers[0].image)


def assert_rolled_back_exactly(
    api: client.ApiClient, proxy: KubeProxy, world: World, labels: dict[str, dict[str, str]]
) -> None:
    """After a rollback: the source DaemonSet is the snapshot plus the person's edits, the
    ConfigMap is the snapshot's, the nodes carry exactly the labels they had, and the target
    objects are gone."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    spec = raw(apps.read_namespaced_daemon_set, "kube-proxy", proxy.namespace)["spec"]
    assert spec == world.source_spec, "the source DaemonSet is not the snapshot (+ edits)"
    assert core.read_namespaced_config_map("kube-proxy", proxy.namespace).data == proxy.cm_data
    now = {n.metadata.name: n.metadata.labels or {} for n in core.list_node().items}
    for node in world.nodes:
        assert now[node] == labels[node], f"{node}'s labels are not what they were"
    dss = sorted(d.metadata.name for d in apps.list_namespaced_daemon_set(proxy.namespace).items)
    assert dss == sorted(["kube-proxy", DECOY_DS]), f"target DaemonSet left: {dss}"
    cms = {c.metadata.name for c in core.list_namespaced_config_map(proxy.namespace).items}
    assert not {c for c in cms if c.startswith("kube-proxy-nftables")}, cms


def labels_of(api: client.ApiClient, nodes: Sequence[str]) -> dict[str, dict[str, str]]:
    wanted = set(nodes)
    return {
        n.metadata.name: dict(n.metadata.labels or {})
        for n in client.CoreV1Api(api).list_node().items
        if n.metadata.name in wanted
    }


WORLD_NODES: dict[str, list[str]] = {
    # Control-plane faults at its three moves: kube-apiserver restarted, etcd restarted, the
    # operator frozen. One canary, then 50% of 3 (one more), then the last.
    "control-plane": names("canary", 1, 1) + names("general", 1, 2),
    "prometheus": names("canary", 2, 2) + names("general", 3, 4),
    "image-finalize": names("canary", 3, 3) + names("general", 5, 6),
    "image-rollback": names("canary", 4, 4) + names("general", 7, 8),
    "label-removed": names("canary", 5, 5) + names("general", 9, 10),
    "label-set": names("canary", 6, 6) + names("general", 11, 12),
    # The same two edits under the chart's label guard: refused, nothing to tolerate.
    "label-guarded": names("canary", 8, 8) + names("general", 16, 17),
    # 4 nodes: one is deleted while it switches; the other three still finish.
    "node-deleted": names("canary", 7, 7) + names("general", 13, 15),
}
"""Which sandbox nodes each case of the concurrent round runs its kube-proxy on; the later
rounds (the kill loop, two replicas) reuse the nodes of cases that have finished."""
CANARY_NODES = sum(1 for ns in WORLD_NODES.values() for n in ns if n.startswith("canary-"))
NODES = sum(len(ns) for ns in WORLD_NODES.values())
