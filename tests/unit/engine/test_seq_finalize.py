"""Finalize with one restart less per node (issue 12 item 5, decision 0014).

A finalized migration hands every node back to the source DaemonSet under the template it
has while the nodes move (the original plus ``proxymode.io/mode NotIn [<target>,
switching]``). With ``finalizeSourceTemplate: KeepExclusionTerm`` (the default) that
template is the final one: putting the update strategy back rolls nothing, so every
kube-proxy starts twice (the switch, the hand-back). ``Exact`` puts the original affinity
back too: one more rolling restart, three starts. The controller model counts the starts.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxymode.api.models import Phase
from tests.unit.engine.seq import (
    THREE_STAGES,
    Run,
    config_mode,
    make_policy,
    terminal,
    with_exclusion_term,
    with_spec,
)
from tests.unit.engine.sim import Sim


def _finalize(sim: Sim, **spec: Any) -> Run:
    run = Run(sim, make_policy(**spec))
    run.until(terminal)
    st = run.policy.status
    assert st.phase == Phase.COMPLETED and st.finalized is True, st.message
    run.settle()
    return run


def _one_ready_source_proxy_each(sim: Sim, mode: str) -> None:
    for node in sim.nodes:
        pods = sim.proxies_on(node)
        assert len(pods) == 1 and pods[0].owner == "kube-proxy" and pods[0].ready, node
        assert pods[0].mode == mode, f"{node} runs {pods[0].mode}"


@pytest.mark.parametrize("target", ["nftables", "ipvs"])
def test_keep_exclusion_term_starts_every_kube_proxy_twice(target: str) -> None:
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = _finalize(sim, targetMode=target)
    assert sim.starts == dict.fromkeys(sim.nodes, 2), sim.starts
    _one_ready_source_proxy_each(sim, target)
    assert config_mode(sim) == target
    ds = sim.get("DaemonSet", "kube-proxy")
    assert ds["spec"] == with_exclusion_term(json.loads(run.original_ds), target)
    assert "proxymode.io/original-update-strategy" not in ds["metadata"].get("annotations", {})
    assert ds["status"]["updatedNumberScheduled"] == len(sim.nodes), "no pod left to roll"


def test_exact_puts_the_original_template_back_with_one_more_rolling_restart() -> None:
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = _finalize(sim, finalizeSourceTemplate="Exact")
    assert sim.starts == dict.fromkeys(sim.nodes, 3), sim.starts
    _one_ready_source_proxy_each(sim, "nftables")
    ds = sim.get("DaemonSet", "kube-proxy")
    assert json.dumps(ds["spec"], sort_keys=True) == run.original_ds


def test_a_node_that_joins_after_a_kept_term_runs_the_source_at_once() -> None:
    """The kept term matches a node without the label: a newcomer gets the source proxy."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    _finalize(sim)
    sim.add_node("general-9", "general")
    sim.tick()
    sim.tick()
    _one_ready_source_proxy_each(sim, "nftables")


def test_finalize_false_over_every_node_names_no_others() -> None:
    """Stages that cover every node with ``finalize: false`` end with both DaemonSets kept;
    there are no "others" staying on the source to speak of (a review saw "the others stay
    on iptables" on a cluster where every node had moved)."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(finalize=False))
    run.until(lambda p: p.status.phase == Phase.COMPLETED)
    message = run.policy.status.message or ""
    assert "3 nodes run nftables, every node the policy covers" in message, message
    assert "others" not in message
    run.steps(3)  # the terminal look's own words
    assert "others" not in (run.policy.status.message or ""), run.policy.status.message


def _liberal(sim: Sim) -> None:
    """A person's edit of the source ConfigMap mid-run (not its mode)."""
    cm = sim.get("ConfigMap", "kube-proxy")
    cm["data"]["config.conf"] = cm["data"]["config.conf"].replace(
        "tcpBeLiberal: false", "tcpBeLiberal: true"
    )
    sim._store(cm)


def _is_liberal(sim: Sim) -> bool:
    return "tcpBeLiberal: true" in sim.get("ConfigMap", "kube-proxy")["data"]["config.conf"]


def test_a_persons_config_edit_mid_bake_survives_an_abort() -> None:
    """The operator writes the source ConfigMap only in Finalizing. An abort mid-bake put
    the whole ConfigMap back to the snapshot all the same, silently undoing a person's
    ``tcpBeLiberal: true`` (a review); it is now left as the person left it."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    stages = [{**s, "bakeSeconds": 600} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=stages))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    _liberal(sim)
    sim.action = "abort"
    run.until(terminal)
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    assert _is_liberal(sim), "the person's edit was undone"
    assert config_mode(sim) == "iptables"


def test_a_persons_config_edit_mid_bake_is_kept_by_finalize() -> None:
    """Finalize rendered the target mode into the snapshot's configuration, so a person's
    edit made since was lost with it; it now renders into the ConfigMap as it is."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(finalize=True))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    _liberal(sim)
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    assert config_mode(sim) == "nftables"
    assert _is_liberal(sim), "finalize dropped the person's edit"


