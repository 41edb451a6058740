"""What ``advise`` judges, pure: the cluster's pools, inventory and today's metrics.

Kept apart from the judgement (``advice``) so that the collector in ``advise`` and the tests
build the same plain records without pulling in the four dimensions' rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxymode.kubeproxy import kernel_supports
from proxymode.kubeproxy.versions import NFTABLES

# Labels that name a node pool, most specific first (the first any node carries wins).
POOL_LABELS = (
    "pool",
    "node-pool",
    "worker.gardener.cloud/pool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "agentpool",
)


@dataclass(frozen=True)
class Pool:
    """Nodes that share a pool label (or all nodes, when none has one)."""

    name: str
    label: str | None
    nodes: tuple[str, ...]
    kernels: tuple[str, ...]

    def nftables_ok(self) -> bool | None:
        """Every node's kernel runs nftables; None when some kernel is unknown."""
        answers = [kernel_supports(NFTABLES, k) for k in self.kernels]
        if any(a is False for a in answers):
            return False
        return None if any(a is None for a in answers) else True


@dataclass(frozen=True)
class Metrics:
    """Today's numbers from Prometheus; None where nothing was measured."""

    sync_p99: float | None = None
    network_programming_p99: float | None = None
    syncs_per_second: float | None = None
    conntrack_max_ratio: float | None = None
    localhost_nodeport_packets: float | None = None
    ct_invalid_drops: float | None = None


@dataclass(frozen=True)
class Inventory:
    kubernetes_version: str | None
    kube_proxy_version: str | None
    current_mode: str | None
    pools: tuple[Pool, ...]
    services_by_type: Mapping[str, int] = field(default_factory=dict)
    endpoint_slices: int | None = None
    endpoints: int | None = None
    cni: str | None = None
    metallb: bool = False
    strict_arp: bool | None = None
    metrics: Metrics = field(default_factory=Metrics)
    prometheus_url: str | None = None

    @property
    def services(self) -> int:
        return sum(self.services_by_type.values())


def pools_of(nodes: Sequence[Mapping[str, Any]]) -> tuple[Pool, ...]:
    """Group nodes by the first pool label any node carries (``(all)`` when none does)."""
    label = next(
        (
            key
            for key in POOL_LABELS
            if any(key in (n["metadata"].get("labels") or {}) for n in nodes)
        ),
        None,
    )
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for n in nodes:
        labels = n["metadata"].get("labels") or {}
        groups.setdefault(labels.get(label, "(none)") if label else "(all)", []).append(n)
    return tuple(
        Pool(
            name=name,
            label=label,
            nodes=tuple(sorted(n["metadata"]["name"] for n in members)),
            kernels=tuple(
                ((n.get("status") or {}).get("nodeInfo") or {}).get("kernelVersion", "")
                for n in members
            ),
        )
        for name, members in sorted(groups.items())
    )
