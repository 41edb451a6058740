"""Issue 9 sequences about rollback and restore: what decides, what is restored, in which order.

Each test drives the public ``advance()`` through the controller model (``sim.Sim``) with
the invariants checked at every step, and asserts the behaviour issue 9 expects. A test
marked xfail(strict) fails against today's engine: the reason says what happens instead.
"""

from __future__ import annotations

import json
from datetime import timedelta

from proxymode.api.models import Phase
from proxymode.engine.observed import MODE_LABEL
from tests.unit.engine.seq import (
    Run,
    history_reasons,
    make_policy,
    nodes_labelled,
    phase_is,
    terminal,
    with_rival,
)
from tests.unit.engine.sim import Sim


def _source_spec(sim: Sim) -> dict[str, object]:
    return dict(sim.get("DaemonSet", "kube-proxy")["spec"])


def test_rollback_undoes_what_the_labels_say_even_after_a_lost_status_write() -> None:
    """issue 9 item 13: the labels (the snapshot of them), not status.stages alone, decide
    what rollback undoes; the RolledBack message names the real source mode."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy(maxUnavailable=3))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.add_node("canary-3", "canary")
    sim.tick()
    sim.tick()
    run.checking = False  # the lost write itself leaves a label the stored status lacks
    run.step(lose_status=True)
    assert nodes_labelled(sim, "switching") & {"canary-3"}, "the move started"
    sim.action = "abort"
    run.step()
    run.checking = True
    run.until(phase_is(Phase.ROLLED_BACK, Phase.FAILED))
    assert "None" not in (run.policy.status.message or "")
    run.assert_restored()


def test_after_backup_lost_the_operators_own_patch_never_outlives_the_run() -> None:
    """issue 9 item 14: the backup ConfigMap deleted mid-run: whatever follows (retry, roll
    back, a new run), the operator's OnDelete + NotIn patch does not stay on the source."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy())
    original = json.loads(run.original_ds)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    del sim.objects[("ConfigMap", "proxymode-backup-to-nft")]
    run.until(terminal)
    assert run.policy.status.phase == Phase.FAILED
    # What to do, said (a review: it said "roll back by hand", and abort is refused here).
    assert "retry (proxymode.io/action=retry) or delete the policy" in run.policy.status.message
    sim.action = "retry"
    run.until(lambda p: p.status.phase == Phase.ROLLED_BACK)
    assert _source_spec(sim)["updateStrategy"] == original["updateStrategy"], "RolledBack"
    run.until(lambda p: p.status.phase in (Phase.COMPLETED, Phase.FAILED))
    assert _source_spec(sim)["updateStrategy"] == original["updateStrategy"], "after run 2"


def _bump_source_image(sim: Sim) -> str:
    ds = sim.get("DaemonSet", "kube-proxy")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    bumped = str(container["image"]).rsplit(":", 1)[0] + ":v1.37.3"
    container["image"] = bumped
    sim._store(ds)
    return bumped


def _image(sim: Sim, daemon_set: str) -> str:
    return str(
        sim.get("DaemonSet", daemon_set)["spec"]["template"]["spec"]["containers"][0]["image"]
    )


def test_finalize_keeps_an_image_bump_made_to_the_source_mid_rollout() -> None:
    """issue 9 item 15: finalize restores only what the operator changed (affinity, update
    strategy); a person's image bump on the source DaemonSet survives."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy())
    original = json.loads(run.original_ds)
    run.until(lambda p: p.status.current_stage == 1)
    bumped = _bump_source_image(sim)
    run.steps(3)
    assert _image(sim, "kube-proxy-nftables") == bumped, "the target follows the source's edit"
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    assert _image(sim, "kube-proxy") == bumped
    assert _source_spec(sim)["updateStrategy"] == original["updateStrategy"]


def test_rollback_keeps_an_image_bump_made_to_the_source_mid_rollout() -> None:
    """issue 9 item 15, after rollback: the source's affinity and strategy come back from
    the snapshot, a person's image bump stays, and every node runs the bumped image."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy())
    original = json.loads(run.original_ds)
    run.until(lambda p: p.status.current_stage == 1)
    bumped = _bump_source_image(sim)
    sim.action = "abort"
    run.until(lambda p: p.status.phase == Phase.ROLLED_BACK)
    run.settle()
    spec = _source_spec(sim)
    assert _image(sim, "kube-proxy") == bumped
    assert spec["updateStrategy"] == original["updateStrategy"]
    affinity = spec["template"]["spec"].get("affinity")  # type: ignore[index]
    assert affinity == original["template"]["spec"].get("affinity")
    assert all(MODE_LABEL not in n.labels for n in sim.nodes.values())
    for node in sim.nodes:
        pods = sim.proxies_on(node)
        assert len(pods) == 1 and pods[0].owner == "kube-proxy" and pods[0].ready, node
    status = sim.get("DaemonSet", "kube-proxy")["status"]
    assert status["updatedNumberScheduled"] == len(sim.nodes), "every pod of the bumped template"


def test_deleting_a_policy_whose_rollback_is_stuck_does_not_flap() -> None:
    """issue 9 item 24: a stuck rollback, then delete: one state, not a Failed/RollingBack
    pair and a Warning Event every look."""
    sim = Sim.cluster({"canary": 1, "general": 1})
    sim.fail_jobs = True
    run = Run(sim, make_policy(targetMode="ipvs"))
    run.until(terminal)
    assert run.policy.status.phase == Phase.FAILED
    run.deleting = True
    before = len(run.decisions)
    run.steps(30)
    reasons = history_reasons(run.policy.status)
    assert reasons.count("RollbackStarted") <= 2, reasons
    warnings = [
        a for d in run.decisions[before:] for a in d.actions if getattr(a, "type", "") == "Warning"
    ]
    assert len(warnings) <= 3, [w.reason for w in warnings]