def test_a_persons_config_edit_mid_bake_survives_an_abort_after_finalize_wrote() -> None:
    """The same edit, then Finalizing writes nftables (keeping it), then an abort: the
    rollback put the configuration back to the snapshot's text, the edit with it (a
    review). Finalizing now keeps the text it replaces in the snapshot first, and the
    rollback puts that back: iptables again, the edit kept."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(finalize=True))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    _liberal(sim)
    run.until(lambda p: p.status.phase == Phase.FINALIZING and config_mode(sim) == "nftables")
    assert _is_liberal(sim)
    sim.action = "abort"
    run.until(terminal)
    assert run.policy.status.phase == Phase.ROLLED_BACK, run.policy.status.message
    assert config_mode(sim) == "iptables"
    assert _is_liberal(sim), "the person's edit was undone by the rollback"


def test_finalize_set_true_on_a_completed_mixed_mode_policy_finalizes_it() -> None:
    """A review: ``finalize: false`` ran to Completed over every node, then ``finalize:
    true`` was set and nothing happened, without a word (and deleting the policy rolls
    every node back). It now finalizes, as a run with ``finalize: true`` would have."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy(finalize=False))
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED and run.policy.status.finalized is False
    run.policy = with_spec(run.policy, finalize=True)
    run.until(lambda p: p.status.phase == Phase.COMPLETED and bool(p.status.finalized))
    assert "Finalizing" in [h.phase for h in run.policy.status.history]
    assert sim.get("DaemonSet", "kube-proxy-nftables") is None
    for node in sim.nodes:
        (pod,) = sim.proxies_on(node)
        assert pod.owner == "kube-proxy" and pod.mode == "nftables", node


def test_finalize_set_true_on_a_partial_mixed_mode_policy_says_what_it_waits_for() -> None:
    sim = Sim.cluster({"canary": 2, "general": 2})
    canary = [{"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}}]
    run = Run(sim, make_policy(stages=canary, finalize=False))
    run.until(terminal)
    run.policy = with_spec(run.policy, finalize=True)
    run.steps(3)
    assert run.policy.status.phase == Phase.COMPLETED and not run.policy.status.finalized
    assert "spec.finalize is true: the policy finalizes once its stages cover every node" in (
        run.policy.status.message or ""
    )


def test_finalize_set_true_while_paused_waits_for_the_pause_to_end() -> None:
    """A review: finalize: true on a Completed mixed-mode policy with spec.paused true went
    to Finalizing (Completed is not paused), and could not be taken back."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy(finalize=False))
    run.until(terminal)
    run.policy = with_spec(run.policy, finalize=True, paused=True)
    run.steps(3)
    assert run.policy.status.phase == Phase.COMPLETED and not run.policy.status.finalized
    assert "spec.finalize is true, held by spec.paused" in (run.policy.status.message or "")
    assert sim.get("DaemonSet", "kube-proxy-nftables") is not None
    run.policy = with_spec(run.policy, finalize=False, paused=False)
    run.steps(3)
    assert run.policy.status.phase == Phase.COMPLETED and not run.policy.status.finalized
    assert "spec.finalize is true" not in (run.policy.status.message or "")


def test_a_config_override_that_cannot_render_while_finalizing_holds_until_fixed() -> None:
    """A review: configOverrides.mode: ipvs set while nodes were handed back failed the run
    (FinalizeBlocked) with a hand-back at switching and no kube-proxy there, and resume was
    refused. It now pauses; the hand-back in flight finishes; fixed and resumed, it ends."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy())
    run.until(lambda p: p.status.phase == Phase.FINALIZING and bool(p.status.moves))
    good = run.policy.spec.wire().get("configOverrides")
    run.policy = with_spec(run.policy, configOverrides={"mode": "ipvs"})
    run.until(lambda p: p.status.phase == Phase.PAUSED, limit=10)
    assert run.policy.status.paused_reason == "TargetConfigInvalid"
    run.until(lambda p: not p.status.moves, limit=20)  # invariants checked at every step
    run.policy = with_spec(run.policy, configOverrides=good)
    sim.action = "resume"
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED and run.policy.status.finalized
