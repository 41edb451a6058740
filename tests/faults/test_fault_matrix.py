"""The fault matrix: real migrations run to their end while the control plane, the operator
and people misbehave, with the invariants sampled throughout (tests/sandbox/invariants.py).

Round 1 runs eight cases side by side in one sandbox, each on nodes of its own: kube-apiserver
restarted, etcd restarted and the operator frozen (one case, one fault per node move),
Prometheus stopped mid-bake, the source image bumped by a person (kept after finalize, kept
after a rollback), ``proxymode.io/mode`` removed or set by hand (without the chart's label
guard, and with it: refused), a node deleted while it switches. Every case asserts zero
violations and its own end state. The operator SIGKILLed through whole runs, two replicas
and a rollback beside another migration are in ``test_fault_kills.py``: a module (so a
sandbox) of their own, run beside this one.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode.engine.observed import MODE_LABEL
from proxymode_sandbox import Sandbox
from tests.faults.guard import label_guard, person
from tests.faults.matrix import Case, Matrix, report
from tests.faults.worlds import (
    STAGES,
    WORLD_NODES,
    assert_rolled_back_exactly,
    bump_image,
    labels_of,
    source_image,
)
from tests.sandbox.harness import Policies, mode_of, node_modes, pods_by_node

READY_TIMEOUT = 30
"""The control-plane case's readyTimeoutSeconds (its freeze must outlast it: ``FREEZE_SECONDS``)."""
BYSTANDER_READY_TIMEOUT = 120
"""Every other case's. They run beside the control-plane case, whose faults stall the whole
cluster at once: kube-apiserver took up to 131 s to serve again after its restart on a loaded
machine (``matrix.WAIT``), and neither the DaemonSet controller nor the operator acts
meanwhile. A node of another case that is switching then waits out the stall, and with 30 s
(a 60 s switch deadline: grace plus ready) is rolled back for what the control plane did,
not for anything its own case injected. (CI's run of 893c477: label-set never reached
its first bake; an earlier rerun of the round saw label-set rolled back so: its canary's old
pod "has not gone 60s after the move started".) None of these cases tests a deadline;
120 s (150 s to switch) outlasts the stall, and a healthy move takes seconds, so no case
takes longer for it. The product's side of this (deadlines that pause while the operator
cannot look) is an open question, written down in docs/reliability.md."""
FREEZE_SECONDS = 65
"""Longer than every timeout the operator runs on: kopf's watch requests (the server ends them
after 60s, ``settings.watching.server_timeout``), a moved node's readyTimeoutSeconds (30s
here), the daemon's longest wait between looks (60s). The issue's 60s would exceed all but
the first; 65s exceeds the first too, and takes ~1 minute less than 2 x 60s would."""
OUTAGE_SECONDS = 20
"""Prometheus down for four analysis intervals: more than inconclusiveLimit (2) rounds."""
NEW_IMAGE = "registry.k8s.io/kube-proxy:v1.37.3"


def _analysis(box: Sandbox) -> dict[str, Any]:
    return {
        "prometheus": {"url": box.prometheus_url},
        "intervalSeconds": 5,
        "windowSeconds": 10,
        "warmupSeconds": 10,
        "failureLimit": 2,
        "inconclusiveLimit": 2,
        "minPassingRounds": 2,
        "checks": [
            {"name": "sync-p99", "template": "SyncLatencyP99", "maxSeconds": 1},
            {"name": "failures", "template": "SyncFailures", "max": 0},
        ],
    }


def _bake(stage: int, seconds: int) -> list[dict[str, Any]]:
    return [{**s, "bakeSeconds": seconds} if i == stage else s for i, s in enumerate(STAGES)]


