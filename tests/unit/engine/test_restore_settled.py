"""The source is settled only when every node's kube-proxy is Ready and staying (pure).

The DaemonSet's status can say rolled out mid-restart: it counts a node Ready while the old
pod, terminating, still reports Ready, and updated once the new pod exists (a review saw
RolledBack while a node's restart was under way)."""

from __future__ import annotations

from dataclasses import replace

from proxymode.engine.look import Look
from proxymode.engine.observed import ProxyKind, ProxyPod
from proxymode.engine.settle import unserved as _unserved
from tests.unit.engine.seq import make_policy
from tests.unit.engine.sim import Sim


def _look(*extra: ProxyPod, terminating: str | None = None) -> Look:
    sim = Sim.cluster({"canary": 1, "general": 1})
    sim.tick()
    observed = sim.observe(policy="to-nft")
    pods = tuple(
        replace(p, terminating=True) if p.node == terminating else p for p in observed.pods
    )
    return Look(make_policy(), replace(observed, pods=pods + extra))


def test_every_node_serving_is_settled() -> None:
    assert not _unserved(_look())


def test_a_node_whose_old_pod_terminates_before_the_new_one_is_ready_is_not() -> None:
    new = ProxyPod("kube-proxy-new", "canary-1", ProxyKind.SOURCE, ready=False)
    assert _unserved(_look(new, terminating="canary-1")) == ["canary-1"]
    assert not _unserved(_look(replace(new, ready=True), terminating="canary-1"))
