"""A rollback decided on a cache's stale copy is read again from the server first.

CI's run of 48f2c79: the fault matrix froze the operator (SIGSTOP) for 65 s while general-1
switched. On SIGCONT the daemon's look ran before the pod watch had applied the old pod's
deletion (still in the socket's buffer), saw that pod "not gone 65s after the move started
(limit 60s)" and rolled back a migration that was fine. Here the same, without the luck
of timing: a real ``Reconciler`` with a real ``ClusterCache`` on the worker's sandbox (the
session's operator frozen meanwhile, so that only this reconciler acts), the cache's pod
watch held back (events kept, not applied) while the old pod goes on the server, and the
move's start put back past its deadline. The cache's copy says "stuck switching"; the
server says the pod is gone. The look must go on with the move, and say it read again.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from proxymode.api import models
from proxymode.engine.objects import job_node
from proxymode.engine.observed import MODE_LABEL, POLICY_LABEL
from proxymode.kube.cache import ClusterCache
from proxymode.kube.observe import Observer
from proxymode.kube.reconcile import Reconciler
from proxymode_sandbox import Sandbox
from tests.sandbox.harness import PATIENCE, STAGES, KubeProxy, Policies, eventually

pytestmark = pytest.mark.sandbox
G, V, P = models.GROUP, models.VERSION, models.PLURAL


@pytest.fixture
def frozen(operator: Sandbox, policies: Policies) -> Iterator[None]:
    """The session's operator stopped (SIGSTOP) for the test: two reconcilers acting on one
    policy would be a different test. It runs again afterwards, watches and all, and before
    ``policies`` deletes what is left (this fixture depends on it, so it is torn down
    first): a policy the test could not walk back is then rolled back by the operator, not
    deleted finalizer-less with its nodes still labelled."""
    operator.freeze_operator()
    try:
        yield
    finally:
        operator.freeze_operator(False)


def _pods_on(core: client.CoreV1Api, namespace: str, node: str) -> list[str]:
    pods = core.list_namespaced_pod(namespace, field_selector=f"spec.nodeName={node}").items
    return [p.metadata.name for p in pods]


def _unreachable() -> client.ApiClient:
    """A client for a port nothing listens on (loopback): every request is refused."""
    config = client.Configuration()
    config.host = "http://127.0.0.1:9"
    config.retries = False
    return client.ApiClient(config)


def _second_looks(reconciler: Reconciler, outcome: str) -> float:
    value = reconciler.telemetry.registry.get_sample_value(
        "proxymode_second_looks_total", {"outcome": outcome}
    )
    return value or 0.0


@pytest.mark.usefixtures("frozen")
def test_a_stuck_switching_seen_only_in_the_cache_is_not_rolled_back(
    api: client.ApiClient, core: client.CoreV1Api, policies: Policies, proxy: KubeProxy
) -> None:
    ns = proxy.namespace
    name = policies.create(ns, stages=STAGES[:1], readyTimeoutSeconds=10)
    cache = ClusterCache(api, lambda: None)
    reconciler = Reconciler(api, cache=cache)
    held: list[Any] = []
    try:
        cache.pods(ns)  # the pod watch, listed now, then held back from its first event on
        watched = cache._pods[ns]
        eventually(lambda: watched.watches, timeout=30, what="the pod watch to open")
        watched._apply = held.append  # type: ignore[method-assign]

        def move() -> dict[str, Any] | None:
            reconciler.once(name)
            st = policies.status(name)
            assert st.get("phase") not in ("RollingBack", "Failed"), st.get("message")
            return next(iter(st.get("moves") or []), None)

        started = eventually(move, timeout=60, what="the first move to start")
        node = started["node"]
        assert core.read_node(node).metadata.labels.get(MODE_LABEL) == "switching"
        eventually(lambda: not _pods_on(core, ns, node), timeout=60, what=f"{node}'s old pod to go")
        kept = [r.name for r in cache.pods(ns) if r.node == node]
        assert kept, "the held-back cache still has the old pod"

        # The move started long ago, as after a stall of the operator.
        since = (datetime.now(UTC) - timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
        client.CustomObjectsApi(api).patch_cluster_custom_object_status(
            G, V, P, name, {"status": {"moves": [{**started, "since": since}]}}
        )
        # First with the server out of reach for the second read: nothing is acted on, and
        # the status says why.
        server = reconciler.fresh
        reconciler.fresh = Observer(_unreachable())
        reconciler.once(name)
        st = policies.status(name)
        assert st.get("phase") == "Progressing", (st.get("phase"), st.get("message"))
        assert str(st.get("message")).startswith("could not confirm from the API server"), st
        assert "RollingBack (KubeProxyUnhealthy)" in str(st.get("message")), st.get("message")
        # Tried again while the server is still out of reach: the same words, so the status
        # is not rewritten on every try.
        # (The server drops the null fields of list items, history[].stage among them; a
        # comparison that kept them wrote the status on every look, idle ones included.)
        unchanged = reconciler.status_unchanged
        version = policies.get(name)["metadata"]["resourceVersion"]
        reconciler.once(name)
        assert policies.status(name).get("message") == st.get("message")
        assert reconciler.status_unchanged == unchanged + 1, "no status write for a retry"
        assert policies.get(name)["metadata"]["resourceVersion"] == version
        assert core.read_node(node).metadata.labels.get(MODE_LABEL) == "switching"
        assert _second_looks(reconciler, "unread") == 2
        reconciler.fresh = server

        reconciler.once(name)
        st = policies.status(name)
        assert st.get("phase") in ("Progressing", "Analyzing"), (st.get("phase"), st.get("message"))
        assert st.get("rollbackReason") is None, st.get("rollbackMessage")
        assert (reconciler.second_looks, reconciler.withdrawn) == (3, 1), (
            "the cache's copy called for a rollback, and the server's did not bear it out"
        )
        assert _second_looks(reconciler, "withdrawn") == 1
        assert _second_looks(reconciler, "confirmed") == 0
        # The move went on from what the server showed: the node on to nftables (or its
        # cleanup Job made), not back.
        label = core.read_node(node).metadata.labels.get(MODE_LABEL)
        jobs = (
            client.BatchV1Api(api)
            .list_namespaced_job(ns, label_selector=f"{POLICY_LABEL}={name}")
            .items
        )
        mine = [j.metadata.name for j in jobs if job_node(j.metadata.to_dict()) == node]
        assert label == "nftables" or mine, (label, [j.metadata.name for j in jobs])
    finally:
        # Walk the nodes back with a reconciler that reads the server itself (the held-back
        # cache is behind by design), while the session's operator is still frozen: it never
        # saw this policy, so it holds no finalizer on it. Then let the policy go. Should
        # the walk back fail, ``frozen`` wakes the operator before ``policies`` deletes the
        # policy, and the operator rolls it back.
        reconciler.close()
        cache.close()
        walker = Reconciler(api)
        try:
            eventually(
                lambda: walker.once(name, deleting=True).release_finalizer,
                timeout=120 * PATIENCE,
                interval=0.5,
                what="the walk back",
            )
            client.CustomObjectsApi(api).delete_cluster_custom_object(G, V, P, name)
        finally:
            walker.close()
