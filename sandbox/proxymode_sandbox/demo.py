"""``make demo``: an iptables -> nftables migration on the sandbox, gated on metrics, shown live.

Installs the CRD (generated from the models), runs the operator as a sandbox process,
applies a three-stage policy (the canary pool, then half the nodes, then all) whose stages
are judged on the sandbox's Prometheus (p99 rule-sync latency, against an absolute bound
and against the nodes still on iptables; conntrack usage; sync failures), and prints a
line whenever something changes: phase, stage, nodes moved, the mode each node runs, and
every analysis round's canary and baseline values with their verdicts.

Scenarios (``make demo SCENARIO=...``):

- ``migrate`` (default): healthy nodes; the policy promotes stage by stage to Completed.
- ``rollback``: once the canaries have passed a round, ``slow-sync`` is injected into one
  canary (the node annotation ``sandbox.proxymode.io/fault``); the gate fails
  ``failureLimit`` rounds in a row and the operator rolls every node back to iptables by
  itself. The fault is removed at the end.

The sandbox and its operator stay up for a look around (``source .sandbox/env``; deleting
the policy needs the operator, which lets its finalizer go), until ``make sandbox-down``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from proxymode.api import crd as crd_gen
from proxymode.api import models
from proxymode_sandbox import evidence, kubeadm_proxy
from proxymode_sandbox.cluster import Sandbox, SandboxError
from proxymode_sandbox.kube_proxy_metrics import FAULT_ANNOTATION
from proxymode_sandbox.show import render_cluster

POLICY = "demo-to-nftables"
MODE_LABEL = "proxymode.io/mode"
SHORT = {"iptables": "ipt", "nftables": "nft", "ipvs": "ipvs", "switching": "~~~"}
SCENARIOS = ("migrate", "rollback")
FAULTY_NODE = "canary-1"
TERMINAL = ("Completed", "RolledBack", "Failed")


def demo_analysis(prometheus_url: str) -> dict[str, Any]:
    """The gate: what a platform team would watch by hand, every 5 s over a 10 s window."""
    return {
        "prometheus": {"url": prometheus_url},
        "intervalSeconds": 5,
        "windowSeconds": 10,
        "warmupSeconds": 16,  # a fresh kube-proxy's first syncs are slow (full resync)
        "failureLimit": 2,
        "minPassingRounds": 2,
        "checks": [
            {"name": "sync-p99", "template": "SyncLatencyP99", "maxSeconds": 1},
            {"name": "vs-iptables", "template": "SyncLatencyP99", "maxRatioToBaseline": 2},
            {"name": "conntrack", "template": "ConntrackUsage", "maxRatio": 0.85},
            {"name": "sync-failures", "template": "SyncFailures", "max": 0},
        ],
    }


def demo_policy(
    target: str = "nftables", prometheus_url: str = "", scenario: str = "migrate"
) -> dict[str, Any]:
    """The demo's policy; in ``rollback`` the canary stage bakes long enough to see the fault."""
    canary_bake = 90 if scenario == "rollback" else 8
    spec: dict[str, Any] = {
        "targetMode": target,
        "stages": [
            {
                "name": "canary",
                "nodeSelector": {"matchLabels": {"pool": "canary"}},
                "bakeSeconds": canary_bake,
            },
            {"name": "half", "percent": 50, "bakeSeconds": 8},
            {"name": "all", "percent": 100, "bakeSeconds": 5},
        ],
        "maxUnavailable": 1,
    }
    if prometheus_url:
        spec["analysis"] = demo_analysis(prometheus_url)
    return {
        "apiVersion": f"{models.GROUP}/{models.VERSION}",
        "kind": models.KIND,
        "metadata": {"name": POLICY},
        "spec": spec,
    }


def _node_modes(box: Sandbox) -> dict[str, str]:
    nodes = box.get_json("nodes")["items"]
    cm = box.get_json("configmap", "kube-proxy", namespace="kube-system")
    source = str(yaml.safe_load(cm["data"]["config.conf"]).get("mode") or "iptables")
    out = {}
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        label = (node["metadata"].get("labels") or {}).get(MODE_LABEL)
        out[node["metadata"]["name"]] = label or source
    return out


def _line(elapsed: float, status: dict[str, Any], modes: dict[str, str]) -> str:
    nodes = " ".join(f"{n}={SHORT.get(m, m)}" for n, m in modes.items())
    phase = status.get("phase", "-")
    stage = status.get("currentStageName") or "-"
    progress = status.get("nodeProgress") or "-"
    return f"{elapsed:6.1f}s  {phase:<12} {stage:<7} {progress:>5}  {nodes}"


