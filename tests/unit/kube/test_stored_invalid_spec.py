"""A policy stored (and in flight) under the previous CRD, with a selector the models now
refuse (d47361f): deleting it must not let the finalizer go without its rollback (a review).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from proxymode.api.models import Phase
from proxymode.kube.reconcile import Reconciler
from tests.unit.engine.seq import Run, make_policy, phase_is
from tests.unit.engine.sim import Sim


def test_an_in_flight_policy_with_a_now_refused_selector_is_not_let_go_without_a_rollback() -> None:
    sim = Sim.cluster({"canary": 1, "general": 2})
    stages = [
        {
            "name": "canary",
            "nodeSelector": {
                "matchExpressions": [{"key": "pool", "operator": "In", "values": ["canary"]}]
            },
            "bakeSeconds": 600,
        },
        {"name": "all", "percent": 100, "bakeSeconds": 0},
    ]
    run = Run(sim, make_policy(stages=stages))
    run.until(phase_is(Phase.ANALYZING))  # canary-1 runs nftables, the source is patched
    assert sim.nodes["canary-1"].labels.get("proxymode.io/mode") == "nftables"
    body: dict[str, Any] = {
        "apiVersion": "proxymode.io/v1alpha1",
        "kind": "ProxyModePolicy",
        "metadata": {
            **run.policy.metadata,
            "deletionTimestamp": "2026-11-01T13:00:00Z",
            "finalizers": ["proxymode.io/rollback"],
        },
        "spec": run.policy.spec.wire(),
        "status": json.loads(run.policy.status.model_dump_json(by_alias=True)),
    }
    # As the old CRD stored it (accepted before d47361f): values under Exists.
    body["spec"]["stages"][0]["nodeSelector"] = {
        "matchExpressions": [{"key": "pool", "operator": "Exists", "values": ["canary"]}]
    }
    rec = Reconciler(client.ApiClient())
    stored: list[dict[str, Any]] = []
    rec.read = lambda name: body  # type: ignore[method-assign]
    rec._store = lambda name, status, b: stored.append(status) or True  # type: ignore[method-assign]
    outcome = rec._once("to-nft", deleting=True)
    assert not outcome.release_finalizer, (
        "the finalizer goes without a rollback: canary-1 keeps label nftables and the"
        " source DaemonSet its exclusion term; once the target DaemonSet is collected"
        " canary-1 has no kube-proxy"
    )
    said = stored[-1]["message"]
    assert stored[-1]["phase"] == "Failed" and "this run changed the cluster" in said, said
    assert "fix the spec" in said, said
