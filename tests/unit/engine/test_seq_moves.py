"""Issue 9 sequences about node moves: deadlines, cleanup Jobs, health, budgets, labels.

Each test drives the public ``advance()`` through the controller model (``sim.Sim``) with
the invariants checked at every step, and asserts the behaviour issue 9 expects. A test
marked xfail(strict) fails against today's engine: the reason says what happens instead.
"""

from __future__ import annotations

from datetime import timedelta

from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.engine import naming
from proxymode.engine.actions import CreateJob
from proxymode.engine.observed import MODE_LABEL
from tests.unit.engine.seq import (
    THREE_STAGES,
    Run,
    condition,
    make_policy,
    nodes_labelled,
    phase_is,
    rollback_code,
    rollback_text,
    terminal,
)
from tests.unit.engine.sim import Sim

STOPPED = (Phase.PAUSED, Phase.ROLLING_BACK, Phase.ROLLED_BACK, Phase.FAILED)


def _jobs_for(run: Run, node: str) -> list[CreateJob]:
    """The cleanup Jobs created for ``node`` (not its verification Jobs)."""
    return [
        a
        for d in run.decisions
        for a in d.actions
        if isinstance(a, CreateJob)
        and a.job["spec"]["template"]["spec"]["nodeName"] == node
        and a.job["metadata"]["name"].startswith("proxymode-cleanup-")
    ]


def _said(run: Run) -> str:
    st = run.policy.status
    return f"{st.message} {rollback_text(st)}"


def test_a_node_stuck_switching_pauses_or_breaches_naming_it_after_a_deadline() -> None:
    """issue 9 item 6: the old kube-proxy stuck terminating: after a deadline, a clear pause
    or breach naming the node, not an endless wait."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.stuck.add("canary-1")
    run = Run(sim, make_policy(readyTimeoutSeconds=30))
    run.until(phase_is(*STOPPED), limit=150)
    assert "canary-1" in _said(run), _said(run)


def test_a_cleanup_job_that_never_finishes_has_a_deadline_and_the_move_breaches() -> None:
    """issue 9 item 6: cleanup Jobs carry activeDeadlineSeconds; a hung one ends in a
    pause or breach naming the node."""
    sim = Sim.cluster({"canary": 1, "general": 1})
    sim.hang_jobs = True
    run = Run(sim, make_policy(targetMode="ipvs", readyTimeoutSeconds=30))
    run.until(lambda p: bool(_jobs_for(run, "canary-1")), limit=50)
    job = _jobs_for(run, "canary-1")[0].job
    assert job["spec"].get("activeDeadlineSeconds"), "a cleanup Job must end by itself"
    run.until(phase_is(*STOPPED), limit=150)
    assert "canary-1" in _said(run), _said(run)


def test_a_node_stuck_switching_in_rollback_fails_naming_it_after_a_deadline() -> None:
    """issue 9 item 6 (RollingBack): the same deadline holds on the way back."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy(readyTimeoutSeconds=30))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.stuck.add("canary-1")
    sim.action = "abort"
    run.until(phase_is(Phase.FAILED, Phase.PAUSED, Phase.ROLLED_BACK), limit=150)
    assert run.policy.status.phase != Phase.ROLLED_BACK, "canary-1 is not back"
    assert "canary-1" in _said(run), _said(run)


def test_deleting_the_source_daemon_set_mid_cleanup_move_fails_clearly_and_releases() -> None:
    """issue 9 item 9: the source DaemonSet gone while an iptables->ipvs move sits at
    switching: no exception, a clear failure, and deletion releases the finalizer."""
    sim = Sim.cluster({"canary": 1, "general": 1})
    sim.hang_jobs = True
    run = Run(sim, make_policy(targetMode="ipvs"))
    run.until(lambda p: bool(nodes_labelled(sim, "switching")) and bool(p.status.moves))
    del sim.objects[("DaemonSet", "kube-proxy")]
    for _ in range(3):
        run.step()
    assert run.policy.status.phase in (Phase.FAILED, Phase.PAUSED), run.policy.status.phase
    assert "DaemonSet" in (run.policy.status.message or "")
    run.deleting = True
    run.until(lambda p: False, limit=30)
    assert run.decisions[-1].release_finalizer


def test_deleting_the_source_daemon_set_while_the_cleanup_job_is_pending_never_raises() -> None:
    """issue 9 item 9: the same, with the node at switching before its cleanup Job exists."""
    sim = Sim.cluster({"canary": 1, "general": 1})
    sim.stuck.add("canary-1")  # the old pod lingers, so the Job is not created yet
    run = Run(sim, make_policy(targetMode="ipvs"))
    run.until(lambda p: bool(nodes_labelled(sim, "switching")) and bool(p.status.moves))
    del sim.objects[("DaemonSet", "kube-proxy")]
    sim.stuck.clear()
    for _ in range(4):
        run.step()
    run.deleting = True
    run.until(lambda p: False, limit=30)
    assert run.decisions[-1].release_finalizer


