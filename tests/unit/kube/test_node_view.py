"""What a Node object becomes for the engine: its Ready condition, and since when."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from proxymode.kube.observe import node_view


def _node(status: str, since: str) -> dict[str, Any]:
    ready = {"type": "Ready", "status": status, "lastTransitionTime": since}
    pressure = {"type": "MemoryPressure", "status": "False", "lastTransitionTime": "2020-01-01"}
    return {"metadata": {"name": "n1"}, "status": {"conditions": [pressure, ready]}}


def test_a_ready_node_says_since_when_a_kubelet_back_restarts_the_move_clocks() -> None:
    view = node_view(_node("True", "2026-12-07T08:00:05Z"))
    assert view.ready
    assert view.ready_since == datetime(2026, 12, 7, 8, 0, 5, tzinfo=UTC)


def test_a_node_not_ready_or_unknown_has_no_ready_since() -> None:
    for status in ("False", "Unknown"):
        view = node_view(_node(status, "2026-12-07T08:00:05Z"))
        assert not view.ready and view.ready_since is None, status
    bare = node_view({"metadata": {"name": "n1"}})
    assert not bare.ready and bare.ready_since is None
