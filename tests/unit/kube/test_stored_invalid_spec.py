"""A policy stored (and in flight) under the previous CRD, with a selector the models now
refuse (d47361f): deleting it must not let the finalizer go without its rollback, and once
the spec is fixed the run goes on from where it was (two reviews).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.kube.reconcile import Outcome, Reconciler
from proxymode.kube.status_merge import merged
from tests.unit.engine.seq import CANARY_THEN_ALL, Run, make_policy, phase_is
from tests.unit.engine.sim import Sim


def _stored_look(run: Run, *, deleting: bool) -> tuple[Outcome, dict[str, Any], dict[str, Any]]:
    """One look of the real reconciler at ``run``'s policy as the old CRD stored it (values
    under Exists, accepted before d47361f): its outcome, the status it wrote, the body."""
    meta: dict[str, Any] = {**run.policy.metadata, "finalizers": ["proxymode.io/rollback"]}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-01T13:00:00Z"
    body: dict[str, Any] = {
        "apiVersion": "proxymode.io/v1alpha1",
        "kind": "ProxyModePolicy",
        "metadata": meta,
        "spec": run.policy.spec.wire(),
        "status": json.loads(run.policy.status.model_dump_json(by_alias=True)),
    }
    body["spec"]["stages"][0]["nodeSelector"] = {
        "matchExpressions": [{"key": "pool", "operator": "Exists", "values": ["canary"]}]
    }
    rec = Reconciler(client.ApiClient())
    stored: list[dict[str, Any]] = []
    rec.read = lambda name: body  # type: ignore[method-assign]
    rec._store = lambda name, status, b: stored.append(status) or True  # type: ignore[method-assign]
    outcome = rec._once("to-nft", deleting=deleting)
    return outcome, stored[-1], body


def test_an_in_flight_policy_with_a_now_refused_selector_is_not_let_go_without_a_rollback() -> None:
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(stages=CANARY_THEN_ALL))
    run.until(phase_is(Phase.ANALYZING))  # canary-1 runs nftables, the source is patched
    assert sim.nodes["canary-1"].labels.get("proxymode.io/mode") == "nftables"
    outcome, written, _ = _stored_look(run, deleting=True)
    assert not outcome.release_finalizer, (
        "the finalizer goes without a rollback: canary-1 keeps label nftables and the"
        " source DaemonSet its exclusion term; once the target DaemonSet is collected"
        " canary-1 has no kube-proxy"
    )
    said = written["message"]
    assert "phase" not in written, "the run's own phase is kept, to go on from"
    assert "this run changed the cluster" in said and "the spec is fixed" in said, said


def _invalid_look(run: Run) -> str:
    """``_stored_look`` (not deleted), its status write merged as the server would, then the
    spec fixed (the valid one again); returns its message."""
    outcome, written, body = _stored_look(run, deleting=False)
    assert not outcome.release_finalizer
    status = merged(body["status"], written)
    run.policy = ProxyModePolicy.model_validate(
        {"metadata": run.policy.metadata, "spec": run.policy.spec.wire(), "status": status}
    )
    run._publish()
    return str(written["message"])


@pytest.mark.parametrize("when", ["analyzing", "rolling-back"])
def test_once_the_spec_is_fixed_the_run_goes_on_from_where_it_was(when: str) -> None:
    """The look that cannot read the spec used to write phase Failed over the run's own:
    Failed has no way back, so with the spec fixed the run stayed there, and a rollback
    half done left canary-1 at switching without any kube-proxy (a review). It now writes
    only its words; the run goes on from its phase once the spec is valid."""
    sim = Sim.cluster({"canary": 1, "general": 2})
    run = Run(sim, make_policy(stages=CANARY_THEN_ALL))
    run.until(phase_is(Phase.ANALYZING))
    if when == "rolling-back":
        sim.action = "abort"
        run.until(phase_is(Phase.ROLLING_BACK))
    before = run.policy.status.phase
    said = _invalid_look(run)
    assert "nothing is done until the spec is fixed" in said, said
    assert run.policy.status.phase == before, "the run's phase was overwritten"
    run.until(phase_is(Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED))
    want = Phase.COMPLETED if when == "analyzing" else Phase.ROLLED_BACK
    assert run.policy.status.phase == want, run.policy.status.message
