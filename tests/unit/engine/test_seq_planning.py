"""Issue 9 sequences about the plan: caps, newcomers, plan edits, rivals, pre-set labels.

Each test drives the public ``advance()`` through the controller model (``sim.Sim``) with
the invariants checked at every step, and asserts the behaviour issue 9 expects. A test
marked xfail(strict) fails against today's engine: the reason says what happens instead.
"""

from __future__ import annotations

import pytest

from proxymode.api.models import Phase, Preflight, ProxyModePolicy
from proxymode.engine.actions import SetNodeMode
from proxymode.engine.machine import advance
from proxymode.engine.observed import MODE_LABEL
from tests.unit.engine.seq import (
    ANALYSIS,
    THREE_STAGES,
    Run,
    check_world,
    history_reasons,
    make_policy,
    nodes_labelled,
    paused_code,
    phase_is,
    terminal,
    with_spec,
)
from tests.unit.engine.sim import Sim

CANARY = {"matchLabels": {"pool": "canary"}}
GENERAL = {"matchLabels": {"pool": "general"}}


def _max_stage_size(run: Run, index: int) -> int:
    peak = 0

    def hook(_i: int, _s: Sim, p: ProxyModePolicy) -> None:
        nonlocal peak
        if len(p.status.stages) > index:
            peak = max(peak, len(p.status.stages[index].nodes))

    run.until(lambda p: p.status.phase in (Phase.COMPLETED, Phase.FAILED), hook=hook)
    return max(peak, len(run.policy.status.stages[index].nodes))


def test_stage_max_nodes_cap_holds_across_later_stages() -> None:
    """issue 9 item 1: {nodeSelector: pool=canary, maxNodes: 3} keeps 3 nodes to the end;
    the canary nodes the cap left out are not newcomers (none joined the cluster)."""
    sim = Sim.cluster({"canary": 5, "general": 4})
    stages = [
        {"name": "canary", "nodeSelector": CANARY, "maxNodes": 3, "bakeSeconds": 10},
        {"name": "general", "nodeSelector": GENERAL, "bakeSeconds": 10},
    ]
    run = Run(sim, make_policy(stages=stages))
    assert _max_stage_size(run, 0) == 3
    assert not run.events("NodeJoined"), "no node joined the cluster: there is no newcomer"
    assert len(nodes_labelled(sim, "nftables") & {f"canary-{i}" for i in range(1, 6)}) == 3


def test_percent_stage_max_nodes_cap_holds() -> None:
    """issue 9 item 1: {percent: 100, maxNodes: 2} followed by more stages stays at 2 nodes."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    stages = [
        {"name": "two", "percent": 100, "maxNodes": 2, "bakeSeconds": 10},
        {"name": "canary", "nodeSelector": CANARY, "bakeSeconds": 10},
    ]
    run = Run(sim, make_policy(stages=stages))
    assert _max_stage_size(run, 0) == 2
    assert not run.events("NodeJoined")


def test_a_node_that_joins_the_cluster_is_a_newcomer_of_a_capped_selector_stage() -> None:
    """issue 9 item 1 (the other half): a node that really joined still joins its pool's stage."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    stages = [
        {"name": "canary", "nodeSelector": CANARY, "maxNodes": 3, "bakeSeconds": 10},
        {"name": "all", "percent": 100, "bakeSeconds": 10},
    ]
    run = Run(sim, make_policy(stages=stages))
    run.until(lambda p: p.status.current_stage == 1)
    sim.add_node("canary-3", "canary")
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    assert "canary-3" in [n for s in run.policy.status.stages for n in s.nodes]


BOTH_POOLS = {
    "matchExpressions": [{"key": "pool", "operator": "In", "values": ["canary", "general"]}]
}
MIXED_MODE_EDITS = {
    "add-a-stage": [THREE_STAGES[0], {"name": "general", "nodeSelector": GENERAL}],
    "widen-the-stage": [{"name": "canary", "nodeSelector": BOTH_POOLS, "bakeSeconds": 20}],
}


