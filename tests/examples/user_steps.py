"""A new user's steps, exactly: ``make sandbox``, then ``kubectl apply -f examples/<file>``.

test_examples.py runs every policy example to its end with sandbox timings, each against a
kube-proxy of its own. This module does what the getting-started guide tells a person to do
instead, and nothing else:

- the sandbox comes up through the command ``make sandbox`` runs (``proxymode-sandbox up``
  with its defaults: six nodes, three of them real, the CRD installed, the operator started
  as a sandbox process), in a state directory of its own;
- each policy example is applied unmodified with ``kubectl apply --server-side -f``: its
  Prometheus is ``http://prometheus-operated.monitoring.svc:9090``, its bakes are hours,
  its kube-proxy is kube-system's. Reaching Prometheus at that name is the point: the
  sandbox publishes it as a real Service and the operator, outside the cluster, goes through
  the API server's service proxy (docs/decisions/0032-in-cluster-urls-from-outside.md).
  The baseline values the first round records prove that the checks had data;
- nobody waits hours: as the examples README says, a person promotes each stage by hand
  (``kubectl annotate pmp NAME proxymode.io/action=promote``) once it bakes;
- between two examples the user's own steps: ``kubectl delete pmp NAME``, and after a
  finalized one ``proxymode-sandbox reset-kube-proxy`` (what a fresh sandbox would have).

Each example's documented end (its comments) is then checked on the cluster. The examples
share kube-system's kube-proxy, so in one sandbox they run one after the other; the four are
split over two modules (two sandboxes, side by side under xdist): test_as_a_user_nftables.py
and test_as_a_user_custom_ipvs.py. This module holds the steps they share.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxymode.engine.observed import ACTION_ANNOTATION, MODE_LABEL
from proxymode_sandbox import Sandbox, SandboxConfig, kubeadm_proxy, monitoring
from proxymode_sandbox.process import log_tail
from tests.examples.conftest import EXAMPLES

TERMINAL = ("Completed", "Failed", "RolledBack", "Paused")
KUBE_SYSTEM = kubeadm_proxy.NAMESPACE


def ipvs_available() -> bool:
    """Whether this machine lets a real kube-proxy run ipvs: it needs the kernel's IPVS and
    the ipset tool, and exits at start without them."""
    return Path("/proc/net/ip_vs").exists() and shutil.which("ipset") is not None


def cli(state: Path, *args: str, timeout: float = 300) -> str:
    """``proxymode-sandbox --dir STATE ARGS``, as the Makefile runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "proxymode_sandbox", "--dir", str(state), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=os.environ.copy(),
    )
    assert proc.returncode == 0, f"proxymode-sandbox {' '.join(args)}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """The sandbox as ``make sandbox`` brings it up; down however the module ends."""
    state = tmp_path_factory.mktemp("user-sandbox") / "state"
    try:
        started = time.monotonic()
        print(cli(state, "up"), f"(up in {time.monotonic() - started:.1f}s)")
        box = Sandbox(SandboxConfig(state_dir=state))
        assert box.operator_record() is not None, "make sandbox runs the operator"
        yield box
    finally:
        record = Sandbox(SandboxConfig(state_dir=state)).operator_record()
        if record is not None:  # shown by pytest only when something failed
            print(f"--- last lines of {record.log} ---\n{log_tail(record.log, 40)}")
        subprocess.run(
            [sys.executable, "-m", "proxymode_sandbox", "--dir", str(state), "down"],
            capture_output=True,
            check=False,
            timeout=180,
        )


def contains(stored: Any, given: Any) -> bool:
    """Whether every field the file gives is in the stored object with the same value (the
    API server adds the CRD's defaults, nothing else)."""
    if isinstance(given, Mapping):
        return isinstance(stored, Mapping) and all(
            k in stored and contains(stored[k], v) for k, v in given.items()
        )
    if isinstance(given, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(given)
            and all(contains(s, g) for s, g in zip(stored, given, strict=True))
        )
    return bool(stored == given)


def status_of(box: Sandbox, name: str) -> dict[str, Any]:
    return dict(box.get_json("proxymodepolicy", name).get("status") or {})


def has_baseline(status: Mapping[str, Any], checks: list[str]) -> bool:
    """Whether the first round recorded a baseline value for each of ``checks``: Prometheus
    answered, through the Service."""
    metrics = (status.get("baseline") or {}).get("metrics") or {}
    return all(name in metrics for name in checks)


def verdicts(status: Mapping[str, Any]) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in (status.get("analysis") or {}).get("checks", [])}