def test_finalize_waits_until_every_planned_node_is_on_the_target() -> None:
    """issue 9 item 10: a planned node that lost its label is moved again (with its cleanup
    Job) before Finalizing; the final rolling restart never switches a node uncleaned."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(targetMode="ipvs"), check=False)
    # Late in the last bake (20 s): the budget is still held by the node when the bake ends.
    run.until(
        lambda p: (
            p.status.current_stage == 2
            and p.status.phase == Phase.ANALYZING
            and (sim.now - (p.status.stages[2].baked_since or sim.now)).total_seconds() >= 16
        )
    )
    del sim.nodes["canary-1"].labels[MODE_LABEL]  # a person (or a script) removed it
    planned = {n for s in run.policy.status.stages for n in s.nodes}
    while not terminal(run.policy):
        before = {n: sim.nodes[n].labels.get(MODE_LABEL) for n in planned}
        was = run.policy.status.phase
        run.step()
        if was != Phase.FINALIZING and run.policy.status.phase == Phase.FINALIZING:
            assert all(v == "ipvs" for v in before.values()), f"finalized from {before}"
    assert len(_jobs_for(run, "canary-1")) >= 2, "moved back to ipvs with a fresh cleanup"


def test_a_stale_successful_cleanup_job_is_not_reused() -> None:
    """issue 9 item 11: a succeeded cleanup Job left from before (node re-registered under
    the same name) does not count for this move: a fresh one runs."""
    sim = Sim.cluster({"canary": 1, "general": 1})
    stale = naming.cleanup_job("to-nft", "canary-1")
    sim.jobs[stale] = {"node": "canary-1", "age": 10, "done": "succeeded"}
    run = Run(sim, make_policy(targetMode="ipvs"))
    run.until(lambda p: sim.nodes["canary-1"].labels.get(MODE_LABEL) == "ipvs")
    assert _jobs_for(run, "canary-1"), "no cleanup ran for this move"


def test_the_status_names_the_unhealthy_node_that_holds_the_budget() -> None:
    """issue 9 item 16: one unhealthy node in a later stage blocks moves; status names it."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    sim.broken.add("general-4")
    sim.tick()
    run = Run(sim, make_policy())
    run.steps(40)
    assert "general-4" in (run.policy.status.message or ""), run.policy.status.message


def test_a_mixed_mode_newcomer_that_cannot_finish_is_reported_degraded() -> None:
    """issue 9 item 17: Completed mixed mode, a newcomer's move fails: Degraded=True and the
    message names the node."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy(targetMode="ipvs", stages=[THREE_STAGES[0]]))
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED
    sim.fail_jobs = True
    sim.add_node("canary-3", "canary")
    run.steps(20)
    st = run.policy.status
    assert condition(st, "Degraded") == "True"
    assert "canary-3" in (st.message or "")


def test_a_mixed_mode_newcomer_is_counted_once_it_runs_the_target() -> None:
    """Completed mixed mode moves a newcomer of its pools; its stage's nodesDone and the
    message count it then (a review saw nodesDone 4 of 5 and "6 nodes run nftables")."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy(stages=[THREE_STAGES[0]]))
    run.until(terminal)
    assert run.policy.status.message.startswith("2 nodes run nftables"), run.policy.status.message
    sim.add_node("canary-3", "canary")
    run.until(
        lambda p: not p.status.moves and sim.nodes["canary-3"].labels.get(MODE_LABEL) is not None,
        limit=40,
    )
    run.steps(2)
    (stage,) = run.policy.status.stages
    assert "canary-3" in stage.nodes and stage.nodes_done == len(stage.nodes) == 3, stage
    assert run.policy.status.message.startswith("3 nodes run nftables"), run.policy.status.message


