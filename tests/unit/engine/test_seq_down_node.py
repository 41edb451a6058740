"""A node whose kubelet goes down while the source DaemonSet is put back (controller model).

No pod starts, stops or gets Ready on such a node until its kubelet returns: the old
kube-proxy stays Terminating, the new one never runs, and the DaemonSet never counts the
node Ready. Rollback and finalize used to wait for the source DaemonSet to settle on every
node, so one node powered off at that moment kept the policy in RollingBack or Finalizing
for ever (found by a review). They now leave such nodes out of the wait and name them when
the phase ends; a live node whose kube-proxy is not Ready is still waited for, and named.
"""

from __future__ import annotations

import pytest

from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.engine.observed import MODE_LABEL
from tests.unit.engine.seq import THREE_STAGES, Run, make_policy, phase_is
from tests.unit.engine.sim import Sim

BAKING = [{**s, "bakeSeconds": 600} for s in THREE_STAGES]


def _unlabelled(sim: Sim) -> bool:
    return all(MODE_LABEL not in n.labels for n in sim.nodes.values())


def _down_once_unlabelled(run: Run, node: str, phase: Phase) -> None:
    """Steps until every node is off the migration's labels in ``phase``, then takes
    ``node``'s kubelet down: only the source DaemonSet's restore is left."""
    run.until(lambda p: p.status.phase == phase and not p.status.moves and _unlabelled(run.sim))
    run.sim.down.add(node)


def test_a_rollback_ends_when_a_node_goes_down_as_the_source_is_restored() -> None:
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(stages=BAKING))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.action = "abort"
    _down_once_unlabelled(run, "general-2", Phase.ROLLING_BACK)
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED), limit=200)
    status = run.policy.status
    assert status.phase == Phase.ROLLED_BACK, status.message
    assert "not seen on node general-2, whose kubelet is not Ready" in status.message
    rolled = run.events("RolledBack")
    assert rolled and "general-2" in rolled[-1].message, "the Event names the node too"
    for node in ("canary-1", "general-1"):
        pods = sim.proxies_on(node)
        assert len(pods) == 1 and pods[0].owner == "kube-proxy" and pods[0].ready, node


@pytest.mark.parametrize("template", ["KeepExclusionTerm", "Exact"])
def test_finalize_completes_when_a_node_goes_down_after_its_hand_back(template: str) -> None:
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(finalize=True, finalizeSourceTemplate=template))
    _down_once_unlabelled(run, "general-1", Phase.FINALIZING)
    run.until(phase_is(Phase.COMPLETED, Phase.FAILED, Phase.PAUSED), limit=200)
    status = run.policy.status
    assert status.phase == Phase.COMPLETED and status.finalized, status.message
    assert "not seen on node general-1" in status.message
    assert sim.get("DaemonSet", "kube-proxy-nftables") is None


def test_a_live_node_whose_source_proxy_is_not_ready_is_waited_for_and_named() -> None:
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(stages=BAKING))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.action = "abort"
    run.until(lambda p: p.status.phase == Phase.ROLLING_BACK and _unlabelled(sim))
    sim.broken.add("general-2")  # its kubelet is fine; its kube-proxy crash-loops
    run.checking = False  # a crash-looping source proxy is not a move's doing
    for _ in range(30):
        run.step()
    status = run.policy.status
    assert status.phase == Phase.ROLLING_BACK, status.message
    assert status.message.endswith("kube-proxy not Ready on node general-2"), status.message
    sim.broken.discard("general-2")
    for pod in sim.pods:
        pod.crashloop = False
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))
    assert run.policy.status.phase == Phase.ROLLED_BACK
    assert "not seen" not in run.policy.status.message


def test_the_kubelet_back_brings_the_restored_kube_proxy() -> None:
    sim = Sim.cluster({"canary": 1, "general": 2})
    run: Run = Run(sim, make_policy(stages=BAKING))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.action = "abort"
    _down_once_unlabelled(run, "general-2", Phase.ROLLING_BACK)
    run.until(phase_is(Phase.ROLLED_BACK))
    sim.down.clear()
    run.settle()
    for _ in range(4):
        sim.tick()
    policy: ProxyModePolicy = run.policy
    assert policy.status.phase == Phase.ROLLED_BACK
    run.assert_restored()