def apply_as_a_user(
    box: Sandbox,
    relpath: str,
    *,
    before_promote: Callable[[Mapping[str, Any]], bool] = lambda _: True,
    timeout: float = 900,
) -> tuple[str, dict[str, Any]]:
    """Apply the example unmodified; promote each stage once it bakes, its built-in checks
    have their baseline values and ``before_promote`` holds; return (name, status) when the
    policy settles."""
    path = EXAMPLES / relpath
    doc = yaml.safe_load(path.read_text())
    name = doc["metadata"]["name"]
    built_in = [c["name"] for c in doc["spec"]["analysis"]["checks"] if "template" in c]
    assert built_in, "every policy example has a check over kube-proxy's own series"
    box.kubectl("apply", "--server-side", "-f", str(path))
    stored = box.get_json("proxymodepolicy", name)["spec"]
    assert contains(stored, doc["spec"]), "stored as the file says, defaults aside"
    assert stored["analysis"]["prometheus"]["url"] == monitoring.URL
    start, promoted, seen = time.monotonic(), -1, ""
    while True:
        status = status_of(box, name)
        phase, stage = status.get("phase", ""), status.get("currentStage", -1)
        if f"{phase}/{stage}" != seen:
            seen = f"{phase}/{stage}"
            print(f"  {time.monotonic() - start:6.1f}s {relpath}: {phase} stage {stage}")
        if phase in TERMINAL:
            return name, status
        ready = has_baseline(status, built_in) and before_promote(status)
        if phase == "Analyzing" and stage != promoted and ready:
            box.kubectl(
                "annotate", "proxymodepolicy", name, f"{ACTION_ANNOTATION}=promote", "--overwrite"
            )
            promoted = stage
        assert time.monotonic() - start < timeout, (
            relpath,
            status.get("message"),
            f"promoted once Analyzing with baseline values of {built_in}",
            {"baseline": (status.get("baseline") or {}).get("metrics")},
            {"analysis": status.get("analysis")},
        )
        time.sleep(0.5)


def delete_policy(box: Sandbox, name: str) -> None:
    """``kubectl delete pmp NAME``: returns once the operator let it go (rolled back first
    when it is mid-way or in mixed mode)."""
    box.kubectl("delete", "proxymodepolicy", name, "--ignore-not-found", "--timeout=300s")


def modes(box: Sandbox) -> dict[str, str | None]:
    return {
        n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(MODE_LABEL)
        for n in box.get_json("nodes")["items"]
    }


def config_mode(box: Sandbox, name: str = kubeadm_proxy.NAME) -> str:
    cm = box.get_json("configmap", name, namespace=KUBE_SYSTEM)
    return str(yaml.safe_load(cm["data"]["config.conf"])["mode"])


def daemon_sets(box: Sandbox) -> list[str]:
    items = box.get_json("daemonsets", namespace=KUBE_SYSTEM)["items"]
    return sorted(d["metadata"]["name"] for d in items)


def assert_finalized(box: Sandbox, status: Mapping[str, Any], mode: str) -> None:
    """Completed and folded back: kube-system's kube-proxy says ``mode``, no label is left,
    no DaemonSet of the operator's."""
    assert status["phase"] == "Completed", (status.get("message"), status.get("history", [])[-5:])
    assert status["finalized"] is True
    assert config_mode(box) == mode
    assert set(modes(box).values()) == {None}
    assert daemon_sets(box) == [kubeadm_proxy.NAME]


def nft_table_on_real_nodes(box: Sandbox) -> dict[str, bool]:
    """Real node -> whether its kernel holds kube-proxy's nftables table now."""
    return {
        n: box.exec(n, ["nft", "list", "table", "ip", "kube-proxy"]).returncode == 0
        for n in box.real_node_names()
    }
