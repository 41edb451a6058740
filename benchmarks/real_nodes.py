"""The physical floor of a node move: the real kube-proxy on real netfilter, by Service count.

    .venv/bin/python -m benchmarks.real_nodes [--services 100,1000,5000] [--dir DIR]

For each Service count, one sandbox with one real node (all Services have echo's three
backends). Measured, per mode, from the real kube-proxy's own ``/metrics`` on the node:

- first sync: ``kubeproxy_sync_proxy_rules_duration_seconds`` of the first sync after start
  (the full one that programs every Service);
- p99 sync: the histogram's p99 (a bucket bound) over 30 s in which one Service's endpoints
  change every second (without changes kube-proxy syncs only every ``syncPeriod``, 30 s);
- broken: while the node switches iptables -> nftables and back (ConfigMap mode changed,
  the pod deleted, the DaemonSet's new pod started by the sandbox's kubelet), echo's
  ClusterIP is probed from the node every 100 ms; the figure is the span from the first
  failed probe to the last, and the count of failed probes.

Nothing is asserted; the machine is shared, so read the figures as orders of magnitude.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from proxymode_sandbox import Sandbox, SandboxConfig, evidence, services

SYNC = "kubeproxy_sync_proxy_rules_duration_seconds"
STEADY_SECONDS = 30  # steady state sampled for p99


@dataclass
class Outage:
    failures: list[float] = field(default_factory=list)
    probes: int = 0

    def text(self) -> str:
        if not self.failures:
            return f"0 of {self.probes} probes failed"
        span = max(self.failures) - min(self.failures) + 0.1
        return f"{span:.1f}s broken ({len(self.failures)} of {self.probes} probes failed)"


def _metrics(ip: str) -> str:
    with urllib.request.urlopen(f"http://{ip}:10249/metrics", timeout=2) as r:
        return str(r.read().decode())


def _histogram(text: str) -> tuple[int, float, list[tuple[float, int]]]:
    count = total = 0.0
    buckets: list[tuple[float, int]] = []
    for line in text.splitlines():
        if 'ip_family="IPv6"' in line:
            continue  # the node has no IPv6 address; its IPv6 proxier syncs nothing of use
        if line.startswith(f"{SYNC}_count"):
            count = float(line.split()[-1])
        elif line.startswith(f"{SYNC}_sum"):
            total = float(line.split()[-1])
        elif line.startswith(f"{SYNC}_bucket"):
            le = re.search(r'le="([^"]+)"', line)
            if le and le.group(1) != "+Inf":
                buckets.append((float(le.group(1)), int(float(line.split()[-1]))))
    return int(count), total, buckets


def _p99(buckets: list[tuple[float, int]], count: int) -> float:
    for bound, seen in sorted(buckets):
        if seen >= 0.99 * count:
            return bound
    return float("inf")


def _first_sync(ip: str, timeout: float = 1200) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            count, total, _ = _histogram(_metrics(ip))
        except OSError:
            count, total = 0, 0.0
        if count >= 1:
            return total / count
        time.sleep(0.1)
    raise TimeoutError("no sync")


def _switch(box: Sandbox, node: str, mode: str) -> tuple[Outage, float]:
    outage, halt = Outage(), threading.Event()
    start = time.monotonic()

    def probe() -> None:
        while not halt.is_set():
            ok = evidence.echo(box.exec, node, timeout=0.1).startswith("echo-")
            outage.probes += 1
            if not ok:
                outage.failures.append(time.monotonic() - start)
            time.sleep(0.1)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    cm = box.get_json("configmap", "kube-proxy", namespace="kube-system")
    conf = yaml.safe_load(cm["data"]["config.conf"])
    conf["mode"] = mode
    cm["data"]["config.conf"] = yaml.safe_dump(conf)
    box.apply(
        [
            {k: cm[k] for k in ("apiVersion", "kind", "data")}
            | {"metadata": {"name": "kube-proxy", "namespace": "kube-system"}}
        ]
    )
    box.kubectl("delete", "pod", "-n", "kube-system", "-l", "k8s-app=kube-proxy", "--wait=true")
    box.wait_kube_proxy_ready()
    first = _first_sync(box.real.nodes[node]["ip"])
    time.sleep(3)  # the tail of the outage, if any, shows in these probes
    halt.set()
    thread.join()
    return outage, first


def _churn(box: Sandbox, seconds: float) -> None:
    """Flip svc-00001's endpoints between two and three backends, about once a second."""
    backends = [b["ip"] for b in box.real.state["real"]["backends"].values()]
    deadline, flip = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        flip += 1
        ips = backends[: 2 + flip % 2]
        slices = [o for o in services.objects(ips, 1) if o["kind"] == "EndpointSlice"]
        box.apply([s for s in slices if s["metadata"]["name"] == "svc-00001-real"])
        time.sleep(1.0)


def _row(services: int, mode: str, first: float, buckets: list[tuple[float, int]], n: int) -> str:
    return f"{services:>6} {mode} first sync {first:.3f}s, p99 <= {_p99(buckets, n)}s ({n} syncs)"


def run(count: int, state: Path) -> list[str]:
    box = Sandbox(
        SandboxConfig(
            state_dir=state,
            nodes=1,
            canary_nodes=0,
            real_nodes=1,
            services=count,
            prometheus=False,
            ready_timeout=1800,
        )
    )
    rows = []
    try:
        box.up()
        node = box.real_node_names()[0]
        ip = box.real.nodes[node]["ip"]
        first = _first_sync(ip)
        _churn(box, STEADY_SECONDS)
        syncs, _, buckets = _histogram(_metrics(ip))
        rows.append(_row(count, "iptables", first, buckets, syncs))
        out, first = _switch(box, node, "nftables")
        _churn(box, STEADY_SECONDS)
        syncs, _, buckets = _histogram(_metrics(ip))
        rows.append(_row(count, "nftables", first, buckets, syncs))
        rows.append(f"{count:>6} iptables -> nftables: {out.text()}")
        back, _ = _switch(box, node, "iptables")
        rows.append(f"{count:>6} nftables -> iptables: {back.text()}")
    finally:
        box.down()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--services", default="100,1000,5000")
    p.add_argument("--dir", type=Path, default=None, help="state root (default: a new temp dir)")
    args = p.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="pm-bench-real-"))
    for n in (int(x) for x in args.services.split(",")):
        for row in run(n, root / f"s{n}"):
            print(row, flush=True)


if __name__ == "__main__":
    main()