@pytest.mark.parametrize("edit", sorted(MIXED_MODE_EDITS))
def test_editing_the_stages_of_a_completed_mixed_mode_policy_pauses_for_the_new_plan(
    edit: str,
) -> None:
    """issue 9 item 2: decision 0020 — a plan edit of a mixed-mode Completed policy pauses
    (PlanChanged); nothing new moves until resume, and then stage by stage."""
    sim = Sim.cluster({"canary": 2, "general": 3})
    run = Run(sim, make_policy(stages=[THREE_STAGES[0]]))
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED and run.policy.status.finalized is False
    run.policy = with_spec(run.policy, stages=MIXED_MODE_EDITS[edit])
    run.steps(10)
    assert not nodes_labelled(sim, "nftables") - {"canary-1", "canary-2"}, "nothing ungated"
    assert not nodes_labelled(sim, "switching")
    assert run.policy.status.phase == Phase.PAUSED
    assert paused_code(run.policy.status) == "PlanChanged"
    sim.action = "resume"
    run.until(terminal)
    st = run.policy.status
    assert st.phase == Phase.COMPLETED, st.message
    general = {"general-1", "general-2", "general-3"}
    assert general <= nodes_labelled(sim, "nftables") or st.finalized, "the new plan ran"
    if edit == "add-a-stage":
        assert [s.name for s in st.stages] == ["canary", "general"]
        assert set(st.stages[1].nodes) == general, "recorded under the new stage"


EDITS = {
    "drop": [THREE_STAGES[0], {"name": "rest", "percent": 100, "bakeSeconds": 10}],
    "rename": [THREE_STAGES[0], {**THREE_STAGES[1], "name": "halfway"}, THREE_STAGES[2]],
    "only-first": [THREE_STAGES[0]],
}


@pytest.mark.parametrize("edit", sorted(EDITS))
@pytest.mark.parametrize("resume", [False, True], ids=["deleted-paused", "resumed-then-deleted"])
def test_dropping_the_stage_in_progress_keeps_its_moved_nodes_and_deletion_restores(
    edit: str, resume: bool
) -> None:
    """issue 9 item 3: a plan edit that drops or renames the stage in progress forgets no
    moved node; deleting the policy then puts every node back, never two kube-proxies."""
    sim = Sim.cluster({"canary": 2, "general": 6})
    run = Run(sim, make_policy())
    run.until(
        lambda p: (
            p.status.current_stage == 1
            and any(n.startswith("general") for n in nodes_labelled(sim, "nftables"))
        )
    )
    moved = nodes_labelled(sim, "nftables") | nodes_labelled(sim, "switching")
    run.policy = with_spec(run.policy, stages=EDITS[edit])
    run.steps(3)
    if resume:
        sim.action = "resume"
        run.steps(6)
    recorded = {n for s in run.policy.status.stages for n in s.nodes}
    assert moved <= recorded, f"forgotten: {sorted(moved - recorded)}"
    # Their finished moves are kept too: never taken for a person's label and walked back.
    assert run.events("HandSetLabel") == [], run.events("HandSetLabel")
    run.deleting = True
    run.until(lambda p: False, limit=300)
    sim.collect_garbage("uid-1")
    run.deleting = False
    run.assert_restored()


def _two_policies(sim: Sim) -> tuple[Run, Run]:
    first = Run(sim, make_policy(), check=False)
    second = Run(sim, make_policy(name="to-ipvs", uid="uid-2", targetMode="ipvs"), check=False)
    return first, second


