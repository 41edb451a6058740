"""What the kernel of each real node says: the Service rules per mode, and echo answering.

The seeds' runbook checks by hand — ``iptables-save | grep -c KUBE-SVC``, ``nft list
tables``, "Service calls succeed" — read from inside each node's namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from subprocess import CompletedProcess

from proxymode_sandbox.services import ECHO_CLUSTER_IP, NAMESPACE

Exec = Callable[[str, Sequence[str]], CompletedProcess[str]]


@dataclass(frozen=True)
class NodeRules:
    node: str
    iptables_services: int
    """``KUBE-SVC-*`` chains in iptables' nat table (any namespace: leftovers count)."""
    nft_services: int | None
    """namespace ``sandbox``'s ``service-*`` chains in ``table ip kube-proxy``; None: no table."""
    echo: str
    """What echo's ClusterIP answered ("" when nothing did)."""

    def line(self) -> str:
        nft = "absent" if self.nft_services is None else f"{self.nft_services} services"
        return (
            f"{self.node:<12} nft table ip kube-proxy: {nft}; "
            f"iptables KUBE-SVC chains: {self.iptables_services}; "
            f"echo: {self.echo or 'NO ANSWER'}"
        )


def kube_svc_chains(run: Exec, node: str) -> int:
    """Every ``KUBE-SVC-*`` chain in iptables' nat table, whichever Service it is for."""
    out = run(node, ["iptables-save", "-t", "nat"]).stdout
    return sum(1 for line in out.splitlines() if line.startswith(":KUBE-SVC-"))


def iptables_services(run: Exec, node: str, namespace: str = NAMESPACE) -> int:
    """Services of ``namespace`` that ``KUBE-SERVICES`` sends to a ``KUBE-SVC-*`` chain."""
    out = run(node, ["iptables-save", "-t", "nat"]).stdout
    return sum(
        1
        for line in out.splitlines()
        if line.startswith("-A KUBE-SERVICES ")
        and f'--comment "{namespace}/' in line
        and "-j KUBE-SVC-" in line
    )


def nft_services(run: Exec, node: str, namespace: str = NAMESPACE) -> int | None:
    """Service chains of ``namespace`` in ``table ip kube-proxy``; None: no such table."""
    proc = run(node, ["nft", "list", "table", "ip", "kube-proxy"])
    if proc.returncode != 0:
        return None
    return sum(
        1
        for line in proc.stdout.splitlines()
        if line.strip().startswith("chain service-") and f"-{namespace}/" in line
    )


def ask(
    run: Exec, node: str, url: str, timeout: float = 1.0, prefix: Sequence[str] = ()
) -> CompletedProcess[str]:
    """One HTTP GET of ``url`` from the node (curl; ``prefix`` runs before it, e.g. nice)."""
    return run(node, [*prefix, "curl", "-s", "-m", str(timeout), url])


def echo(run: Exec, node: str, timeout: float = 1.0) -> str:
    proc = ask(run, node, f"http://{ECHO_CLUSTER_IP}/", timeout)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def collect(run: Exec, nodes: Sequence[str]) -> list[NodeRules]:
    return [
        NodeRules(n, kube_svc_chains(run, n), nft_services(run, n), echo(run, n)) for n in nodes
    ]
