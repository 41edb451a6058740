"""A person's edit of the source DaemonSet rolls the target DaemonSet: never beside a move.

The target's template follows the source's (an image bump reaches it), and its
``RollingUpdate`` replaces one target pod at a time by the DaemonSet controller's hand. A
move of the operator's beside that roll put two nodes between proxies where maxUnavailable
was 1 (the fault matrix's image-finalize case, CI rehearsal of 2026-12-07). The controller
model rolls the target the way the DaemonSet controller does, and ``Run`` checks the budget
against the world after every step, whatever put a node down.
"""

from __future__ import annotations

import copy

import pytest

from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.engine.actions import SetNodeMode
from proxymode.engine.machine import advance
from proxymode.engine.observed import MODE_LABEL, SPEC_WRITERS
from tests.unit.engine.seq import Run, make_policy, terminal, with_spec
from tests.unit.engine.sim import Sim, SimPod, _hash


def _bump(sim: Sim) -> str:
    ds = sim.get("DaemonSet", "kube-proxy")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    container["image"] = str(container["image"]).rsplit(":", 1)[0] + ":v1.37.3"
    ds["metadata"]["generation"] = int(ds["metadata"].get("generation", 1)) + 1
    sim._store(ds)
    return str(container["image"])


def _bumped_at(step: int) -> tuple[Run, str | None]:
    """A run ``step`` looks in, then the source's image bumped; with the target's template
    hash from before the bump (its pods of any other template carry the bumped image)."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.steps(step)
    old = sim.get("DaemonSet", "kube-proxy-nftables")
    before = _hash(old["spec"]["template"]) if old else None
    _bump(sim)
    return run, before


def _bumped_pods(sim: Sim, before: str | None) -> list[SimPod]:
    return [p for p in sim.pods if p.owner == "kube-proxy-nftables" and p.template != before]


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


# -- found by a review of the first version (each failed before its fix) ---------------------


def test_no_hand_back_starts_until_the_last_replaced_pod_is_ready() -> None:
    """Bumped while the last stage bakes, the roll runs into Finalizing: the hold must last
    until the last node's new pod is Ready, not only until its old one is gone (the
    hand-back budget counts only the nodes being moved)."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.until(lambda p: p.status.phase == Phase.ANALYZING and p.status.current_stage == 2)
    _bump(sim)
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message


def test_a_move_hidden_by_a_lost_status_write_still_defers_the_template() -> None:
    """The operator died after labelling a node ``switching`` and before writing the move:
    the status shows none in flight, the label does; the template waits for it."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.until(lambda p: p.status.current_stage == 1 and p.status.stages[1].nodes_done == 1)
    run.until(lambda p: not p.status.moves)
    while not advance(run.policy, run.observe()).status.moves:
        run.step()
    run.step(lose_status=True)
    assert not run.policy.status.moves
    assert "switching" in {v.labels.get(MODE_LABEL) for v in sim.nodes.values()}
    _bump(sim)
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message


def test_the_template_waits_while_a_node_is_already_down() -> None:
    """The roll takes one node down: with maxUnavailable already used by a node whose
    kube-proxy is not Ready, the template waits like a move would."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.until(lambda p: p.status.current_stage == 1 and p.status.stages[1].nodes_done == 1)
    run.until(lambda p: not p.status.moves)
    down = next(p for p in sim.pods if p.node == "general-4")
    down.unready = 20
    run.step()
    before = _target_image(sim)
    bumped = _bump(sim)
    run.steps(3)
    assert down.unready and _target_image(sim) == before, "applied beside a node already down"
    run.until(lambda p: _target_image(sim) == bumped, limit=100)
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message


@pytest.mark.parametrize("step", [12, 30, 48, 60])
def test_a_bumped_image_that_crash_loops_rolls_back_without_spreading(step: int) -> None:
    """The bumped image's target pods crash-loop. The run rolls back (from a stage, or from
    Finalizing by way of a FinalizeStuck pause), and the rollback turns the target's
    strategy to OnDelete: each node walked back would otherwise free the controller's
    budget for the next node to get the bad image, beside the walk."""
    run, before = _bumped_at(step)

    def bad_image(_i: int, s: Sim, _p: object) -> None:
        for pod in _bumped_pods(s, before):
            pod.crashloop = True

    run.until(terminal, hook=bad_image, limit=1000)
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    assert "restarted" in (run.policy.status.rollback_message or "")


