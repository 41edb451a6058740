"""What a node's tools print, read into one ``NodeReading``. Pure: text in, numbers out.

The structures each mode leaves in the kernel (kube-proxy.md §5):

- iptables: ``KUBE-SVC-*`` chains in the nat table, sent to from ``KUBE-SERVICES``;
- ipvs: the ``kube-ipvs0`` dummy device (holding every Service IP) and ``KUBE-SERVICES``
  in nat, but no ``KUBE-SVC-*`` chains;
- nftables: ``table ip kube-proxy`` (and ``ip6``) with a ``service-*`` chain per Service
  port.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True)
class ProbeOutcome:
    """One TCP connect through a Service's ClusterIP, as the node made it."""

    target: str
    """``namespace/name:port`` as the policy named it."""
    address: str = ""
    ok: bool = False
    millis: float | None = None
    error: str = ""


@dataclass(frozen=True)
class NodeReading:
    """Everything one verification attempt saw on the node."""

    mode: str | None = None
    """What kube-proxy's ``/proxyMode`` answered; None when it did not answer."""
    started: float | None = None
    """kube-proxy's ``process_start_time_seconds``."""
    last_sync: float | None = None
    """``kubeproxy_sync_proxy_rules_last_timestamp_seconds`` (0 before the first sync)."""
    iptables_svc_chains: int = 0
    iptables_services_chain: bool = False
    """``KUBE-SERVICES`` exists in the nat table (iptables and ipvs modes program it)."""
    nft_tables: tuple[str, ...] = ()
    """kube-proxy's nftables tables present, by family (``ip``, ``ip6``)."""
    nft_services: int = 0
    ipvs_device: bool = False
    probe: ProbeOutcome | None = None
    errors: tuple[str, ...] = field(default=())
    """Tools that could not run (missing binary, no permission): said, never guessed."""

    @property
    def synced_after_start(self) -> bool:
        return (
            self.started is not None
            and self.last_sync is not None
            and self.last_sync > 0
            and self.last_sync >= self.started
        )

    @property
    def first_sync_seconds(self) -> float | None:
        if not self.synced_after_start or self.started is None or self.last_sync is None:
            return None
        return self.last_sync - self.started


def parse_metrics(text: str) -> dict[str, float]:
    """One value per metric name of a Prometheus text exposition: the unlabelled sample,
    else the smallest over its series. kube-proxy labels its sync gauges by ``ip_family``
    on a dual-stack node; the oldest family's last sync is the one that must be after the
    start, so the smallest value is the one that counts."""
    plain: dict[str, float] = {}
    labelled: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if m.group(2):
            name = m.group(1)
            labelled[name] = min(value, labelled.get(name, value))
        else:
            plain[m.group(1)] = value
    return {**labelled, **plain}


def iptables_counts(nat: str) -> tuple[int, bool]:
    """``(KUBE-SVC-* chains, KUBE-SERVICES present)`` in ``iptables-save -t nat`` output."""
    svc = sum(1 for line in nat.splitlines() if line.startswith(":KUBE-SVC-"))
    services = any(line.startswith(":KUBE-SERVICES ") for line in nat.splitlines())
    return svc, services


def nft_counts(chains: str) -> tuple[tuple[str, ...], int]:
    """``(kube-proxy tables by family, service chains)`` in ``nft list chains`` output."""
    tables: list[str] = []
    services = 0
    current: str | None = None
    for raw in chains.splitlines():
        line = raw.strip()
        if line.startswith("table "):
            words = line.split()
            current = words[1] if len(words) >= 3 and words[2] == "kube-proxy" else None
            if current is not None and current not in tables:
                tables.append(current)
        elif current is not None and line.startswith("chain service-"):
            services += 1
    return tuple(tables), services


def has_device(links: str, name: str = "kube-ipvs0") -> bool:
    """Is ``name`` among the links of ``ip -o link show`` output?"""
    return any(
        (parts := line.split(":", 2)) and len(parts) > 1 and parts[1].strip().split("@")[0] == name
        for line in links.splitlines()
    )


def read_rules(nat: str, chains: str, links: str, metrics: str, mode: str | None) -> NodeReading:
    """One reading from the four outputs (without the probe)."""
    values = parse_metrics(metrics)
    svc, services = iptables_counts(nat)
    tables, nft_services = nft_counts(chains)
    return NodeReading(
        mode=mode.strip() if mode else None,
        started=values.get("process_start_time_seconds"),
        last_sync=values.get("kubeproxy_sync_proxy_rules_last_timestamp_seconds"),
        iptables_svc_chains=svc,
        iptables_services_chain=services,
        nft_tables=tables,
        nft_services=nft_services,
        ipvs_device=has_device(links),
    )
