"""The sandbox's lifecycle: bring a real control plane up, report on it, take it down.

``up`` runs etcd, kube-apiserver (TLS, RBAC, ServiceAccount signing),
kube-controller-manager, kube-scheduler and kwok on free loopback ports, registers
simulated nodes and installs kube-proxy the kubeadm way, then waits until every
node is Ready and every kube-proxy pod is Ready. Everything lives in one state
directory; ``down`` stops every process whose command line names that directory
and removes it, so nothing outlives the sandbox even after a crash.

With ``real_nodes`` the last nodes are real instead (``realnode``: a network namespace
each, the real kube-proxy run by the sandbox's kubelet), with real Services
(``services``); ``down`` also removes their namespaces, links and processes.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Any

import yaml

from proxymode_sandbox import kubeadm_proxy, monitoring, netns, process, services
from proxymode_sandbox.binaries import binary_dir
from proxymode_sandbox.certs import CertificateAuthority, service_account_signing_key
from proxymode_sandbox.kubeconfig import write_kubeconfig
from proxymode_sandbox.process import ProcessRecord
from proxymode_sandbox.realnode import API_PORT, REAL_LABEL, TLS_SERVER_NAME, RealNodes
from proxymode_sandbox.topology import KWOK_ANNOTATION, PoolSpec, Topology, node_manifest

STATE_FILE = "state.json"
CRASHLOOP_ANNOTATION = "sandbox.proxymode.io/crashloop"
SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_CIDR = "10.244.0.0/16"
OPERATOR_JOB = "proxymode-operator"
# Node InternalIPs live on loopback (127.0.10.N unless taken, see Sandbox._node_net):
# reachable, never leave the host.
DEFAULT_STATE_DIR = Path(".sandbox")
CRD = Path(__file__).resolve().parents[2] / "crds" / "proxymode.io_proxymodepolicies.yaml"
KWOK_MISSED_POD_SECONDS = 45.0
"""A kube-proxy pod bound to a kwok node and still Pending this long at ``up`` was missed by
kwok (its log never names the pod); it is deleted once, so the DaemonSet makes another."""


def _kube_proxy_pod(pod: dict[str, Any]) -> bool:
    """A pod of the sandbox's kubeadm kube-proxy DaemonSet."""
    return any(
        r.get("kind") == "DaemonSet" and r.get("name") == kubeadm_proxy.NAME
        for r in pod["metadata"].get("ownerReferences") or []
    )


class SandboxError(RuntimeError):
    """The sandbox could not be brought up or used; the message says which part failed and why."""


@dataclass
class SandboxConfig:
    """How to build a sandbox. The defaults are the demo's 6-node cluster."""

    state_dir: Path = DEFAULT_STATE_DIR
    nodes: int = 6
    canary_nodes: int = 2
    legacy_nodes: int = 0
    proxy_mode: str = "iptables"
    ready_timeout: float = 180.0
    prometheus: bool = True
    """Run simulated kube-proxy metrics and a Prometheus that scrapes them."""
    real_nodes: int = 0
    """How many of the nodes (the last ones in creation order) are real (``realnode``)."""
    services: int = 100
    """Services besides ``echo`` in namespace ``sandbox`` (only with real nodes)."""
    containers_conf: str = ""
    """Opt-in: a real node's pod whose image is in the local podman store runs under podman
    with this ``containers.conf`` (images/build.sh writes it); empty: every pod is a process
    (decision 0066)."""
    node_lease_seconds: int = 40
    """kwok's node Lease duration (renewed about every quarter of it). Thousands of kwok
    nodes renew a Lease each every 10 s at the default: on two cores that load keeps the
    controllers behind (the 5,000-node benchmark raises it; the node lifecycle controller's
    grace period follows, so no node goes NotReady between renewals)."""
    controller_qps: int = 0
    """kube-controller-manager's ``--kube-api-qps`` (burst twice that); 0 keeps its default
    of 20, which paces the DaemonSet controller's pod creations and deletions."""

    def topology(self) -> Topology:
        return Topology.sized(self.nodes, self.canary_nodes, self.legacy_nodes)


@dataclass
class ComponentStatus:
    name: str
    pid: int
    running: bool
    log: Path
    log_tail: str = ""


@dataclass
class SandboxStatus:
    """What ``status`` reports: which components run, and where to reach the API."""

    state_dir: Path
    exists: bool
    server: str = ""
    kubernetes_version: str = ""
    components: list[ComponentStatus] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        """The cluster's own parts all run. The operator is the sandbox's guest, not a part:
        one killed (``kill -9``, a crash) leaves a usable cluster, and ``make sandbox`` or
        ``proxymode-sandbox operator start`` starts it again."""
        parts = [c for c in self.components if not _is_operator(c.name)]
        return self.exists and bool(parts) and all(c.running for c in parts)


@dataclass
class UpReport:
    """Timings of one ``up``, in seconds, by phase."""

    phases: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.phases.values())