def _number(value: Any) -> str:
    if value is None:
        return "-"
    number = float(value)
    return f"{number:.3f}" if abs(number) < 100 else f"{number:.0f}"


def gate_line(status: dict[str, Any]) -> str:
    """One analysis round: each check's canary value, baseline value and verdict."""
    analysis = status.get("analysis") or {}
    parts = [
        f"{c['name']} {_number(c.get('canary'))}"
        + (f" vs {_number(c.get('baseline'))}" if c.get("baseline") is not None else "")
        + f" {c.get('verdict', '?')}"
        for c in analysis.get("checks") or []
    ]
    counts = (
        f"round {analysis.get('rounds', 0)}, passing {analysis.get('passingRounds', 0)},"
        f" failing in a row {analysis.get('consecutiveFailures', 0)}"
    )
    return f"{'':9}gate: {' | '.join(parts)}  ({counts})"


def _set_fault(box: Sandbox, node: str, fault: str | None) -> None:
    value = "-" if fault is None else f"={fault}"
    box.kubectl("annotate", "node", node, f"{FAULT_ANNOTATION}{value}", "--overwrite")


def _operator_metrics(box: Sandbox) -> list[str]:
    """The operator's own /metrics lines about this policy's phase and gate."""
    url = box.operator_metrics_url
    if not url:
        return []
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback URL
            text = response.read().decode()
    except OSError as e:
        return [f"(could not read {url}: {e})"]
    wanted = ("proxymode_policy_phase{", "proxymode_analysis_check_", "proxymode_policy_nodes{")
    return [
        line
        for line in text.splitlines()
        if line.startswith(wanted) and not line.endswith(" 0.0") and POLICY in line
    ]


class _Watch:
    """Prints what changed since the last look, and injects the rollback scenario's fault."""

    def __init__(self, box: Sandbox, out: Any, scenario: str) -> None:
        self.box, self.out, self.scenario = box, out, scenario
        self.start = time.monotonic()
        self.last_line = ""
        self.last_round = ""
        self.injected: float | None = None
        self.rollback_seen = False
        self.real_modes: dict[str, str] = {}

    def look(self) -> str:
        """One look; returns the phase."""
        status = self.box.get_json("proxymodepolicy", POLICY).get("status") or {}
        elapsed = time.monotonic() - self.start
        modes = _node_modes(self.box)
        line = _line(elapsed, status, modes)
        if line.split("s  ", 1)[1] != self.last_line:
            self.out(line)
            self.last_line = line.split("s  ", 1)[1]
        real_modes = {n: modes.get(n, "") for n in self.box.real_node_names()}
        if real_modes != self.real_modes:
            self.real_modes = real_modes
            if self.last_round or status:
                print_rules(self.box, self.out, "during")
        analysis = status.get("analysis") or {}
        if analysis.get("lastRoundTime") and analysis["lastRoundTime"] != self.last_round:
            self.last_round = analysis["lastRoundTime"]
            self.out(gate_line(status))
        phase = str(status.get("phase", ""))
        if self.scenario == "rollback":
            self._fault(elapsed, analysis, phase)
        if phase in TERMINAL:
            self.out(f"\n{phase}: {status.get('message', '')}")
            if status.get("rollbackReason"):
                detail = status.get("rollbackMessage") or ""
                self.out(f"rollback reason: {status['rollbackReason']}: {detail}")
        return phase

    def _fault(self, elapsed: float, analysis: dict[str, Any], phase: str) -> None:
        if self.injected is None and analysis.get("passingRounds", 0) >= 1:
            _set_fault(self.box, FAULTY_NODE, "slow-sync")
            self.injected = time.monotonic()
            self.out(f"{elapsed:6.1f}s  >>> injected slow-sync into {FAULTY_NODE}")
        elif (
            self.injected is not None
            and not self.rollback_seen
            and phase in (*TERMINAL, "RollingBack")
        ):
            self.rollback_seen = True
            took = time.monotonic() - self.injected
            self.out(f"{'':9}>>> rollback started {took:.1f}s after the fault")