def test_rollback_from_finalizing_restores_the_config_map_before_walking_nodes_back() -> None:
    """issue 9 Also (config ordering): every source pod started by a rollback from
    Finalizing reads the source mode."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase == Phase.FINALIZING)
    run.steps(3)
    sim.action = "abort"
    rolling_back = False
    started_wrong: list[str] = []
    while run.policy.status.phase != Phase.ROLLED_BACK:
        known = {p.name for p in sim.pods}
        run.step()
        rolling_back = rolling_back or run.policy.status.phase == Phase.ROLLING_BACK
        if rolling_back:
            started_wrong += [
                f"{p.node}:{p.mode}"
                for p in sim.pods
                if p.name not in known and p.owner == "kube-proxy" and p.mode != "iptables"
            ]
        assert len(run.decisions) < 400, run.policy.status.message
    assert not started_wrong, f"source pods started in the target mode: {started_wrong}"
    run.assert_restored()


def test_an_abort_in_the_second_finalizing_began_walks_back_every_handed_back_node() -> None:
    """A pod's creationTimestamp has whole seconds, the history's times microseconds: the
    first nodes Finalizing hands back get source pods created in the very second of the
    Finalizing entry, so they looked older than it and were never restarted after an abort
    (a review: RolledBack, yet the node ran nftables)."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    sim.now += timedelta(milliseconds=200)
    # Finalized once before with KeepExclusionTerm: restoring the template then changes
    # nothing the DaemonSet controller rolls, so no rolling restart hides a missed node.
    kept = {"key": MODE_LABEL, "operator": "NotIn", "values": ["nftables", "switching"]}
    ds = sim.get("DaemonSet", "kube-proxy")
    ds["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [kept]}]
            }
        }
    }
    sim._store(ds)
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase == Phase.FINALIZING)
    run.until(lambda _: any(p.owner == "kube-proxy" and p.mode == "nftables" for p in sim.pods))
    began = max(h.time for h in run.policy.status.history if h.reason == "Finalizing")
    for pod in sim.pods:
        if pod.owner == "kube-proxy" and pod.mode == "nftables":
            # As on a real cluster: created a few milliseconds after the Finalizing entry,
            # in the same second, so the creationTimestamp reads earlier than the entry.
            pod.born = began + timedelta(milliseconds=100)
            assert pod.born.replace(microsecond=0) < began
    sim.action = "abort"  # the first nodes are handed back: their source pods run nftables
    run.until(lambda p: p.status.phase == Phase.ROLLED_BACK, limit=400)
    wrong = sorted(f"{p.node}:{p.mode}" for p in sim.pods if p.mode != "iptables")
    assert not wrong, f"RolledBack, yet these run another mode: {wrong}"
    run.assert_restored()


def test_a_new_server_side_default_does_not_stop_the_restore_from_finishing() -> None:
    """issue 9 Also: the API server starts defaulting a field after the snapshot; rollback
    still finishes, with the operator's own changes (affinity, strategy) undone."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy())
    original = json.loads(run.original_ds)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.server_defaults = {"revisionHistoryLimit": 10}
    sim.action = "abort"
    run.until(lambda p: p.status.phase == Phase.ROLLED_BACK, limit=200)
    spec = _source_spec(sim)
    assert spec["updateStrategy"] == original["updateStrategy"]
    affinity = spec["template"]["spec"].get("affinity")  # type: ignore[index]
    assert affinity == original["template"]["spec"].get("affinity")
    assert all(MODE_LABEL not in n.labels for n in sim.nodes.values())


def test_the_source_patch_and_restore_keep_another_policys_exclusion() -> None:
    """A rival policy on other pools of the same DaemonSet (Failed, so no longer counted in
    flight) left canary-1 on its target, ipvs, and its ``NotIn [ipvs, switching]`` on the
    source. This policy's snapshot, source patch and restore keep that exclusion: the source
    kube-proxy never comes back onto canary-1, next to the rival's proxy."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    rival = with_rival(sim)
    sim.nodes["canary-1"].labels[MODE_LABEL] = "ipvs"
    for _ in range(3):
        sim.tick()
    assert not sim.proxies_on("canary-1"), "the rival's node runs no source proxy"
    run = Run(
        sim,
        make_policy(
            nodeSelector={"matchLabels": {"pool": "general"}},
            stages=[{"name": "all", "percent": 100, "bakeSeconds": 600}],
            finalize=False,
        ),
        check=False,
    )
    on_rival = []
    for _ in range(200):
        run.step()
        on_rival += [p.name for p in sim.proxies_on("canary-1")]
        if run.policy.status.phase in (Phase.ANALYZING, Phase.FAILED):
            break
    assert run.policy.status.phase == Phase.ANALYZING, run.policy.status.message
    sim.action = "abort"
    for _ in range(200):
        run.step()
        on_rival += [p.name for p in sim.proxies_on("canary-1")]
        if run.policy.status.phase in (Phase.ROLLED_BACK, Phase.FAILED):
            break
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    run.settle()
    on_rival += [p.name for p in sim.proxies_on("canary-1")]
    assert not on_rival, f"the source kube-proxy came onto the rival's node: {on_rival}"
    affinity = _source_spec(sim)["template"]["spec"]["affinity"]  # type: ignore[index]
    assert (
        rival
        in affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][0]["matchExpressions"]
    )