# -- a rollback beside the roll (docs/reliability.md finding 12, the open residue) -----------


def _replacing(sim: Sim) -> bool:
    """A node at the target whose pod the DaemonSet controller is replacing right now."""
    return any(
        view.labels.get(MODE_LABEL) == "nftables"
        and not all(p.ready for p in sim.proxies_on(name) or [None])  # type: ignore[union-attr]
        for name, view in sim.nodes.items()
    )


@pytest.mark.parametrize("how", ["abort", "delete"])
@pytest.mark.parametrize("step", [26, 41, 53])
def test_a_rollback_while_the_controller_replaces_a_pod_walks_that_node_first(
    how: str, step: int
) -> None:
    """Aborted (or deleted) while the target DaemonSet replaces one pod for a healthy bump:
    that node is already down, so it is the first walked back; a healthy node walked back
    beside it put two down (16 of 36 such sequences before the fix)."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.steps(step)
    _bump(sim)
    run.until(lambda _p: _replacing(sim), limit=30)
    if how == "abort":
        sim.action = "abort"
    else:
        run.deleting = True
    run.until(terminal)
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message


@pytest.mark.parametrize("step", [10, 30, 46, 54])
def test_a_bumped_image_never_ready_rolls_back_within_the_budget(step: int) -> None:
    """The bumped image's target pods run but never get Ready (not a crash loop): the run
    rolls back on the ready timeout (or is aborted from a FinalizeStuck pause), and the
    node already down goes back first (10 of 16 such sequences broke the budget before)."""
    run, before = _bumped_at(step)

    def never_ready(_i: int, s: Sim, p: ProxyModePolicy) -> None:
        for pod in _bumped_pods(s, before):
            pod.unready = pod.unready or 10**6
        if p.status.phase == Phase.PAUSED:
            s.action = "abort"

    run.until(terminal, hook=never_ready, limit=1500)
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message


@pytest.mark.parametrize("how", ["abort", "delete"])
def test_without_a_roll_a_broken_node_keeps_its_stage_s_turn(how: str) -> None:
    """Found by a review of the first version: a node down for a reason of its own (both
    kube-proxies crash there) was walked back first, failed, and stopped the rollback
    before any healthy node went back. Without a roll of the target the stages keep their
    order: every other stage goes back, and the rollback stops at the broken node's."""
    sim = Sim.cluster({"canary": 2, "general": 6})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.until(
        lambda p: (
            p.status.current_stage == 2
            and p.status.stages[2].nodes_done >= 1
            and not p.status.moves
        )
    )
    sim.broken.add("canary-1")
    run.step()
    if how == "abort":
        sim.action = "abort"
    else:
        run.deleting = True
    for _ in range(800):
        run.step()
        if run.policy.status.phase == Phase.FAILED:
            break
    assert run.policy.status.phase == Phase.FAILED
    assert "canary-1" in (run.policy.status.message or "")
    labelled = {n for n, v in sim.nodes.items() if v.labels.get(MODE_LABEL)}
    assert labelled <= {"canary-1", "canary-2"}, "a later stage was left on the target"


# -- a person's edit of the target DaemonSet itself ----------------------------------------


def _edit_target(sim: Sim) -> str:
    """``kubectl set image ds/kube-proxy-nftables``: the operator's config hash unchanged.
    A copy is edited, so the store sees the spec change (and bumps its generation)."""
    ds = copy.deepcopy(sim.get("DaemonSet", "kube-proxy-nftables"))
    container = ds["spec"]["template"]["spec"]["containers"][0]
    container["image"] = str(container["image"]).rsplit(":", 1)[0] + ":v1.37.9-hotfix"
    sim._store(ds)
    ds[SPEC_WRITERS] = ["kubectl-set"]  # what the adapter reads from managedFields
    return str(container["image"])


