"""Real nodes: the real kube-proxy on real netfilter, one network namespace per node.

A real node is a namespace on the sandbox's bridge (``netns``), a Node object without
kwok's annotation (kwok manages only ``kwok.x-k8s.io/node=fake`` nodes) and labelled
``sandbox.proxymode.io/real: "true"``, kept Ready with its Lease renewed by the
sandbox's kubelet (``kubelet``), which runs the pods bound there — kube-proxy from any
DaemonSet, and the operator's Jobs — as processes in the namespace. Each node also runs
node_exporter (conntrack collector) on its own address; Prometheus scrapes it and the
node's kube-proxy at ``<node IP>:10249`` with the labels the simulated nodes carry.

The API server binds 127.0.0.1 only; the nodes reach it through ``forward`` on the
host side of the bridge, with a kubeconfig whose ``tls-server-name`` is a SAN of the
serving certificate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxymode_sandbox import netns, podrun, process

REAL_LABEL = "sandbox.proxymode.io/real"
API_PORT = 6443
TLS_SERVER_NAME = "kubernetes"
SERVICE_ROUTE = "10.96.0.0/16"
NODE_EXPORTER_PORT = 9100
KUBE_PROXY_METRICS_PORT = 10249
NODE_EXPORTER_COLLECTORS = ("conntrack", "netdev", "sockstat")

Starter = Callable[[str, list[str]], process.ProcessRecord]


@dataclass
class RealNodes:
    """The real-node part of one sandbox; its facts live in the sandbox's state dict."""

    state_dir: Path
    state: dict[str, Any]

    @property
    def root(self) -> Path:
        return self.state_dir / "realnodes"

    @property
    def bridge(self) -> netns.Bridge:
        real = self.state["real"]
        return netns.Bridge(real["sid"], int(real["octet"]))

    @property
    def nodes(self) -> dict[str, dict[str, Any]]:
        nodes: dict[str, dict[str, Any]] = self.state.get("real", {}).get("nodes", {})
        return nodes

    @property
    def server(self) -> str:
        """The API server as the nodes reach it."""
        return f"https://{self.bridge.host_ip}:{API_PORT}"

    def create_network(self, preferred_octet: int | None) -> None:
        sid = netns.sandbox_id(self.state_dir)
        self.remove()  # what a crashed sandbox of this directory may have left
        octet = netns.choose_octet(preferred_octet)
        self.state["real"] = {"sid": sid, "octet": octet, "nodes": {}, "backends": {}}
        self.bridge.create()
        self.root.mkdir(parents=True, exist_ok=True)

    def start_forwarder(self, start: Starter, apiserver_port: int) -> None:
        start(
            "api-forwarder",
            [
                *_python(),
                "proxymode_sandbox.forward",
                f"--listen={self.bridge.host_ip}:{API_PORT}",
                f"--to=127.0.0.1:{apiserver_port}",
                f"--state-dir={self.state_dir}",
            ],
        )

    def add_node(self, name: str) -> str:
        """Make the node's namespace; returns its InternalIP."""
        index = len(self.nodes) + 1
        octet = netns.NODE_OCTETS[index - 1]
        ip = self.bridge.attach(name, "n", index, octet, [SERVICE_ROUTE])
        self.nodes[name] = {
            "name": name,
            "netns": self.bridge.netns(name),
            "ip": ip,
            "root": str(self.root / name),
        }
        (self.root / name).mkdir(parents=True, exist_ok=True)
        return ip

    def start_kubelet(
        self, start: Starter, kubeconfig: Path, bin_dir: Path, containers_conf: str = ""
    ) -> None:
        """``containers_conf``: pods whose image is in the local podman store run under
        podman with this configuration (decision 0066); empty: every pod is a process."""
        body: dict[str, Any] = {
            "kubeconfig": str(kubeconfig),
            "binDir": str(bin_dir),
            "nodes": list(self.nodes.values()),
        }
        if containers_conf:
            body["podman"] = {"containersConf": containers_conf, "sandbox": self.bridge.sid}
            self.state["real"]["containersConf"] = containers_conf
        cfg = self.root / "kubelet.json"
        cfg.write_text(json.dumps(body, indent=1))
        start("kubelet", [*_python(), "proxymode_sandbox.kubelet", f"--config={cfg}"])

    def start_node_exporters(self, start: Starter) -> None:
        binary = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
        if binary is None:
            raise netns.NetnsError(
                "prometheus-node-exporter is not installed; `make system-deps` installs it"
            )
        for node in self.nodes.values():
            textfiles = Path(node["root"]) / "textfile"
            textfiles.mkdir(parents=True, exist_ok=True)
            collectors = [f"--collector.{c}" for c in NODE_EXPORTER_COLLECTORS]
            start(
                f"node-exporter-{node['name']}",
                netns.exec_argv(
                    node["netns"],
                    [
                        binary,
                        f"--web.listen-address={node['ip']}:{NODE_EXPORTER_PORT}",
                        "--collector.disable-defaults",
                        *collectors,
                        "--collector.textfile",
                        # names the state directory, so `down` finds the process by it
                        f"--collector.textfile.directory={textfiles}",
                    ],
                ),
            )

    def write_targets(self, targets_dir: Path, pools: dict[str, str]) -> None:
        """Prometheus file_sd targets for the real nodes (the simulator covers the rest)."""
        targets_dir.mkdir(parents=True, exist_ok=True)
        for job, port in (
            ("kube-proxy", KUBE_PROXY_METRICS_PORT),
            ("node-exporter", NODE_EXPORTER_PORT),
        ):
            entries = [
                {
                    "targets": [f"{n['ip']}:{port}"],
                    "labels": {"instance": name, "node": name, "pool": pools.get(name, "")},
                }
                for name, n in sorted(self.nodes.items())
            ]
            (targets_dir / f"{job}-real.json").write_text(json.dumps(entries, indent=1))

    def netns_of(self, node: str) -> str:
        if node in self.nodes:
            return str(self.nodes[node]["netns"])
        backends = self.state.get("real", {}).get("backends", {})
        if node in backends:
            return str(backends[node]["netns"])
        known = sorted([*self.nodes, *backends])
        raise KeyError(f"{node!r} is not a real node of this sandbox (real: {', '.join(known)})")

    def remove(self) -> list[str]:
        """Stop every process in this sandbox's namespaces, then delete them and the bridge.

        Works from the directory alone, so it also cleans up after a crash.
        """
        sid = netns.sandbox_id(self.state_dir)
        # The containers of this sandbox's pods (labelled with its id): when it ran any, or
        # when its state is lost and nobody knows.
        conf = str(self.state.get("real", {}).get("containersConf", ""))
        if (conf or not self.state) and shutil.which("podman"):
            podrun.Podman(conf or os.environ.get("CONTAINERS_CONF", ""), sid).remove_all()
        pids = [pid for ns in netns.namespaces(sid) for pid in netns.pids_in(ns)]
        process.stop_pids(pids, grace_seconds=5.0)
        return netns.teardown(sid)


BLACKHOLE_TABLE = "sandbox_fault"


def set_blackhole(ns: str, on: bool) -> None:
    """The ``blackhole`` fault: a host firewall that disagrees with kube-proxy, i.e. an
    nftables table of the sandbox's own, hooked before NAT, dropping all Service traffic."""
    if on:
        rules = (
            f"table ip {BLACKHOLE_TABLE} {{ chain output {{"
            " type filter hook output priority -300; policy accept;"
            f" ip daddr {SERVICE_ROUTE} counter drop; }}; }}"
        )
        argv = ["nft", "-f", "-"]
    else:
        rules, argv = "", ["nft", "delete", "table", "ip", BLACKHOLE_TABLE]
    subprocess.run(
        netns.exec_argv(ns, argv), input=rules.encode(), capture_output=True, check=False
    )


def _python() -> list[str]:
    return [sys.executable, "-m"]
