"""Migrations run by the real operator process on the real control plane.

Each test gets its own kubeadm-shaped kube-proxy (DaemonSet, ConfigMap, ServiceAccount)
in its own namespace, so tests share nothing but the nodes; every policy it creates is
deleted (and so rolled back) afterwards. While a migration runs, a sampler checks the
invariants twice a second: never two kube-proxies on a node, never more nodes between
proxies than maxUnavailable allows.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode.api import models
from proxymode.engine.observed import MODE_LABEL
from proxymode_sandbox import Sandbox, kubeadm_proxy
from tests.sandbox.conftest import eventually

G, V, P = models.GROUP, models.VERSION, models.PLURAL
NOT_LEGACY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["legacy"]}]}
            ]
        }
    }
}
STAGES = [
    {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}, "bakeSeconds": 2},
    {"name": "half", "percent": 50, "bakeSeconds": 2},
    {"name": "all", "percent": 100, "bakeSeconds": 2},
]


@dataclass
class KubeProxy:
    """A kubeadm-shaped kube-proxy in a test namespace, and its state before the test."""

    namespace: str
    nodes: list[str]
    ds_spec: dict[str, Any] = field(default_factory=dict)
    cm_data: dict[str, str] = field(default_factory=dict)


def install_kube_proxy(
    api: client.ApiClient, namespace: str, *, include_legacy: bool = False, mode: str = "iptables"
) -> KubeProxy:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    objs = {
        o["kind"]: copy.deepcopy(o)
        for o in kubeadm_proxy.manifests("https://127.0.0.1:1", "v1.37.2", mode)
    }
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "kube-proxy"}})
    cm = objs["ConfigMap"]
    cm["metadata"]["namespace"] = namespace
    core.create_namespaced_config_map(namespace, cm)
    ds = objs["DaemonSet"]
    ds["metadata"]["namespace"] = namespace
    if not include_legacy:
        ds["spec"]["template"]["spec"]["affinity"] = NOT_LEGACY
    apps.create_namespaced_daemon_set(namespace, ds)
    nodes = sorted(
        n.metadata.name
        for n in core.list_node().items
        if include_legacy or n.metadata.labels.get("pool") != "legacy"
    )
    eventually(
        lambda: (
            (d := apps.read_namespaced_daemon_set("kube-proxy", namespace).status)
            and d.number_ready == len(nodes) == d.desired_number_scheduled
        ),
        what="the test kube-proxy to be Ready on every node",
    )
    proxy = KubeProxy(namespace, nodes)
    proxy.ds_spec = raw(apps.read_namespaced_daemon_set, "kube-proxy", namespace)["spec"]
    proxy.cm_data = core.read_namespaced_config_map("kube-proxy", namespace).data
    return proxy


def raw(call: Callable[..., Any], *args: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(call(*args, _preload_content=False).data)
    return data


class Sampler(threading.Thread):
    """Checks the invariants against the API while a migration runs."""

    def __init__(self, api: client.ApiClient, namespace: str, budget: int) -> None:
        super().__init__(daemon=True)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.namespace = namespace
        self.budget = budget
        self.halt = threading.Event()
        self.violations: list[str] = []
        self.samples = 0
        self.jobs: dict[str, str] = {}  # job name -> node
        self.max_switching = 0
        self.on_pod: Callable[[client.V1Pod], None] | None = None

    def run(self) -> None:
        while not self.halt.is_set():
            with contextlib.suppress(ApiException):
                self.sample()
            self.halt.wait(0.3)

    def sample(self) -> None:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector="k8s-app=kube-proxy"
        ).items
        per_node: dict[str, list[str]] = {}
        for pod in pods:
            if pod.spec.node_name:
                per_node.setdefault(pod.spec.node_name, []).append(pod.metadata.name)
            if self.on_pod:
                self.on_pod(pod)
        for node, names in per_node.items():
            if len(names) > 1:
                self.violations.append(f"two kube-proxies on {node}: {names}")
        switching = [
            n.metadata.name
            for n in self.core.list_node().items
            if (n.metadata.labels or {}).get(MODE_LABEL) == "switching"
        ]
        self.max_switching = max(self.max_switching, len(switching))
        if len(switching) > self.budget:
            self.violations.append(f"{len(switching)} nodes switching at once: {switching}")
        for job in self.batch.list_namespaced_job(self.namespace).items:
            self.jobs[job.metadata.name] = (job.metadata.labels or {}).get("proxymode.io/node", "")
        self.samples += 1

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=5)


class Policies:
    """Creates policies for a test and deletes (rolls back) them afterwards."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.names: list[str] = []

    def create(self, namespace: str, **spec: Any) -> str:
        name = f"pmp-{uuid.uuid4().hex[:8]}"
        body = {
            "apiVersion": f"{G}/{V}",
            "kind": models.KIND,
            "metadata": {"name": name},
            "spec": {
                "targetMode": "nftables",
                "kubeProxy": {"namespace": namespace},
                "stages": STAGES,
                "readyTimeoutSeconds": 60,
                **spec,
            },
        }
        self.custom.create_cluster_custom_object(G, V, P, body)
        self.names.append(name)
        return name

    def get(self, name: str) -> dict[str, Any]:
        body: dict[str, Any] = self.custom.get_cluster_custom_object(G, V, P, name)
        return body

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.get(name).get("status") or {})

    def wait_phase(self, name: str, *phases: str, timeout: float = 180) -> dict[str, Any]:
        return eventually(
            lambda: (st := self.status(name)).get("phase") in phases and st,
            timeout=timeout,
            interval=0.5,
            what=f"policy {name} to reach {phases} (now {self.status(name).get('phase')}:"
            f" {self.status(name).get('message')})",
        )

    def act(self, name: str, action: str) -> None:
        patch = {"metadata": {"annotations": {"proxymode.io/action": action}}}
        self.custom.patch_cluster_custom_object(G, V, P, name, patch)

    def delete_all(self) -> None:
        for name in self.names:
            try:
                self.custom.delete_cluster_custom_object(G, V, P, name)
            except ApiException as e:
                if e.status != 404:
                    raise
        for name in self.names:
            eventually(lambda n=name: not self._exists(n), timeout=180, what=f"{name} to go")

    def _exists(self, name: str) -> bool:
        try:
            self.get(name)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True


