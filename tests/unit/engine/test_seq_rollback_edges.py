"""Rollback edges found by a review after the verification and stray-rule merges: a move back
that cannot be verified (Service gone, Job never finishing) still rolls back, and a node this
run labelled goes back even after it left spec.nodeSelector."""

from __future__ import annotations

import json

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


def test_an_abort_after_a_lost_write_walks_one_node_back_at_a_time() -> None:
    """One node's move ends and the next one's starts in a look whose status write is lost:
    the stored status still shows the first node moving, the second sits at switching
    unrecorded. An abort then turned the stale record into a move back and adopted the
    second node too, and both left their proxy at once: two nodes without a Ready
    kube-proxy on a budget of one (a review; finding 12's residue). A recorded move whose
    node is still on its label now leaves it only with room in the budget."""
    sim = Sim.cluster({"canary": 1, "general": 3})
    stages = [{"name": "all", "percent": 100, "bakeSeconds": 0}]
    run = Run(sim, make_policy(maxUnavailable=1, stages=stages, verify={"enabled": False}))
    run.until(lambda p: bool(p.status.moves))
    first = run.policy.status.moves[0].node
    run.checking = False  # the lost write's own look: labelled, not yet recorded
    while not nodes_labelled(sim, "switching") - {first}:
        run.step(lose_status=True)
    run.checking = True
    sim.action = "abort"
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))  # invariants on every look
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    run.assert_restored()


def _edit_source_command(sim: Sim, *, add: str | None = None, drop: str | None = None) -> None:
    ds = sim.get("DaemonSet", "kube-proxy")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    command = [c for c in container.get("command", []) if c != drop]
    container["command"] = [*command, add] if add else command
    sim._store(ds)


def test_a_rollback_stuck_on_a_broken_source_template_ends_once_a_person_fixes_it() -> None:
    """A person's bad flag on the source template reaches the target (by design): the
    canary's new kube-proxy crashes and the run rolls back; its move back then crashes on
    the same template and the rollback fails (RollbackStuck). The person fixes the template
    and deletes the policy. Under the OnDelete this operator put on the source, the fixed
    template never reached the crashing pod: the deletion waited for ever, the finalizer
    with it (a review). The node now goes through switching once more, and its source
    kube-proxy starts from the fixed template."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    stages = [{**s, "bakeSeconds": 600} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=stages, readyTimeoutSeconds=30))
    run.until(phase_is(Phase.ANALYZING))
    sim.bad_arg = "--bogus-flag"
    _edit_source_command(sim, add="--bogus-flag")
    run.until(phase_is(Phase.FAILED, Phase.ROLLED_BACK), limit=400)
    status = run.policy.status
    assert status.phase == Phase.FAILED, status.message
    assert "rollback cannot finish" in (status.message or ""), status.message
    _edit_source_command(sim, drop="--bogus-flag")
    run.deleting = True
    for _ in range(400):
        if run.step().release_finalizer:
            break
    else:
        raise AssertionError(f"the finalizer was held: {run.policy.status.message}")
    for node in sim.nodes:
        pods = sim.proxies_on(node)
        assert len(pods) == 1 and pods[0].owner == "kube-proxy" and pods[0].ready, node
    assert not nodes_labelled(sim, "nftables") and not nodes_labelled(sim, "switching")


def test_deleting_a_policy_whose_source_config_map_is_gone_makes_it_again_and_rolls_back() -> None:
    """A review: the source ConfigMap deleted mid-bake (Failed: it disappeared), then the
    policy deleted: every label went at once and the finalizer with it, over source pods
    that cannot start without their ConfigMap (nodes without any kube-proxy), and the
    source DaemonSet stayed patched. The rollback now makes the ConfigMap again from the
    snapshot and brings every node back, within the budget."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    before = json.loads(json.dumps(sim.get("DaemonSet", "kube-proxy")["spec"]))
    config = json.loads(json.dumps(sim.get("ConfigMap", "kube-proxy")["data"]))
    run = Run(sim, make_policy(stages=[{**s, "bakeSeconds": 600} for s in THREE_STAGES]))
    run.checking = False  # the ConfigMap goes: no world to check against
    run.until(phase_is(Phase.ANALYZING))
    del sim.objects[("ConfigMap", "kube-proxy")]
    run.until(phase_is(Phase.FAILED))
    run.deleting = True
    run.checking = True
    for _ in range(200):
        if run.step().release_finalizer:
            break
    else:
        raise AssertionError(f"the finalizer was held: {run.policy.status.message}")
    assert sim.get("ConfigMap", "kube-proxy")["data"] == config
    assert len(run.events("SourceConfigMapRestored")) == 1
    ds = sim.get("DaemonSet", "kube-proxy")
    assert ds["spec"]["updateStrategy"] == before["updateStrategy"]
    assert ds["spec"]["template"]["spec"].get("affinity") == before["template"]["spec"].get(
        "affinity"
    )
    assert "proxymode.io/original-update-strategy" not in ds["metadata"].get("annotations", {})
    assert not nodes_labelled(sim, "nftables") and not nodes_labelled(sim, "switching")
    for node in sim.nodes:
        (pod,) = sim.proxies_on(node)
        assert pod.owner == "kube-proxy" and pod.ready and pod.mode == "iptables", node