def _completed(m: Matrix, row: Case, name: str, namespace: str, nodes: set[str]) -> None:
    """A finished, finalized run: nftables everywhere, one kube-proxy per node, no labels."""
    st = m.end(name)
    row.outcome = st["phase"]
    assert st["phase"] == "Completed", (st.get("message"), st.get("rollbackMessage"))
    assert st["finalized"] is True
    assert mode_of(m.core, namespace) == "nftables"
    modes = node_modes(m.core)
    assert all(modes[n] is None for n in nodes if n in modes), "proxymode.io/mode left behind"
    pods = pods_by_node(m.core, namespace, "k8s-app=kube-proxy")
    assert sorted(pods) == sorted(n for n in nodes if n in modes), "one kube-proxy per node"


# -- round 1 ----------------------------------------------------------------------------


def case_control_plane(m: Matrix) -> Case:
    row = m.row(
        "control-plane",
        "kube-apiserver restarted, etcd restarted, operator SIGSTOPped",
        "Completed",
    )
    proxy, world = m.world(row.name, WORLD_NODES[row.name])
    name = m.policies.create(proxy.namespace, stages=STAGES, readyTimeoutSeconds=READY_TIMEOUT)
    done: set[str] = set()
    for fault in ("kube-apiserver", "etcd", "freeze"):
        node = m.move_in_flight(name, world.nodes, done)
        done.add(node)
        where = m.at(name)
        started = time.monotonic()
        if fault == "freeze":
            m.box.freeze_operator()
            try:
                time.sleep(FREEZE_SECONDS)
            finally:
                m.box.freeze_operator(False)
        else:
            m.box.restart_component(fault, downtime=3)
        row.faults.append(
            {"fault": fault, "node": node, **where, "seconds": round(time.monotonic() - started, 1)}
        )
    _completed(m, row, name, proxy.namespace, world.nodes)
    return row


def case_prometheus(m: Matrix) -> Case:
    row = m.row(
        "prometheus",
        "Prometheus stopped mid-bake, started again",
        "Completed (paused on NoData meanwhile)",
    )
    proxy, world = m.world(row.name, WORLD_NODES[row.name])
    name = m.policies.create(
        proxy.namespace,
        stages=_bake(0, 30),
        readyTimeoutSeconds=BYSTANDER_READY_TIMEOUT,
        analysis=_analysis(m.box),
    )
    m.until(
        name,
        lambda s: s.get("phase") == "Analyzing" and (s.get("analysis") or {}).get("rounds", 0) >= 1,
        "a first analysis round of the canary",
    )
    where = m.at(name)
    started = time.monotonic()
    m.box.stop_prometheus()
    try:
        paused = m.until(
            name,
            lambda s: s.get("phase") == "Paused" and s.get("pausedReason"),
            "the rollout to pause for want of data",
            timeout=240,
        )
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - started)))
    finally:
        m.box.start_prometheus()
    row.faults.append(
        {
            "fault": "prometheus down",
            **where,
            "seconds": round(time.monotonic() - started, 1),
            "pausedReason": paused,
        }
    )
    assert paused == "NoData"
    _completed(m, row, name, proxy.namespace, world.nodes)
    return row


def case_image_finalize(m: Matrix) -> Case:
    row = m.row(
        "image-finalize",
        "a person bumps the source image mid-run; run finalizes",
        "Completed, the person's image kept",
    )
    proxy, world = m.world(row.name, WORLD_NODES[row.name])
    name = m.policies.create(
        proxy.namespace, stages=_bake(0, 8), readyTimeoutSeconds=BYSTANDER_READY_TIMEOUT
    )
    where = m.analyzing(name, 0)
    bump_image(m.api, world, NEW_IMAGE)
    row.faults.append({"fault": f"image -> {NEW_IMAGE}", "phase": where["phase"], "stage": 0})
    _completed(m, row, name, proxy.namespace, world.nodes)
    assert source_image(m.api, proxy.namespace) == NEW_IMAGE, "the person's image was reverted"
    images = {
        n: p.spec.containers[0].image
        for n, p in pods_by_node(m.core, proxy.namespace, "k8s-app=kube-proxy").items()
    }
    assert set(images.values()) == {NEW_IMAGE}, images
    return row


