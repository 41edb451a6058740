"""A node whose kubelet goes down while the source DaemonSet is put back (controller model).

No pod starts, stops or gets Ready on such a node until its kubelet returns: the old
kube-proxy stays Terminating, the new one never runs, and the DaemonSet never counts the
node Ready. Rollback and finalize used to wait for the source DaemonSet to settle on every
node, so one node powered off at that moment kept the policy in RollingBack or Finalizing
for ever (found by a review). They now leave such nodes out of the wait and name them when
the phase ends; a live node whose kube-proxy is not Ready is still waited for, and named.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

import pytest

from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.engine.look import Look
from proxymode.engine.observed import MODE_LABEL, SWITCHING, NodeView, Object, ProxyPod
from proxymode.engine.settle import down_nodes, source_settled
from tests.unit.engine.seq import (
    CANARY_THEN_ALL,
    THREE_STAGES,
    Run,
    make_policy,
    nodes_labelled,
    phase_is,
    stray_canary_3,
    with_rival,
)
from tests.unit.engine.sim import Sim

BAKING = [{**s, "bakeSeconds": 600} for s in THREE_STAGES]


def _unlabelled(sim: Sim) -> bool:
    return all(MODE_LABEL not in n.labels for n in sim.nodes.values())


def _down_once_unlabelled(run: Run, node: str, phase: Phase) -> None:
    """Steps until every node is off the migration's labels in ``phase``, then takes
    ``node``'s kubelet down: only the source DaemonSet's restore is left."""
    run.until(lambda p: p.status.phase == phase and not p.status.moves and _unlabelled(run.sim))
    run.sim.down.add(node)


def _handed_back_in_finalizing() -> tuple[Sim, Run]:
    """A run in Finalizing with at least one node handed back: its source pod read the
    target mode (nftables) and its hand-back has ended."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase == Phase.FINALIZING)
    run.until(lambda p: bool(_handed(sim, p)))
    return sim, run


def _handed(sim: Sim, p: ProxyModePolicy) -> list[str]:
    moving = {m.node for m in p.status.moves}
    return [
        q.node
        for q in sim.pods
        if q.owner == "kube-proxy" and q.mode == "nftables" and q.ready and q.node not in moving
    ]


def _status_behind(
    sim: Sim,
    node_view: Callable[[NodeView], NodeView],
    pod_view: Callable[[ProxyPod], ProxyPod],
    **counts: int,
) -> tuple[Look, Object]:
    """A look whose source DaemonSet status (``counts``, desired 3) is an event behind its
    pods: general-1 between its old pod and its new one (none), and the nodes and pods
    reshaped by ``node_view`` and ``pod_view``."""
    obs = sim.observe(policy="to-nft")
    ds = copy.deepcopy(obs.source_daemon_set)
    ds["status"] = {
        "observedGeneration": ds["metadata"]["generation"],
        "desiredNumberScheduled": 3,
        "currentNumberScheduled": 3,
        **counts,
    }
    obs = replace(
        obs,
        nodes=tuple(node_view(n) for n in obs.nodes),
        pods=tuple(pod_view(p) for p in obs.pods if p.node != "general-1"),
        source_daemon_set=ds,
    )
    return Look(make_policy(), obs), ds


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
    assert status.message.endswith("no Ready kube-proxy that stays on node general-2"), (
        status.message
    )
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