def _start(box: Sandbox, out: Any, scenario: str) -> None:
    if scenario not in SCENARIOS:
        raise SandboxError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    if not box.status().healthy:
        raise SandboxError("the sandbox is not running; `make sandbox` first")
    box.apply([crd_gen.crd()])
    box.kubectl("wait", "--for=condition=Established", "crd/proxymodepolicies.proxymode.io")
    _set_fault(box, FAULTY_NODE, None)
    box.start_operator()
    out(f"operator started (log: {box.dir / 'logs' / 'operator.log'})")
    # A policy from an earlier run goes first; its finalizer needs the operator running
    # (it rolls back whatever that run left, then lets go).
    box.kubectl(
        "delete", "proxymodepolicy", POLICY, "--ignore-not-found", "--wait=true", "--timeout=300s"
    )
    conf = box.get_json("configmap", kubeadm_proxy.NAME, namespace=kubeadm_proxy.NAMESPACE)
    running = (yaml.safe_load(conf["data"][kubeadm_proxy.CONFIG_KEY]) or {}).get("mode") or ""
    if running != "iptables":
        # An earlier demo finalized nftables into kube-system: there would be nothing to move.
        out(f"kube-system's kube-proxy runs {running} from an earlier run: putting it back")
        box.reset_kube_proxy()
    out(f"operator metrics: {box.operator_metrics_url}; Prometheus: {box.prometheus_url or '-'}")
    policy = demo_policy(prometheus_url=box.prometheus_url, scenario=scenario)
    box.kubectl("apply", "-f", "-", input_text=json.dumps(policy))
    out(f"applied ProxyModePolicy {POLICY}: iptables -> nftables, stages canary, half, all")
    if box.prometheus_url:
        checks = demo_analysis("")["checks"]
        out("each stage is judged on Prometheus: " + ", ".join(c["name"] for c in checks))
    if scenario == "rollback":
        out(f"scenario rollback: slow-sync goes into {FAULTY_NODE} after its first passing round")
    out("\n  time   phase        stage   nodes  per-node mode (~~~ = switching between proxies)")


def plugin_status(box: Sandbox) -> str:
    """``kubectl proxymode status POLICY`` as a user runs it: the sandbox's kubectl finds the
    plugin (``kubectl-proxymode``, installed next to this Python) on PATH."""
    env = dict(os.environ, KUBECONFIG=str(box.kubeconfig))
    path = [str(box.bin_dir), str(Path(sys.executable).parent), env.get("PATH", "")]
    env["PATH"] = os.pathsep.join(path)
    done = subprocess.run(
        [str(box.bin_dir / "kubectl"), "proxymode", "status", POLICY],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout if done.returncode == 0 else f"(kubectl proxymode: {done.stderr.strip()})"


def print_rules(box: Sandbox, out: Any, when: str) -> None:
    """Per real node, the kernel's word: Service rules per mode, and echo answering."""
    nodes = box.real_node_names()
    if not nodes:
        return
    out(f"{'':9}real nodes, {when}:")
    for rules in evidence.collect(box.exec, nodes):
        out(f"{'':11}{rules.line()}")


def _report(box: Sandbox, out: Any, phase: str) -> None:
    out("\nevents:")
    # The operator posts Events off its look's thread: the last one (Completed, RolledBack)
    # may land a moment after the phase did.
    deadline = time.monotonic() + 10.0
    uid = box.get_json("proxymodepolicy", POLICY)["metadata"]["uid"]  # this run's, not older
    while True:
        events = box.kubectl(
            "get",
            "events",
            "-n",
            "default",
            f"--field-selector=involvedObject.name={POLICY},involvedObject.uid={uid}",
            "--sort-by=.eventTime",
            "-o",
            "custom-columns=TYPE:.type,REASON:.reason,MESSAGE:.message",
            "--no-headers",
        ).stdout
        if phase not in ("Completed", "RolledBack") or f" {phase} " in events:
            break
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for row in events.splitlines():
        out(f"  {row}")
    out("\n" + render_cluster(box))
    out(f"\n$ kubectl proxymode status {POLICY}")
    out(plugin_status(box).rstrip())
    out(
        f"\nthe sandbox and its operator are still up: source {box.env_file};"
        " `make sandbox-down` when done"
    )


def run(box: Sandbox, timeout: float = 600.0, out: Any = print, scenario: str = "migrate") -> str:
    """Run the demo; returns the final phase (``expected_phase`` says which one is success)."""
    _start(box, out, scenario)
    print_rules(box, out, "before")
    watch = _Watch(box, out, scenario)
    phase = ""
    try:
        while time.monotonic() - watch.start < timeout:
            phase = watch.look()
            if phase in TERMINAL:
                break
            time.sleep(1.0)
        else:
            out(f"\nstill {phase} after {timeout:.0f}s")
        out("\noperator metrics (non-zero, this policy):")
        for row in _operator_metrics(box):
            out(f"  {row}")
    finally:
        if scenario == "rollback":
            _set_fault(box, FAULTY_NODE, None)
    print_rules(box, out, "after")
    _report(box, out, phase)
    return phase


def expected_phase(scenario: str) -> str:
    """The phase that means the scenario showed what it set out to show."""
    return "RolledBack" if scenario == "rollback" else "Completed"