def case_image_rollback(m: Matrix) -> Case:
    row = m.row(
        "image-rollback",
        "a person bumps the source image mid-run; run rolled back",
        "RolledBack exactly, the person's image kept",
    )
    proxy, world = m.world(row.name, WORLD_NODES[row.name])
    labels = labels_of(m.api, sorted(world.nodes))
    name = m.policies.create(
        proxy.namespace, stages=_bake(1, 600), readyTimeoutSeconds=BYSTANDER_READY_TIMEOUT
    )
    m.analyzing(name, 1)
    bump_image(m.api, world, NEW_IMAGE)
    row.faults.append({"fault": f"image -> {NEW_IMAGE}", **m.at(name)})
    m.others_ended(row.name)
    m.policies.act(name, "abort")
    st = m.end(name)
    row.outcome = st["phase"]
    assert st["phase"] == "RolledBack", st.get("message")
    assert_rolled_back_exactly(m.api, proxy, world, labels)
    return row


def case_label_removed(m: Matrix) -> Case:
    row = m.row(
        "label-removed", "a person removes proxymode.io/mode from a moved node", "Completed"
    )
    proxy, world = m.world(row.name, WORLD_NODES[row.name])
    name = m.policies.create(
        proxy.namespace, stages=_bake(1, 10), readyTimeoutSeconds=BYSTANDER_READY_TIMEOUT
    )
    m.analyzing(name, 1)
    moved = sorted(n for n, v in node_modes(m.core).items() if n in world.nodes and v == "nftables")
    m.core.patch_node(moved[-1], {"metadata": {"labels": {MODE_LABEL: None}}})
    row.faults.append({"fault": "label removed", "node": moved[-1], **m.at(name)})
    _completed(m, row, name, proxy.namespace, world.nodes)
    return row


def case_label_set(m: Matrix) -> Case:
    row = m.row(
        "label-set", "a person sets proxymode.io/mode=nftables on a node not yet moved", "Completed"
    )
    proxy, world = m.world(row.name, WORLD_NODES[row.name])
    name = m.policies.create(
        proxy.namespace, stages=_bake(0, 10), readyTimeoutSeconds=BYSTANDER_READY_TIMEOUT
    )
    m.analyzing(name, 0)
    waiting = sorted(n for n, v in node_modes(m.core).items() if n in world.nodes and v is None)
    m.core.patch_node(waiting[-1], {"metadata": {"labels": {MODE_LABEL: "nftables"}}})
    row.faults.append({"fault": "label set", "node": waiting[-1], **m.at(name)})
    _completed(m, row, name, proxy.namespace, world.nodes)
    return row


def case_label_guarded(m: Matrix) -> Case:
    row = m.row(
        "label-guarded",
        "a person sets and removes proxymode.io/mode under the chart's label guard",
        "both edits refused (403); Completed",
    )
    proxy, world = m.world(row.name, WORLD_NODES[row.name])
    with label_guard(m.box, sorted(world.nodes)):
        name = m.policies.create(
            proxy.namespace, stages=_bake(1, 10), readyTimeoutSeconds=BYSTANDER_READY_TIMEOUT
        )
        m.analyzing(name, 1)
        modes = {n: v for n, v in node_modes(m.core).items() if n in world.nodes}
        moved = sorted(n for n, v in modes.items() if v == "nftables")
        waiting = sorted(n for n, v in modes.items() if v is None)
        jane = person(m.box)
        for node, value, what in ((moved[-1], None, "removed"), (waiting[-1], "nftables", "set")):
            try:
                jane.patch_node(node, {"metadata": {"labels": {MODE_LABEL: value}}})
            except ApiException as e:
                assert e.status == 403, e.body
                assert "only by the proxymode operator" in json.loads(e.body)["message"]
            else:
                raise AssertionError(f"the guard let a person's edit of {node} through")
            row.faults.append({"fault": f"label {what}: refused", "node": node, **m.at(name)})
        _completed(m, row, name, proxy.namespace, world.nodes)
    return row