@pytest.mark.parametrize("pod_left", [False, True], ids=["rival-walked-first", "pod-stuck"])
def test_a_down_node_the_source_does_not_run_on_excuses_nothing(pod_left: bool) -> None:
    """Another migration's node (its label, and its ``NotIn`` on the source) is down: the
    source does not run there, so it neither relaxes the wait nor is named as "not seen",
    also when its source pod is stuck Terminating there (its kubelet went down as the
    other migration walked it: a review's case)."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    with_rival(sim)
    if pod_left:
        for _ in range(3):
            sim.tick()
        sim.down.add("canary-1")
    sim.nodes["canary-1"].labels[MODE_LABEL] = "switching" if pod_left else "ipvs"
    for _ in range(3):
        sim.tick()
    assert bool(sim.proxies_on("canary-1")) == pod_left
    run = Run(
        sim,
        make_policy(
            nodeSelector={"matchLabels": {"pool": "general"}},
            stages=[{"name": "all", "percent": 100, "bakeSeconds": 600}],
            finalize=False,
        ),
        check=False,
    )
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.down.add("canary-1")
    sim.action = "abort"
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))
    assert down_nodes(Look(run.policy, run.observe()), sim.get("DaemonSet", "kube-proxy")) == []
    assert run.policy.status.phase == Phase.ROLLED_BACK
    assert "not seen" not in run.policy.status.message


def test_a_status_one_event_behind_the_pods_does_not_settle() -> None:
    """general-2's kubelet is down; general-1's old pod has gone and its new one is not made
    yet, while the DaemonSet's status still counts the old one (two watches, two paces)."""
    look, ds = _status_behind(
        Sim.cluster({"canary": 1, "general": 2}),
        lambda n: replace(n, ready=n.name != "general-2"),
        lambda p: replace(p, ready=False) if p.node == "general-2" else p,
        numberReady=2,
        numberUnavailable=1,
        updatedNumberScheduled=1,
    )
    assert down_nodes(look, ds) == ["general-2"]
    assert not source_settled(look, ds)


def test_a_rival_s_stuck_pod_does_not_cover_a_node_between_pods() -> None:
    """canary-1 is another migration's (ipvs, off the source by its ``NotIn``) and down, a
    source pod stuck Terminating there; general-1 is between its old pod and its new one,
    the status an event behind. The stuck pod covers nothing (a review's case)."""
    sim = Sim.cluster({"canary": 1, "general": 3})
    with_rival(sim)
    sim.tick()
    look, ds = _status_behind(
        sim,
        lambda n: (
            replace(n, ready=False, labels={**n.labels, MODE_LABEL: "ipvs"})
            if n.name == "canary-1"
            else n
        ),
        lambda p: replace(p, ready=False, terminating=True) if p.node == "canary-1" else p,
        numberReady=3,
        numberUnavailable=0,
        updatedNumberScheduled=3,
    )
    assert down_nodes(look, ds) == []
    assert not source_settled(look, ds)


def test_a_node_handed_back_then_down_waits_on_its_label_for_its_restart() -> None:
    """Finalizing handed canary-1 back (its source pod runs nftables), then its kubelet went
    down, then an abort. The rollback must restart that pod in the source mode, but a walk
    through switching cannot stop a pod on a down node: the node stayed at switching,
    without any kube-proxy once its kubelet was back (a review's reproducer). It now waits
    on its label, says why, and restarts the pod when the kubelet is back."""
    sim, run = _handed_back_in_finalizing()
    node = _handed(sim, run.policy)[0]
    sim.down.add(node)
    sim.action = "abort"
    run.until(lambda p: "waiting for its kubelet" in p.status.message, limit=200)
    for _ in range(20):
        run.step()
        assert MODE_LABEL not in sim.nodes[node].labels, "a down node is not walked"
    assert run.policy.status.phase == Phase.ROLLING_BACK
    assert f"node {node} ran nftables" in run.policy.status.message
    sim.down.clear()
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    run.assert_restored()


def test_finalize_names_the_kubelet_of_a_node_down_at_the_target() -> None:
    """general-4's kubelet goes down while it still runs the target: no hand-back starts
    beside it (a hand-back restarts every kube-proxy), and the wait and the pause that ends
    it say the kubelet is the cause, not an image (a review found "a bad image?")."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(finalize=True))
    run.until(lambda p: p.status.phase == Phase.FINALIZING)
    assert sim.nodes["general-4"].labels.get(MODE_LABEL) == "nftables"
    sim.down.add("general-4")
    run.until(
        lambda p: "the kubelet of node general-4 is not Ready" in (p.status.message or ""), limit=3
    )
    run.until(phase_is(Phase.PAUSED, Phase.COMPLETED, Phase.FAILED), limit=300)
    status = run.policy.status
    assert status.phase == Phase.PAUSED, status.message
    assert "the node's kubelet is not Ready" in status.message
    assert "bad image" not in status.message


@pytest.mark.parametrize("then", ["kubelet-back", "node-deleted"])
def test_a_node_down_at_the_target_waits_on_its_label_while_the_rest_goes_back(
    then: str,
) -> None:
    """canary-1 runs the target when its kubelet goes down; then an abort. Its move back
    used to walk it to switching, where the target pod could not stop: the rollback failed
    there, and once the kubelet was back the node stayed at switching without any
    kube-proxy (a review's reproducer). Now it keeps its label, every other node goes
    back, and the rollback says why; it ends when the kubelet is back, or the Node goes."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(stages=BAKING))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    assert sim.nodes["canary-1"].labels.get(MODE_LABEL) == "nftables"
    sim.down.add("canary-1")
    sim.action = "abort"
    run.until(lambda p: "every other node is back" in p.status.message, limit=200)
    for _ in range(20):
        run.step()
        assert sim.nodes["canary-1"].labels.get(MODE_LABEL) == "nftables"
    status = run.policy.status
    assert status.phase == Phase.ROLLING_BACK
    assert (
        "node canary-1 is still on the migration's label and its kubelet is not" in status.message
    )
    assert not nodes_labelled(sim, "nftables") - {"canary-1"}, "the others are back"
    if then == "kubelet-back":
        sim.down.clear()
        run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))
        assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
        run.assert_restored()
    else:
        sim.remove_node("canary-1")
        run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))
        assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
        for node in sim.nodes:
            pods = sim.proxies_on(node)
            assert len(pods) == 1 and pods[0].owner == "kube-proxy" and pods[0].ready, node


def test_an_unrecorded_node_whose_kubelet_is_down_is_waited_for() -> None:
    """canary-3 was labelled by this run, then a status write was lost (a stray), then its
    kubelet went down: the rollback ended RolledBack with its label left, and once the
    kubelet was back the node stayed at switching without a kube-proxy (a review)."""
    sim, run = stray_canary_3()
    assert sim.nodes["canary-3"].labels.get(MODE_LABEL) == "switching"
    sim.down.add("canary-3")
    sim.action = "abort"
    run.until(lambda p: "every other node is back" in p.status.message, limit=200)
    for _ in range(10):
        run.step()
    assert run.policy.status.phase == Phase.ROLLING_BACK
    assert "node canary-3 is still on the migration's label" in run.policy.status.message
    sim.down.clear()
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    for _ in range(5):
        run.step()
    assert MODE_LABEL not in sim.nodes["canary-3"].labels
    pods = sim.proxies_on("canary-3")
    assert len(pods) == 1 and pods[0].owner == "kube-proxy" and pods[0].ready


def test_pods_that_read_the_target_mode_restart_beside_a_node_waiting_for_its_kubelet() -> None:
    """Finalizing handed some nodes back (their source pods run nftables); a node still at
    the target loses its kubelet; abort. The handed-back nodes restart in the source mode
    while that node waits: "every other node is back" only once they have (a review)."""
    sim, run = _handed_back_in_finalizing()
    moving = {m.node for m in run.policy.status.moves}
    at_target = sorted(
        n
        for n, v in sim.nodes.items()
        if v.labels.get(MODE_LABEL) == "nftables" and n not in moving
    )
    down = at_target[-1]
    sim.down.add(down)
    sim.action = "abort"
    run.until(lambda p: "every other node is back" in p.status.message, limit=200)
    for node in sim.nodes:
        if node != down:
            modes = [p.mode for p in sim.proxies_on(node)]
            assert modes == ["iptables"], f"{node} runs {modes} while {down} waits"
    sim.down.clear()
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    run.assert_restored()


