"""The sandbox kubelet outlives one of its nodes being deleted (``kubectl delete node``).

It used to read every node's object on each heartbeat, and the 404 of a deleted one raised
out of the whole loop on every pass: no status, no Lease and no pod of any other node was
looked after again. Tried on `make sandbox` by deleting a real node, then migrating.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode_sandbox.kubelet import Kubelet
from proxymode_sandbox.podspec import NodeInfo

LEASES = "kube-node-lease"


@pytest.fixture
def two_nodes(core: client.CoreV1Api) -> Iterator[list[str]]:
    """Two Node objects of this test's own. Without ``kubernetes.io/os`` no DaemonSet of
    the session's (kube-proxy, a migration's target) puts a pod on them, and without kwok's
    annotation kwok leaves them alone: only the kubelet under test posts for them."""
    tag = uuid.uuid4().hex[:6]
    names = [f"kubelet-test-{tag}-a", f"kubelet-test-{tag}-b"]
    for name in names:
        core.create_node({"metadata": {"name": name, "labels": {"test": "kubelet"}}})
    try:
        yield names
    finally:
        leases = client.CoordinationV1Api(core.api_client)
        for name in names:
            for delete in (core.delete_node, lambda n: leases.delete_namespaced_lease(n, LEASES)):
                try:
                    delete(name)
                except ApiException as e:
                    if e.status != 404:
                        raise


def _renewed(api: client.ApiClient, name: str) -> datetime | None:
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(name, LEASES)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    renewed: datetime | None = lease.spec.renew_time
    return renewed


def test_a_deleted_node_stops_being_posted_and_the_others_go_on(
    api: client.ApiClient, core: client.CoreV1Api, two_nodes: list[str], tmp_path: Path
) -> None:
    gone, kept = two_nodes
    kubelet = Kubelet(
        api, [NodeInfo(n, netns="", ip="127.0.0.1", root=tmp_path / n) for n in two_nodes], tmp_path
    )
    kubelet.heartbeat()
    ready = core.read_node(kept).status.conditions
    assert any(c.type == "Ready" and c.status == "True" for c in ready or [])
    before = _renewed(api, kept)
    assert before is not None and _renewed(api, gone) is not None

    core.delete_node(gone)
    kubelet.last_status = kubelet.last_lease = 0.0  # both due again
    kubelet.heartbeat()  # raised NotFound here, for every node, on every pass

    assert kubelet.gone == {gone}
    after = _renewed(api, kept)
    assert after is not None and after > before, "the other node's Lease was not renewed"
    with pytest.raises(ApiException) as missing:
        core.read_node(gone)
    assert missing.value.status == 404, "a kubelet does not register a deleted node again"
    kubelet.heartbeat()  # and says so once, not on every pass
