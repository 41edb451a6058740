"""``advise [--prometheus URL]``: the seeds' four dimensions on the live cluster; see ``advice``.

Gathers the inventory (versions, the kube-proxy ConfigMap's mode, pools and kernels,
Services by type, EndpointSlices, CNI, MetalLB) and today's metrics (sync and programming
p99, churn, conntrack, the iptables-workaround counters), then prints the recommendation,
its reasons per dimension, the pools to leave out and a starter ProxyModePolicy.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from typing import Any

import yaml

from proxymode.cli import advice
from proxymode.cli.client import ClientError, Cluster
from proxymode.cli.common import common_flags, connection, emit
from proxymode.kube.observe import CNI_DAEMON_SETS

QUERIES = {
    "sync_p99": "histogram_quantile(0.99, sum by (le)"
    " (rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket[5m])))",
    "network_programming_p99": "histogram_quantile(0.99, sum by (le)"
    " (rate(kubeproxy_network_programming_duration_seconds_bucket[5m])))",
    "syncs_per_second": "sum(rate(kubeproxy_sync_proxy_rules_duration_seconds_count[5m]))",
    "conntrack_max_ratio": "max(node_nf_conntrack_entries / node_nf_conntrack_entries_limit)",
    "localhost_nodeport_packets": "sum(kubeproxy_iptables_localhost_nodeports_accepted"
    "_packets_total)",
    "ct_invalid_drops": "sum(kubeproxy_iptables_ct_state_invalid_dropped_packets_total)",
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "advise",
        parents=[common_flags()],
        help="should this cluster change kube-proxy mode, and to which?",
        description="kubectl proxymode advise: judge correctness, rule convergence,"
        " operations and evolution from the live inventory and metrics; recommend a mode or"
        " 'stay', name the pools to leave out, and print a starter ProxyModePolicy.",
    )
    p.add_argument(
        "--prometheus",
        default=None,
        help="Prometheus URL (default: $PROMETHEUS_URL, else the one a policy names)",
    )
    p.add_argument("--namespace", default="kube-system", help="kube-proxy's namespace")
    p.add_argument("--config-map", default="kube-proxy", help="kube-proxy's ConfigMap")
    p.add_argument("--config-key", default="config.conf", help="the key with its config")
    p.set_defaults(func=cmd_advise)


def _prometheus_url(cluster: Cluster, given: str | None) -> str | None:
    if given:
        return given
    if os.environ.get("PROMETHEUS_URL"):  # the sandbox's env file sets it
        return os.environ["PROMETHEUS_URL"]
    try:
        policies = cluster.policies()
    except ClientError:
        return None
    for p in policies:
        url = (((p.get("spec") or {}).get("analysis") or {}).get("prometheus") or {}).get("url")
        if url:
            return str(url)
    return None


def _metrics(cluster: Cluster, url: str | None) -> advice.Metrics:
    if not url:
        return advice.Metrics()
    prom = cluster.prometheus(url)
    values = {name: prom.scalar(query) for name, query in QUERIES.items()}
    clean = {k: (None if v is None or math.isnan(v) else v) for k, v in values.items()}
    return advice.Metrics(**clean)


def _kube_proxy(cluster: Cluster, args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The configured mode (empty reads as iptables) and the kube-proxy image's version."""
    mode = None
    cm = cluster.config_map(args.namespace, args.config_map)
    if cm is not None:
        text = (cm.get("data") or {}).get(args.config_key)
        if text:
            config = yaml.safe_load(text) or {}
            mode = str(config.get("mode") or "iptables")
    version = None
    for ds in cluster.daemon_sets():
        if ds["metadata"]["namespace"] == args.namespace and ds["metadata"]["name"] == "kube-proxy":
            for c in ds["spec"]["template"]["spec"].get("containers") or []:
                image = str(c.get("image", ""))
                if ":" in image:
                    version = image.rsplit(":", 1)[1]
    return mode, version


def inventory(cluster: Cluster, args: argparse.Namespace) -> advice.Inventory:
    services = cluster.services()
    by_type: dict[str, int] = {}
    for s in services:
        kind = str((s.get("spec") or {}).get("type", "ClusterIP"))
        by_type[kind] = by_type.get(kind, 0) + 1
    daemon_sets = cluster.daemon_sets()
    cni = sorted(
        {
            CNI_DAEMON_SETS[d["metadata"]["name"]]
            for d in daemon_sets
            if d["metadata"]["name"] in CNI_DAEMON_SETS
        }
    )
    metallb = any("metallb" in d["metadata"]["name"] for d in daemon_sets)
    mode, version = _kube_proxy(cluster, args)
    strict_arp = None
    cm = cluster.config_map(args.namespace, args.config_map)
    if cm is not None and (cm.get("data") or {}).get(args.config_key):
        config = yaml.safe_load(cm["data"][args.config_key]) or {}
        strict_arp = bool((config.get("ipvs") or {}).get("strictARP", False))
    slices = cluster.endpoint_slices()
    url = _prometheus_url(cluster, args.prometheus)
    return advice.Inventory(
        kubernetes_version=cluster.server_version(),
        kube_proxy_version=version,
        current_mode=mode,
        pools=advice.pools_of(cluster.nodes()),
        services_by_type=by_type,
        endpoint_slices=len(slices),
        endpoints=sum(len(s.get("endpoints") or []) for s in slices),
        cni=", ".join(cni) or None,
        metallb=metallb,
        strict_arp=strict_arp,
        metrics=_metrics(cluster, url),
        prometheus_url=url,
    )


def cmd_advise(args: argparse.Namespace) -> int:
    cluster = Cluster(connection(args))
    inv = inventory(cluster, args)
    a = advice.advise(inv)
    with contextlib.suppress(ClientError):  # no CRD: no policy can be in flight
        a = advice.with_policies(a, cluster.policies())
    if args.output != "text":
        emit(a.wire(), args.output)
        return 0
    print(advice.render(a), end="")
    if a.policy is not None:
        print("\nA starter policy (check it with `kubectl proxymode plan -f FILE`):")
        read = inv.prometheus_url
        named = a.policy["spec"]["analysis"]["prometheus"]["url"]
        if read and read != named:
            print(
                f"# Prometheus was read at {read}, this machine's own address for it; the"
                f" policy names {named}, as the operator's pod would reach it: set yours."
            )
        print("---")
        print(yaml.safe_dump(a.policy, sort_keys=False), end="")
    return 0