def test_two_policies_created_together_only_one_proceeds() -> None:
    """issue 9 item 4: of two policies created in the same moment, exactly one proceeds;
    the other waits or fails with a message naming the first; never two proxies on a node."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    first, second = _two_policies(sim)
    for _ in range(40):
        # Both operators' looks start at the same moment: neither sees the other's status.
        seen = [run.observe() for run in (first, second)]
        for run, observed in zip((first, second), seen, strict=True):
            run.step(tick=False, observed=observed)
        sim.tick(2.0)
        for node in sim.nodes:
            assert len(sim.proxies_on(node)) <= 1, f"two kube-proxies on {node}"
    moving = [
        r for r in (first, second) if r.policy.status.phase not in (Phase.PENDING, Phase.FAILED)
    ]
    assert len(moving) == 1, [str(r.policy.status.phase) for r in (first, second)]
    other = second if moving[0] is first else first
    assert moving[0].name in (other.policy.status.message or ""), other.policy.status.message


def test_a_policy_created_while_another_is_in_flight_waits_and_names_it() -> None:
    """issue 9 item 4: once one policy is in flight, a second one (a rival in
    other_policies) never patches the source DaemonSet and says which policy holds it."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    first = Run(sim, make_policy(), check=False)
    first.until(lambda p: p.status.phase == Phase.ANALYZING)
    # Created now, while the first is in flight (not before it: then the tie-break of
    # policies created together would decide, by name).
    second = Run(sim, make_policy(name="to-ipvs", uid="uid-2", targetMode="ipvs"), check=False)
    generation = sim.get("DaemonSet", "kube-proxy")["metadata"]["generation"]
    for _ in range(10):
        second.step(tick=False)
        first.step()
    assert sim.get("DaemonSet", "kube-proxy")["metadata"]["generation"] == generation
    assert second.policy.status.phase in (Phase.PENDING, Phase.FAILED)
    assert first.name in (second.policy.status.message or "")
    if second.policy.status.phase == Phase.FAILED:
        message = second.policy.status.message or ""
        # Refused: it says that a retry is needed (waiting alone never starts it again), and
        # never "remove the label" of the nodes the first policy moved.
        assert "retry" in message and ".;" not in message, message
        codes = {f.code for f in (second.policy.status.preflight or Preflight()).findings}
        assert "NodesAlreadyLabelled" not in codes, codes


def test_a_node_labelled_before_the_policy_is_refused_or_handled() -> None:
    """issue 9 item 5: a node already carrying proxymode.io/mode before the policy: preflight
    refuses naming it, or the run handles it (never two proxies; rollback keeps the label)."""
    sim = Sim.cluster({"canary": 2, "general": 3})
    sim.nodes["general-3"].labels[MODE_LABEL] = "nftables"
    sim.tick()
    sim.tick()
    run = Run(sim, make_policy())

    def hook(i: int, s: Sim, _p: ProxyModePolicy) -> None:
        if i == 12:
            s.action = "abort"

    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED), hook=hook)
    st = run.policy.status
    if st.phase == Phase.FAILED:
        assert "general-3" in (st.message or ""), st.message
        assert sim.get("DaemonSet", "kube-proxy-nftables") is None, "refused: nothing changed"
    else:
        run.assert_restored()
        assert sim.nodes["general-3"].labels.get(MODE_LABEL) == "nftables"


def test_a_node_joining_mid_rollout_on_an_old_kernel_is_not_moved_to_nftables() -> None:
    """issue 9 item 7: a newcomer on kernel 4.18 is held back like preflight holds the others."""
    sim = Sim.cluster({"canary": 2, "general": 3})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.current_stage == 1)
    sim.add_node("general-old", "general", kernel="4.18.0-553.el8_10.x86_64")
    seen: set[str | None] = set()

    def hook(_i: int, s: Sim, _p: ProxyModePolicy) -> None:
        seen.add(s.nodes["general-old"].labels.get(MODE_LABEL))

    run.until(terminal, hook=hook)
    assert "nftables" not in seen
    assert [p.owner for p in sim.proxies_on("general-old")] == ["kube-proxy"]


