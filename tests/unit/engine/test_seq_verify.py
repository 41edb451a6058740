"""Issue 11: a node is moved only when it proves it (the verification Job), in sequences.

The Sim's Job controller ends a verification Job with what ``proxymode verify-node`` would
report on that node (its kube-proxy's mode, a sync, the Service probe); ``unverifiable``
nodes fail their probe, as a host firewall that drops Service traffic would make them.
"""

from __future__ import annotations

from proxymode.api.models import Phase
from proxymode.engine.actions import CreateJob, EmitEvent
from proxymode.engine.observed import MODE_LABEL
from tests.unit.engine.seq import THREE_STAGES, Run, make_policy, rollback_code, rollback_text
from tests.unit.engine.sim import Sim


def _verify_jobs(run: Run) -> list[CreateJob]:
    return [
        a
        for d in run.decisions
        for a in d.actions
        if isinstance(a, CreateJob) and a.job["metadata"]["name"].startswith("proxymode-verify-")
    ]


def _events(run: Run, reason: str) -> list[EmitEvent]:
    return [a for d in run.decisions for a in d.actions
            if isinstance(a, EmitEvent) and a.reason == reason]  # fmt: skip


def test_every_moved_node_is_verified_and_said_with_its_figures() -> None:
    sim = Sim.cluster({"canary": 1, "general": 3})
    run = Run(sim, make_policy(finalize=False))
    run.until(lambda p: p.status.phase in (Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED))
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    jobs = _verify_jobs(run)
    assert sorted(j.job["spec"]["template"]["spec"]["nodeName"] for j in jobs) == sorted(sim.nodes)
    command = jobs[0].job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:4] == ["proxymode", "verify-node", "--mode=nftables", "--previous=iptables"]
    assert "--address=10.96.0.1:443" in command
    verification = run.policy.status.verification
    assert verification is not None
    assert (verification.verified, verification.failed) == (4, 0)
    assert len(verification.latest) == 4 and not verification.failures
    said = _events(run, "NodeVerified")
    assert len(said) == 4
    assert "first sync 1.5 s after start" in said[0].message
    assert "nftables table with 10 services" in said[0].message
    assert "kubernetes:443 reachable in 3 ms" in said[0].message
    assert not sim.jobs, "verification Jobs left behind"


def test_a_node_that_fails_verification_rolls_back_naming_it() -> None:
    sim = Sim.cluster({"canary": 1, "general": 3})
    sim.unverifiable.add("canary-1")
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase in (Phase.ROLLED_BACK, Phase.FAILED, Phase.COMPLETED))
    status = run.policy.status
    assert status.phase == Phase.ROLLED_BACK, status.message
    assert rollback_code(status) == "NodeNotVerified"
    text = rollback_text(status)
    assert "canary-1" in text and "default/kubernetes:443 timed out" in text, text
    assert status.verification is not None
    # Failed in nftables (the breach) and again back in iptables: the host firewall drops
    # Service traffic in any mode. The rollback still ends; both failures are said.
    assert [(f.node, f.mode) for f in status.verification.failures] == [
        ("canary-1", "nftables"),
        ("canary-1", "iptables"),
    ]
    assert len(_events(run, "NodeNotVerified")) == 2
    assert all(MODE_LABEL not in n.labels for n in sim.nodes.values())


def test_an_unverified_node_holds_max_unavailable() -> None:
    """Ready is not moved: while a node's verification runs, no other node starts moving."""
    sim = Sim.cluster({"canary": 1, "general": 4})
    run = Run(sim, make_policy(stages=[{"name": "all", "percent": 100, "bakeSeconds": 0}]))
    worst = 0
    for _ in range(400):
        run.step()
        moving = {m.node for m in run.policy.status.moves}
        worst = max(worst, len(moving))
        assert len(moving) <= 1, moving
        if run.policy.status.phase in (Phase.COMPLETED, Phase.FAILED, Phase.ROLLED_BACK):
            break
    assert run.policy.status.phase == Phase.COMPLETED
    # Each verification Job was created after its node's new pod was Ready, while that
    # node was still in status.moves (holding the budget).
    assert len(_verify_jobs(run)) >= 5


def test_verification_off_trusts_ready_and_runs_no_job() -> None:
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(stages=THREE_STAGES, finalize=False, verify={"enabled": False}))
    run.until(lambda p: p.status.phase in (Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED))
    assert run.policy.status.phase == Phase.COMPLETED
    assert not _verify_jobs(run)
    assert run.policy.status.verification is None


def test_a_verify_service_that_does_not_exist_is_refused_before_anything_moves() -> None:
    """A review: a typo in spec.verify.service passed preflight, and the first moved node's
    verification failed and rolled the run back. Preflight now refuses it."""
    sim = Sim.cluster({"canary": 1, "general": 1})
    sim.service_ips.clear()
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase in (Phase.ROLLED_BACK, Phase.FAILED, Phase.COMPLETED))
    assert run.policy.status.phase == Phase.FAILED, run.policy.status.message
    assert "VerifyServiceMissing" in [f.code for f in run.policy.status.preflight.findings]
    assert "The Service default/kubernetes" in (run.policy.status.message or "")
    assert sim.get("DaemonSet", "kube-proxy-nftables") is None, "nothing changed"


def test_a_verify_service_gone_mid_run_is_a_breach_naming_it() -> None:
    sim = Sim.cluster({"canary": 1, "general": 1})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase == Phase.PROGRESSING)
    sim.service_ips.clear()
    run.until(lambda p: p.status.phase in (Phase.ROLLED_BACK, Phase.FAILED, Phase.COMPLETED))
    # The rollback itself is not stopped by the missing Service: its moves back count as done.
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    assert rollback_code(run.policy.status) == "NodeNotVerified"
    assert "default/kubernetes (spec.verify.service) was not found" in rollback_text(
        run.policy.status
    )


def test_rollback_and_finalize_verify_the_nodes_in_their_final_mode() -> None:
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase in (Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED))
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    modes = [
        (j.job["spec"]["template"]["spec"]["nodeName"],
         j.job["spec"]["template"]["spec"]["containers"][0]["command"][2])
        for j in _verify_jobs(run)
    ]  # fmt: skip
    # every node verified twice: in nftables after its switch, and after its hand-back
    assert sorted(modes) == sorted([(n, "--mode=nftables") for n in sim.nodes] * 2)

    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(stages=[{**s, "bakeSeconds": 600} for s in THREE_STAGES]))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.action = "abort"
    run.until(lambda p: p.status.phase in (Phase.ROLLED_BACK, Phase.FAILED))
    assert run.policy.status.phase == Phase.ROLLED_BACK
    commands = [
        (j.job["spec"]["template"]["spec"]["nodeName"], j.job["spec"]["template"]["spec"])
        for j in _verify_jobs(run)
    ]
    back = [n for n, spec in commands if "--mode=iptables" in spec["containers"][0]["command"]]
    assert back == ["canary-1"]
    assert run.policy.status.verification is not None
    assert run.policy.status.verification.latest[-1].mode == "iptables"
    assert run.policy.status.verification.latest[-1].verified
