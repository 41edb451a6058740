"""What a kube-proxy pod becomes for the engine: the template generation it was made from."""

from __future__ import annotations

from typing import Any

from proxymode.engine.observed import ProxyKind
from proxymode.kube.cache import pod_record
from proxymode.kube.observe import proxy_pod


def _pod(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "kube-proxy-x", "labels": labels, "creationTimestamp": None},
        "spec": {"nodeName": "n1"},
        "status": {},
    }


def test_the_pod_template_generation_label_is_read_by_both_paths() -> None:
    """A source pod made from an older template than its DaemonSet's is replaced on a move
    back (the operator's OnDelete keeps a person's fix from it otherwise)."""
    pod = _pod({"k8s-app": "kube-proxy", "pod-template-generation": "7"})
    assert proxy_pod(pod, ProxyKind.SOURCE).template_generation == 7
    assert pod_record(pod).template_generation == "7"


def test_a_missing_or_odd_generation_is_unknown() -> None:
    assert proxy_pod(_pod({}), ProxyKind.SOURCE).template_generation is None
    odd = _pod({"pod-template-generation": "seven"})
    assert proxy_pod(odd, ProxyKind.SOURCE).template_generation is None


def test_the_latest_container_end_is_read_by_both_paths() -> None:
    """When a pod's container last ended tells a reboot's restart (before the kubelet was
    back) from a crash after it."""
    pod = _pod({})
    pod["status"] = {
        "containerStatuses": [
            {"lastState": {"terminated": {"finishedAt": "2026-12-07T09:00:05Z"}}},
            {"lastState": {"terminated": {"finishedAt": "2026-12-07T09:01:00Z"}}},
            {"lastState": {}},
        ]
    }
    ended = proxy_pod(pod, ProxyKind.SOURCE).last_terminated
    assert ended is not None and ended.isoformat() == "2026-12-07T09:01:00+00:00"
    assert pod_record(pod).last_terminated == "2026-12-07T09:01:00Z"
    assert proxy_pod(_pod({}), ProxyKind.SOURCE).last_terminated is None
