"""``advise``, pure: should this cluster change kube-proxy mode, to which, and where not?

The seeds' four dimensions, each judged from the inventory and today's metrics:

* **correctness and semantics**: what the change would break: Service types in use,
  MetalLB (ipvs needs ``strictARP``), the iptables-only behaviours nftables drops (localhost
  NodePorts and the conntrack-INVALID drop, measured by kube-proxy's two workaround
  counters), the CNI (Calico's nftables caveat), and the kernels (nftables needs 5.13);
* **rule convergence**: Services, endpoints, churn and today's sync p99: how much a faster
  rule engine would buy;
* **operations**: what this kube-proxy version supports (ipvs deprecated from 1.35,
  nftables GA from 1.33) and what the team must learn;
* **evolution**: where the project is going (nftables the planned default from 1.40, ipvs
  off by default from 1.40 and removed later).

The result is a mode or "stay", the reasons per dimension, the pools to leave out (old
kernels) and a starter ProxyModePolicy. ipvs is never recommended where it is deprecated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from proxymode.api import models

# The inventory types live in their own module; advise's callers know them from here.
from proxymode.cli.inventory import Inventory, Metrics, Pool, pools_of
from proxymode.engine.look import TERMINAL
from proxymode.kubeproxy import (
    KubeVersion,
    ModeSupport,
    mode_support,
    parse_version,
)
from proxymode.kubeproxy.versions import IPTABLES, IPVS, NFTABLES

__all__ = ["Advice", "Dimension", "Inventory", "Metrics", "Pool", "advise", "pools_of", "render"]

STAY = "stay"
SYNC_P99_SLOW = 1.0  # seconds: the seeds' KubeProxyRuleSyncSlow bound
MANY_SERVICES = 1000
MANY_ENDPOINTS = 10000
CONNTRACK_HIGH = 0.85


@dataclass
class Dimension:
    name: str
    leaning: str = "neutral"  # "for" the recommended change, "against", "neutral"
    reasons: list[str] = field(default_factory=list)


@dataclass
class Advice:
    recommendation: str  # a mode, or "stay"
    current_mode: str
    summary: str
    dimensions: list[Dimension]
    leave_out: list[dict[str, Any]]
    policy: dict[str, Any] | None
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    """Policies migrating this cluster now (name, phase, targetMode, nodeProgress): the advice
    reads the cluster as its source mode, and a second policy would be refused."""

    def wire(self) -> dict[str, Any]:
        return {
            "recommendation": self.recommendation,
            "currentMode": self.current_mode,
            "summary": self.summary,
            "dimensions": [d.__dict__ for d in self.dimensions],
            "leaveOut": self.leave_out,
            "policy": self.policy,
            "inFlight": self.in_flight,
        }


NOT_RUNNING = frozenset({"", str(models.Phase.PENDING), *(str(p) for p in TERMINAL)})
"""Phases in which a policy drives nothing: not started yet, or ended (the engine's own)."""


def with_policies(a: Advice, policies: Sequence[dict[str, Any]]) -> Advice:
    """``a`` told of the policies migrating the cluster now: they are named, and no starter
    policy is offered while one runs (preflight would refuse a second: AnotherPolicyInFlight)."""
    running = [
        {
            "name": p["metadata"]["name"],
            "phase": (p.get("status") or {}).get("phase", ""),
            "mixedMode": (p.get("status") or {}).get("finalized") is False
            and (p.get("status") or {}).get("phase") == str(models.Phase.COMPLETED),
            "finalize": bool((p.get("spec") or {}).get("finalize", True)),
            "targetMode": (p.get("spec") or {}).get("targetMode"),
            "nodeProgress": (p.get("status") or {}).get("nodeProgress"),
        }
        for p in policies
        if _drives_nodes(p.get("status") or {})
    ]
    if not running:
        return a
    return replace(a, in_flight=running, policy=None)


def _drives_nodes(status: Mapping[str, Any]) -> bool:
    """In flight, or Completed in mixed mode (``finalized: false``): its nodes run the target
    mode through its own DaemonSet, whatever the source ConfigMap says, and preflight refuses
    another policy beside it (a review saw advise offer a starter policy then)."""
    phase = status.get("phase", "")
    mixed = phase == str(models.Phase.COMPLETED) and status.get("finalized") is False
    return phase not in NOT_RUNNING or mixed


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "not measured"
    return f"{value:.3g}{unit}"


@dataclass(frozen=True)
class _Facts:
    """What the four judgements share: the versions' support and the pools by kernel."""

    inv: Inventory
    current: str
    target: str
    version: KubeVersion
    nft: ModeSupport
    ipvs: ModeSupport
    old_pools: tuple[Pool, ...]
    unknown_pools: tuple[Pool, ...]


def _facts(inv: Inventory) -> _Facts:
    current = inv.current_mode or IPTABLES
    try:
        version = parse_version(inv.kube_proxy_version or inv.kubernetes_version or "")
    except ValueError:
        version = parse_version("v1.0.0")
    nft = mode_support(NFTABLES, version)
    ipvs = mode_support(IPVS, version)
    able = [p for p in inv.pools if p.nftables_ok() is True]
    if current == NFTABLES:
        target = STAY
    elif nft.supported and able:
        target = NFTABLES
    elif current == IPVS and ipvs.deprecated:
        target = IPTABLES  # off a deprecated mode, to the one every node can run
    else:
        target = STAY
    return _Facts(
        inv=inv,
        current=current,
        target=target,
        version=version,
        nft=nft,
        ipvs=ipvs,
        old_pools=tuple(p for p in inv.pools if p.nftables_ok() is False),
        unknown_pools=tuple(p for p in inv.pools if p.nftables_ok() is None),
    )


def _correctness(f: _Facts) -> Dimension:
    d = Dimension("correctness and semantics")
    inv = f.inv
    types = ", ".join(f"{t} {c}" for t, c in sorted(inv.services_by_type.items())) or "none"
    d.reasons.append(f"Services by type: {types}.")
    for p in f.old_pools:
        kernels = ", ".join(sorted(set(p.kernels)))
        d.reasons.append(
            f"pool {p.name} ({len(p.nodes)} nodes, kernel {kernels}) cannot run nftables (it"
            " needs kernel 5.13 or later): keep it on iptables."
        )
    for p in f.unknown_pools:
        d.reasons.append(f"pool {p.name}: a kernel version is unknown; check by hand.")
    if inv.metallb:
        arp = {True: "on", False: "off", None: "unknown"}[inv.strict_arp]
        d.reasons.append(
            f"MetalLB is installed (strictARP {arp}); ipvs would need strictARP: true."
        )
    if f.target == NFTABLES:
        d.reasons.extend(_nftables_semantics(f, d))
    return d


def _nftables_semantics(f: _Facts, d: Dimension) -> list[str]:
    """What iptables does that nftables mode does not, measured where kube-proxy counts it."""
    inv, m = f.inv, f.inv.metrics
    reasons: list[str] = []
    if m.localhost_nodeport_packets:
        d.leaning = "against"
        reasons.append(
            f"{m.localhost_nodeport_packets:.0f} packets reached NodePorts on localhost;"
            " nftables mode has none: move those clients first."
        )
    elif m.localhost_nodeport_packets == 0:
        reasons.append("no packets reached NodePorts on localhost (measured).")
    else:
        reasons.append(
            "localhost NodePorts were not measured (kubeproxy_iptables_localhost_nodeports"
            "_accepted_packets_total); nftables mode has none."
        )
    if m.ct_invalid_drops:
        reasons.append(
            f"{m.ct_invalid_drops:.0f} conntrack-INVALID packets dropped by iptables'"
            " workaround; nftables has none: consider conntrack.tcpBeLiberal."
        )
    elif m.ct_invalid_drops == 0:
        reasons.append("no conntrack-INVALID drops by the iptables workaround (measured).")
    nodeports = inv.services_by_type.get("NodePort", 0) + inv.services_by_type.get(
        "LoadBalancer", 0
    )
    if nodeports:
        reasons.append(
            f"{nodeports} NodePort/LoadBalancer Services: under nftables NodePorts listen on"
            " the primary IPs only and host firewalls must allow the NodePort range."
        )
    if inv.cni and "calico" in inv.cni:
        d.leaning = "against"
        reasons.append(
            "Calico runs here: older Calico panics with nftables-mode kube-proxy; use a Calico"
            " with its nftables dataplane before moving."
        )
    elif inv.cni:
        reasons.append(f"CNI {inv.cni}: check it supports nftables-mode kube-proxy.")
    else:
        reasons.append("no known CNI DaemonSet found.")
    return reasons


def _convergence(f: _Facts) -> Dimension:
    d = Dimension("rule convergence")
    inv, m = f.inv, f.inv.metrics
    slices = _fmt(None if inv.endpoint_slices is None else float(inv.endpoint_slices))
    endpoints = _fmt(None if inv.endpoints is None else float(inv.endpoints))
    d.reasons.append(f"{inv.services} Services, {slices} EndpointSlices, {endpoints} endpoints.")
    d.reasons.append(
        f"rule sync p99 today {_fmt(m.sync_p99, 's')}, network programming p99"
        f" {_fmt(m.network_programming_p99, 's')}, {_fmt(m.syncs_per_second)} syncs/s across"
        f" nodes, conntrack at most {_fmt(m.conntrack_max_ratio)} of its limit."
    )
    slow = m.sync_p99 is not None and m.sync_p99 > SYNC_P99_SLOW
    big = inv.services >= MANY_SERVICES or (inv.endpoints or 0) >= MANY_ENDPOINTS
    if f.target == NFTABLES:
        if slow or big:
            d.leaning = "for"
            d.reasons.append(
                "nftables syncs incrementally, in proportion to the change rather than the"
                " ruleset: the large gain is here."
            )
        else:
            d.reasons.append(
                "syncs are fast today; nftables is faster still, but the gain here is small."
            )
        d.reasons.append(
            "a fresh nftables kube-proxy's first full sync is slower than iptables' at tens of"
            " thousands of Services: bake the canary and watch NetworkProgrammingP99."
        )
    if m.conntrack_max_ratio is not None and m.conntrack_max_ratio > CONNTRACK_HIGH:
        d.leaning = "against"
        d.reasons.append("conntrack is above 85% of its limit somewhere: fix that first.")
    return d


def _operations(f: _Facts) -> Dimension:
    d = Dimension("operations")
    d.reasons.append(f"kube-proxy {f.version}: {f.nft.reason}")
    if f.ipvs.deprecated:
        d.reasons.append(
            f"ipvs is deprecated in {f.version} (since 1.35): it is never the recommendation."
        )
        if f.current == IPVS:
            d.leaning = "for"
    if f.target == NFTABLES:
        d.leaning = "for"
        d.reasons.append(
            "the team debugs with `nft list table ip kube-proxy` instead of iptables-save; a"
            " mixed cluster (pools on both modes) is supported during and after the move."
        )
        if f.old_pools:
            d.reasons.append(
                "the old-kernel pools stay on iptables: a mixed cluster until they are replaced."
            )
    return d


def _evolution(f: _Facts) -> Dimension:
    d = Dimension("evolution")
    d.reasons.append(
        "nftables is GA since 1.33 and planned as the default mode from 1.40; ipvs goes off by"
        " default in 1.40 and is removed after (KEP-5495, KEP-5343)."
    )
    if f.target == NFTABLES:
        d.leaning = "for"
    elif f.target == STAY and f.current == NFTABLES:
        d.reasons.append("already on nftables, where the project is going.")
    return d


def advise(inv: Inventory) -> Advice:
    """The recommendation and its reasons."""
    f = _facts(inv)
    dimensions = [_correctness(f), _convergence(f), _operations(f), _evolution(f)]
    leave_out = (
        [
            {
                "pool": p.name,
                "label": p.label,
                "nodes": list(p.nodes),
                "kernels": sorted(set(p.kernels)),
                "reason": "kernel older than 5.13: nftables refuses to start; keep it on iptables",
            }
            for p in f.old_pools
        ]
        if f.target == NFTABLES
        else []
    )
    return Advice(
        recommendation=f.target,
        current_mode=f.current,
        summary=_summary(f.target, f.current, f.old_pools, dimensions[0]),
        dimensions=dimensions,
        leave_out=leave_out,
        policy=starter_policy(f.target, inv, f.old_pools) if f.target != STAY else None,
    )


def _summary(target: str, current: str, old: Sequence[Pool], correctness: Dimension) -> str:
    if target == STAY:
        return f"stay on {current}: no supported move would be better here today."
    text = f"move from {current} to {target}"
    if old:
        text += f", leaving {', '.join(p.name for p in old)} on {current} (old kernels)"
    if correctness.leaning == "against":
        text += "; first resolve the correctness findings below"
    return text + "."


IN_CLUSTER_PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
"""prometheus-operator's Service for a Prometheus named ``prometheus`` in ``monitoring`` (the
examples' and the sandbox's): the starter policy's URL when advise read Prometheus at an
address only this machine has."""


def starter_prometheus(url: str | None) -> str:
    """The Prometheus URL for the starter policy: the one advise read, unless it is this
    machine's own (a port-forward, ``$PROMETHEUS_URL`` on loopback), which the operator in
    its pod would take for its own loopback and never reach."""
    if url is None:
        return IN_CLUSTER_PROMETHEUS
    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", "0.0.0.0", "::", "::1") or host.startswith("127."):  # noqa: S104
        return IN_CLUSTER_PROMETHEUS
    return url


def starter_policy(target: str, inv: Inventory, old: Sequence[Pool]) -> dict[str, Any]:
    """A ProxyModePolicy to start from: a canary pool, then a tenth, half, all; gated."""
    label = inv.pools[0].label if inv.pools else None
    spec: dict[str, Any] = {"targetMode": target}
    if old and label:
        spec["nodeSelector"] = {
            "matchExpressions": [
                {"key": label, "operator": "NotIn", "values": sorted(p.name for p in old)}
            ]
        }
    canary_pool = next((p for p in inv.pools if "canary" in p.name and p not in old), None)
    first: dict[str, Any] = {"name": "canary", "bakeSeconds": 900}
    if canary_pool is not None and label:
        first["nodeSelector"] = {"matchLabels": {label: canary_pool.name}}
        first["maxNodes"] = 3
    else:
        first.update(percent=5, maxNodes=3)
    spec["stages"] = [
        first,
        {"name": "tenth", "percent": 10, "bakeSeconds": 1800},
        {"name": "half", "percent": 50, "bakeSeconds": 1800},
        {"name": "all", "percent": 100, "bakeSeconds": 600},
    ]
    spec["maxUnavailable"] = 1
    spec["analysis"] = {
        "prometheus": {"url": starter_prometheus(inv.prometheus_url)},
        "intervalSeconds": 60,
        "warmupSeconds": 120,
        "failureLimit": 2,
        "checks": [
            {"name": "sync-p99", "template": "SyncLatencyP99", "maxSeconds": 1},
            {"name": "vs-baseline", "template": "SyncLatencyP99", "maxRatioToBaseline": 1.5},
            {"name": "programming-p99", "template": "NetworkProgrammingP99", "maxSeconds": 10},
            {"name": "conntrack", "template": "ConntrackUsage", "maxRatio": 0.85},
            {"name": "sync-failures", "template": "SyncFailures", "max": 0},
        ],
    }
    return {
        "apiVersion": f"{models.GROUP}/{models.VERSION}",
        "kind": models.KIND,
        "metadata": {"name": f"to-{target}"},
        "spec": spec,
    }


def render(a: Advice) -> str:
    verdict = a.recommendation if a.recommendation == STAY else f"move to {a.recommendation}"
    out = [f"Recommendation: {verdict}", f"  {a.summary}", ""]
    for p in a.in_flight:
        progress = f", {p['nodeProgress']} nodes moved" if p.get("nodeProgress") else ""
        if p.get("mixedMode"):
            out[2:2] = [
                f"  Note: policy {p['name']} is Completed in mixed mode: its nodes"
                f"{progress.replace(', ', ' (', 1) + ')' if progress else ''} run"
                f" {p['targetMode']} through its own DaemonSet, while this reads the cluster"
                " as the source mode; no starter policy is offered while it exists (a second"
                " would be refused). "
                + (
                    "Its stages do not cover every node, so it cannot finalize: add a stage"
                    " for the rest to make"
                    if p.get("finalize")
                    else "Set finalize: true on it to make"
                )
                + f" {p['targetMode']} permanent, or delete it to move every node back.",
            ]
            continue
        out[2:2] = [
            f"  Note: policy {p['name']} is migrating this cluster to {p['targetMode']} now"
            f" ({p['phase']}{progress}): this reads the cluster as its source mode, and no"
            " starter policy is offered while it runs (a second would be refused).",
        ]
    marks = {"for": "+", "against": "!", "neutral": "="}
    for d in a.dimensions:
        out.append(f"{marks.get(d.leaning, '=')} {d.name} ({d.leaning})")
        out.extend(f"    - {r}" for r in d.reasons)
    if a.leave_out:
        out.append("")
        out.append("Leave out")
        for p in a.leave_out:
            out.append(
                f"  pool {p['pool']} ({', '.join(p['nodes'])}; kernel"
                f" {', '.join(p['kernels'])}): {p['reason']}"
            )
    return "\n".join(out) + "\n"
