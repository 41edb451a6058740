"""A person's edit of the source DaemonSet rolls the target DaemonSet: never beside a move.

The target's template follows the source's (an image bump reaches it), and its
``RollingUpdate`` replaces one target pod at a time by the DaemonSet controller's hand. A
move of the operator's beside that roll put two nodes between proxies where maxUnavailable
was 1 (the fault matrix's image-finalize case, CI rehearsal of 2026-12-07). The controller
model rolls the target the way the DaemonSet controller does, and ``Run`` checks the budget
against the world after every step, whatever put a node down.
"""

from __future__ import annotations

import pytest

from proxymode.api.models import Phase
from tests.unit.engine.seq import Run, make_policy, terminal
from tests.unit.engine.sim import Sim


def _bump(sim: Sim) -> str:
    ds = sim.get("DaemonSet", "kube-proxy")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    container["image"] = str(container["image"]).rsplit(":", 1)[0] + ":v1.37.3"
    ds["metadata"]["generation"] = int(ds["metadata"].get("generation", 1)) + 1
    sim._store(ds)
    return str(container["image"])


def _target_image(sim: Sim) -> str:
    ds = sim.get("DaemonSet", "kube-proxy-nftables")
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


@pytest.mark.parametrize("when", ["move in flight", "between moves", "during finalize"])
def test_an_image_bump_rolls_the_target_without_a_second_node_down(when: str) -> None:
    """Bumped with a move in flight, between two moves, or while nodes are handed back:
    at no step more than one node without a Ready kube-proxy, the target follows the
    bump, and the run completes with every node on the bumped image."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    if when == "move in flight":
        run.until(lambda p: p.status.current_stage == 1 and bool(p.status.moves))
    elif when == "between moves":
        run.until(lambda p: p.status.current_stage == 1 and p.status.stages[1].nodes_done == 1)
        run.until(lambda p: not p.status.moves)
    else:
        run.until(lambda p: p.status.phase == Phase.FINALIZING and bool(p.status.moves))
    bumped = _bump(sim)
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    run.settle()
    for node in sim.nodes:
        pods = sim.proxies_on(node)
        assert len(pods) == 1 and pods[0].ready, node
    image = sim.get("DaemonSet", "kube-proxy")["spec"]["template"]["spec"]["containers"][0]
    assert image["image"] == bumped


def test_the_target_follows_the_bump_once_the_moves_in_flight_end() -> None:
    """Deferred, not dropped: while a move is in flight the target keeps its template and
    the status says why no move starts; after it, the target carries the bumped image."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.until(lambda p: p.status.current_stage == 1 and bool(p.status.moves))
    before = _target_image(sim)
    bumped = _bump(sim)
    run.steps(2)  # the first look waits for the source's controller to see the edit
    assert run.policy.status.moves, "the move in flight ended too soon for this test"
    assert _target_image(sim) == before
    assert "no new node move starts: the source DaemonSet's template changed" in (
        run.policy.status.message or ""
    )
    run.until(lambda p: _target_image(sim) == bumped, limit=50)
