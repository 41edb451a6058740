"""Simulated kube-proxy and node_exporter metrics for the sandbox's kwok nodes.

kwok nodes run no kube-proxy, so this process plays its metrics (real nodes, labelled
``sandbox.proxymode.io/real``, serve their own: ``realnode``): for each node it serves
``http://<node InternalIP>:10249/metrics`` (kube-proxy) and ``:9100/metrics``
(node_exporter's conntrack gauges) on the node's loopback address, with kube-proxy's exact
metric names, types, labels and buckets (reference/kube-proxy.md §1) for the mode the node
runs *now* — read from the cluster: the newest Running kube-proxy pod on the node, its
``proxymode.io/mode`` label, else its ConfigMap's ``mode``.

Values are noisy but reproducible (seeded per node): nftables syncs faster than iptables
at the sandbox's Service count; a fresh kube-proxy's first syncs are slow; a new pod
restarts the counters, as a new process would. Faults come from the node annotation
``sandbox.proxymode.io/fault``: ``slow-sync``, ``conntrack-high``, ``sync-failures``,
``no-metrics`` (none: healthy).

It also writes Prometheus file_sd target files, so the sandbox's Prometheus scrapes
every node, labelled ``instance=<node name>`` and ``pool``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from proxymode_sandbox.informer import Informer

FAULT_ANNOTATION = "sandbox.proxymode.io/fault"
REAL_LABEL = "sandbox.proxymode.io/real"
FAULTS = ("slow-sync", "conntrack-high", "sync-failures", "no-metrics")
KUBE_PROXY_PORT = 10249
NODE_EXPORTER_PORT = 9100
SYNC_BUCKETS = tuple(0.001 * 2**i for i in range(15))  # ExponentialBuckets(0.001, 2, 15)
NETPROG_BUCKETS = (
    0.25,
    0.5,
    *(float(s) for s in range(1, 60)),
    *(float(s) for s in range(60, 120, 5)),
    *(float(s) for s in range(120, 301, 30)),
)
# Median sync time per mode at the sandbox's Service count (seconds), and for a fault.
SYNC_MEDIAN = {"iptables": 0.12, "ipvs": 0.08, "nftables": 0.03}
SLOW_SYNC_MEDIAN = 2.5
NETPROG_MEDIAN = {"iptables": 1.2, "ipvs": 1.0, "nftables": 0.6}
WARMUP_SECONDS = 10.0  # a fresh kube-proxy's first syncs are slow, this long
CONNTRACK_LIMIT = 131072
FAILURE_COUNTERS = {
    "iptables": "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
    "ipvs": "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
    "nftables": "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
}


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1

    def render(self, name: str, labels: str) -> list[str]:
        lines = [f"# TYPE {name} histogram"]
        for bound, count in zip(self.buckets, self.counts, strict=True):
            lines.append(f'{name}_bucket{{{labels},le="{_fmt(bound)}"}} {count}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.n}')
        lines.append(f"{name}_sum{{{labels}}} {self.total:.6f}")
        lines.append(f"{name}_count{{{labels}}} {self.n}")
        return lines


def _fmt(value: float) -> str:
    text = f"{value:.6g}"
    return text if "." in text or "e" in text else f"{text}"


@dataclass
class ProxyProcess:
    """The simulated state of one kube-proxy process on one node."""

    mode: str
    started: float
    rng: random.Random
    sync: Histogram = field(default_factory=lambda: Histogram(SYNC_BUCKETS))
    full_sync: Histogram = field(default_factory=lambda: Histogram(SYNC_BUCKETS))
    netprog: Histogram = field(default_factory=lambda: Histogram(NETPROG_BUCKETS))
    failures: int = 0
    last_sync: float = 0.0
    last_queued: float = 0.0
    advanced_to: float = 0.0

    def advance(self, now: float, fault: str | None) -> None:
        """Play the syncs since the last call: about one a second, a full one every 30s."""
        t = max(self.advanced_to, self.started)
        while t + 1.0 <= now:
            t += 1.0
            self.last_queued = t
            median = SLOW_SYNC_MEDIAN if fault == "slow-sync" else SYNC_MEDIAN[self.mode]
            if t - self.started < WARMUP_SECONDS:
                median *= 8
            duration = median * math.exp(self.rng.gauss(0, 0.35))
            self.sync.observe(duration)
            if int(t - self.started) % 30 == 0:
                self.full_sync.observe(duration * 1.5)
            self.netprog.observe(NETPROG_MEDIAN[self.mode] * math.exp(self.rng.gauss(0, 0.3)))
            if fault == "sync-failures" and int(t) % 3 == 0:
                self.failures += 1
            elif fault != "slow-sync" or duration < 1.0:
                self.last_sync = t
        self.advanced_to = t

    def render(self) -> str:
        fam = 'ip_family="IPv4"'
        lines: list[str] = []
        lines += self.sync.render("kubeproxy_sync_proxy_rules_duration_seconds", fam)
        if self.mode == "iptables":
            lines += self.full_sync.render("kubeproxy_sync_full_proxy_rules_duration_seconds", fam)
        lines += self.netprog.render("kubeproxy_network_programming_duration_seconds", fam)
        for name, value in (
            ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", self.last_sync),
            ("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", self.last_queued),
        ):
            lines += [f"# TYPE {name} gauge", f"{name}{{{fam}}} {value:.3f}"]
        counters = {FAILURE_COUNTERS[self.mode]: self.failures}
        if self.mode == "iptables":
            counters["kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"] = 0
            # The two iptables-only workarounds nftables mode drops (reference §1, §5): the
            # sandbox's clients use neither, as `kubectl proxymode advise` reports.
            counters["kubeproxy_iptables_localhost_nodeports_accepted_packets_total"] = 0
            counters["kubeproxy_iptables_ct_state_invalid_dropped_packets_total"] = 0
        if self.mode == "nftables":
            counters["kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"] = 0
        for name, value in sorted(counters.items()):
            lines += [f"# TYPE {name} counter", f"{name}{{{fam}}} {value}"]
        return "\n".join(lines) + "\n"


@dataclass
class NodeState:
    name: str
    ip: str
    pool: str
    fault: str | None = None
    proxy: ProxyProcess | None = None
    proxy_pod: str | None = None
    rng: random.Random = field(default_factory=lambda: _rng(""))

    def conntrack(self) -> str:
        high = self.fault == "conntrack-high"
        base = CONNTRACK_LIMIT * (0.93 if high else 0.09)
        entries = int(base * (1 + self.rng.uniform(-0.02, 0.02)))
        return (
            "# TYPE node_nf_conntrack_entries gauge\n"
            f"node_nf_conntrack_entries {entries}\n"
            "# TYPE node_nf_conntrack_entries_limit gauge\n"
            f"node_nf_conntrack_entries_limit {CONNTRACK_LIMIT}\n"
        )


class Simulator:
    """Follows the cluster and serves every node's metrics.

    The nodes, kube-proxy pods and ConfigMaps come from informers (a list, then a watch):
    ``poll`` reads their local copies and makes no request of its own.
    """

    def __init__(self, api: client.ApiClient, targets_dir: Path) -> None:
        self.core = client.CoreV1Api(api)
        self.targets_dir = targets_dir
        self.nodes: dict[str, NodeState] = {}
        self.servers: dict[tuple[str, int], ThreadingHTTPServer] = {}
        self.lock = threading.Lock()
        self.changed = threading.Event()
        self.node_informer = Informer(self.core.list_node, self.changed)
        self.pod_informer = Informer(
            self.core.list_pod_for_all_namespaces, self.changed, label_selector="k8s-app=kube-proxy"
        )
        self.config_informer = Informer(self.core.list_config_map_for_all_namespaces, self.changed)
        self.informers = (self.node_informer, self.pod_informer, self.config_informer)
        self._parsed: dict[tuple[str, str], tuple[str, str]] = {}
        """(namespace, ConfigMap) -> (resourceVersion, mode): each version parsed once."""

    def start(self, timeout: float = 60) -> None:
        """Start following the cluster; return once every copy has its first list."""
        for informer in self.informers:
            informer.start()
        deadline = time.monotonic() + timeout
        for informer in self.informers:
            informer.wait_synced(max(0.0, deadline - time.monotonic()))

    def wait_change(self, timeout: float) -> None:
        """Return when a copy changed (or after ``timeout``); the next ``poll`` sees it."""
        self.changed.wait(timeout)
        self.changed.clear()

    def poll(self) -> None:
        nodes = self.node_informer.items()
        pods = self.pod_informer.items()
        modes = self._config_modes(pods)
        newest: dict[str, dict[str, Any]] = {}
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if not node or pod["metadata"].get("deletionTimestamp") or not _ready(pod):
                continue
            seen = newest.get(node)
            if seen is None or _created(pod) > _created(seen):
                newest[node] = pod
        now = time.time()
        with self.lock:
            present = set()
            for node in nodes:
                meta = node["metadata"]
                addresses = (node.get("status") or {}).get("addresses") or []
                ip = next((a["address"] for a in addresses if a.get("type") == "InternalIP"), None)
                if ip is None or (meta.get("labels") or {}).get(REAL_LABEL) == "true":
                    continue  # a real node serves its own kube-proxy and node_exporter metrics
                name = meta["name"]
                present.add(name)
                state = self.nodes.get(name)
                if state is None:
                    pool = (meta.get("labels") or {}).get("pool", "")
                    state = NodeState(name, ip, pool, rng=_rng(name))
                    self.nodes[name] = state
                    self._serve(state)
                fault = (meta.get("annotations") or {}).get(FAULT_ANNOTATION)
                state.fault = fault if fault in FAULTS else None
                self._follow(state, newest.get(name), modes, now)
            for gone in set(self.nodes) - present:
                self._stop(self.nodes.pop(gone))
        self._write_targets()

    def _config_modes(self, pods: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
        """The mode in each kube-proxy ConfigMap the pods mount."""
        out: dict[tuple[str, str], str] = {}
        for pod in pods:
            namespace = pod["metadata"]["namespace"]
            for cm in _config_maps(pod):
                if (namespace, cm) in out:
                    continue
                data = self.config_informer.get(namespace, cm)
                if data is None:
                    continue
                version = str((data.get("metadata") or {}).get("resourceVersion", ""))
                known = self._parsed.get((namespace, cm))
                if known is not None and known[0] == version:
                    out[(namespace, cm)] = known[1]
                    continue
                with contextlib.suppress(Exception):
                    conf = yaml.safe_load((data.get("data") or {}).get("config.conf", "")) or {}
                    out[(namespace, cm)] = str(conf.get("mode") or "iptables")
                    self._parsed[(namespace, cm)] = (version, out[(namespace, cm)])
        return out

    def _follow(
        self,
        state: NodeState,
        pod: dict[str, Any] | None,
        modes: dict[tuple[str, str], str],
        now: float,
    ) -> None:
        if pod is None:
            state.proxy, state.proxy_pod = None, None
            return
        name = pod["metadata"]["name"]
        if name == state.proxy_pod and state.proxy is not None:
            return
        namespace = pod["metadata"]["namespace"]
        mode = (pod["metadata"].get("labels") or {}).get("proxymode.io/mode")
        if not mode:
            found = [modes[(namespace, c)] for c in _config_maps(pod) if (namespace, c) in modes]
            mode = found[0] if found else "iptables"
        started = min(_created(pod), now)
        if mode not in SYNC_MEDIAN:
            mode = "iptables"
        state.proxy = ProxyProcess(mode, started, _rng(f"{state.name}/{name}"))
        state.proxy_pod = name

    def _serve(self, state: NodeState) -> None:
        for port in (KUBE_PROXY_PORT, NODE_EXPORTER_PORT):
            server = ThreadingHTTPServer((state.ip, port), _handler(self, state.name, port))
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, daemon=True).start()
            self.servers[(state.name, port)] = server

    def _stop(self, state: NodeState) -> None:
        for port in (KUBE_PROXY_PORT, NODE_EXPORTER_PORT):
            server = self.servers.pop((state.name, port), None)
            if server is not None:
                server.shutdown()
                server.server_close()

    def render(self, node: str, port: int) -> tuple[int, str]:
        with self.lock:
            state = self.nodes.get(node)
            if state is None:
                return 404, "no such node\n"
            if port == NODE_EXPORTER_PORT:
                return 200, state.conntrack()
            if state.proxy is None:
                return 503, "no kube-proxy runs on this node\n"
            if state.fault == "no-metrics":
                return 503, "metrics unavailable (fault injected)\n"
            state.proxy.advance(time.time(), state.fault)
            return 200, state.proxy.render()

    def _write_targets(self) -> None:
        self.targets_dir.mkdir(parents=True, exist_ok=True)
        for job, port in (("kube-proxy", KUBE_PROXY_PORT), ("node-exporter", NODE_EXPORTER_PORT)):
            targets = [
                {
                    "targets": [f"{s.ip}:{port}"],
                    "labels": {"instance": s.name, "node": s.name, "pool": s.pool},
                }
                for s in sorted(self.nodes.values(), key=lambda s: s.name)
            ]
            path = self.targets_dir / f"{job}.json"
            text = json.dumps(targets, indent=1)
            if not path.exists() or path.read_text() != text:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(text)
                tmp.replace(path)


def _rng(seed: str) -> random.Random:
    """Noise, not secrets: reproducible per node and per pod."""
    return random.Random(seed)  # noqa: S311


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _created(pod: dict[str, Any]) -> float:
    text = str(pod["metadata"]["creationTimestamp"]).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def _config_maps(pod: dict[str, Any]) -> list[str]:
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return [v["configMap"]["name"] for v in volumes if v.get("configMap")]


def _handler(sim: Simulator, node: str, port: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            code, body = sim.render(node, port)
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            return

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--targets-dir", required=True, type=Path)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args(argv)
    api = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    sim = Simulator(api, args.targets_dir)
    sim.start()
    print(f"kube-proxy metrics simulator: targets in {args.targets_dir}", flush=True)
    while True:
        try:
            sim.poll()
        except Exception as e:  # keep serving through API hiccups
            print(f"poll failed: {e}", file=sys.stderr, flush=True)
        # At once after a change (a new pod, a label, a fault annotation), at least every
        # interval; never more than 4 times a second however busy the cluster is.
        time.sleep(0.25)
        sim.wait_change(max(0.0, args.interval - 0.25))


if __name__ == "__main__":
    sys.exit(main())