@pytest.fixture
def policies(api: client.ApiClient, operator: Sandbox) -> Iterator[Policies]:
    made = Policies(api)
    try:
        yield made
    finally:
        made.delete_all()


@pytest.fixture
def proxy(api: client.ApiClient, namespace: str) -> KubeProxy:
    return install_kube_proxy(api, namespace)


@pytest.fixture
def sampler(api: client.ApiClient, proxy: KubeProxy) -> Iterator[Sampler]:
    s = Sampler(api, proxy.namespace, budget=1)
    s.start()
    try:
        yield s
    finally:
        s.stop()
    assert s.violations == [], s.violations[:5]


def node_modes(core: client.CoreV1Api) -> dict[str, str | None]:
    return {
        n.metadata.name: (n.metadata.labels or {}).get(MODE_LABEL) for n in core.list_node().items
    }


def assert_restored(api: client.ApiClient, proxy: KubeProxy) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    assert (
        raw(apps.read_namespaced_daemon_set, "kube-proxy", proxy.namespace)["spec"] == proxy.ds_spec
    )
    assert core.read_namespaced_config_map("kube-proxy", proxy.namespace).data == proxy.cm_data
    assert all(v is None for v in node_modes(core).values())
    names = [d.metadata.name for d in apps.list_namespaced_daemon_set(proxy.namespace).items]
    assert names == ["kube-proxy"], "the target DaemonSet is gone"


def mode_of(core: client.CoreV1Api, namespace: str) -> str:
    conf = core.read_namespaced_config_map("kube-proxy", namespace).data["config.conf"]
    return str(yaml.safe_load(conf)["mode"])


# -- (a) ----------------------------------------------------------------------------------