def test_an_empty_first_stage_with_analysis_completes_at_once() -> None:
    """issue 9 item 20: a first stage that matches no node completes at once, as preflight
    says, even with analysis (there is nothing to measure): no pause, no rollback."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.verdict = "Inconclusive"  # no canary: nothing to measure
    stages = [
        {"name": "gpu", "nodeSelector": {"matchLabels": {"pool": "gpu"}}, "bakeSeconds": 10},
        {"name": "all", "percent": 100, "bakeSeconds": 10},
    ]
    run = Run(sim, make_policy(stages=stages, analysis=ANALYSIS))
    run.until(lambda p: (p.status.current_stage or 0) >= 1 or terminal(p), limit=60)
    reasons = history_reasons(run.policy.status)
    assert not [r for r in reasons if r.startswith("Paused") or r == "RollbackStarted"], reasons
    assert run.policy.status.stages[0].phase == "Completed"


def test_promote_during_a_plan_changed_pause_does_not_adopt_the_new_plan() -> None:
    """issue 9 item 26: only resume adopts a changed plan; a promote while paused for
    PlanChanged is refused out loud (decision 0020)."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    slow = [{**s, "bakeSeconds": 3600} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=slow))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    old_hash = run.policy.status.plan_hash
    wider = [slow[0], {"name": "most", "percent": 75, "bakeSeconds": 10}, slow[2]]
    run.policy = with_spec(run.policy, stages=wider)
    run.step()
    assert paused_code(run.policy.status) == "PlanChanged"
    sim.action = "promote"
    run.steps(4)
    st = run.policy.status
    assert st.phase == Phase.PAUSED and paused_code(st) == "PlanChanged", st.phase
    assert st.plan_hash == old_hash, "the new plan waits for resume"
    assert run.events("PromoteIgnored")


def test_a_plan_edit_while_paused_in_finalizing_never_remigrates_handed_back_nodes() -> None:
    """issue 9 item 26: nodes handed back to the source DaemonSet in Finalizing are never
    given a target label again by a plan edit made while paused there."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy())
    run.until(
        lambda p: (
            p.status.phase == Phase.FINALIZING
            and any(MODE_LABEL not in v.labels for v in sim.nodes.values())
        )
    )
    handed_back = {n for n, v in sim.nodes.items() if MODE_LABEL not in v.labels}
    run.policy = with_spec(run.policy, paused=True)
    run.steps(2)
    run.policy = with_spec(run.policy, stages=[THREE_STAGES[0], {"name": "rest", "percent": 100}])
    run.steps(2)
    run.policy = with_spec(run.policy, paused=False)
    sim.action = "resume"
    relabelled: set[str] = set()

    def hook(_i: int, s: Sim, _p: ProxyModePolicy) -> None:
        relabelled.update(n for n in handed_back if MODE_LABEL in s.nodes[n].labels)

    run.until(terminal, hook=hook)
    assert not relabelled, f"handed back, then moved again: {sorted(relabelled)}"
    assert run.policy.status.phase == Phase.COMPLETED and run.policy.status.finalized


def test_check_world_catches_two_proxies() -> None:
    """The harness itself: the invariant check fails on two kube-proxies on one node."""
    sim = Sim.cluster({"canary": 1})
    run = Run(sim, make_policy())
    sim.pods.append(sim.pods[0].__class__("extra", "canary-1", "kube-proxy-nftables", "x"))
    with pytest.raises(AssertionError, match="two kube-proxies"):
        check_world(sim, run.policy.status, 1, {})


def test_a_dropped_stage_s_finished_moves_are_never_taken_for_hand_set_labels() -> None:
    """The stage in progress is dropped once its nodes are all moved: the stage that takes
    them over (a new one) keeps them as this policy's moves, never walking them back."""
    sim = Sim.cluster({"canary": 2, "general": 6})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.current_stage == 1 and p.status.phase == Phase.ANALYZING)
    moved = nodes_labelled(sim, "nftables")
    assert any(n.startswith("general") for n in moved)
    run.policy = with_spec(run.policy, stages=EDITS["drop"])
    run.steps(3)
    sim.action = "resume"
    run.until(lambda p: p.status.phase in (Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED))
    assert run.policy.status.phase == Phase.COMPLETED
    assert run.events("HandSetLabel") == [], [e.message for e in run.events("HandSetLabel")]


