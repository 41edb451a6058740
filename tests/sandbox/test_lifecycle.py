"""``up``, ``status`` and ``down`` of a sandbox of its own: crashes are reported, nothing leaks."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from proxymode_sandbox import Sandbox, SandboxConfig, SandboxError
from proxymode_sandbox import process as proc
from proxymode_sandbox.cluster import ComponentStatus
from tests.sandbox.conftest import eventually


def test_up_status_crash_report_and_down_leave_nothing(tmp_path: Path) -> None:
    box = Sandbox(SandboxConfig(state_dir=tmp_path / "mini", nodes=2, canary_nodes=1))
    try:
        report = box.up()
        assert set(report.phases) >= {"etcd", "kube-apiserver", "controllers", "nodes"}
        assert box.status().healthy
        assert box.kubeconfig.is_file()
        env = box.env_file.read_text()
        assert f"export KUBECONFIG={box.kubeconfig}" in env
        assert f"export PATH={box.bin_dir}:$PATH" in env
        assert (box.bin_dir / "kubectl").exists() and (box.bin_dir / "helm").exists()
        with pytest.raises(SandboxError, match="already running"):
            box.up()

        # The operator is the sandbox's guest: killed, it leaves the cluster usable, and
        # starting it again needs no clean-up.
        box.install_crd()
        killed = box.start_operator()
        os.killpg(killed.pid, signal.SIGKILL)  # as a person's `kill -9` would, record kept
        _eventually_dead(box, "operator")
        assert box.status().healthy and box.operator_record() is None
        again = box.start_operator()
        assert box.operator_record() == again and again.pid != killed.pid
        box.stop_operator()

        # A component that dies is reported with the last lines of its log.
        scheduler = next(c for c in box.status().components if c.name == "kube-scheduler")
        os.killpg(scheduler.pid, signal.SIGKILL)
        report_after = _eventually_dead(box, "kube-scheduler")
        assert report_after.log_tail, "a dead component comes with its log tail"
        assert not box.status().healthy
    finally:
        stopped = box.down()
    assert "kube-apiserver" in stopped and "kube-scheduler" not in stopped
    assert proc.pids_referencing(str(tmp_path / "mini")) == []
    assert not (tmp_path / "mini").exists()


def _eventually_dead(box: Sandbox, name: str) -> ComponentStatus:
    return eventually(
        lambda: next(
            (c for c in box.status().components if c.name == name and not c.running), None
        ),
        timeout=15,
        what=f"{name} to be reported dead",
    )
