"""``make demo``: a full iptables -> nftables migration on the sandbox, shown live.

Installs the CRD (generated from the models), runs the operator as a sandbox process,
applies a three-stage policy (the canary pool, then half the nodes, then all) with short
bake times, and prints a line whenever something changes: phase, stage, nodes moved,
and which kube-proxy mode each node runs. The operator stops at the end; the sandbox
stays up for a look around (``source .sandbox/env``), until ``make sandbox-down``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import yaml

from proxymode.api import crd as crd_gen
from proxymode.api import models
from proxymode_sandbox.cluster import Sandbox, SandboxError
from proxymode_sandbox.show import render_cluster

POLICY = "demo-to-nftables"
MODE_LABEL = "proxymode.io/mode"
SHORT = {"iptables": "ipt", "nftables": "nft", "ipvs": "ipvs", "switching": "~~~"}


def demo_policy(target: str = "nftables") -> dict[str, Any]:
    return {
        "apiVersion": f"{models.GROUP}/{models.VERSION}",
        "kind": models.KIND,
        "metadata": {"name": POLICY},
        "spec": {
            "targetMode": target,
            "stages": [
                {
                    "name": "canary",
                    "nodeSelector": {"matchLabels": {"pool": "canary"}},
                    "bakeSeconds": 8,
                },
                {"name": "half", "percent": 50, "bakeSeconds": 8},
                {"name": "all", "percent": 100, "bakeSeconds": 5},
            ],
            "maxUnavailable": 1,
        },
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


def run(box: Sandbox, timeout: float = 600.0, out: Any = print) -> str:
    """Run the demo migration; returns the final phase."""
    if not box.status().healthy:
        raise SandboxError("the sandbox is not running; `make sandbox` first")
    box.apply([crd_gen.crd()])
    box.kubectl("wait", "--for=condition=Established", "crd/proxymodepolicies.proxymode.io")
    box.kubectl("delete", "proxymodepolicy", POLICY, "--ignore-not-found", "--wait=true")
    box.start_operator()
    out(f"operator started (log: {box.dir / 'logs' / 'operator.log'})")
    box.kubectl("apply", "-f", "-", input_text=json.dumps(demo_policy()))
    out(f"applied ProxyModePolicy {POLICY}: iptables -> nftables, stages canary, half, all\n")
    out("  time   phase        stage   nodes  per-node mode (~~~ = switching between proxies)")
    start = time.monotonic()
    last = ""
    phase = ""
    try:
        while time.monotonic() - start < timeout:
            status = box.get_json("proxymodepolicy", POLICY).get("status") or {}
            line = _line(time.monotonic() - start, status, _node_modes(box))
            if line.split("s  ", 1)[1] != last:
                out(line)
                last = line.split("s  ", 1)[1]
            phase = str(status.get("phase", ""))
            if phase in ("Completed", "RolledBack", "Failed"):
                out(f"\n{phase}: {status.get('message', '')}")
                break
            time.sleep(1.0)
        else:
            out(f"\nstill {phase} after {timeout:.0f}s")
    finally:
        box.stop_operator()
    out("\nevents:")
    events = box.kubectl(
        "get",
        "events",
        "-n",
        "default",
        f"--field-selector=involvedObject.name={POLICY}",
        "--sort-by=.lastTimestamp",
        "-o",
        "custom-columns=REASON:.reason,MESSAGE:.message",
        "--no-headers",
    ).stdout
    for row in events.splitlines():
        out(f"  {row}")
    out("\n" + render_cluster(box))
    out(f"\nthe sandbox is still up: source {box.env_file}; `make sandbox-down` when done")
    return phase