@pytest.mark.parametrize("moving", [True, False])
def test_a_node_is_in_one_stage_after_the_canary_stage_is_dropped(moving: bool) -> None:
    """Dropping the canary stage in flight puts its moved nodes in the stage now current;
    the stages after it were planned before that and listed them too, so "nodes moved"
    read 6/10 on an 8-node cluster until the next stage started. Every step after the
    resume: each node in at most one stage, the progress never over the cluster."""
    sim = Sim.cluster({"canary": 2, "general": 6})
    run = Run(sim, make_policy(stages=THREE_STAGES))
    run.until(  # the second stage moving its nodes, or baking them
        lambda p: (
            p.status.current_stage == 1
            and (bool(p.status.moves) if moving else p.status.phase == Phase.ANALYZING)
        )
    )
    run.policy = with_spec(run.policy, stages=THREE_STAGES[1:])
    run.steps(2)
    sim.action = "resume"
    for _ in range(200):
        run.step()
        status = run.policy.status
        listed = [n for s in status.stages for n in s.nodes]
        assert len(listed) == len(set(listed)), [s.nodes for s in status.stages]
        _, _, planned = (status.node_progress or "0/0").partition("/")
        assert int(planned) <= len(sim.nodes), status.node_progress
        if status.phase == Phase.COMPLETED:
            break
    assert run.policy.status.phase == Phase.COMPLETED


def test_a_dropped_canary_stage_s_nodes_stay_recorded_in_mixed_mode() -> None:
    """Partial pools (a fence around canary and general, a third pool left out): the canary
    stage is dropped while it bakes, the run resumed. Its moved nodes are carried to the
    general stage, which was still pending; starting it re-planned its nodes from the
    selectors and dropped them, so they ran nftables unrecorded (the model's invariant:
    labelled but not recorded), "4/4" and "4 nodes run nftables" with six on it, and a
    delete said it moved 4 back."""
    sim = Sim.cluster({"canary": 2, "general": 4, "legacy": 1})
    fence = {
        "matchExpressions": [{"key": "pool", "operator": "In", "values": ["canary", "general"]}]
    }
    stages = [
        {"name": "canary", "nodeSelector": CANARY, "bakeSeconds": 20},
        {"name": "general", "nodeSelector": GENERAL, "bakeSeconds": 20},
    ]
    run = Run(sim, make_policy(stages=stages, nodeSelector=fence))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    run.policy = with_spec(run.policy, stages=stages[1:])
    run.steps(2)
    sim.action = "resume"
    run.until(lambda p: p.status.phase in (Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED))
    status = run.policy.status
    assert status.phase == Phase.COMPLETED and status.node_progress == "6/6", status
    assert "6 nodes run nftables" in (status.message or ""), status.message
    assert nodes_labelled(sim, "nftables") == {f"canary-{i}" for i in (1, 2)} | {
        f"general-{i}" for i in range(1, 5)
    }


def test_a_newcomer_that_arrives_while_a_stage_bakes_is_recorded_for_one_window() -> None:
    """A node that joins the baking canary stage and moves is recorded with the time it
    arrived (``status.recentSwitches``), so the analysis leaves it out of the canary group
    for one window; the record goes once the window has passed. A node that never moved
    (a roll of the target's template makes its pod new) is not recorded."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    analysis = {**ANALYSIS, "windowSeconds": 30}
    stages = [
        {"name": "canary", "nodeSelector": CANARY, "bakeSeconds": 600},
        {"name": "all", "percent": 100, "bakeSeconds": 10},
    ]
    run = Run(sim, make_policy(stages=stages, analysis=analysis))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    assert run.policy.status.recent_switches == [], "the stage's own nodes came before it"
    sim.add_node("canary-3", "canary")
    run.until(lambda p: any(s.node == "canary-3" for s in p.status.recent_switches))
    assert [s.node for s in run.policy.status.recent_switches] == ["canary-3"]
    run.until(lambda p: not p.status.recent_switches, limit=40)


def test_a_plan_edit_taken_back_says_so_and_a_pause_during_a_rollback_is_said_to_do_nothing() -> (
    None
):
    """A review: a stage added, then removed again, left the pause saying "the stage plan
    changed mid-rollout"; and spec.paused during a rollback was ignored without a word."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    stages = [{**s, "bakeSeconds": 600} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=stages))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    original = run.policy
    run.policy = with_spec(run.policy, stages=[*stages, {"name": "extra", "percent": 100}])
    run.step()
    assert paused_code(run.policy.status) == "PlanChanged"
    run.policy = with_spec(run.policy, stages=original.spec.wire()["stages"])
    run.step()
    assert run.policy.status.phase == Phase.PAUSED
    assert "the stage plan is the one in flight again" in (run.policy.status.message or "")
    sim.action = "abort"
    run.policy = with_spec(run.policy, paused=True)
    run.until(lambda p: p.status.phase == Phase.ROLLING_BACK)
    run.step()
    assert "spec.paused does not hold a rollback" in (run.policy.status.message or "")
    run.policy = with_spec(run.policy, paused=False)
    run.step()
    assert "spec.paused" not in (run.policy.status.message or ""), "said after it went"
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))
    assert run.policy.status.phase == Phase.ROLLED_BACK


