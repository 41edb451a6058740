"""kwok simulates what the operator must survive: crash-looping pods, nodes coming and going."""

from __future__ import annotations

from kubernetes import client

from proxymode_sandbox import Sandbox
from tests.sandbox.conftest import eventually, pods_by_node


def _restarts(pod: client.V1Pod) -> int:
    return sum(c.restart_count for c in pod.status.container_statuses or [])


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def test_a_chosen_pod_crash_loops_on_demand(
    sandbox: Sandbox, core: client.CoreV1Api, namespace: str
) -> None:
    for name in ("victim", "bystander"):
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": name},
                "spec": {
                    "nodeSelector": {"pool": "general"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "app", "image": "app:1"}],
                },
            },
        )
    for name in ("victim", "bystander"):
        eventually(
            lambda n=name: _ready(core.read_namespaced_pod(n, namespace)), what=f"{name} Ready"
        )

    sandbox.set_crashloop(namespace, "victim")
    first = eventually(
        lambda: (
            (p := core.read_namespaced_pod("victim", namespace))
            and not _ready(p)
            and _restarts(p) >= 1
            and p
        ),
        what="the victim to stop being Ready",
    )
    waiting = first.status.container_statuses[0].state.waiting
    assert waiting is not None and waiting.reason == "CrashLoopBackOff"
    eventually(
        lambda: _restarts(core.read_namespaced_pod("victim", namespace)) >= _restarts(first) + 2,
        what="the restart count to keep rising",
    )
    bystander = core.read_namespaced_pod("bystander", namespace)
    assert _ready(bystander) and _restarts(bystander) == 0


def test_nodes_join_and_leave_while_things_run(sandbox: Sandbox, core: client.CoreV1Api) -> None:
    before = set(sandbox.node_names())
    added = sandbox.add_node("general")
    try:
        assert added not in before
        node = core.read_node(added)
        assert node.metadata.labels["pool"] == "general"
        pod = eventually(
            lambda: (
                (p := pods_by_node(core, "kube-system", "k8s-app=kube-proxy").get(added))
                and _ready(p)
                and p
            ),
            what="kube-proxy to start on the new node",
        )
        assert pod.spec.node_name == added
    finally:
        sandbox.remove_node(added)
    assert set(sandbox.node_names()) == before
    eventually(
        lambda: added not in pods_by_node(core, "kube-system", "k8s-app=kube-proxy"),
        what="the removed node's kube-proxy pod to go",
    )
    sandbox.wait_kube_proxy_ready()
