"""Ports for the sandbox's components: below the kernel's ephemeral range (where outgoing
connections take theirs), and held for a while so two sandboxes starting at once do not
pick the same one (sandbox/proxymode_sandbox/process.py, a CI rehearsal's kube-controller-
manager found its port taken a moment after it was chosen)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from proxymode_sandbox import process


def test_ports_are_below_the_ephemeral_range_distinct_and_free(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(process.tempfile, "gettempdir", lambda: str(tmp_path))
    low, _ = process._ephemeral_range()
    ports = [process.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low for p in ports), ports
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free right now
    held = {int(p.name) for p in (tmp_path / "proxymode-ports").iterdir()}
    # A superset: a port held here but found in use (another sandbox's component, with
    # its hold in the real temp directory) keeps its hold and is passed over (a CI run
    # saw one).
    assert set(ports) <= held


def test_a_held_port_is_skipped_until_its_hold_is_old(tmp_path: Path) -> None:
    hold = tmp_path / "30001"
    assert process._reserve(hold)
    assert not process._reserve(hold), "held by another caller just now"
    old = time.time() - process.PORT_HOLD_SECONDS - 1
    os.utime(hold, (old, old))
    assert process._reserve(hold), "an old hold is taken over"
    assert not process._reserve(hold)


def test_a_port_in_use_is_not_handed_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(process.tempfile, "gettempdir", lambda: str(tmp_path))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        taken = busy.getsockname()[1]
        busy.listen()
        assert not process._bindable(taken)
