"""The Event the operator posts about a policy (pure): as the API server's components post
a cluster-scoped object's, and within the API server's limits."""

from __future__ import annotations

from datetime import UTC, datetime

from proxymode.engine.actions import EmitEvent
from proxymode.kube.events import MAX_MESSAGE, event_body

POLICY = {
    "apiVersion": "proxymode.io/v1alpha1",
    "kind": "ProxyModePolicy",
    "metadata": {"name": "to-nft", "uid": "u-1", "resourceVersion": "42"},
}


def test_a_cluster_scoped_policy_s_event_names_no_namespace_for_it() -> None:
    """kubectl describe asks for involvedObject.namespace="" (kopf's wrote "default")."""
    body = event_body(POLICY, EmitEvent("RolloutStarted", "go"), datetime(2026, 12, 6, tzinfo=UTC))
    assert body["metadata"]["namespace"] == "default"
    assert "namespace" not in body["involvedObject"]
    assert body["involvedObject"]["uid"] == "u-1"
    assert body["eventTime"] == "2026-12-06T00:00:00.000000Z"


def test_a_long_message_is_cut_in_bytes_not_characters() -> None:
    message = "é" * 1000  # 2,000 bytes of UTF-8 in 1,000 characters
    body = event_body(POLICY, EmitEvent("NodeVerified", message), datetime.now(UTC))
    assert len(body["message"].encode()) <= MAX_MESSAGE
    assert body["message"].endswith("...")