@pytest.mark.parametrize("when", ["move in flight", "between moves"])
def test_a_direct_edit_of_the_target_rolls_without_a_move_beside_it(when: str) -> None:
    """The config hash does not change, so the operator used to see no roll: its moves ran
    beside the controller's replacements (two nodes down on a budget of one). The template
    generation shows the roll; ``Run`` checks the budget after every step. An edit made
    while a move is in flight takes a second node down at once, by the person's hand (as
    deleting a kube-proxy pod would): from the end of that move on, the budget holds."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.until(lambda p: p.status.current_stage == 1 and p.status.stages[1].nodes_done == 1)
    if when == "between moves":
        run.until(lambda p: not p.status.moves)
        _edit_target(sim)
    else:
        run.until(lambda p: bool(p.status.moves))
        _edit_target(sim)
        run.checking = False
        run.until(lambda p: not p.status.moves)
        run.checking = True
        run.check()
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message


def test_no_move_starts_while_a_directly_edited_target_still_has_pods_to_replace() -> None:
    """The moment between two of the controller's replacements (the last new pod Ready, the
    next old one not yet deleted): no node is down, the config hash is the operator's, and
    only the pods' template generation says a roll is under way. A move started there runs
    beside the next replacement. (Paused with no move in flight, edited, resumed; looks
    without the controllers' tick hold that moment.)"""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.until(lambda p: p.status.current_stage == 2 and bool(p.status.moves))
    run.policy = with_spec(run.policy, paused=True)
    run.until(lambda p: p.status.phase == Phase.PAUSED and not p.status.moves)
    _edit_target(sim)
    ds = sim.get("DaemonSet", "kube-proxy-nftables")
    # Taken up by the controller, which counts no pod of the new template yet.
    ds["status"]["observedGeneration"] = ds["metadata"]["generation"]
    ds["status"]["updatedNumberScheduled"] = 0
    run.policy = with_spec(run.policy, paused=False)
    for _ in range(3):
        decision = run.step(tick=False)
        started = [a for a in decision.actions if isinstance(a, SetNodeMode) and a.value]
        assert not started, f"a move started beside the roll: {started}"
    assert "rolling a changed template out" in (run.policy.status.message or "")


def test_a_direct_edit_of_the_target_is_said_once() -> None:
    """Someone else's change to the target DaemonSet is lost when the migration ends: said
    once (a Warning naming who made it and where to make it instead), remembered on the
    DaemonSet, not said again on every look."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.until(lambda p: p.status.current_stage == 1 and bool(p.status.moves))
    assert not run.events("TargetEdited")
    _edit_target(sim)
    run.checking = False  # the person's edit takes a node down beside the move
    run.until(lambda p: not p.status.moves)
    run.checking = True
    (event,) = run.events("TargetEdited")
    assert event.type == "Warning"
    assert "changes by kubectl-set" in event.message
    assert "make them on the source DaemonSet kube-system/kube-proxy" in event.message
    ds = sim.get("DaemonSet", "kube-proxy-nftables")
    generation = ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"]
    assert ds["metadata"]["annotations"]["proxymode.io/edit-reported"] == generation
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    assert len(run.events("TargetEdited")) == 1


def test_a_deleted_target_is_made_again_and_said() -> None:
    """``kubectl delete ds kube-proxy-nftables`` mid-walk takes the moved nodes' kube-proxies
    with it: the operator makes it again (the moved nodes get theirs back) and says so,
    with how to stop a migration instead; the run still completes."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.until(lambda p: p.status.current_stage == 1 and p.status.stages[1].nodes_done == 1)
    run.until(lambda p: not p.status.moves)
    del sim.objects[("DaemonSet", "kube-proxy-nftables")]
    sim.pods = [p for p in sim.pods if p.owner != "kube-proxy-nftables"]
    run.checking = False  # the person's deletion took three nodes' proxies at once
    run.step()
    (event,) = run.events("TargetDeleted")
    assert "was deleted, and the kube-proxies of nodes canary-1, canary-2" in event.message
    assert "proxymode.io/action=abort" in event.message
    assert sim.get("DaemonSet", "kube-proxy-nftables") is not None, "made again"
    run.until(lambda p: not sim.without_ready_proxy(), limit=20)
    run.checking = True
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    assert len(run.events("TargetDeleted")) == 1


def test_a_target_edit_taken_back_mid_roll_does_not_hold_the_walk() -> None:
    """A review: ``kubectl set image`` on the target, one pod replaced, then ``kubectl
    rollout undo``. The pods still on the first template keep their old generation, and the
    controller never replaces them (their revision hash is current again): judged by
    generation alone they held every move for ever. The DaemonSet's own count of updated
    pods says whether a roll is left."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=1))
    run.until(lambda p: p.status.current_stage == 1 and p.status.stages[1].nodes_done >= 1)
    run.until(lambda p: not p.status.moves)
    ds = sim.get("DaemonSet", "kube-proxy-nftables")
    before = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    _edit_target(sim)
    run.checking = False  # the person's roll takes a node down at once
    sim.tick()  # the controller replaces one pod
    ds = sim.get("DaemonSet", "kube-proxy-nftables")
    ds["spec"]["template"]["spec"]["containers"][0]["image"] = before  # rollout undo
    sim._store(ds)
    run.until(terminal, limit=150)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message


@pytest.mark.parametrize("where", ["paused", "mixed mode", "finalizing"])
def test_a_target_deleted_while_paused_or_in_mixed_mode_is_made_again(where: str) -> None:
    """A review: deleted while the run was paused, or after it completed in mixed mode, the
    target DaemonSet was made again only by the rollout's looks: the moved nodes stayed
    without any kube-proxy, the status healthy, nothing said."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    if where == "paused":
        run = Run(sim, make_policy(maxUnavailable=1))
        run.until(lambda p: p.status.phase == Phase.ANALYZING)
        run.policy = with_spec(run.policy, paused=True)
        run.until(lambda p: p.status.phase == Phase.PAUSED)
    elif where == "finalizing":
        run = Run(sim, make_policy(maxUnavailable=1))
        run.until(lambda p: p.status.phase == Phase.FINALIZING and bool(p.status.moves))
    else:
        canary = [{"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}}]
        run = Run(sim, make_policy(stages=canary, finalize=False))
        run.until(terminal)
    del sim.objects[("DaemonSet", "kube-proxy-nftables")]
    sim.pods = [p for p in sim.pods if p.owner != "kube-proxy-nftables"]
    run.checking = False  # the person's deletion took the moved nodes' proxies at once
    run.until(lambda p: not sim.without_ready_proxy(), limit=20)
    assert len(run.events("TargetDeleted")) == 1
    run.checking = True
    run.steps(5)
    assert len(run.events("TargetDeleted")) == 1


def test_a_newcomer_in_mixed_mode_waits_for_a_direct_edit_s_roll() -> None:
    """A review: Completed in mixed mode, kube-proxy-nftables edited by hand, a node joins:
    its move started beside the controller's roll, and the edit was never said."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy(maxUnavailable=2, finalize=False))
    run.until(terminal)
    _edit_target(sim)
    sim.add_node("general-5", "general")
    decision = run.step(tick=False)
    started = [a for a in decision.actions if isinstance(a, SetNodeMode) and a.value]
    assert not started, started
    assert "no new node move starts" in (run.policy.status.message or "")
    assert len(run.events("TargetEdited")) == 1
    run.until(lambda p: "general-5" in nodes_on(sim, "nftables"), limit=60)


def nodes_on(sim: Sim, mode: str) -> set[str]:
    return {n for n, v in sim.nodes.items() if v.labels.get(MODE_LABEL) == mode}


def test_another_migration_s_labels_do_not_make_a_finished_target_again() -> None:
    """CI (examples run side by side, each on a kube-proxy of its own): a node labelled by
    another migration made this policy's finalized target DaemonSet again, after Finalizing
    had deleted it. Only this run's nodes say the target was deleted under them."""
    sim = Sim.cluster({"canary": 2, "general": 2, "other": 1})
    # This kube-proxy does not run on pool "other"; another one, migrated by another
    # policy, does, and labelled its node.
    ds = copy.deepcopy(sim.get("DaemonSet", "kube-proxy"))
    for name, node in sim.nodes.items():
        if not name.startswith("other"):
            node.labels["pool-owner"] = "mine"
    ds["spec"]["template"]["spec"]["nodeSelector"] = {"pool-owner": "mine"}
    sim._store(ds)
    sim.pods = [p for p in sim.pods if p.node != "other-1"]
    sim.nodes["other-1"].labels[MODE_LABEL] = "nftables"
    run = Run(sim, make_policy(), check=False)
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED and run.policy.status.finalized
    run.steps(3)
    assert sim.get("DaemonSet", "kube-proxy-nftables") is None
    assert not run.events("TargetDeleted")