@pytest.mark.parametrize("down", [["canary-1"], ["general-2"], ["canary-1", "general-2"]])
def test_a_stage_waiting_for_a_kubelet_is_rolling_back_and_the_others_rolled_back(
    down: list[str],
) -> None:
    sim = Sim.cluster({"canary": 1, "general": 3})
    stages = [{**s, "bakeSeconds": 40} for s in THREE_STAGES[:2]]
    run = Run(sim, make_policy(stages=[*stages, {**THREE_STAGES[2], "bakeSeconds": 600}]))
    run.until(lambda p: p.status.phase == Phase.ANALYZING and p.status.current_stage == 1)
    sim.down.update(down)
    sim.action = "abort"
    run.until(lambda p: "every other node is back" in p.status.message, limit=200)
    for stage in run.policy.status.stages:
        waiting = set(stage.nodes) & set(down)
        if waiting:
            assert stage.phase == "RollingBack", (stage.name, stage.phase)
        elif stage.phase != "Pending":
            assert stage.phase == "RolledBack", (stage.name, stage.phase)
    assert f"{', '.join(sorted(down))} {'is' if len(down) == 1 else 'are'} still" in (
        run.policy.status.message
    )


@pytest.mark.parametrize("down", [False, True], ids=["all-up", "a-node-down"])
def test_a_rollback_on_an_ondelete_source_ends(down: bool) -> None:
    """The source's own strategy is OnDelete: its controller replaces no pod when the
    restore puts the original template back, so the count of updated pods never reaches
    the nodes'. The rollback waited for it for ever (a review); it now ends once every
    node is served by a Ready source kube-proxy (the template reaches a node when its pod
    is next deleted, as the person's strategy says)."""
    sim = Sim.cluster({"canary": 1, "general": 3})
    ds = copy.deepcopy(sim.get("DaemonSet", "kube-proxy"))
    ds["spec"]["updateStrategy"] = {"type": "OnDelete"}
    sim._store(ds)
    for _ in range(3):
        sim.tick()
    stages = [{**s, "bakeSeconds": 40} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=stages, finalize=False))
    run.until(lambda p: p.status.phase == Phase.ANALYZING and p.status.current_stage == 1)
    if down:
        sim.down.add("general-3")
    sim.action = "abort"
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED), limit=300)
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    assert sim.get("DaemonSet", "kube-proxy")["spec"]["updateStrategy"] == {"type": "OnDelete"}
    for node in sim.nodes:
        if node not in sim.down:
            pods = sim.proxies_on(node)
            assert len(pods) == 1 and pods[0].owner == "kube-proxy" and pods[0].ready, node
            assert pods[0].mode == "iptables", node
    assert "rolling update" not in run.policy.status.message


