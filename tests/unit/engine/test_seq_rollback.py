"""Issue 9 sequences about rollback and restore: what decides, what is restored, in which order.

Each test drives the public ``advance()`` through the controller model (``sim.Sim``) with
the invariants checked at every step, and asserts the behaviour issue 9 expects. A test
marked xfail(strict) fails against today's engine: the reason says what happens instead.
"""

from __future__ import annotations

import json

import pytest

from proxymode.api.models import Phase
from proxymode.engine.observed import MODE_LABEL
from tests.unit.engine.seq import (
    Run,
    history_reasons,
    make_policy,
    nodes_labelled,
    phase_is,
    terminal,
)
from tests.unit.engine.sim import Sim


def _source_spec(sim: Sim) -> dict[str, object]:
    return dict(sim.get("DaemonSet", "kube-proxy")["spec"])


@pytest.mark.xfail(
    strict=True,
    reason="issue 9 item 13: after a lost status write, rollback leaves a switching node"
    " and says RolledBack",
)
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


@pytest.mark.xfail(
    strict=True,
    reason="issue 9 item 14: after BackupLost, rollback leaves OnDelete + NotIn on the source"
    " and says RolledBack",
)
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
    sim.action = "retry"
    run.until(lambda p: p.status.phase == Phase.ROLLED_BACK)
    assert _source_spec(sim)["updateStrategy"] == original["updateStrategy"], "RolledBack"
    run.until(lambda p: p.status.phase in (Phase.COMPLETED, Phase.FAILED))
    assert _source_spec(sim)["updateStrategy"] == original["updateStrategy"], "after run 2"


@pytest.mark.xfail(
    strict=True,
    reason="issue 9 item 15: Finalize reverts an image bump made to the source mid-rollout",
)
def test_finalize_keeps_an_image_bump_made_to_the_source_mid_rollout() -> None:
    """issue 9 item 15: finalize restores only what the operator changed (affinity, update
    strategy); a person's image bump on the source DaemonSet survives."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.current_stage == 1)
    ds = sim.get("DaemonSet", "kube-proxy")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    bumped = container["image"].rsplit(":", 1)[0] + ":v1.37.3"
    container["image"] = bumped
    sim._store(ds)
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    image = sim.get("DaemonSet", "kube-proxy")["spec"]["template"]["spec"]["containers"][0]
    assert image["image"] == bumped


@pytest.mark.xfail(
    strict=True,
    reason="issue 9 item 24: deleting a policy whose rollback is stuck flips Failed <->"
    " RollingBack every look",
)
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


@pytest.mark.xfail(
    strict=True,
    reason="issue 9 Also: rollback from Finalizing walks nodes back before the ConfigMap is"
    " restored; source pods it starts read the target mode",
)
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


@pytest.mark.xfail(
    strict=True,
    reason="issue 9 Also: restore-done requires the whole spec to equal the snapshot; a new"
    " server-side default loops forever",
)
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
