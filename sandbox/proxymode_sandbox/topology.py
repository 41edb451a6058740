"""What the sandbox's simulated cluster looks like: pools, zones, kernels, OS images.

The defaults mirror a small production cluster: a canary pool and a general pool
on different OS images and kernels, spread over three zones. A legacy pool with a
kernel older than 5.13 (RHEL 8) can be added to exercise nftables preflight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ZONES = ("zone-a", "zone-b", "zone-c")
POOL_LABEL = "pool"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


@dataclass(frozen=True)
class PoolSpec:
    """One node pool: how many nodes and what they run."""

    name: str
    count: int
    kernel: str
    os_image: str
    instance_type: str = "m6i.large"


CANARY = PoolSpec("canary", 2, "6.1.0-28-cloud-amd64", "Debian GNU/Linux 12 (bookworm)")
GENERAL = PoolSpec("general", 4, "5.15.0-1071-aws", "Ubuntu 22.04.5 LTS", "m6i.xlarge")
LEGACY = PoolSpec("legacy", 1, "4.18.0-553.el8_10.x86_64", "Red Hat Enterprise Linux 8.10 (Ootpa)")


@dataclass(frozen=True)
class Topology:
    """The pools of a sandbox cluster, in creation order."""

    pools: tuple[PoolSpec, ...] = field(default=(CANARY, GENERAL))

    @classmethod
    def sized(cls, nodes: int = 6, canary: int = 2, legacy: int = 0) -> Topology:
        """``nodes`` in all: ``canary`` canaries, ``legacy`` old-kernel ones, the rest general."""
        general = nodes - canary - legacy
        if canary < 0 or legacy < 0 or general < 0:
            raise ValueError(f"cannot split {nodes} nodes into {canary} canary and {legacy} legacy")
        pools = [
            PoolSpec(p.name, n, p.kernel, p.os_image, p.instance_type)
            for p, n in ((CANARY, canary), (GENERAL, general), (LEGACY, legacy))
            if n > 0
        ]
        return cls(tuple(pools))

    def pool(self, name: str) -> PoolSpec:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(f"no pool {name!r}; pools: {[p.name for p in self.pools]}")

    def node_names(self) -> list[str]:
        return [f"{p.name}-{i}" for p in self.pools for i in range(1, p.count + 1)]


def node_manifest(name: str, pool: PoolSpec, index: int, kubernetes_version: str) -> dict[str, Any]:
    """A Node as a kubelet on that pool would register it, marked for kwok to manage."""
    zone = ZONES[(index - 1) % len(ZONES)]
    resources = {"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": pool.instance_type,
                "topology.kubernetes.io/region": "sandbox-1",
                "topology.kubernetes.io/zone": zone,
                POOL_LABEL: pool.name,
                "type": "kwok",
            },
        },
        "spec": {},
        "status": {
            "allocatable": resources,
            "capacity": resources,
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "",
                "containerRuntimeVersion": "containerd://1.7.24",
                "kernelVersion": pool.kernel,
                "kubeProxyVersion": "",
                "kubeletVersion": kubernetes_version,
                "machineID": "",
                "operatingSystem": "linux",
                "osImage": pool.os_image,
                "systemUUID": "",
            },
        },
    }