@pytest.mark.parametrize("looks", [1, 200])
def test_a_move_back_whose_kubelet_goes_down_waits_and_the_others_go_back(looks: int) -> None:
    """general-2's move back is at switching when its kubelet goes down. The move used to
    fail at its deadline (Failed) and leave the node at switching, without any kube-proxy
    once the kubelet was back (a review). It now waits where it is, still counted in the
    budget (once back it walks on without asking again: a review saw two live nodes
    between proxies when it was not), and finishes when the kubelet is back; then the
    others go back."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    stages = [{**s, "bakeSeconds": 40} for s in THREE_STAGES[:2]]
    run = Run(sim, make_policy(stages=[*stages, {**THREE_STAGES[2], "bakeSeconds": 600}]))
    run.until(lambda p: p.status.phase == Phase.ANALYZING and p.status.current_stage == 1)
    sim.action = "abort"
    run.until(
        lambda p: any(
            sim.nodes[m.node].labels.get(MODE_LABEL) == "switching" for m in p.status.moves
        )
    )
    node = run.policy.status.moves[0].node
    sim.down.add(node)
    for _ in range(looks):  # every look checks the invariants (budget: 1), also once back
        run.step()
    status = run.policy.status
    assert status.phase == Phase.ROLLING_BACK, status.message
    assert f"the move back of node {node} waits for its kubelet" in status.message
    sim.down.clear()
    run.step()
    run.until(lambda p: not p.status.message.startswith("the move back of"), limit=20)
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    run.assert_restored()


# -- the walk forward (Progressing, Analyzing, mixed mode) ------------------------------------


def _switching(sim: Sim, p: ProxyModePolicy) -> str | None:
    return next(
        (m.node for m in p.status.moves if sim.nodes[m.node].labels.get(MODE_LABEL) == SWITCHING),
        None,
    )


@pytest.mark.parametrize("looks", [1, 200])
def test_a_forward_move_whose_kubelet_goes_down_waits_and_the_walk_goes_on_once_back(
    looks: int,
) -> None:
    """A node's move forward is at switching, its old pod Terminating, when its kubelet
    goes down. The move used to fail at its deadline and roll the whole migration back
    (KubeProxyUnhealthy) for an outage that is not the new mode's doing; once the kubelet
    was back the node sat at switching until the rollback reached it. It now waits where it
    is, says why, and the walk ends Completed once the kubelet is back, however long it
    was away (200 looks are far past the switch and ready deadlines)."""
    sim = Sim.cluster({"canary": 1, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=2))
    run.until(lambda p: p.status.current_stage == 1 and _switching(sim, p) is not None)
    node = _switching(sim, run.policy)
    assert node is not None
    sim.down.add(node)
    for _ in range(looks):
        run.step()
        assert run.policy.status.phase in (Phase.PROGRESSING, Phase.ANALYZING)
    status = run.policy.status
    assert f"the kubelet of node {node} is not Ready" in status.message, status.message
    assert sim.nodes[node].labels.get(MODE_LABEL) == SWITCHING
    sim.down.clear()
    run.until(phase_is(Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED, Phase.PAUSED))
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    assert not run.events("RollbackStarted")


def test_no_move_starts_on_a_node_whose_kubelet_is_down_and_the_stage_waits_for_it() -> None:
    """general-4's kubelet is down before its stage starts. Its move used to start all the
    same: the source pod, deleted, stayed Terminating; the move failed at its deadline and
    the migration rolled back. Now no move starts there; the others move within the budget
    (the down node holds one place of it: its kube-proxy is not Ready) and the stage says
    which kubelet it waits for; once back, the node moves and the run completes."""
    sim = Sim.cluster({"canary": 1, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=2))
    sim.down.add("general-4")
    run.until(
        lambda p: (
            p.status.current_stage == 2
            and p.status.phase == Phase.PROGRESSING
            and not p.status.moves
            and "general-4" in p.status.message
        ),
        limit=300,
    )
    for _ in range(100):
        run.step()
        assert sim.nodes["general-4"].labels.get(MODE_LABEL) is None, "a move started"
        assert run.policy.status.phase == Phase.PROGRESSING, run.policy.status.message
    message = run.policy.status.message
    assert "the kubelet of node general-4 is not Ready" in message, message
    assert message.startswith("stage all: 1/2 nodes moved"), message
    sim.down.clear()
    run.until(phase_is(Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED, Phase.PAUSED))
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message


def test_a_moved_node_whose_kubelet_goes_down_is_no_kube_proxy_failure() -> None:
    """The canary runs nftables and bakes when its kubelet goes down: the node lifecycle
    controller marks its pod not Ready. That used to read as the new kube-proxy not Ready
    past readyTimeoutSeconds, a KubeProxyUnhealthy rollback of the whole migration for a
    node outage. The stage now waits for the kubelet and says so; once it is back (its pod
    Ready again) the stage bakes and the run completes. The ready timeout counts from the
    kubelet's return: an outage longer than it is no failure either."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    stages = [{**s, "bakeSeconds": 30} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=stages, readyTimeoutSeconds=30))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.down.add("canary-1")
    for _ in range(60):  # 5 s a look: ten times readyTimeoutSeconds
        run.step()
        assert run.policy.status.phase in (Phase.PROGRESSING, Phase.ANALYZING)
    assert "the kubelet of node canary-1 is not Ready" in run.policy.status.message
    assert run.policy.status.current_stage == 0, "a stage with a node unseen completed"
    sim.down.clear()
    run.until(phase_is(Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED, Phase.PAUSED))
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    assert not run.events("RollbackStarted")


def _job_in_flight(sim: Sim, p: ProxyModePolicy, kind: str) -> str | None:
    moving = {m.node for m in p.status.moves}
    return next(
        (
            j["node"]
            for j in sim.jobs.values()
            if j["node"] in moving and not j["done"] and j.get("kind") == kind
        ),
        None,
    )


