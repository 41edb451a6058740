"""Whole rollouts through the pure engine, step by step, with the invariants checked each step.

The world is ``sim.Sim``; a step is: observe, ``advance``, carry out the actions, let the
controllers run. Faults are injected between steps: a status write lost (the operator died
after acting), actions cut short (it died mid-way), an action conflict.
"""

from __future__ import annotations

import functools
import json
import random

import pytest

from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.engine.actions import CreateJob
from proxymode.engine.observed import MODE_LABEL
from tests.unit.engine.seq import (
    THREE_STAGES,
    Run,
    config_mode,
    make_policy,
    paused_code,
    rollback_code,
    rollback_text,
    terminal,
    with_exclusion_term,
)
from tests.unit.engine.sim import Sim


def test_forward_through_three_stages_then_finalize() -> None:
    sim = Sim.cluster({"canary": 2, "general": 6})
    run = Run(sim, make_policy())
    run.until(terminal)
    st = run.policy.status
    assert st.phase == Phase.COMPLETED and st.finalized is True, st.message
    assert run.phases() == [
        "Preflight",
        "Progressing",
        "Analyzing",
        "Progressing",
        "Analyzing",
        "Progressing",
        "Analyzing",
        "Finalizing",
        "Completed",
    ]
    assert [len(s.nodes) for s in st.stages] == [2, 2, 4]
    assert [s.phase for s in st.stages] == ["Completed"] * 3
    assert config_mode(sim) == "nftables"
    assert sim.get("DaemonSet", "kube-proxy-nftables") is None
    assert sim.get("ConfigMap", "kube-proxy-nftables") is None
    assert all(MODE_LABEL not in n.labels for n in sim.nodes.values())
    for node in sim.nodes:
        pods = sim.proxies_on(node)
        assert len(pods) == 1 and pods[0].owner == "kube-proxy" and pods[0].ready
    ds = sim.get("DaemonSet", "kube-proxy")
    # finalizeSourceTemplate: KeepExclusionTerm (the default, decision 0014): the strategy
    # back, the template the nodes were handed back to kept, every kube-proxy started twice.
    assert ds["spec"] == with_exclusion_term(json.loads(run.original_ds), "nftables")
    assert sim.starts == dict.fromkeys(sim.nodes, 2), sim.starts
    assert st.node_progress == "8/8"
    assert {c.type: c.status for c in st.conditions}["Ready"] == "True"
    # Nodes moved does not fall to the handed-back count while Finalizing hands them to the
    # source DaemonSet (a review saw 7/7 fall to 1/7): a node handed back still runs the
    # target; only one between proxies (switching) is not counted for that moment.
    finalizing = [
        int(str(d.status.node_progress).split("/")[0])
        for d in run.decisions
        if d.status.phase == Phase.FINALIZING
    ]
    switching_at_most = run.budget  # maxUnavailable
    assert finalizing and min(finalizing) >= 8 - switching_at_most, finalizing
    assert finalizing[0] == 8, finalizing


def test_iptables_to_ipvs_cleans_every_moved_node() -> None:
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy(targetMode="ipvs"))
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    cleaned = {
        a.job["spec"]["template"]["spec"]["nodeName"]
        for d in run.decisions
        for a in d.actions
        if isinstance(a, CreateJob)
    }
    assert cleaned == set(sim.nodes)
    assert config_mode(sim) == "ipvs"


def test_a_failed_cleanup_job_stops_the_move_and_fails_the_rollback_loudly() -> None:
    sim = Sim.cluster({"canary": 1, "general": 1})
    sim.fail_jobs = True
    run = Run(sim, make_policy(targetMode="ipvs"))
    run.until(terminal)
    st = run.policy.status
    assert st.phase == Phase.FAILED
    assert "cleanup Job" in (st.message or "")
    assert sim.nodes["canary-1"].labels[MODE_LABEL] == "switching", "left for a person, said so"


@functools.cache
def phases_by_step() -> tuple[str, ...]:
    """The phase before every step of an undisturbed rollout of the abort tests' cluster.

    Computed once, on first use (not at import: collecting the suite runs no rollout).
    """
    run = Run(Sim.cluster({"canary": 2, "general": 4}), make_policy())
    phases: list[str] = []
    run.until(lambda p: phases.append(str(p.status.phase)) is None and terminal(p))
    return ("Pending", *phases[:-1])


IN_FLIGHT = ("Pending", "Progressing", "Analyzing", "Finalizing")
ABORT_POINTS = [(phase, which) for phase in IN_FLIGHT for which in ("first", "middle", "last")]