def test_one_not_ready_look_on_a_long_healthy_canary_does_not_roll_back() -> None:
    """issue 9 item 18: readiness is timed from when the pod stopped being Ready."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    slow = [{**s, "bakeSeconds": 7200} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=slow))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.now += timedelta(hours=1)
    pod = next(p for p in sim.pods if p.node == "canary-1")
    pod.unready = 2
    run.steps(5)
    assert run.policy.status.phase == Phase.ANALYZING, (
        f"{run.policy.status.phase}: {rollback_text(run.policy.status)}"
    )


def test_a_canary_not_ready_for_longer_than_the_timeout_rolls_back() -> None:
    """issue 9 item 18 (the other half): a pod not Ready past readyTimeoutSeconds still
    rolls back — the fix for item 18 must not blind the health check."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    slow = [{**s, "bakeSeconds": 7200} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=slow, readyTimeoutSeconds=20))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    pod = next(p for p in sim.pods if p.node == "canary-1")
    pod.unready = 1000
    run.until(phase_is(Phase.ROLLING_BACK, Phase.ROLLED_BACK), limit=60)
    assert rollback_code(run.policy.status) == "KubeProxyUnhealthy"
    assert "canary-1" in rollback_text(run.policy.status)


def test_ready_timeout_is_not_charged_for_the_old_pods_termination() -> None:
    """issue 9 item 25: an old pod that takes 12 s to go, a new one Ready at once, with
    readyTimeoutSeconds 10: the move succeeds."""
    sim = Sim.cluster({"canary": 1, "general": 1})
    sim.termination_ticks["canary-1"] = 6  # 6 looks of 2 s
    run = Run(sim, make_policy(readyTimeoutSeconds=10))
    run.until(lambda p: p.status.phase in (Phase.ANALYZING, *STOPPED))
    assert run.policy.status.phase == Phase.ANALYZING, rollback_text(run.policy.status)


def test_a_hand_set_target_label_is_not_trusted_as_a_finished_move() -> None:
    """issue 9 Also: a node a person labelled proxymode.io/mode=ipvs by hand is moved
    properly (through switching, with its cleanup Job) or the run pauses naming it."""
    sim = Sim.cluster({"canary": 1, "general": 3})
    run = Run(sim, make_policy(targetMode="ipvs"), check=False)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.nodes["general-3"].labels[MODE_LABEL] = "ipvs"
    paused_naming = False

    def watch(p: ProxyModePolicy) -> bool:
        nonlocal paused_naming
        paused_naming = paused_naming or (
            p.status.phase == Phase.PAUSED and "general-3" in (p.status.message or "")
        )
        return paused_naming or terminal(p)

    run.until(watch)
    assert paused_naming or _jobs_for(run, "general-3"), "general-3 switched with no cleanup"
    said = [e.message for e in run.events("HandSetLabel")]
    assert paused_naming or (len(said) == 1 and "general-3" in said[0]), said


def test_a_hand_set_label_in_the_stage_under_way_is_not_trusted_either() -> None:
    """A node of the stage that is moving now, labelled by hand before its own move
    started, is not counted as moved: it walks back and moves again, through switching
    and with its cleanup, and the stage does not bake until it has."""
    sim = Sim.cluster({"canary": 3, "general": 1})
    run = Run(sim, make_policy(targetMode="ipvs"), check=False)

    def one_moved(p: ProxyModePolicy) -> bool:
        return (
            p.status.phase == Phase.PROGRESSING
            and sim.nodes["canary-1"].labels.get(MODE_LABEL) == "ipvs"
        )

    run.until(one_moved)
    moving = {m.node for m in run.policy.status.moves}
    waiting = [
        n
        for n in ("canary-2", "canary-3")
        if n not in moving and sim.nodes[n].labels.get(MODE_LABEL) is None
    ]
    assert waiting, "no canary node waits for its move"
    node = waiting[-1]
    jobs_before = len(_jobs_for(run, node))
    sim.nodes[node].labels[MODE_LABEL] = "ipvs"
    run.until(lambda p: p.status.phase == Phase.ANALYZING or terminal(p))
    said = [e.message for e in run.events("HandSetLabel")]
    assert len(said) == 1 and node in said[0], said
    assert len(_jobs_for(run, node)) > jobs_before, f"{node} counted as moved with no cleanup"
    stage = run.policy.status.stages[0]
    assert stage.moved is not None and node in stage.moved
    assert stage.nodes_done == len(stage.nodes)


def test_a_status_from_before_moved_was_recorded_trusts_the_nodes_on_target() -> None:
    """An operator upgraded mid-stage reads a status without ``moved``: the nodes it finds on
    the target are the earlier operator's moves, never walked back as hand-set."""
    sim = Sim.cluster({"canary": 3, "general": 1})
    run = Run(sim, make_policy(), check=False)
    run.until(lambda p: p.status.phase == Phase.PROGRESSING and p.status.stages[0].nodes_done > 0)
    run.policy.status.stages[0].moved = None
    run.until(lambda p: p.status.phase == Phase.ANALYZING or terminal(p))
    assert run.policy.status.phase == Phase.ANALYZING, rollback_text(run.policy.status)
    assert run.events("HandSetLabel") == []
