"""DESIGN §3 holds on the real DaemonSet controller and scheduler.

A source DaemonSet patched to ``OnDelete`` plus a ``NotIn`` node affinity restarts
none of its pods; labelling a node takes the source pod off it; a second DaemonSet
with ``In`` affinity places a pod there only once the label says so. The test uses
a kubeadm-shaped clone of kube-proxy in its own namespace and its own label key,
so it shares nothing with other tests.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from proxymode_sandbox import kubeadm_proxy
from tests.sandbox.conftest import eventually, pods_by_node


def kube_proxy_clone(namespace: str, name: str, app: str) -> dict[str, Any]:
    """kubeadm's kube-proxy DaemonSet, renamed into ``namespace`` with its own selector."""
    objs = kubeadm_proxy.manifests("https://127.0.0.1:1", "v1.37.2")
    ds = copy.deepcopy(next(o for o in objs if o["kind"] == "DaemonSet"))
    ds["metadata"] = {"name": name, "namespace": namespace, "labels": {"k8s-app": app}}
    ds["spec"]["selector"] = {"matchLabels": {"k8s-app": app}}
    ds["spec"]["template"]["metadata"]["labels"] = {"k8s-app": app}
    ds["spec"]["template"]["spec"]["serviceAccountName"] = "default"
    ds["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"] = "missing-is-fine-on-kwok"
    return ds


def affinity(key: str, operator: str, values: list[str]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": key, "operator": operator, "values": values}]}
                ]
            }
        }
    }


@pytest.fixture
def mode_label(core: client.CoreV1Api) -> Iterator[str]:
    """A node label key private to this test, removed from every node afterwards."""
    key = f"test.proxymode.io/mode-{uuid.uuid4().hex[:6]}"
    try:
        yield key
    finally:
        for node in core.list_node().items:
            if key in (node.metadata.labels or {}):
                core.patch_node(node.metadata.name, {"metadata": {"labels": {key: None}}})


def test_two_daemonsets_hand_a_node_over_without_restarts(
    core: client.CoreV1Api, apps: client.AppsV1Api, namespace: str, mode_label: str
) -> None:
    nodes = sorted(n.metadata.name for n in core.list_node().items)
    source = kube_proxy_clone(namespace, "proxy", "proxy-src")
    apps.create_namespaced_daemon_set(namespace, source)
    before = eventually(
        lambda: (
            (p := pods_by_node(core, namespace, "k8s-app=proxy-src"))
            and len(p) == len(nodes)
            and all(x.status.phase == "Running" for x in p.values())
            and p
        ),
        what="a Ready source pod on every node",
    )
    uids = {node: pod.metadata.uid for node, pod in before.items()}

    # Step 4: OnDelete and NotIn [target, switching], in one patch.
    patch = {
        "spec": {
            "updateStrategy": {"type": "OnDelete", "rollingUpdate": None},
            "template": {
                "spec": {"affinity": affinity(mode_label, "NotIn", ["nftables", "switching"])}
            },
        }
    }
    patched = apps.patch_namespaced_daemon_set("proxy", namespace, patch)
    eventually(
        lambda: (
            apps.read_namespaced_daemon_set("proxy", namespace).status.observed_generation
            == patched.metadata.generation
        ),
        what="the DaemonSet controller to observe the patch",
    )
    time.sleep(3)  # give the controller time to (wrongly) restart anything
    assert {
        n: p.metadata.uid for n, p in pods_by_node(core, namespace, "k8s-app=proxy-src").items()
    } == uids

    # The target DaemonSet selects nodes labelled with the target mode: none yet.
    target = kube_proxy_clone(namespace, "proxy-nftables", "proxy-tgt")
    target["spec"]["template"]["spec"]["affinity"] = affinity(mode_label, "In", ["nftables"])
    apps.create_namespaced_daemon_set(namespace, target)
    eventually(
        lambda: (
            apps.read_namespaced_daemon_set("proxy-nftables", namespace).status.observed_generation
        ),
        what="the target DaemonSet to be observed",
    )
    assert (
        apps.read_namespaced_daemon_set("proxy-nftables", namespace).status.desired_number_scheduled
        == 0
    )

    # Step 5: the node goes through `switching`: the source pod leaves, no target pod comes.
    moved = nodes[0]
    core.patch_node(moved, {"metadata": {"labels": {mode_label: "switching"}}})
    eventually(
        lambda: moved not in pods_by_node(core, namespace, "k8s-app=proxy-src"),
        what="the source pod to leave the switching node",
    )
    time.sleep(2)
    assert pods_by_node(core, namespace, "k8s-app=proxy-tgt") == {}

    # Final label: the target pod arrives on that node only.
    core.patch_node(moved, {"metadata": {"labels": {mode_label: "nftables"}}})
    target_pods = eventually(
        lambda: (
            (p := pods_by_node(core, namespace, "k8s-app=proxy-tgt"))
            and moved in p
            and p[moved].status.phase == "Running"
            and p
        ),
        what="a Running target pod on the moved node",
    )
    assert set(target_pods) == {moved}
    after = pods_by_node(core, namespace, "k8s-app=proxy-src")
    assert moved not in after
    assert {n: p.metadata.uid for n, p in after.items()} == {
        n: u for n, u in uids.items() if n != moved
    }
