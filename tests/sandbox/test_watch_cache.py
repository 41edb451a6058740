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

from proxymode.api import models
from proxymode.engine.actions import SetNodeMode
from proxymode.engine.observed import MODE_LABEL, NodeView
from proxymode.kube import observe as observe_module
from proxymode.kube import watched as watched_module
from proxymode.kube.cache import ClusterCache, Watched
from proxymode.kube.execute import Executor
from proxymode.kube.observe import Observer, node_view
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
    watch holds the server's version. A label that went back to an earlier value must not
    be taken as caught up by a watch that still has the first write to deliver; a failed
    GET is tried once more, then fails the look rather than give the held copy."""
    name = f"ryw-{uuid.uuid4().hex[:8]}"
    # A bare node of its own, at ``switching``: no kube-proxy DaemonSet of another test
    # places a pod on it, and no other test's node is relabelled.
    core.create_node(
        client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={MODE_LABEL: "switching"}))
    )
    cache = ClusterCache(api, lambda: None)

    def mode() -> str | None:
        return _mode(cache, name)

    def label(value: str | None) -> str:
        node = core.patch_node(name, {"metadata": {"labels": {MODE_LABEL: value}}})
        return str(node.metadata.resource_version)

    try:
        watched = _watching(cache, name)
        held: list[Any] = []
        deliver = watched._apply

        def arrived(version: str) -> bool:
            return any(
                (e.get("object") or {}).get("metadata", {}).get("resourceVersion") == version
                for e in held
            )

        watched._apply = held.append  # type: ignore[method-assign]
        written = label("nftables")
        cache.unsettle_nodes([name])
        assert mode() == "nftables", "its own write, fresh"
        assert mode() == "nftables", "still behind: fresh"
        assert cache.node_gets == 2
        held_view = watched.item(name)
        assert held_view is not None and held_view.mode_label == "switching", "cache behind"
        eventually(lambda: arrived(written), timeout=30, what="the write's event")
        for event in held:
            deliver(event)
        held.clear()
        for _ in range(5):
            assert mode() == "nftables"
        assert cache.node_gets == 3, "one GET finds the watch caught up; then the cache"

        # Switching, then back to nftables (a quick rollback), while the watch is behind:
        # its copy says nftables, the value written, and is still stale.
        first, second = label("switching"), label("nftables")
        cache.unsettle_nodes([name])
        eventually(lambda: arrived(first) and arrived(second), timeout=30, what="both events")
        assert mode() == "nftables"  # the cache agrees by value, and is still behind
        while held:  # the watch up to the first write (the node controller may add more)
            event = held.pop(0)
            deliver(event)
            if event["object"]["metadata"]["resourceVersion"] == first:
                break
        assert watched.item(name) is not None and watched.item(name).mode_label == "switching"
        assert mode() == "nftables", "not settled by an earlier value"
        # The server failing a GET once: tried again. Failing twice: the look fails rather
        # than see the held (stale) copy, and the node stays unsettled.
        read = cache._read_node
        failures = [client.ApiException(status=503, reason="Service Unavailable")]

        def flaky(node: str) -> tuple[NodeView | None, str | None]:
            if failures:
                raise failures.pop()
            return read(node)

        cache._read_node = flaky  # type: ignore[method-assign]
        assert mode() == "nftables", "a second GET after a failed one"
        failures[:] = [client.ApiException(status=503, reason="Service Unavailable")] * 2
        with pytest.raises(client.ApiException):
            mode()
        cache._read_node = read  # type: ignore[method-assign]
        gets = cache.node_gets
        for event in held:
            deliver(event)
        watched._apply = deliver  # type: ignore[method-assign]
        for _ in range(5):
            assert mode() == "nftables"
        assert cache.node_gets == gets + 1, "caught up: one GET, then the cache"
        # A batch refused before its write: the GET shows the version the watch has.
        cache.unsettle_nodes([name])
        assert mode() == "nftables" and mode() == "nftables"
        assert cache.node_gets == gets + 2
    finally:
        cache.close()
        core.delete_node(name)


def test_a_written_node_is_served_from_the_writes_answer_until_the_watch_has_it(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    """The operator's own label change, answered by the server, needs no GET: the answer is
    served while the node watch is behind (its events held back) and given up for the
    watch's copy once the watch has got that far, a later change by someone else included.
    A refused change (the label was not what the engine saw) is read fresh instead."""
    name = f"wrote-{uuid.uuid4().hex[:8]}"
    core.create_node(
        client.V1Node(metadata=client.V1ObjectMeta(name=name, labels={MODE_LABEL: "switching"}))
    )
    cache = ClusterCache(api, lambda: None)
    executor = Executor(api, "wrote-test", lambda _: None, cache.wrote_node)

    def mode() -> str | None:
        return _mode(cache, name)

    try:
        watched = _watching(cache, name)
        held: list[Any] = []
        deliver = watched._apply
        watched._apply = held.append  # type: ignore[method-assign]
        assert executor.run([SetNodeMode(name, "nftables", "switching")]) == 1
        for _ in range(3):
            assert mode() == "nftables", "the write's answer, while the watch is behind"
        assert cache.node_gets == 0, "an answered write is not read again"
        held_view = watched.item(name)
        assert held_view is not None and held_view.mode_label == "switching", "cache behind"
        assert cache._written, "kept until the watch has it"

        # Someone else changes the node after the write; the watch delivers both.
        core.patch_node(name, {"metadata": {"labels": {"proxymode.test/other": "x"}}})
        eventually(lambda: len(held) >= 2, timeout=30, what="both events")
        for event in held:
            deliver(event)
        held.clear()
        watched._apply = deliver  # type: ignore[method-assign]

        def replaced() -> bool:
            other = any(
                n.name == name and n.labels.get("proxymode.test/other") for n in cache.nodes()
            )
            return other and not cache._written  # nodes() first: it is what lets go

        eventually(
            replaced,
            timeout=30,
            what="the watch's copy, the later change in it, to replace the answer",
        )
        assert mode() == "nftables" and cache.node_gets == 0

        # Refused: the label is nftables, not the switching the engine saw. Read fresh.
        assert executor.run([SetNodeMode(name, "iptables", "switching")]) == 0
        cache.unsettle_nodes([name])  # what the reconciler does for an unanswered change
        assert mode() == "nftables"
        assert cache.node_gets >= 1, "a refused change is read from the server"
    finally:
        cache.close()
        core.delete_node(name)


def test_a_cold_start_lists_in_pages(
    core: client.CoreV1Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list is read a page at a time (a bounded peak of decoded JSON) and still holds
    every node, from one consistent snapshot that the watch then goes on from."""
    monkeypatch.setattr(watched_module, "LIST_PAGE", 2)
    everything = {n.metadata.name for n in core.list_node().items}
    assert len(everything) > 2, "more nodes than a page, or the test proves nothing"
    pages: list[int] = []

    def list_node(*args: Any, **kwargs: Any) -> Any:
        pages.append(kwargs["limit"])
        return core.list_node(*args, **kwargs)

    nodes = Watched("nodes", list_node, node_view, lambda: None)
    try:
        assert everything <= {n.name for n in nodes.items()}
        assert len(pages) >= 2 and set(pages) == {2}, f"pages asked: {pages}"
        assert nodes.lists == 1
        eventually(lambda: nodes.watches, timeout=30, what="the watch to open from the list")
    finally:
        nodes.close()


def test_preflight_names_static_kube_proxy_pods_from_the_cache_or_a_paged_list(
    api: client.ApiClient, core: client.CoreV1Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Static kube-proxy pods (mirror pods named after the DaemonSet) are found from the pod
    cache when the operator has one, and from a list read a page at a time when not: the
    whole namespace's pods at once (a pod a node) were the operator's peak memory at 5,000
    nodes. Neither way names a pod that is not a mirror, nor a mirror of something else."""
    monkeypatch.setattr(observe_module, "LIST_PAGE", 2)
    ns = f"static-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    mirror = {"kubernetes.io/config.mirror": "0123abcd"}
    pods = {"kube-proxy-a": mirror, "kube-proxy-b": {}, "other-c": mirror, "kube-proxy-d": mirror}
    for pod, notes in pods.items():
        core.create_namespaced_pod(
            ns,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name=pod, annotations=notes),
                # On no node: nothing schedules or runs them, and they stay as written.
                spec=client.V1PodSpec(
                    node_name="no-such-node",
                    containers=[client.V1Container(name="c", image="registry.invalid/none")],
                ),
            ),
        )
    policy = models.from_wire(
        {
            "metadata": {"name": f"static-{ns}", "generation": 1},
            "spec": {
                "targetMode": "nftables",
                "kubeProxy": {"namespace": ns},
                "stages": [{"name": "all", "percent": 100}],
            },
        }
    )
    cache = ClusterCache(api, lambda: None)
    listed: list[int] = []
    real_list = client.CoreV1Api.list_namespaced_pod

    def counting(self: client.CoreV1Api, *args: Any, **kwargs: Any) -> Any:
        listed.append(kwargs.get("limit", 0))
        return real_list(self, *args, **kwargs)

    try:
        assert Observer(api, cache)._facts(policy).static_kube_proxy_pods == (
            "kube-proxy-a",
            "kube-proxy-d",
        )
        monkeypatch.setattr(client.CoreV1Api, "list_namespaced_pod", counting)
        uncached = Observer(api)._facts(policy).static_kube_proxy_pods
        assert sorted(uncached) == ["kube-proxy-a", "kube-proxy-d"]
        assert len(listed) >= 2 and set(listed) == {2}, f"pages asked: {listed}"
    finally:
        cache.close()
        core.delete_namespace(ns)


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


def _mode(cache: ClusterCache, name: str) -> str | None:
    """The mode label of ``name`` as a look would read it from ``cache``."""
    view = next((n for n in cache.nodes() if n.name == name), None)
    assert view is not None
    return view.mode_label


def _watching(cache: ClusterCache, name: str) -> Watched[NodeView]:
    """The cache's node watch, once it holds ``name`` and its watch is open."""
    eventually(lambda: any(n.name == name for n in cache.nodes()), timeout=30, what="the node")
    watched = cache._nodes
    assert watched is not None
    eventually(lambda: watched.watches, timeout=30, what="the node watch to open")
    return watched


def _can_list(api: client.CoreV1Api) -> bool:
    try:
        api.list_node(limit=1)
    except client.ApiException:
        return False
    return True