def abort_step(phase: str, which: str) -> int:
    """The step at which the policy is in ``phase`` (its first, middle or last such look)."""
    steps = [i for i, p in enumerate(phases_by_step()) if p == phase]
    assert steps, f"an undisturbed run never looks in {phase}"
    return {"first": steps[0], "middle": steps[len(steps) // 2], "last": steps[-1]}[which]


def test_the_abort_points_cover_the_start_and_every_phase_in_flight() -> None:
    assert set(IN_FLIGHT) <= set(phases_by_step())


@pytest.mark.parametrize(("phase", "which"), ABORT_POINTS)
def test_abort_at_any_step_restores_exactly(phase: str, which: str) -> None:
    abort_at = abort_step(phase, which)
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy())

    def hook(i: int, s: Sim, _p: ProxyModePolicy) -> None:
        if i == abort_at:
            s.action = "abort"

    run.until(lambda p: p.status.phase == Phase.ROLLED_BACK, hook=hook)
    run.assert_restored()
    assert sim.action is None, "the one-shot annotation is consumed"


def test_crash_looping_canaries_roll_back_automatically_with_a_reason() -> None:
    sim = Sim.cluster({"canary": 2, "general": 4})
    sim.crashloop_target = True
    run = Run(sim, make_policy())
    run.until(terminal)
    st = run.policy.status
    assert st.phase == Phase.ROLLED_BACK
    assert rollback_code(st) == "KubeProxyUnhealthy"
    assert "restarted" in rollback_text(st) or "not Ready" in rollback_text(st)
    assert {c.type: c.status for c in st.conditions}["Degraded"] == "True"
    assert run.phases()[-2:] == ["RollingBack", "RolledBack"]
    sim.crashloop_target = False
    run.assert_restored()


def test_without_automatic_rollback_a_breach_pauses() -> None:
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.crashloop_target = True
    run = Run(sim, make_policy(rollback={"automatic": False}))
    run.until(lambda p: p.status.phase == Phase.PAUSED)
    assert paused_code(run.policy.status) == "KubeProxyUnhealthy"


@pytest.mark.parametrize("seed", range(12))
def test_operator_restarts_and_lost_writes_between_any_steps(seed: int) -> None:
    sim = Sim.cluster({"canary": 2, "general": 5})
    run = Run(sim, make_policy(maxUnavailable=2))
    run.until(terminal, rng=random.Random(seed), limit=600)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    assert config_mode(sim) == "nftables"
    assert all(MODE_LABEL not in n.labels for n in sim.nodes.values())


@pytest.mark.parametrize("seed", range(6))
def test_rollback_survives_restarts_and_lost_writes(seed: int) -> None:
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy())

    def hook(i: int, s: Sim, _p: ProxyModePolicy) -> None:
        if i == 18:
            s.action = "abort"

    run.until(lambda p: p.status.phase == Phase.ROLLED_BACK, hook=hook, rng=random.Random(seed))
    run.assert_restored()