class Sandbox:
    """A sandbox rooted at one state directory."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.dir = self.config.state_dir.resolve()
        self._state: dict[str, Any] = self._load_state()
        self._net_lock: IO[bytes] | None = None

    # -- paths --

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (``system:masters``)."""
        return self.dir / "kubeconfig"

    @property
    def env_file(self) -> Path:
        """A file a shell can ``source`` to drive the sandbox with ordinary tools."""
        return self.dir / "env"

    @property
    def bin_dir(self) -> Path:
        """kubectl and helm, linked from the build cache."""
        return self.dir / "bin"

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    @property
    def server(self) -> str:
        return str(self._state.get("server", ""))

    @property
    def kubernetes_version(self) -> str:
        return str(self._state.get("kubernetesVersion", ""))

    @property
    def prometheus_url(self) -> str:
        """The sandbox's Prometheus (empty when it runs without one)."""
        return str(self._state.get("prometheus", ""))

    @property
    def marker(self) -> str:
        """The string every component's command line contains: the state directory."""
        return str(self.dir)

    # -- state --

    def _load_state(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self.dir / STATE_FILE).read_text())
        except FileNotFoundError:
            return {}
        return data

    def _save_state(self) -> None:
        (self.dir / STATE_FILE).write_text(json.dumps(self._state, indent=2, sort_keys=True))

    def _records(self) -> list[ProcessRecord]:
        return [ProcessRecord.from_json(p) for p in self._state.get("processes", [])]

    def _add_record(self, record: ProcessRecord) -> None:
        self._state.setdefault("processes", []).append(record.to_json())
        self._save_state()

    # -- lifecycle --

    def up(self, log: Callable[[str], None] = lambda _: None) -> UpReport:
        """Bring the sandbox up and wait until it is usable.

        Raises ``SandboxError`` (with the failing component's last log lines) and
        stops whatever it started when any part does not come up.
        """
        status = self.status()
        if status.healthy:
            raise SandboxError(f"a sandbox is already running in {self.dir}; `down` it first")
        if status.exists:
            self.down()
        report = UpReport()
        try:
            self._up(report, log)
        except BaseException:
            self._stop_processes()
            RealNodes(self.dir, self._state).remove()
            raise
        return report

    def _phase(self, report: UpReport, name: str, log: Callable[[str], None]) -> _PhaseTimer:
        return _PhaseTimer(report, name, log)

    def _prepare(self, bins: Path) -> tuple[dict[str, int], str]:
        """The state directory, free ports, the first state file and the tool links."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for sub in ("logs", "pki", "bin"):
            (self.dir / sub).mkdir(exist_ok=True)
        version = _binary_version(bins / "kube-apiserver")
        ports = {
            k: process.free_port() for k in ("etcd", "etcdPeer", "apiserver", "kcm", "scheduler")
        }
        server = f"https://127.0.0.1:{ports['apiserver']}"
        self._state = {
            "binDir": str(bins),
            "kubernetesVersion": version,
            "server": server,
            "ports": ports,
            "processes": [],
            "topology": [p.__dict__ for p in self.config.topology().pools],
            "proxyMode": self.config.proxy_mode,
        }
        self._save_state()
        for tool in ("kubectl", "helm"):
            link = self.bin_dir / tool
            link.unlink(missing_ok=True)
            link.symlink_to(bins / tool)
        return ports, server

    def _up(self, report: UpReport, log: Callable[[str], None]) -> None:
        with self._phase(report, "binaries", log):
            bins = binary_dir()
        ports, server = self._prepare(bins)
        version = self._state["kubernetesVersion"]
        with self._phase(report, "certificates", log):
            self._write_pki(server)
        with self._phase(report, "etcd", log):
            self._start_etcd(bins, ports)
        with self._phase(report, "kube-apiserver", log):
            self._start_apiserver(bins, ports, server)
        with self._phase(report, "controllers", log):
            self._start_controllers(bins, ports)
        real = self._real_count(log)
        node_server, sni = server, ""
        # The bridge carries the real nodes, and Prometheus's in-cluster address (monitoring).
        if real or self._bridge_for_monitoring(log):
            with self._phase(report, "network", log):
                self.real.create_network(_third_octet(self._node_net()))
                self._save_state()
                if real:
                    self.real.start_forwarder(self._start, ports["apiserver"])
                    node_server, sni = self.real.server, TLS_SERVER_NAME
        with self._phase(report, "kube-proxy", log):
            self.apply(kubeadm_proxy.manifests(node_server, version, self.config.proxy_mode, sni))
        with self._phase(report, "nodes", log):
            # The last nodes are the real ones: the canaries stay kwok, where the demo's
            # simulated faults live; a sandbox of real nodes only has real canaries too.
            names = self.config.topology().node_names()
            real_names = set(names[len(names) - real :])
            for pool in self.config.topology().pools:
                for i in range(1, pool.count + 1):
                    self._create_node(pool, i, real=f"{pool.name}-{i}" in real_names)
            if real:
                self.real.start_kubelet(
                    self._start, self.kubeconfig, bins, self.config.containers_conf
                )
                self.real.start_node_exporters(self._start)
            self.wait_nodes_ready()
        if real:
            with self._phase(report, "services", log):
                ips = services.start_backends(self.real, self._start)
                self._save_state()
                services.apply(self.apply, services.objects(ips, self.config.services))
                self.apply([services.kubernetes_endpoints(self.real.bridge.host_ip, API_PORT)])
        with self._phase(report, "kube-proxy ready", log):
            self.wait_kube_proxy_ready()
        if self.config.prometheus:
            with self._phase(report, "prometheus", log):
                self._start_monitoring()
        self._write_env()

    def down(self) -> list[str]:
        """Stop every process of this sandbox and remove its state directory.

        Returns the names of the components that were still running.
        """
        stopped = self._stop_processes()
        RealNodes(self.dir, self._state).remove()
        if self.dir.exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        self._state = {}
        if self._net_lock is not None:
            self._net_lock.close()
            self._net_lock = None
        return stopped

    def _stop_processes(self) -> list[str]:
        records = self._records()
        running = [r for r in records if process.alive(r, self.marker)]
        # Stop in reverse start order (kwok and controllers before the API server, etcd last),
        # then anything else that mentions the state directory (a child, a half-started process).
        for record in reversed(running):
            process.stop_pids([record.pid])
        process.stop_pids(process.pids_referencing(self.marker))
        return [r.name for r in running]

    def status(self) -> SandboxStatus:
        """Which components run; a dead one comes with the last lines of its log."""
        self._state = self._load_state()
        result = SandboxStatus(
            state_dir=self.dir,
            exists=bool(self._state),
            server=self.server,
            kubernetes_version=self.kubernetes_version,
        )
        for record in self._records():
            running = process.alive(record, self.marker)
            result.components.append(
                ComponentStatus(
                    name=record.name,
                    pid=record.pid,
                    running=running,
                    log=record.log,
                    log_tail="" if running else process.log_tail(record.log),
                )
            )
        return result

    # -- components --

    def _write_pki(self, server: str) -> None:
        ca = CertificateAuthority()
        ca.pair.write(self.pki, "ca")
        ca.issue(
            "kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ip_addresses=("127.0.0.1", "10.96.0.1"),
            server=True,
        ).write(self.pki, "apiserver")
        service_account_signing_key().write(self.pki, "sa")
        ca_pem = ca.pair.cert_pem
        identities = {
            "kubeconfig": ("kubernetes-admin", ("system:masters",)),
            "controller-manager.kubeconfig": ("system:kube-controller-manager", ()),
            "scheduler.kubeconfig": ("system:kube-scheduler", ()),
            "kwok.kubeconfig": ("kwok-controller", ("system:masters",)),
        }
        for filename, (cn, orgs) in identities.items():
            pair = ca.issue(cn, organizations=orgs, client=True)
            write_kubeconfig(self.dir / filename, server, ca_pem, user=cn, client=pair)

    def _start(self, name: str, argv: Sequence[str]) -> ProcessRecord:
        record = process.start(name, argv, self.dir / "logs" / f"{name}.log")
        self._add_record(record)
        return record

    def _start_etcd(self, bins: Path, ports: dict[str, int]) -> None:
        client = f"http://127.0.0.1:{ports['etcd']}"
        peer = f"http://127.0.0.1:{ports['etcdPeer']}"
        record = self._start(
            "etcd",
            [
                str(bins / "etcd"),
                "--name=sandbox",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=sandbox={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait_http(record, f"{client}/health", "etcd")

    def _start_apiserver(self, bins: Path, ports: dict[str, int], server: str) -> None:
        pki = self.pki
        record = self._start(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['apiserver']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.crt'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                f"--cert-dir={self.dir / 'apiserver-certs'}",
            ],
        )
        self._wait_http(record, f"{server}/readyz", "kube-apiserver", tls=True)

    def _start_controllers(self, bins: Path, ports: dict[str, int]) -> None:
        pki = self.pki
        kcm_kc = self.dir / "controller-manager.kubeconfig"
        sched_kc = self.dir / "scheduler.kubeconfig"
        kcm = self._start(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={kcm_kc}",
                f"--authentication-kubeconfig={kcm_kc}",
                f"--authorization-kubeconfig={kcm_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['kcm']}",
                f"--cert-dir={self.dir / 'kcm-certs'}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--cluster-name=proxymode-sandbox",
                "--controllers=*,bootstrapsigner,tokencleaner",
                *self._controller_tuning(),
            ],
        )
        sched = self._start(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                f"--kubeconfig={sched_kc}",
                f"--authentication-kubeconfig={sched_kc}",
                f"--authorization-kubeconfig={sched_kc}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['scheduler']}",
                f"--cert-dir={self.dir / 'scheduler-certs'}",
                "--leader-elect=false",
            ],
        )
        stages = self.dir / "kwok-stages.yaml"
        stages.write_text(
            resources.files("proxymode_sandbox").joinpath("data/kwok-stages.yaml").read_text()
        )
        kwok = self._start(
            "kwok",
            [
                str(bins / "kwok"),
                f"--kubeconfig={self.dir / 'kwok.kubeconfig'}",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--config={stages}",
                f"--node-lease-duration-seconds={self.config.node_lease_seconds}",
                f"--cidr={CLUSTER_CIDR}",
            ],
        )
        self._wait_http(
            kcm,
            f"https://127.0.0.1:{ports['kcm']}/healthz",
            "kube-controller-manager",
            tls=True,
            verify=False,
        )
        self._wait_http(
            sched,
            f"https://127.0.0.1:{ports['scheduler']}/healthz",
            "kube-scheduler",
            tls=True,
            verify=False,
        )
        self._check_alive(kwok)

    def _controller_tuning(self) -> list[str]:
        """kube-controller-manager flags that follow the config's scale knobs."""
        flags = []
        if self.config.node_lease_seconds > 40:
            # A node is unhealthy once its Lease is older than the grace period (default
            # 50 s): keep it past one renewal interval and a late one.
            flags.append(f"--node-monitor-grace-period={self.config.node_lease_seconds + 10}s")
        if self.config.controller_qps > 0:
            qps = self.config.controller_qps
            flags += [f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}"]
        return flags

    def _start_monitoring(self) -> None:
        """Simulated per-node kube-proxy metrics, and a real Prometheus scraping them."""
        if shutil.which("prometheus") is None:
            raise SandboxError("prometheus is not installed; `make system-deps` installs it")
        targets = self.dir / "prometheus" / "targets"
        targets.mkdir(parents=True, exist_ok=True)
        metrics = self._start(
            "kube-proxy-metrics",
            [
                sys.executable,
                "-m",
                "proxymode_sandbox.kube_proxy_metrics",
                f"--kubeconfig={self.kubeconfig}",
                f"--targets-dir={targets}",
            ],
        )
        self._wait(
            "the metrics simulator's targets",
            lambda: None if (targets / "kube-proxy.json").exists() else "no targets yet",
        )
        self._check_alive(metrics)
        if self.real.nodes:
            pools = {n: n.rsplit("-", 1)[0] for n in self.real.nodes}
            self.real.write_targets(targets, pools)
        self._start_prometheus(process.free_port())
        if "real" in self._state:
            self._publish_prometheus()

    def _publish_prometheus(self) -> None:
        """``monitoring/prometheus-operated``, the examples' Prometheus URL (``monitoring``):
        a forwarder on the bridge to the loopback Prometheus, and the objects that name it."""
        ip, port = self.real.bridge.host_ip, int(self.prometheus_url.rsplit(":", 1)[1])
        record = self._start(
            "prometheus-forwarder",
            [
                sys.executable,
                "-m",
                "proxymode_sandbox.forward",
                f"--listen={ip}:{monitoring.PORT}",
                f"--to=127.0.0.1:{port}",
                f"--state-dir={self.dir}",
            ],
        )
        self._wait_http(record, f"http://{ip}:{monitoring.PORT}/-/ready", "prometheus-forwarder")
        monitoring.publish(ip, self.apply, self.kubectl)

    def _bridge_for_monitoring(self, log: Callable[[str], None]) -> bool:
        """Whether a sandbox without real nodes still gets its bridge, for Prometheus's
        in-cluster address; said once when it cannot."""
        if not self.config.prometheus:
            return False
        why = netns.available()
        if why:
            log(f"{monitoring.URL}: not published ({why}); use $PROMETHEUS_URL")
            return False
        return True

    def _start_prometheus(self, port: int) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise SandboxError("prometheus is not installed; `make system-deps` installs it")
        prom_dir = self.dir / "prometheus"
        targets = prom_dir / "targets"
        config = {
            "global": {
                "scrape_interval": "2s",
                "scrape_timeout": "1s",
                "evaluation_interval": "2s",
            },
            "scrape_configs": [
                {
                    "job_name": job,
                    "file_sd_configs": [
                        # <job>.json from the simulator, <job>-real.json for the real nodes
                        {"files": [str(targets / f"{job}*.json")], "refresh_interval": "2s"}
                    ],
                }
                for job in ("kube-proxy", "node-exporter", OPERATOR_JOB)
            ],
        }
        (prom_dir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        url = f"http://127.0.0.1:{port}"
        record = self._start(
            "prometheus",
            [
                binary,
                f"--config.file={prom_dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={prom_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1d",
                "--log.level=warn",
            ],
        )
        self._wait_http(record, f"{url}/-/ready", "prometheus")
        self._state["prometheus"] = url
        self._save_state()

    def stop_prometheus(self) -> None:
        """Stop the sandbox's Prometheus, as an outage would (``start_prometheus`` ends it)."""
        for record in self._records():
            if record.name == "prometheus" and process.alive(record, self.marker):
                process.stop_pids([record.pid])
        self._state["processes"] = [
            p for p in self._state.get("processes", []) if p["name"] != "prometheus"
        ]
        self._save_state()

    def start_prometheus(self) -> None:
        """Start Prometheus again on the same address, with the data it had."""
        port = int(self.prometheus_url.rsplit(":", 1)[1])
        self._start_prometheus(port)

    def _wait_ports_free(self, name: str, timeout: float = 15.0) -> None:
        """Wait until the stopped component's ports can be bound again.

        A process reaped is not yet a port released: a new kube-apiserver started 0.2 s
        after the old one exited once found its port still held ("bind: address already in
        use"), exited, and left every later test of that worker without an API server.
        """
        ports = [self._state["ports"][k] for k in COMPONENT_PORTS.get(name, ())]
        deadline = time.monotonic() + timeout
        while not all(_port_free("127.0.0.1", p) for p in ports):
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"{name}'s ports {ports} are still held {timeout:.0f}s after it stopped"
                )
            time.sleep(0.1)

    def restart_component(self, name: str, downtime: float = 0.0, kill: bool = False) -> None:
        """Stop control-plane component ``name`` (``etcd``, ``kube-apiserver``, ...) and start
        it again with the same command line, as a node reboot or an upgrade would; returns once
        it answers its health check again. ``downtime``: seconds it stays down in between;
        ``kill``: SIGKILL (a crash) instead of SIGTERM (a clean stop)."""
        index, record = next(
            ((i, r) for i, r in enumerate(self._records()) if r.name == name), (-1, None)
        )
        if record is None or not process.alive(record, self.marker):
            raise SandboxError(f"{name} is not running in {self.dir}")
        argv = process.argv_of(record.pid)
        if kill:
            process.kill_now(record.pid)
        else:
            process.stop_pids([record.pid])
        time.sleep(downtime)
        self._wait_ports_free(name)
        fresh = process.start(name, argv, record.log)
        # Same place in the start order, so ``down`` still stops etcd last.
        self._state["processes"][index] = fresh.to_json()
        self._save_state()
        ports = self._state["ports"]
        health = {
            "etcd": (f"http://127.0.0.1:{ports['etcd']}/health", False),
            "kube-apiserver": (f"{self.server}/readyz", True),
        }
        if name in health:
            url, tls = health[name]
            self._wait_http(fresh, url, name, tls=tls)
        else:
            self._check_alive(fresh)

    # -- waiting --

    def _check_alive(self, record: ProcessRecord) -> None:
        if not process.alive(record, self.marker):
            raise SandboxError(
                f"{record.name} exited during start-up; last lines of {record.log}:\n"
                f"{process.log_tail(record.log)}"
            )

    def _ssl_context(self, verify: bool) -> ssl.SSLContext:
        if not verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return ctx
        return ssl.create_default_context(cafile=str(self.pki / "ca.crt"))

    def _wait_http(
        self, record: ProcessRecord, url: str, what: str, *, tls: bool = False, verify: bool = True
    ) -> None:
        """Poll ``url`` until it answers 200, failing fast when the process dies."""
        ctx = self._ssl_context(verify) if tls else None
        deadline = time.monotonic() + self.config.ready_timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive(record)
            try:
                req = urllib.request.Request(url)  # noqa: S310 - our own loopback URL
                with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:  # noqa: S310
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:300]!r}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.2)
        raise SandboxError(
            f"{what} did not become ready at {url} within {self.config.ready_timeout:.0f}s "
            f"(last answer: {last}); last lines of {record.log}:\n{process.log_tail(record.log)}"
        )

    def _wait(
        self,
        what: str,
        check: Callable[[], str | None],
        explain: Callable[[], str] | None = None,
    ) -> None:
        """Poll ``check`` (None = done, else why not yet) while watching every component.
        ``explain`` runs once at the deadline, to say more than ``check`` can each poll."""
        deadline = time.monotonic() + self.config.ready_timeout
        why: str | None = "not checked"
        while time.monotonic() < deadline:
            for record in self._records():
                self._check_alive(record)
            why = check()
            if why is None:
                return
            time.sleep(0.5)
        more = ""
        if explain is not None:
            try:
                more = f"; {explain()}"
            except Exception as e:  # the explanation must not hide the timeout
                more = f"; (could not say more: {e})"
        raise SandboxError(
            f"timed out after {self.config.ready_timeout:.0f}s waiting for {what}: {why}{more}"
        )

    def wait_nodes_ready(self) -> None:
        """Wait until every sandbox node reports Ready."""

        def check() -> str | None:
            nodes = self.get_json("nodes")["items"]
            expected = set(self.node_names())
            ready = {n["metadata"]["name"] for n in nodes if _condition(n, "Ready") == "True"}
            missing = sorted(expected - ready)
            return f"not Ready: {', '.join(missing)}" if missing else None

        self._wait("nodes to be Ready", check)

    def wait_kube_proxy_ready(self) -> None:
        """Wait until the kube-proxy DaemonSet has a Ready pod on every node.

        kwok (v0.8.0) sometimes never sees one pod bound to one of its nodes at start-up
        (the pod stays Pending with only PodScheduled; kwok's log never names it), and the
        sandbox's ``up`` timed out at 24 of 25 (decision 0040). Such a pod is deleted once
        after ``KWOK_MISSED_POD_SECONDS``: the DaemonSet makes another, which kwok sees."""
        pending_since: dict[str, float] = {}
        replaced: set[str] = set()
        real = set(self.real_node_names())

        def replace_missed() -> None:
            now = time.monotonic()
            pods = self.get_json("pods", namespace=kubeadm_proxy.NAMESPACE)["items"]
            for p in pods:
                name, node = p["metadata"]["name"], (p.get("spec") or {}).get("nodeName")
                owned = _kube_proxy_pod(p)
                pending = (p.get("status") or {}).get("phase") == "Pending"
                if not owned or not node or node in real or not pending:
                    pending_since.pop(name, None)
                    continue
                first = pending_since.setdefault(name, now)
                if now - first >= KWOK_MISSED_POD_SECONDS and name not in replaced:
                    replaced.add(name)
                    print(
                        f"sandbox: kube-proxy pod {name} on kwok node {node} Pending for"
                        f" {now - first:.0f}s (missed by kwok): deleting it once",
                        file=sys.stderr,
                    )
                    self.kubectl(
                        "delete", "pod", name, "-n", kubeadm_proxy.NAMESPACE, "--wait=false",
                        check=False,
                    )  # fmt: skip

        def check() -> str | None:
            ds = self.get_json("daemonset", kubeadm_proxy.NAME, namespace=kubeadm_proxy.NAMESPACE)
            st = ds.get("status", {})
            want = len(self.node_names())
            if st.get("observedGeneration") != ds["metadata"]["generation"]:
                return "DaemonSet status not observed yet"
            got = (st.get("desiredNumberScheduled"), st.get("numberReady"))
            if got == (want, want):
                return None
            replace_missed()
            return f"desired/ready {got}, want {want}"

        def explain() -> str:
            """Which nodes lack a Ready kube-proxy pod, and what their pods show (a setup
            once timed out at 24 of 25 with nothing more said)."""
            pods = self.get_json("pods", namespace=kubeadm_proxy.NAMESPACE)["items"]
            mine = [p for p in pods if _kube_proxy_pod(p)]
            ready = {
                (p.get("spec") or {}).get("nodeName")
                for p in mine
                if _condition(p, "Ready") == "True" and not p["metadata"].get("deletionTimestamp")
            }
            lacking = [n for n in self.node_names() if n not in ready]
            shown = []
            for p in mine:
                node = (p.get("spec") or {}).get("nodeName") or "(unbound)"
                if node in ready:
                    continue
                status = p.get("status") or {}
                conditions = {
                    c.get("type"): c.get("status") for c in status.get("conditions") or []
                }
                shown.append(
                    f"{p['metadata']['name']} on {node}: phase {status.get('phase')},"
                    f" conditions {conditions},"
                    f" deleting {bool(p['metadata'].get('deletionTimestamp'))}"
                )
            return f"nodes without a Ready kube-proxy pod: {lacking}; their pods: {shown}"

        self._wait("kube-proxy to be Ready on every node", check, explain)

    # -- kubectl and objects --

    def kubectl(
        self, *args: str, input_text: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the sandbox's kubectl as admin."""
        bins = Path(self._state["binDir"])
        proc = subprocess.run(
            [str(bins / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=input_text,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and proc.returncode != 0:
            raise SandboxError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def get_json(self, kind: str, name: str = "", namespace: str = "") -> dict[str, Any]:
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        data: dict[str, Any] = json.loads(self.kubectl(*args).stdout)
        return data

    def apply(self, objects: Iterable[dict[str, Any]]) -> None:
        """Server-side apply ``objects`` as the sandbox's field manager."""
        text = yaml.safe_dump_all(list(objects), sort_keys=False)
        self.kubectl(
            "apply",
            "--server-side",
            "--field-manager=proxymode-sandbox",
            "-f",
            "-",
            input_text=text,
        )

    def install_crd(self) -> None:
        """Install the ProxyModePolicy CRD and wait until it is Established (a user's
        ``kubectl apply -f examples/...`` works next)."""
        self.kubectl("apply", "--server-side", "--field-manager=proxymode-sandbox", "-f", str(CRD))
        name = yaml.safe_load(CRD.read_text())["metadata"]["name"]

        def established() -> str | None:
            crd = self.get_json("customresourcedefinition", name)
            return None if _condition(crd, "Established") == "True" else "not Established yet"

        self._wait(f"the CRD {name} to be Established", established)

    def reset_kube_proxy(self) -> None:
        """kube-system's kube-proxy back to what ``up`` installed (its mode and config), every
        pod restarted on it: after a finalized migration, the next example starts where a
        fresh sandbox would. (Delete the policy first; this takes the objects over.)"""
        real = bool(self.real.nodes)
        server = self.real.server if real else self.server
        sni = TLS_SERVER_NAME if real else ""
        mode = str(self._state.get("proxyMode", self.config.proxy_mode))
        text = yaml.safe_dump_all(
            kubeadm_proxy.manifests(server, self.kubernetes_version, mode, sni), sort_keys=False
        )
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=proxymode-sandbox",
            "-f",
            "-",
            input_text=text,
        )
        # Then replaced whole: an apply leaves the fields another manager owns (the
        # operator's affinity term, KeepExclusionTerm), so the DaemonSet kept it.
        self.kubectl("replace", "-f", "-", input_text=text)
        ns, name = kubeadm_proxy.NAMESPACE, kubeadm_proxy.NAME
        self.kubectl("rollout", "restart", f"daemonset/{name}", "-n", ns)
        timeout = f"--timeout={self.config.ready_timeout:.0f}s"
        self.kubectl("rollout", "status", f"daemonset/{name}", "-n", ns, timeout)

    # -- real nodes --

    @property
    def real(self) -> RealNodes:
        """The real nodes (namespaces on the sandbox's bridge), if any."""
        return RealNodes(self.dir, self._state)

    def real_node_names(self) -> list[str]:
        return sorted(self.real.nodes)

    def _real_count(self, log: Callable[[str], None]) -> int:
        wanted = min(self.config.real_nodes, self.config.nodes)
        if wanted <= 0:
            return 0
        why = netns.available()
        if why:
            log(f"real nodes: off, every node is kwok ({why})")
            return 0
        return wanted

    def exec(
        self, node: str, argv: Sequence[str], timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside real node (or backend) ``node``'s network namespace."""
        try:
            ns = self.real.netns_of(node)
        except KeyError as e:
            raise SandboxError(str(e)) from None
        return subprocess.run(
            netns.exec_argv(ns, argv), capture_output=True, text=True, check=False, timeout=timeout
        )

    # -- nodes and faults --

    def node_names(self) -> list[str]:
        return sorted(self._state.get("nodes", []))

    def _pool(self, name: str) -> PoolSpec:
        for p in self._state.get("topology", []):
            if p["name"] == name:
                return PoolSpec(**p)
        defaults = {p.name: p for p in Topology.sized(3, 1, 1).pools}
        if name in defaults:
            return defaults[name]
        raise SandboxError(f"unknown pool {name!r}")

    def _create_node(self, pool: PoolSpec, index: int, real: bool = False) -> str:
        name = f"{pool.name}-{index}"
        number = int(self._state.get("nodeCounter", 0)) + 1
        manifest = node_manifest(name, pool, index, self.kubernetes_version)
        ip = f"{self._node_net()}{number}"
        if real:  # no kwok annotation: kwok leaves it alone, the sandbox's kubelet serves it
            ip = self.real.add_node(name)
            del manifest["metadata"]["annotations"][KWOK_ANNOTATION]
            manifest["metadata"]["labels"].update({REAL_LABEL: "true", "type": "real"})
        manifest["status"]["addresses"] = [
            {"type": "InternalIP", "address": ip},
            {"type": "Hostname", "address": name},
        ]
        self.kubectl("create", "-f", "-", input_text=json.dumps(manifest))
        self._state["nodeCounter"] = number
        self._state.setdefault("nodes", []).append(name)
        self._save_state()
        return name

    def _node_net(self) -> str:
        """The /24 on loopback this sandbox's nodes live in, chosen once and kept in state.

        ``PROXYMODE_SANDBOX_NODE_NET`` decides when set: one prefix (``127.0.30.``), or a
        range to choose from (``127.0.30.-127.0.39.``, for parallel test workers); otherwise
        the first of 127.0.10., 127.0.11., ... that is free: no other sandbox of this machine
        holds its lock (``node_net_lock``, held while this object lives, so sandboxes started
        at the same instant by parallel test workers never pick the same one) and nothing
        serves its kube-proxy metrics port (a ``make demo`` sandbox left running: two
        simulators cannot serve the same node address, and one Prometheus would scrape the
        other's nodes).
        """
        chosen = self._state.get("nodeNet")
        if chosen:
            return str(chosen)
        candidates = node_net_candidates(os.environ.get("PROXYMODE_SANDBOX_NODE_NET", ""))
        for prefix in candidates:
            lock = node_net_lock(prefix)
            if lock is None:
                continue
            if not self.config.prometheus or _port_free(f"{prefix}1", 10249):
                self._net_lock = lock
                self._state["nodeNet"] = prefix
                self._save_state()
                return prefix
            lock.close()
        raise SandboxError(
            f"the node addresses {candidates[0]}1:10249 and on are served by another process"
            " (another sandbox? `make sandbox-down`); set PROXYMODE_SANDBOX_NODE_NET"
        )

    def add_node(self, pool: str, wait: bool = True) -> str:
        """Register one more node in ``pool`` (as when a node group scales up)."""
        spec = self._pool(pool)
        taken = {n for n in self.node_names() if n.startswith(f"{pool}-")}
        index = 1
        while f"{pool}-{index}" in taken:
            index += 1
        name = self._create_node(spec, index)
        if wait:
            self.wait_nodes_ready()
        return name

    def remove_node(self, name: str) -> None:
        """Delete a node as a node group scaling down does; its pods go with it.

        The pod garbage collector would remove the orphaned pods after its quarantine
        (about a minute); the sandbox removes them at once, as a drained node would.
        """
        self.kubectl("delete", "node", name, "--wait=true")
        self.kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector=spec.nodeName={name}",
            "--grace-period=0",
            "--force",
            "--wait=true",
        )
        self._state["nodes"] = [n for n in self.node_names() if n != name]
        self._save_state()

    def set_crashloop(self, namespace: str, pod: str, on: bool = True) -> None:
        """Make a pod crash-loop (never Ready, restarts rising) or stop marking it."""
        value = f"{CRASHLOOP_ANNOTATION}=true" if on else f"{CRASHLOOP_ANNOTATION}-"
        self.kubectl("annotate", "pod", pod, "-n", namespace, value, "--overwrite")

    # -- the operator --

    def start_operator(
        self, kubeconfig: Path | None = None, *, replica: str = "", args: Sequence[str] = ()
    ) -> ProcessRecord:
        """Run the proxymode operator as a process of this sandbox (``down`` stops it too).

        ``replica``: one more operator process beside the default one (``operator-<replica>``,
        its own log and metrics address), e.g. two ``--peering`` replicas; ``args``: more
        command-line flags for it.
        """
        name = _operator_name(replica)
        self.stop_operator(replica=replica)
        metrics = f"127.0.0.1:{process.free_port()}"
        record = process.start(
            name,
            [
                sys.executable,
                "-m",
                "proxymode",
                f"--kubeconfig={kubeconfig or self.kubeconfig}",
                f"--liveness=http://127.0.0.1:{process.free_port()}/healthz",
                f"--metrics-address={metrics}",
                *args,
            ],
            self.dir / "logs" / f"{name}.log",
        )
        self._add_record(record)
        self._state["operatorMetrics" + (f"-{replica}" if replica else "")] = (
            f"http://{metrics}/metrics"
        )
        self._save_state()
        targets = self.dir / "prometheus" / "targets"
        if targets.is_dir():  # the sandbox's Prometheus scrapes the operator too
            job = OPERATOR_JOB + (f"-{replica}" if replica else "")
            (targets / f"{job}.json").write_text(
                json.dumps([{"targets": [metrics], "labels": {"instance": name}}])
            )
        return record

    def operator_record(self) -> ProcessRecord | None:
        """The operator ``start_operator`` started, while it runs."""
        for record in self._records():
            if record.name == "operator" and process.alive(record, self.marker):
                return record
        return None

    @property
    def operator_metrics_url(self) -> str:
        """Where the operator started by ``start_operator`` serves ``/metrics``."""
        return str(self._state.get("operatorMetrics", ""))

    def replica_metrics_url(self, replica: str) -> str:
        """Where operator replica ``replica`` serves ``/metrics``."""
        return str(self._state.get(f"operatorMetrics-{replica}", ""))

    def stop_operator(self, kill: bool = False, *, replica: str = "") -> None:
        """Stop the operator (``kill``: SIGKILL at once, as a crash would)."""
        name = _operator_name(replica)
        records = [r for r in self._records() if r.name == name]
        for record in records:
            if process.alive(record, self.marker):
                if kill:
                    process.kill_now(record.pid)
                else:
                    process.stop_pids([record.pid])
        self._state["processes"] = [
            p for p in self._state.get("processes", []) if p["name"] != name
        ]
        self._save_state()

    def freeze_operator(self, frozen: bool = True) -> None:
        """SIGSTOP the operator's process group (a stalled node, a stop-the-world pause), or
        SIGCONT it again: the process keeps its connections and state but does nothing."""
        for record in self._records():
            if record.name == "operator" and process.alive(record, self.marker):
                os.killpg(record.pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    # -- env --

    def _write_env(self) -> None:
        lines = [
            "# Source this file to drive the proxymode sandbox with kubectl and helm.",
            f"export KUBECONFIG={self.kubeconfig}",
            f"export PATH={self.bin_dir}:$PATH",
            f"export PROXYMODE_SANDBOX={self.dir}",
        ]
        if self.prometheus_url:
            lines.append(f"export PROMETHEUS_URL={self.prometheus_url}")
        self.env_file.write_text("\n".join(lines) + "\n")


class _PhaseTimer:
    def __init__(self, report: UpReport, name: str, log: Callable[[str], None]) -> None:
        self.report, self.name, self.log = report, name, log
        self.start = 0.0

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.monotonic() - self.start
        self.report.phases[self.name] = elapsed
        if exc[0] is None:
            self.log(f"{self.name}: {elapsed:.1f}s")


def _operator_name(replica: str) -> str:
    return f"operator-{replica}" if replica else "operator"


def _is_operator(name: str) -> bool:
    return name == "operator" or name.startswith("operator-")


def _condition(obj: dict[str, Any], kind: str) -> str | None:
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def _binary_version(binary: Path) -> str:
    """The gitVersion a Kubernetes binary reports (``--version`` prints ``Kubernetes vX.Y.Z``)."""
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=True, env={**os.environ}
    ).stdout
    return out.split()[-1]


def _third_octet(prefix: str) -> int | None:
    """24 for a node net ``127.0.24.``: the real nodes' /24 follows it where free."""
    parts = prefix.strip(".").split(".")
    return int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else None


COMPONENT_PORTS: dict[str, tuple[str, ...]] = {
    "etcd": ("etcd", "etcdPeer"),
    "kube-apiserver": ("apiserver",),
    "kube-controller-manager": ("kcm",),
    "kube-scheduler": ("scheduler",),
}
"""The ``ports`` entries each control-plane component listens on."""


def _port_free(host: str, port: int) -> bool:
    """Whether nothing listens on ``host:port`` yet (a bind succeeds).

    SO_REUSEADDR as the servers use it: connections in TIME_WAIT from the last sandbox's
    scrapes (a minute) do not count as a listener.
    """
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def node_net_candidates(wanted: str) -> list[str]:
    """The node-network prefixes ``PROXYMODE_SANDBOX_NODE_NET`` allows, in order."""
    wanted = wanted.strip()
    if not wanted:
        return [f"127.0.{n}." for n in range(10, 60)]
    first, _, last = wanted.partition("-")
    if not last:
        # "127.0.44" means the /24 127.0.44.x; taken as is it made "127.0.441", which
        # nothing serves: every kube-proxy scrape failed and every round had no data.
        return [first if first.endswith(".") else f"{first}."]
    head, low = first.rstrip(".").rsplit(".", 1)
    high = last.rstrip(".").rsplit(".", 1)[1]
    return [f"{head}.{n}." for n in range(int(low), int(high) + 1)]


def node_net_lock(prefix: str) -> IO[bytes] | None:
    """An exclusive lock on ``prefix`` for this machine, or None when another process holds
    it. The lock goes with the returned file (closed, or its process gone)."""
    locks = Path(tempfile.gettempdir()) / "proxymode-node-nets"
    locks.mkdir(exist_ok=True)
    handle = (locks / f"{prefix}lock").open("wb")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle
