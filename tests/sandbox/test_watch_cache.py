"""The watch-fed cache on the real API server: a cold start lists once, changes arrive by
watch (no list per look), and a watch the RBAC refuses does not spin.

The last one is what made the chart's RBAC test time out on the first cut of the cache:
the ServiceAccount could list but not watch, every refused watch was followed at once by a
list and another refused watch, and that thread (two requests per turn, no pause) starved
the looks it fed until the migration missed its deadline.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from proxymode.engine.observed import MODE_LABEL, NodeView
from proxymode.kube.cache import ClusterCache, Watched
from proxymode.kube.observe import node_view
from proxymode_sandbox import Sandbox
from tests.sandbox.harness import eventually, service_account_client

pytestmark = pytest.mark.sandbox


def test_nodes_are_listed_once_then_watched(core: client.CoreV1Api) -> None:
    changed = threading.Event()
    nodes = Watched("nodes", core.list_node, node_view, changed.set)
    try:
        name = sorted(n.name for n in nodes.items())[0]
        label = f"watch-{time.monotonic_ns()}"
        core.patch_node(name, {"metadata": {"labels": {"proxymode.test/watched": label}}})
        eventually(
            lambda: any(
                n.name == name and n.labels.get("proxymode.test/watched") == label
                for n in nodes.items()
            ),
            timeout=30,
            what="the label change to reach the cache by watch",
        )
        assert changed.is_set(), "a label change must wake the policies"
        for _ in range(20):  # twenty looks' worth of reads
            nodes.items()
        assert nodes.lists == 1, f"listed {nodes.lists} times; a cold start lists once"
        assert nodes.watches >= 1
    finally:
        nodes.close()
        core.patch_node(name, {"metadata": {"labels": {"proxymode.test/watched": None}}})


def test_own_label_writes_are_read_fresh_until_the_node_watch_has_them(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    """A look right after the operator set a node's mode label must see it, even while the
    node watch is behind (here: its events held back), and go back to the cache once the
    watch has it; a write that was refused is read as the server has it."""
    name = f"ryw-{uuid.uuid4().hex[:8]}"
    # A bare node of its own, at ``switching``: no kube-proxy DaemonSet of another test
    # places a pod on it, and no other test's node is relabelled.
    core.create_node(
        client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={MODE_LABEL: "switching"}))
    )
    cache = ClusterCache(api, lambda: None)

    def view() -> NodeView | None:
        return next((n for n in cache.nodes() if n.name == name), None)

    try:
        eventually(lambda: view() is not None, timeout=30, what="the new node in the cache")
        watched = cache._nodes
        assert watched is not None
        eventually(lambda: watched.watches, timeout=30, what="the node watch to open")
        held: list[Any] = []
        deliver = watched._apply
        watched._apply = held.append  # type: ignore[method-assign]
        core.patch_node(name, {"metadata": {"labels": {MODE_LABEL: "nftables"}}})
        cache.expect_modes({name: "nftables"})
        assert (v := view()) is not None and v.mode_label == "nftables", "its own write, fresh"
        assert (v := view()) is not None and v.mode_label == "nftables", "still behind: fresh"
        assert cache.node_gets == 2
        held_view = watched.item(name)
        assert held_view is not None and held_view.mode_label == "switching", "cache behind"
        eventually(
            lambda: any((e.get("object") or {}).get("metadata", {}).get("name") == name
                        for e in held),
            timeout=30, what="the write's event to arrive",
        )  # fmt: skip
        watched._apply = deliver  # type: ignore[method-assign]
        for event in held:
            deliver(event)
        for _ in range(5):
            assert (v := view()) is not None and v.mode_label == "nftables"
        assert cache.node_gets == 2, "the watch has it: back to the cache, no GET"
        # A write whose test failed (the label was not what the engine saw): the expected
        # value never comes; one GET says what the server has, then the cache again.
        cache.expect_modes({name: "ipvs"})
        assert (v := view()) is not None and v.mode_label == "nftables", "the server's word"
        assert (v := view()) is not None and v.mode_label == "nftables"
        assert cache.node_gets == 3
    finally:
        cache.close()
        core.delete_node(name)


def test_a_refused_watch_backs_off_instead_of_spinning(
    sandbox: Sandbox,
    api: client.ApiClient,
    core: client.CoreV1Api,
    namespace: str,
    tmp_path: Path,
) -> None:
    """A ServiceAccount that may list nodes but not watch them (the chart before it had the
    verb): the cache holds the list and retries the watch with a growing pause."""
    rbac = client.RbacAuthorizationV1Api(api)
    who = f"list-only-{namespace}"
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "list-only"}})
    rbac.create_cluster_role(
        {
            "metadata": {"name": who},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": who},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": who,
            },
            "subjects": [{"kind": "ServiceAccount", "name": "list-only", "namespace": namespace}],
        }
    )
    try:
        weak = client.CoreV1Api(
            service_account_client(sandbox, core, namespace, "list-only", tmp_path)
        )
        eventually(lambda: _can_list(weak), timeout=30, what="the binding to take effect")
        nodes = Watched("nodes", weak.list_node, node_view, lambda: None)
        try:
            assert nodes.items(), "the list is allowed: the cache holds every node"
            time.sleep(4)
            # Refused watches at 0, 1, 3 s (backing off 1, 2, 4 s) and a list after each:
            # a handful, where a spinning thread makes hundreds.
            assert nodes.watches <= 4, f"{nodes.watches} refused watches in 4s: it spins"
            assert nodes.lists <= 5, f"{nodes.lists} lists in 4s: it spins"
        finally:
            nodes.close()
    finally:
        rbac.delete_cluster_role_binding(who)
        rbac.delete_cluster_role(who)


def _can_list(api: client.CoreV1Api) -> bool:
    try:
        api.list_node(limit=1)
    except client.ApiException:
        return False
    return True