def case_node_deleted(m: Matrix) -> Case:
    row = m.row("node-deleted", "a node deleted while it switches", "Completed without the node")
    proxy, world = m.world(row.name, WORLD_NODES[row.name])
    name = m.policies.create(
        proxy.namespace, stages=STAGES, readyTimeoutSeconds=BYSTANDER_READY_TIMEOUT
    )
    general = {n for n in world.nodes if n.startswith("general-")}
    node = m.move_in_flight(name, general, set())
    where = m.at(name)
    m.box.remove_node(node)
    world.forget_node(node)
    m.invariants.forget_node(node)
    row.faults.append({"fault": "node deleted", "node": node, **where})
    _completed(m, row, name, proxy.namespace, world.nodes)
    planned = {n for s in m.status(name)["stages"] for n in s["nodes"]}
    assert node not in planned
    m.box.add_node("general", wait=False)  # the sandbox's node set as it was (same name)
    return row


ROUND_1 = [
    case_control_plane,
    case_prometheus,
    case_image_finalize,
    case_image_rollback,
    case_label_removed,
    case_label_set,
    case_label_guarded,
    case_node_deleted,
]


LABEL_EDIT = (
    "a person's edit of proxymode.io/mode skips the switching step, and both DaemonSet"
    " controllers act on the label at once: the source DaemonSet's affinity (NotIn [target,"
    " switching]) takes a node without the label, the target's (In [target]) a node with it, so"
    " the new kube-proxy pod is ADDED before the old one is DELETED and the node runs two for a"
    " moment (in most runs, not all: it depends on which controller acts first). The operator"
    " cannot stop the edit after the fact; the chart's label guard (a ValidatingAdmissionPolicy)"
    " refuses such edits, and this matrix runs without it, as a cluster without the chart would"
)
ROUND_1_TESTS = [
    "control-plane",
    "prometheus",
    "image-finalize",
    "image-rollback",
    "label-removed",
    "label-set",
    "label-guarded",
    "node-deleted",
]
LABEL_EDITS = ("label-removed", "label-set")


@pytest.fixture(scope="module")
def round1(api: client.ApiClient, operator: Sandbox, policies: Policies) -> Matrix:
    """Round 1, run once for the module: its rows are checked case by case below."""
    m = Matrix(api, operator, policies)
    started = time.monotonic()
    m.rows = m.run(ROUND_1)
    report("round1", m.rows, m, time.monotonic() - started)
    return m


def _assert_row(row: Case) -> None:
    assert not row.error, row.error
    assert row.outcome, "the run never ended"
    assert row.samples > 20, f"{row.name}: only {row.samples} samples"
    assert row.violations == [], row.violations[:10]


@pytest.mark.parametrize("case", ROUND_1_TESTS)
def test_round1_case_ends_as_expected_with_no_violation(round1: Matrix, case: str) -> None:
    row = next(r for r in round1.rows if r.name == case)
    print(f"\n{row.name}: {row.outcome} in {row.seconds:.0f}s, {row.samples} samples")
    if case not in LABEL_EDITS or not row.faults:
        _assert_row(row)
        return
    # The one known violation: two kube-proxies for a moment on the node the person edited.
    # Every other check of the row stays strict; the overlap makes the case an expected
    # failure only when it was seen.
    edited = f"two kube-proxies on {row.faults[0]['node']}"
    overlap = [v for v in row.violations if v.startswith((f"{edited}:", f"{edited} (pod watch)"))]
    _assert_row(replace(row, violations=[v for v in row.violations if v not in overlap]))
    if overlap:
        pytest.xfail(f"{LABEL_EDIT} (seen: {overlap[0]})")


def test_round1_touches_nothing_outside_its_worlds(round1: Matrix) -> None:
    """Cluster-wide: no node's own labels changed, no stray mode label, kube-system intact."""
    cases = {f"{r.name}:" for r in round1.rows}
    wide = [
        v for v in round1.invariants.violations if v.split("] ", 1)[1].split(" ")[0] not in cases
    ]
    assert round1.invariants.samples > 50
    assert round1.invariants.errors == [], round1.invariants.errors[:3]
    assert wide == [], wide[:10]


# -- round 2 ----------------------------------------------------------------------------


pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1200)]