def test_a_plan_edit_resumed_with_a_move_in_flight_keeps_that_node_recorded() -> None:
    """A review on the sandbox: the stage in progress replaced by another, and resumed at
    once, while one of its nodes was still moving. ``start_stage`` re-planned the new stage
    from its selector and kept only the finished moves, so the node in flight finished on
    the target recorded nowhere (not counted, not health-checked, "3 nodes run nftables"
    where 4 did), and the new stage's first move started beside it."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    stages = [
        {"name": "gen", "nodeSelector": GENERAL, "bakeSeconds": 30},
        {"name": "can", "nodeSelector": CANARY},
    ]
    run = Run(sim, make_policy(stages=stages, maxUnavailable=1))
    run.until(lambda p: p.status.stages[0].nodes_done >= 1 and bool(p.status.moves))
    (flying,) = [m.node for m in run.policy.status.moves]
    run.policy = with_spec(run.policy, stages=[{**stages[1], "bakeSeconds": 5}])
    run.until(lambda p: p.status.phase == Phase.PAUSED)
    assert flying in {m.node for m in run.policy.status.moves}, "still in flight"
    sim.action = "resume"
    peak = 0

    def hook(_i: int, _s: Sim, p: ProxyModePolicy) -> None:
        nonlocal peak
        peak = max(peak, len(p.status.moves))

    run.until(terminal, hook=hook)
    assert peak <= 1, f"{peak} moves in flight at once on maxUnavailable 1"
    st = run.policy.status
    assert st.phase == Phase.COMPLETED, st.message
    recorded = {n for s in st.stages for n in s.moved or []}
    on_target = nodes_labelled(sim, "nftables")
    assert flying in recorded, f"{flying} runs nftables, recorded in no stage"
    assert on_target <= recorded, f"unrecorded: {sorted(on_target - recorded)}"


def test_a_retry_runs_preflight_on_a_look_observed_for_it() -> None:
    """A review on the sandbox: ``retry`` of a refused policy passed preflight in the same
    look, on a snapshot taken for Failed, which carries neither the cluster's facts (the
    rival policies here) nor Prometheus's series (MetricSeriesMissing there): the refused
    policy then started moving nodes. The preflight of a retry waits for the next look."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    first = Run(sim, make_policy(stages=[{**THREE_STAGES[0], "bakeSeconds": 3600}]), check=False)
    first.until(lambda p: p.status.phase == Phase.ANALYZING)
    second = Run(sim, make_policy(name="to-ipvs", uid="uid-2", targetMode="ipvs"), check=False)
    second.until(lambda p: p.status.phase == Phase.FAILED, limit=20)
    generation = sim.get("DaemonSet", "kube-proxy")["metadata"]["generation"]
    sim.action = "retry"
    for _ in range(5):
        second.step(tick=False)
    assert second.policy.status.phase == Phase.FAILED, second.policy.status.message
    assert first.name in (second.policy.status.message or "")
    assert sim.get("DaemonSet", "kube-proxy")["metadata"]["generation"] == generation
    assert sim.get("DaemonSet", "kube-proxy-ipvs") is None, "refused again: nothing changed"


