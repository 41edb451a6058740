"""Which DaemonSets and ConfigMaps a batch writes, and which a look reads (pure).

The read-your-writes rule of ``kube.object_cache`` works only if every object the engine
writes is one a look reads under the same key: driven through whole migrations (forward
with finalize, and a rollback), every write must be among the policy's reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import cast

import pytest
from kubernetes import client

from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.engine.actions import EmitEvent, PatchObject, SetNodeMode
from proxymode.kube import reconcile
from proxymode.kube.cache import ClusterCache
from proxymode.kube.object_cache import CONFIG_MAP, DAEMON_SET, kept, read_by, written
from proxymode.kube.observe import Observer
from proxymode.kube.reconcile import Reconciler
from tests.unit.engine.seq import Run, make_policy, terminal
from tests.unit.engine.sim import Sim


def _writes(run: Run) -> set[tuple[str, str, str]]:
    return {key for d in run.decisions for key in written(d.actions)}


def test_every_object_a_migration_writes_is_one_its_looks_read() -> None:
    for mode in ("nftables", "ipvs"):
        run = Run(Sim.cluster({"canary": 2, "general": 4}), make_policy(targetMode=mode))
        run.until(terminal)
        assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
        writes = _writes(run)
        assert {k[0] for k in writes} == {DAEMON_SET, CONFIG_MAP}, writes
        assert writes <= read_by(run.policy), writes - read_by(run.policy)


def test_a_rollback_writes_only_what_its_looks_read() -> None:
    sim = Sim.cluster({"canary": 2, "general": 4})
    run = Run(sim, make_policy())

    def hook(i: int, s: Sim, _p: ProxyModePolicy) -> None:
        if i == 8:
            s.action = "abort"

    run.until(lambda p: p.status.phase == Phase.ROLLED_BACK, hook=hook)
    writes = _writes(run)
    assert writes and writes <= read_by(run.policy), writes - read_by(run.policy)


def test_kept_objects_look_like_a_get_without_managed_fields() -> None:
    item = {"metadata": {"name": "kube-proxy", "managedFields": [{"manager": "x"}]}, "data": {}}
    obj = kept(CONFIG_MAP)(item)
    assert obj == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "kube-proxy"},
        "data": {},
    }
    assert kept(DAEMON_SET)({"metadata": {"name": "p"}})["apiVersion"] == "apps/v1"


class _Objects:
    def __init__(self) -> None:
        self.asked: set[tuple[str, str, str]] = set()
        self.unsettled: list[set[tuple[str, str, str]]] = []

    def get(self, kind: str, namespace: str, name: str) -> None:
        self.asked.add((kind, namespace, name))

    def unsettle(self, keys: set[tuple[str, str, str]]) -> None:
        self.unsettled.append(set(keys))


class _Cache:
    """What ``Observer`` asks of a cluster cache, answering nothing is there."""

    def __init__(self) -> None:
        self.objects = _Objects()
        self.unsettled_nodes: list[list[str]] = []

    def unsettle_nodes(self, names: Iterable[str]) -> None:
        self.unsettled_nodes.append(list(names))

    def nodes(self) -> list[object]:
        return []

    def pods(self, _namespace: str) -> list[object]:
        return []

    def jobs(self, _namespace: str, _policy: str) -> list[object]:
        return []


def _progressing(**spec: object) -> ProxyModePolicy:
    policy = make_policy(verify={"enabled": False}, **spec)
    status = policy.status.model_copy(update={"phase": Phase.PROGRESSING})
    return policy.model_copy(update={"status": status})


def test_a_look_reads_exactly_the_objects_read_by_names() -> None:
    """``read_by`` is what a conflict unsettles: it must name what ``observe`` reads."""
    for spec in ({}, {"targetMode": "ipvs", "kubeProxy": {"namespace": "proxies"}}):
        policy = _progressing(**spec)
        cache = _Cache()
        Observer(client.ApiClient(), cache=cast(ClusterCache, cache)).observe(policy)
        assert cache.objects.asked == read_by(policy)


class _Executor:
    """Runs nothing; says how many actions went through (``done``), or raises."""

    done: int | Exception = 0

    def __init__(self, *_: object) -> None:
        pass

    def run(self, actions: list[object]) -> int:
        if isinstance(self.done, Exception):
            raise self.done
        return self.done


def test_writes_are_unsettled_before_and_after_and_a_conflict_unsettles_every_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = _progressing()
    ns = policy.spec.kube_proxy.namespace
    actions = [
        PatchObject(
            api_version="apps/v1", kind="DaemonSet", namespace=ns, name="kube-proxy", ops=()
        ),
        EmitEvent("Reason", "message"),
    ]
    cache = _Cache()
    reconciler = Reconciler(client.ApiClient(), cache=cast(ClusterCache, cache))
    monkeypatch.setattr(reconcile, "Executor", _Executor)
    wrote = {("DaemonSet", ns, "kube-proxy")}

    _Executor.done = 2
    assert reconciler._act("p", {}, policy, actions) == 2
    assert cache.objects.unsettled == [wrote, wrote], "before the writes and after them"

    cache.objects.unsettled.clear()
    _Executor.done = 0
    assert reconciler._act("p", {}, policy, actions) == 0
    assert cache.objects.unsettled == [wrote, wrote, read_by(policy)], "refused: all reads"

    cache.objects.unsettled.clear()
    _Executor.done = RuntimeError("the API server went away")
    with pytest.raises(RuntimeError):
        reconciler._act("p", {}, policy, actions)
    assert cache.objects.unsettled == [wrote, wrote], "after a failed batch too"


def test_label_writes_are_unsettled_after_the_batch_whatever_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the batch (a GET before the writes are in would settle the node on the version
    before them), even a refused or failed one, every node whose label it meant to write."""
    policy = _progressing()
    actions = [
        SetNodeMode("n1", "switching", expect=None),
        SetNodeMode("n2", None, expect="nftables"),
        EmitEvent("Reason", "message"),
    ]
    cache = _Cache()
    reconciler = Reconciler(client.ApiClient(), cache=cast(ClusterCache, cache))
    seen_by_run: list[int] = []

    class _Watching(_Executor):
        def run(self, actions: list[object]) -> int:
            seen_by_run.append(len(cache.unsettled_nodes))
            return super().run(actions)

    monkeypatch.setattr(reconcile, "Executor", _Watching)
    for done in (3, 0, RuntimeError("the API server went away")):
        cache.unsettled_nodes.clear()
        _Executor.done = done
        with contextlib.suppress(RuntimeError):
            reconciler._act("p", {}, policy, actions)
        assert cache.unsettled_nodes == [["n1", "n2"]], done
    assert seen_by_run == [0, 0, 0], "nothing is expected before the writes are in"
