"""What the kernel of each real node says: the Service rules per mode, and echo answering.

The seeds' runbook checks by hand — ``iptables-save | grep -c KUBE-SVC``, ``nft list
tables``, "Service calls succeed" — read from inside each node's namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from subprocess import CompletedProcess

from proxymode_sandbox.services import ECHO_CLUSTER_IP

Exec = Callable[[str, Sequence[str]], CompletedProcess[str]]


@dataclass(frozen=True)
class NodeRules:
    node: str
    iptables_services: int
    """``KUBE-SVC-*`` chains in iptables' nat table."""
    nft_services: int | None
    """``service-*`` chains in ``table ip kube-proxy``; None: no such table."""
    echo: str
    """What echo's ClusterIP answered ("" when nothing did)."""

    def line(self) -> str:
        nft = "absent" if self.nft_services is None else f"{self.nft_services} services"
        return (
            f"{self.node:<12} nft table ip kube-proxy: {nft}; "
            f"iptables KUBE-SVC chains: {self.iptables_services}; "
            f"echo: {self.echo or 'NO ANSWER'}"
        )


def iptables_services(run: Exec, node: str) -> int:
    out = run(node, ["iptables-save", "-t", "nat"]).stdout
    return sum(1 for line in out.splitlines() if line.startswith(":KUBE-SVC-"))


def nft_services(run: Exec, node: str) -> int | None:
    proc = run(node, ["nft", "list", "table", "ip", "kube-proxy"])
    if proc.returncode != 0:
        return None
    return sum(1 for line in proc.stdout.splitlines() if line.strip().startswith("chain service-"))


def echo(run: Exec, node: str, timeout: float = 1.0) -> str:
    proc = run(node, ["curl", "-s", "-m", str(timeout), f"http://{ECHO_CLUSTER_IP}/"])
    return proc.stdout.strip() if proc.returncode == 0 else ""


def collect(run: Exec, nodes: Sequence[str]) -> list[NodeRules]:
    return [
        NodeRules(n, iptables_services(run, n), nft_services(run, n), echo(run, n)) for n in nodes
    ]
