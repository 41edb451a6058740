"""A plain-text picture of the sandbox: nodes by pool, and which kube-proxy runs on each."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from proxymode_sandbox.topology import POOL_LABEL

if TYPE_CHECKING:
    from proxymode_sandbox.cluster import Sandbox


def _ready(obj: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions", []) or []
    )


def _describe_pod(pod: dict[str, Any]) -> str:
    statuses = pod["status"].get("containerStatuses", []) or []
    restarts = sum(c.get("restartCount", 0) for c in statuses)
    state = "Ready" if _ready(pod) else pod["status"].get("phase", "Pending")
    return f"{pod['metadata']['name']} ({state}, restarts {restarts})"


def render_cluster(sandbox: Sandbox) -> str:
    """Nodes grouped by pool with zone, kernel, readiness and the kube-proxy pods on each."""
    nodes = sandbox.get_json("nodes")["items"]
    pods = sandbox.get_json("pods", namespace="kube-system")["items"]
    proxies: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod in pods:
        if pod["metadata"].get("labels", {}).get("k8s-app") == "kube-proxy":
            proxies[pod["spec"].get("nodeName", "")].append(pod)
    by_pool: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for node in nodes:
        by_pool[node["metadata"].get("labels", {}).get(POOL_LABEL, "(none)")].append(node)

    lines = [f"Kubernetes {sandbox.kubernetes_version} at {sandbox.server}: {len(nodes)} nodes"]
    for pool in sorted(by_pool):
        lines.append(f"pool {pool}:")
        for node in sorted(by_pool[pool], key=lambda n: n["metadata"]["name"]):
            name = node["metadata"]["name"]
            labels = node["metadata"].get("labels", {})
            info = node["status"].get("nodeInfo", {})
            mode = labels.get("proxymode.io/mode", "-")
            pod_text = ", ".join(_describe_pod(p) for p in proxies.get(name, []))
            lines.append(
                f"  {name:<12} {'Ready' if _ready(node) else 'NotReady':<9}"
                f" {labels.get('topology.kubernetes.io/zone', ''):<7}"
                f" kernel {info.get('kernelVersion', '?'):<26} mode-label {mode:<10}"
                f" {pod_text or 'no kube-proxy pod'}"
            )
    return "\n".join(lines)