def test_iptables_to_nftables_over_three_stages_completes_and_finalizes(
    api: client.ApiClient, proxy: KubeProxy, policies: Policies, sampler: Sampler
) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    started = time.monotonic()
    name = policies.create(proxy.namespace)
    status = policies.wait_phase(name, "Completed", "Failed", "RolledBack")
    elapsed = time.monotonic() - started
    assert status["phase"] == "Completed", status.get("message")
    assert status["finalized"] is True
    assert [s["phase"] for s in status["stages"]] == ["Completed"] * 3
    assert sum(len(s["nodes"]) for s in status["stages"]) == len(proxy.nodes)
    assert mode_of(core, proxy.namespace) == "nftables"
    assert [d.metadata.name for d in apps.list_namespaced_daemon_set(proxy.namespace).items] == [
        "kube-proxy"
    ]
    cms = {c.metadata.name for c in core.list_namespaced_config_map(proxy.namespace).items}
    assert "kube-proxy-nftables" not in cms
    eventually(
        lambda: (
            "proxymode-backup-" + name
            not in {c.metadata.name for c in core.list_namespaced_config_map(proxy.namespace).items}
        ),
        what="the snapshot to be tidied away",
    )
    assert all(v is None for v in node_modes(core).values()), "no proxymode.io/ label left"
    ds = raw(apps.read_namespaced_daemon_set, "kube-proxy", proxy.namespace)
    assert ds["spec"]["updateStrategy"] == proxy.ds_spec["updateStrategy"]
    assert ds["spec"]["template"]["spec"]["affinity"] == NOT_LEGACY
    pods = core.list_namespaced_pod(proxy.namespace, label_selector="k8s-app=kube-proxy").items
    assert sorted(p.spec.node_name for p in pods) == proxy.nodes, "one kube-proxy per node"
    reasons = [
        e.reason
        for e in core.list_namespaced_event("default").items
        if e.involved_object.name == name
    ]
    assert {"RolloutStarted", "StageStarted", "StagePromoted", "Finalizing", "Completed"} <= set(
        reasons
    )
    assert sampler.samples > 10
    print(
        f"\n(a) {len(proxy.nodes)} nodes, 3 stages: Completed in {elapsed:.1f}s,"
        f" {sampler.samples} invariant samples, max switching {sampler.max_switching}"
    )


# -- (b) ----------------------------------------------------------------------------------


def test_iptables_to_ipvs_runs_a_cleanup_job_on_each_moved_node(
    api: client.ApiClient, proxy: KubeProxy, policies: Policies, sampler: Sampler
) -> None:
    name = policies.create(proxy.namespace, targetMode="ipvs")
    status = policies.wait_phase(name, "Completed", "Failed", "RolledBack")
    assert status["phase"] == "Completed", status.get("message")
    assert sorted(set(sampler.jobs.values())) == proxy.nodes
    assert mode_of(client.CoreV1Api(api), proxy.namespace) == "ipvs"


# -- (c) ----------------------------------------------------------------------------------


def test_abort_mid_stage_restores_everything_exactly(
    api: client.ApiClient, proxy: KubeProxy, policies: Policies, sampler: Sampler
) -> None:
    slow = [{**s, "bakeSeconds": 600} for s in STAGES]
    name = policies.create(proxy.namespace, stages=slow)
    policies.wait_phase(name, "Analyzing")
    assert any(v == "nftables" for v in node_modes(client.CoreV1Api(api)).values())
    policies.act(name, "abort")
    status = policies.wait_phase(name, "RolledBack", "Failed")
    assert status["phase"] == "RolledBack", status.get("message")
    assert "Aborted" in status["rollbackReason"]
    eventually(
        lambda: (
            not policies.get(name)["metadata"].get("annotations", {}).get("proxymode.io/action")
        ),
        what="the action annotation to be consumed",
    )
    assert_restored(api, proxy)


# -- (d) ----------------------------------------------------------------------------------


def test_operator_killed_mid_stage_and_restarted_finishes(
    api: client.ApiClient,
    proxy: KubeProxy,
    policies: Policies,
    sampler: Sampler,
    operator: Sandbox,
) -> None:
    name = policies.create(proxy.namespace)
    eventually(
        lambda: policies.status(name).get("moves"), what="a node move in flight", interval=0.1
    )
    operator.stop_operator(kill=True)
    time.sleep(3)
    frozen = node_modes(client.CoreV1Api(api))
    assert "switching" in frozen.values() or any(v == "nftables" for v in frozen.values())
    operator.start_operator()
    status = policies.wait_phase(name, "Completed", "Failed", "RolledBack")
    assert status["phase"] == "Completed", status.get("message")
    assert mode_of(client.CoreV1Api(api), proxy.namespace) == "nftables"


# -- (e) ----------------------------------------------------------------------------------