@pytest.mark.parametrize(("target", "kind"), [("ipvs", "cleanup"), ("nftables", "verify")])
def test_a_job_that_ran_out_while_the_kubelet_was_down_runs_again(target: str, kind: str) -> None:
    """A move's cleanup Job (iptables -> ipvs) or verification Job is made; then the node's
    kubelet goes down for longer than the Job's deadline, and the Job controller fails it
    (its pod could not run). That is not the node's answer: once the kubelet is back the Job
    runs again, and the walk completes (it used to fail the move and roll everything back)."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(targetMode=target, readyTimeoutSeconds=30))
    run.until(lambda p: _job_in_flight(sim, p, kind) is not None)
    node = _job_in_flight(sim, run.policy, kind)
    assert node is not None
    sim.down.add(node)
    run.until(
        lambda p: any(j["node"] == node and j["done"] == "failed" for j in sim.jobs.values()),
        limit=200,
    )
    run.steps(3)
    assert run.policy.status.phase in (Phase.PROGRESSING, Phase.ANALYZING)
    sim.down.clear()
    run.until(phase_is(Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED, Phase.PAUSED))
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    assert not run.events("RollbackStarted")


def test_a_moved_node_rebooted_is_judged_by_readiness_not_its_restart_count() -> None:
    """canary-1 runs nftables and bakes; it is powered off, then on. A reboot restarts every
    container, so its kube-proxy's restart count goes up by one: that used to read as "restarted
    1 time", a KubeProxyUnhealthy rollback the moment the node was back (a review). A pod
    that lived through the outage is judged by becoming Ready again within the ready
    timeout from the return."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(stages=CANARY_THEN_ALL))
    run.until(phase_is(Phase.ANALYZING))
    sim.down.add("canary-1")
    run.steps(10)
    for pod in sim.proxies_on("canary-1"):  # the runtime records the old container's end
        pod.restarts += 1
        pod.last_terminated = sim.now
    sim.down.clear()
    run.until(phase_is(Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED, Phase.PAUSED))
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.rollback_message


@pytest.mark.parametrize("blip", [True, False])
def test_a_crash_after_the_kubelet_is_back_still_counts(blip: bool) -> None:
    """The excuse is for the outage's own restarts only. canary-1's kubelet blips (two
    looks, no container restarted), then, well after its return, its kube-proxy crashes
    once and is Ready again: a KubeProxyUnhealthy rollback, as without the blip (a review:
    any outage had switched the restart check off for the rest of the pod's life)."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    stages = [{**s, "bakeSeconds": 600} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=stages))
    run.until(phase_is(Phase.ANALYZING))
    if blip:
        sim.down.add("canary-1")
        run.steps(2)
        sim.down.clear()
    run.steps(5)  # about 25 s on: past the 10 s slack (a review: a minute let it go)
    for pod in sim.proxies_on("canary-1"):
        pod.restarts += 1
        pod.last_terminated = sim.now
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED, Phase.COMPLETED), limit=100)
    assert run.policy.status.phase == Phase.ROLLED_BACK
    assert "restarted 1 time" in (run.policy.status.rollback_message or "")


def test_a_kubelet_clock_ahead_does_not_stop_the_move_deadlines() -> None:
    """canary-1 was down once and is back, its Ready condition stamped by a kubelet whose
    clock runs a day ahead; its old kube-proxy never goes. A return "in the future" held
    the move's clocks at zero on every look: the policy sat in Progressing for ever instead
    of failing the move at its deadline (a review). Such a time is not believed."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    sim.down.add("canary-1")
    sim.tick()
    sim.down.clear()
    sim.tick()
    sim.back["canary-1"] = sim.now + timedelta(days=1)
    sim.stuck.add("canary-1")
    run = Run(sim, make_policy(readyTimeoutSeconds=30))
    run.until(phase_is(Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED, Phase.PAUSED))
    assert "stuck switching" in (run.policy.status.rollback_message or "")
