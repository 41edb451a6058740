"""Rollback edges found by a review after the verification and stray-rule merges: a move back
that cannot be verified (Service gone, Job never finishing) still rolls back, and a node this
run labelled goes back even after it left spec.nodeSelector."""

from __future__ import annotations

from proxymode.api.models import Phase
from proxymode.engine.observed import MODE_LABEL
from tests.unit.engine.seq import (
    THREE_STAGES,
    Run,
    make_policy,
    nodes_labelled,
    phase_is,
    stray_canary_3,
)
from tests.unit.engine.sim import Sim

END = (Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED)


def test_probe_service_gone_mid_run_still_rolls_back() -> None:
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(stages=[{**s, "bakeSeconds": 600} for s in THREE_STAGES]))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.service_ips.clear()
    sim.action = "abort"
    run.until(lambda p: p.status.phase in END)
    print(run.policy.status.phase, run.policy.status.message)
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    assert all(MODE_LABEL not in n.labels for n in sim.nodes.values())


def test_a_verification_job_that_never_finishes_does_not_stop_a_rollback() -> None:
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(stages=[{**s, "bakeSeconds": 600} for s in THREE_STAGES]))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim._verify = lambda job: None  # type: ignore[method-assign]  # its pod never starts
    sim.action = "abort"
    run.until(lambda p: p.status.phase in END)
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message


def test_a_node_this_run_labelled_is_walked_back_after_it_left_the_selector() -> None:
    sim, run = stray_canary_3()  # the lost write leaves a label the stored status lacks
    assert nodes_labelled(sim, "switching") & {"canary-3"}, "the move started"
    del sim.nodes["canary-3"].labels["team"]  # a person relabels the node mid-run
    sim.action = "abort"
    run.step()
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))
    run.settle()
    left = {n: v.labels.get(MODE_LABEL) for n, v in sim.nodes.items() if MODE_LABEL in v.labels}
    assert not left, f"labels this run set are left behind: {left}"
    assert sim.proxies_on("canary-3"), "canary-3 is left without a kube-proxy"