def test_a_config_override_that_cannot_render_mid_run_holds_until_fixed() -> None:
    """A review on the sandbox: ``configOverrides: {mode: ipvs}`` set while a stage baked,
    then resumed: the run went Failed, its moved canaries on nftables with nobody watching
    their health, ``resume`` refused (the phase is Failed), only ``retry`` (a rollback of
    every node) left. It now holds, Paused, saying why; fixed and resumed, it goes on."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    good = run.policy.spec.wire().get("configOverrides")
    run.policy = with_spec(run.policy, configOverrides={"mode": "ipvs"})
    run.until(lambda p: p.status.phase == Phase.PAUSED)
    sim.action = "resume"
    run.until(lambda p: paused_code(p.status) == "TargetConfigInvalid", limit=10)
    assert "must not change the mode" in (run.policy.status.message or "")
    run.steps(5)
    assert run.policy.status.phase == Phase.PAUSED, run.policy.status.message
    run.policy = with_spec(run.policy, configOverrides=good)
    run.until(lambda p: paused_code(p.status) == "PlanChanged", limit=10)
    sim.action = "resume"
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message


def test_a_narrower_selector_keeps_an_untouched_node_of_a_started_stage_from_moving() -> None:
    """A review on the sandbox: spec.nodeSelector narrowed mid-stage to keep a suspect node
    out, then resumed; the node moved anyway ("PlanAdopted" said nothing of it). A node of
    a started stage that nothing has touched leaves it when the new spec no longer selects
    it; the nodes already moved stay recorded."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    stages = [{"name": "gen", "nodeSelector": GENERAL, "bakeSeconds": 5}]
    run = Run(sim, make_policy(stages=stages, maxUnavailable=1))
    run.until(lambda p: p.status.stages[0].nodes_done >= 1)
    flying = {m.node for m in run.policy.status.moves}
    suspect = next(
        n
        for n in run.policy.status.stages[0].nodes
        if MODE_LABEL not in sim.nodes[n].labels and n not in flying
    )
    narrowed = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["general"]},
                                     {"key": "kubernetes.io/hostname", "operator": "NotIn",
                                      "values": [suspect]}]}  # fmt: skip
    for name, node in sim.nodes.items():
        node.labels.setdefault("kubernetes.io/hostname", name)
    run.policy = with_spec(run.policy, nodeSelector=narrowed)
    run.until(lambda p: p.status.phase == Phase.PAUSED)
    sim.action = "resume"
    run.until(terminal)
    st = run.policy.status
    assert st.phase == Phase.COMPLETED, st.message
    assert MODE_LABEL not in sim.nodes[suspect].labels, f"{suspect} moved"
    assert suspect not in st.stages[0].nodes
    (adopted,) = run.events("PlanAdopted")
    assert f"node {suspect}, not yet moved and no longer selected" in adopted.message


def test_a_node_moving_in_a_stage_stored_pending_is_kept_when_a_plan_edit_leaves_it_out() -> None:
    """A review: the look that started a stage (its first node to ``switching``) lost its
    status write, so the stage was stored Pending; spec.nodeSelector was then narrowed to
    leave that node out; the paused look adopted its move; on resume the Pending stage was
    re-planned without it, and it finished on the target recorded in no stage."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    for name, node in sim.nodes.items():
        node.labels.setdefault("kubernetes.io/hostname", name)
    run = Run(sim, make_policy(maxUnavailable=1))
    while True:
        observed = run.observe()
        decision = advance(run.policy, observed)
        stored = run.policy.status.stages
        if stored and stored[1].phase == "Pending" and decision.status.stages[1].phase != "Pending":
            break
        run.step(observed=observed)
    (node,) = [a.node for a in decision.actions if isinstance(a, SetNodeMode) and a.value]
    run.step(lose_status=True, observed=observed)
    assert run.policy.status.stages[1].phase == "Pending"
    narrowed = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn",
                                      "values": [node]}]}  # fmt: skip
    run.policy = with_spec(run.policy, nodeSelector=narrowed)
    run.until(lambda p: p.status.phase == Phase.PAUSED)
    sim.action = "resume"
    run.until(terminal)  # the invariants: no labelled node unrecorded, at every step
    assert node in {n for s in run.policy.status.stages for n in s.nodes}