def test_rebuilding_from_status_and_labels_alone_resumes() -> None:
    """A fresh operator gets only the stored status: the next step continues the same move."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy())
    for _ in range(6):
        run.step()
    stored = ProxyModePolicy.model_validate(
        {
            "metadata": run.policy.metadata,
            "spec": run.policy.spec.wire(),
            "status": json.loads(run.policy.status.model_dump_json(by_alias=True)),
        }
    )
    run.policy = stored
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED


def test_a_node_added_to_a_finished_pool_is_migrated() -> None:
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.current_stage == 1)
    sim.add_node("canary-3", "canary")
    run.until(lambda p: "canary-3" in p.status.stages[0].nodes)
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED
    assert any(e.reason == "NodeJoined" and "canary-3" in e.message for e in sim.events)
    assert [p.owner for p in sim.proxies_on("canary-3")] == ["kube-proxy"]


def test_a_node_deleted_mid_move_leaves_the_plan() -> None:
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy())
    run.until(lambda p: any(m.node == "canary-1" for m in p.status.moves))
    sim.remove_node("canary-1")
    run.until(terminal)
    st = run.policy.status
    assert st.phase == Phase.COMPLETED, st.message
    assert "canary-1" not in [n for s in st.stages for n in s.nodes]


def test_spec_pause_holds_and_resume_continues() -> None:
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    run.policy = run.policy.model_copy(
        update={"spec": run.policy.spec.model_copy(update={"paused": True})}
    )
    run.until(lambda p: p.status.phase == Phase.PAUSED)
    labels_then = {n: dict(v.labels) for n, v in sim.nodes.items()}
    for _ in range(10):
        run.step()
    assert run.policy.status.phase == Phase.PAUSED
    assert {n: dict(v.labels) for n, v in sim.nodes.items()} == labels_then, "nothing moves"
    run.policy = run.policy.model_copy(
        update={"spec": run.policy.spec.model_copy(update={"paused": False})}
    )
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED


def test_promote_skips_the_rest_of_the_bake() -> None:
    sim = Sim.cluster({"canary": 2, "general": 2})
    slow = [{**s, "bakeSeconds": 86400} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=slow))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.action = "promote"
    run.step()
    assert run.policy.status.current_stage == 1
    assert sim.action == "promote", "removed only once the promotion is stored"
    run.step()
    assert sim.action is None
    run.step()
    assert run.policy.status.current_stage == 1, "promoted once, not twice"


def test_a_plan_change_mid_rollout_pauses_until_resumed() -> None:
    sim = Sim.cluster({"canary": 2, "general": 6})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.current_stage == 1)
    wider = [THREE_STAGES[0], {"name": "most", "percent": 75, "bakeSeconds": 10}, THREE_STAGES[2]]
    run.policy = run.policy.model_copy(
        update={
            "spec": run.policy.spec.model_copy(
                update={"stages": make_policy(stages=wider).spec.stages}
            )
        }
    )
    run.step()
    assert run.policy.status.phase == Phase.PAUSED
    assert paused_code(run.policy.status) == "PlanChanged"
    sim.action = "resume"
    run.until(terminal)
    st = run.policy.status
    assert st.phase == Phase.COMPLETED, st.message
    assert [s.name for s in st.stages] == ["canary", "most", "all"]


def test_stages_covering_some_pools_end_in_mixed_mode_and_deletion_rolls_back() -> None:
    sim = Sim.cluster({"canary": 2, "general": 3})
    run = Run(sim, make_policy(stages=[THREE_STAGES[0]]))
    run.until(terminal)
    st = run.policy.status
    assert st.phase == Phase.COMPLETED and st.finalized is False
    assert sim.get("DaemonSet", "kube-proxy-nftables") is not None, "the pair is kept"
    assert {n for n, v in sim.nodes.items() if v.labels.get(MODE_LABEL) == "nftables"} == {
        "canary-1",
        "canary-2",
    }
    run.deleting = True
    run.until(lambda p: False, limit=200)
    assert run.decisions[-1].release_finalizer
    sim.collect_garbage("uid-1")
    run.deleting = False
    run.policy = run.policy.model_copy(update={"status": run.policy.status})
    run.assert_restored()


def test_deleting_a_finished_finalized_policy_changes_nothing() -> None:
    sim = Sim.cluster({"canary": 1, "general": 1})
    run = Run(sim, make_policy())
    run.until(terminal)
    run.deleting = True
    decision = run.step()
    assert decision.release_finalizer
    assert config_mode(sim) == "nftables"


def test_retry_after_rollback_starts_over() -> None:
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.action = "abort"
    run.until(lambda p: p.status.phase == Phase.ROLLED_BACK)
    sim.action = "retry"
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED
    assert "Retry" in [h.reason for h in run.policy.status.history]


def test_max_unavailable_bounds_parallel_moves() -> None:
    sim = Sim.cluster({"canary": 1, "general": 9})
    run = Run(sim, make_policy(maxUnavailable=3, stages=[{"name": "all", "percent": 100}]))
    peak = 0

    def hook(_i: int, _s: Sim, p: ProxyModePolicy) -> None:
        nonlocal peak
        peak = max(peak, len(p.status.moves))

    run.until(terminal, hook=hook)
    assert peak == 3


def test_retry_of_a_failed_run_walks_it_back_then_starts_the_new_run() -> None:
    """One retry is enough: the failed run's changes are rolled back, then run 2 begins."""
    sim = Sim.cluster({"canary": 1, "general": 1})
    sim.fail_jobs = True
    run = Run(sim, make_policy(targetMode="ipvs"))
    run.until(terminal)
    assert run.policy.status.phase == Phase.FAILED
    sim.fail_jobs = False
    sim.jobs.clear()  # a person looked at the failed cleanup Job and removed it
    sim.action = "retry"
    phases: list[str] = []
    run.until(
        lambda p: p.status.phase in (Phase.COMPLETED, Phase.FAILED),
        hook=lambda _i, _s, p: phases.append(str(p.status.phase)),
    )
    st = run.policy.status
    assert st.phase == Phase.COMPLETED, st.message
    assert st.run == 2
    assert "RolledBack" in phases, "walked back first"
    reasons = [h.reason for h in st.history]
    assert reasons.count("Retry") == 1, reasons
    assert config_mode(sim) == "ipvs"


def test_a_canary_that_crash_loops_before_it_is_ever_ready_fails_its_move_at_once() -> None:
    """A new kube-proxy that keeps exiting (a mode the kernel lacks) is not waited on for the
    whole readyTimeoutSeconds: its restarts fail the move, and the rollback starts."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    sim.crashloop_target = True
    run = Run(sim, make_policy(readyTimeoutSeconds=300))
    started = sim.now
    run.until(lambda p: p.status.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK))
    waited = (sim.now - started).total_seconds()
    assert waited < 120, f"rolled back {waited:.0f}s in, for a 300 s ready timeout"
    st = run.policy.status
    assert rollback_code(st) == "KubeProxyUnhealthy"
    assert "before it was ever Ready" in rollback_text(st), rollback_text(st)
    run.until(terminal)
    sim.crashloop_target = False
    run.assert_restored()