def test_crash_looping_canaries_roll_back_automatically(
    api: client.ApiClient,
    proxy: KubeProxy,
    policies: Policies,
    sampler: Sampler,
    sandbox: Sandbox,
) -> None:
    marked: set[str] = set()

    def crash_target_pods(pod: client.V1Pod) -> None:
        labels = pod.metadata.labels or {}
        if labels.get(MODE_LABEL) == "nftables" and pod.metadata.name not in marked:
            marked.add(pod.metadata.name)
            sandbox.set_crashloop(proxy.namespace, pod.metadata.name)

    sampler.on_pod = crash_target_pods
    name = policies.create(proxy.namespace)
    status = policies.wait_phase(name, "RolledBack", "Failed", "Completed")
    sampler.on_pod = None
    assert status["phase"] == "RolledBack", status.get("message")
    assert "KubeProxyUnhealthy" in status["rollbackReason"]
    assert "restarted" in status["rollbackReason"] or "not Ready" in status["rollbackReason"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    assert_restored(api, proxy)


# -- (g) ----------------------------------------------------------------------------------


def test_a_node_added_to_a_finished_pool_is_migrated(
    api: client.ApiClient,
    proxy: KubeProxy,
    policies: Policies,
    sampler: Sampler,
    sandbox: Sandbox,
) -> None:
    slow = [STAGES[0], {**STAGES[1], "bakeSeconds": 30}, STAGES[2]]
    name = policies.create(proxy.namespace, stages=slow)
    eventually(
        lambda: (policies.status(name).get("currentStage") or 0) >= 1,
        timeout=120,
        what="the canary stage to finish",
    )
    added = sandbox.add_node("canary")
    try:
        eventually(
            lambda: added in policies.status(name)["stages"][0]["nodes"],
            timeout=60,
            what=f"{added} to join the canary stage",
        )
        eventually(
            lambda: node_modes(client.CoreV1Api(api)).get(added) == "nftables",
            timeout=60,
            what=f"{added} to be migrated",
        )
        status = policies.wait_phase(name, "Completed", "Failed", "RolledBack")
        assert status["phase"] == "Completed", status.get("message")
        pods = (
            client.CoreV1Api(api)
            .list_namespaced_pod(proxy.namespace, label_selector="k8s-app=kube-proxy")
            .items
        )
        assert added in {p.spec.node_name for p in pods}
    finally:
        sandbox.remove_node(added)


# -- (h) ----------------------------------------------------------------------------------


def test_policy_deleted_mid_rollout_is_rolled_back_then_released(
    api: client.ApiClient, proxy: KubeProxy, policies: Policies, sampler: Sampler
) -> None:
    slow = [{**s, "bakeSeconds": 600} for s in STAGES]
    name = policies.create(proxy.namespace, stages=slow)
    policies.wait_phase(name, "Analyzing")
    policies.custom.delete_cluster_custom_object(G, V, P, name)
    eventually(
        lambda: not policies._exists(name), timeout=120, what="the policy to roll back and go"
    )
    assert_restored(api, proxy)


# -- (i) ----------------------------------------------------------------------------------


def test_old_kernels_are_refused_or_excluded_by_choice(
    api: client.ApiClient, namespace: str, policies: Policies
) -> None:
    proxy = install_kube_proxy(api, namespace, include_legacy=True)
    refused = policies.create(proxy.namespace)
    status = policies.wait_phase(refused, "Failed", "Progressing", "Completed")
    assert status["phase"] == "Failed"
    finding = next(f for f in status["preflight"]["findings"] if f["code"] == "KernelTooOld")
    assert finding["severity"] == "Error" and finding["nodes"] == ["legacy-1"]
    assert "5.13" in finding["message"]
    assert all(v is None for v in node_modes(client.CoreV1Api(api)).values()), "nothing touched"
    policies.custom.delete_cluster_custom_object(G, V, P, refused)
    eventually(lambda: not policies._exists(refused), what="the refused policy to go")

    excluded = policies.create(proxy.namespace, incompatibleNodes="Exclude")
    status = policies.wait_phase(excluded, "Completed", "Failed", "RolledBack")
    assert status["phase"] == "Completed", status.get("message")
    finding = next(f for f in status["preflight"]["findings"] if f["code"] == "KernelTooOld")
    assert finding["severity"] == "Warning" and finding["nodes"] == ["legacy-1"]
    assert status["finalized"] is False, "legacy-1 stays on iptables: mixed mode, pair kept"
    planned = {n for s in status["stages"] for n in s["nodes"]}
    assert "legacy-1" not in planned
    assert node_modes(client.CoreV1Api(api))["legacy-1"] is None
