"""Which canary nodes a round judges: not those whose window still holds their old proxy.

The engine records when a node arrived on the target mode while a stage baked
(``status.recentSwitches``); the adapter leaves such a node out for one window. A target
pod's age said that before, and a roll of the target DaemonSet's template (a person's image
bump reaches it: every pod new, no node switched) emptied the canary group, so the rounds
"had no canary" and counted as no data (a review: a rollback with ``onNoData: Rollback``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from proxymode.api.models import Switch
from proxymode.kube.rounds import settled_canary

FLOOR = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
NOW = FLOOR + timedelta(seconds=120)


def test_a_node_that_switched_after_the_floor_waits_one_window() -> None:
    switches = [Switch(node="c2", time=FLOOR + timedelta(seconds=100))]
    assert settled_canary(["c1", "c2"], switches, NOW, FLOOR, 60) == ["c1"]
    later = NOW + timedelta(seconds=60)
    assert settled_canary(["c1", "c2"], switches, later, FLOOR, 60) == ["c1", "c2"]


def test_no_record_means_no_newcomer_whatever_the_pods_age() -> None:
    """The roll: every target pod is seconds old, no node switched: the group is whole."""
    assert settled_canary(["c1", "c2"], [], NOW, FLOOR, 300) == ["c1", "c2"]


def test_a_switch_before_the_floor_does_not_count() -> None:
    """The stage's own nodes arrived before it began baking: the window is clipped there."""
    switches = [Switch(node="c1", time=FLOOR - timedelta(seconds=5))]
    assert settled_canary(["c1"], switches, NOW, FLOOR, 300) == ["c1"]
    assert settled_canary(["c1"], switches, NOW, None, 300) == ["c1"]
