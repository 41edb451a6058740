"""Helpers for tests that run the operator against the sandbox.

Each test gets its own kubeadm-shaped kube-proxy (DaemonSet, ConfigMap, ServiceAccount)
in its own namespace, so tests share nothing but the nodes; every policy it creates is
deleted (and so rolled back) afterwards. While a migration runs, a ``Sampler`` checks the
invariants a few times a second: never two kube-proxies on a node, never more nodes
between proxies than maxUnavailable allows.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from proxymode.api import models
from proxymode.engine.observed import MODE_LABEL
from proxymode_sandbox import kubeadm_proxy
from proxymode_sandbox.kubeconfig import write_kubeconfig

T = TypeVar("T")

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
    kubeadm_proxy.install_in(
        api, namespace, mode=mode, affinity=None if include_legacy else NOT_LEGACY
    )
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


def service_account_client(
    sandbox: Any, core: client.CoreV1Api, namespace: str, name: str, where: Path
) -> client.ApiClient:
    """An API client authenticated as ServiceAccount ``namespace/name`` (a 10-minute token;
    the kubeconfig is written under ``where``): what a narrowly granted operator sees."""
    token = core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"audiences": [], "expirationSeconds": 600}}
    ).status.token
    kc = write_kubeconfig(
        where / name, sandbox.server, (sandbox.pki / "ca.crt").read_bytes(), user=name, token=token
    )
    made: client.ApiClient = config.new_client_from_config(config_file=str(kc))
    return made


def raw(call: Callable[..., Any], *args: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(call(*args, _preload_content=False).data)
    return data


class Sampler(threading.Thread):
    """Checks the invariants against the API while a migration runs."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        budget: int,
        nodes: Collection[str] | None = None,
    ) -> None:
        """``nodes``: count only these against the budget (other migrations may run beside
        this one, on other nodes, with budgets of their own)."""
        super().__init__(daemon=True)
        self.nodes = frozenset(nodes) if nodes is not None else None
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.namespace = namespace
        self.budget = budget
        self.halt = threading.Event()
        self.violations: list[str] = []
        self.samples = 0
        self.jobs: dict[str, str] = {}  # job name -> node, every Job seen (a watch)
        self.max_switching = 0
        self.on_pod: Callable[[client.V1Pod], None] | None = None

    def run(self) -> None:
        jobs = threading.Thread(target=self._watch_jobs, daemon=True)
        jobs.start()
        while not self.halt.is_set():
            try:
                self.sample()
            except ApiException:
                pass  # a busy API server: the next sample looks again
            except Exception as e:  # a sampler that stops must not go unseen
                self.violations.append(f"the sampler failed, nothing after is checked: {e!r}")
                raise
            self.halt.wait(0.3)
        jobs.join(timeout=5)

    def _watch_jobs(self) -> None:
        """Every Job created in the namespace, from a watch: a cleanup Job that comes and goes
        between two samples (a busy machine makes a sample slow) is still seen."""
        version = ""
        while not self.halt.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    self.batch.list_namespaced_job,
                    self.namespace,
                    resource_version=version,
                    timeout_seconds=2,
                ):
                    job = event["object"]
                    version = job.metadata.resource_version or version
                    self.jobs[job.metadata.name] = (job.metadata.annotations or {}).get(
                        "proxymode.io/node"
                    ) or (job.metadata.labels or {}).get("proxymode.io/node", "")
                    if self.halt.is_set():
                        break
            except ApiException as e:
                if e.status == 410:  # too old: list again from now
                    version = ""
            finally:
                stream.stop()

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
            and (self.nodes is None or n.metadata.name in self.nodes)
        ]
        self.max_switching = max(self.max_switching, len(switching))
        if len(switching) > self.budget:
            self.violations.append(f"{len(switching)} nodes switching at once: {switching}")
        self.samples += 1

    def stop(self) -> None:
        """Stop counting once every event up to now is in (a stream or two: seconds)."""
        self.halt.set()
        self.join(timeout=30)
        assert not self.is_alive(), "the pod watch did not end"


class PodStarts(threading.Thread):
    """kube-proxy pods started per node in a namespace, from a watch that begins after a
    list (the pods already there are not starts): every pod the DaemonSet controllers
    create is seen, however briefly it lives. ``crashed`` names the nodes where any
    kube-proxy container (an earlier pod's too) was seen restarted: every status the
    kubelet writes is seen, however soon the pod is replaced."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core = client.CoreV1Api(api)
        self.namespace = namespace
        self.halt = threading.Event()
        self.node_of: dict[str, str] = {}  # pod uid -> node, once bound
        self.crashed: set[str] = set()
        self.expired = False
        listed = self.core.list_namespaced_pod(namespace, label_selector="k8s-app=kube-proxy")
        self.version = listed.metadata.resource_version
        self.before = {p.metadata.uid for p in listed.items}

    def run(self) -> None:
        # Each stream ends on the server's 2 s timeout; one that ends after ``stop`` was
        # asked for has delivered everything up to then. (Breaking off at the first event
        # after it dropped the events still queued behind that one: a start seen by the
        # API server before the test stopped counting, lost when this thread lagged.)
        while True:
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    label_selector="k8s-app=kube-proxy",
                    resource_version=self.version,
                    timeout_seconds=2,
                ):
                    pod = event["object"]
                    self.version = pod.metadata.resource_version or self.version
                    if pod.metadata.uid not in self.before and pod.spec.node_name:
                        self.node_of[pod.metadata.uid] = pod.spec.node_name
                    statuses = (pod.status and pod.status.container_statuses) or []
                    if pod.spec.node_name and any(cs.restart_count > 0 for cs in statuses):
                        self.crashed.add(pod.spec.node_name)
            except ApiException as e:
                if e.status == 410:  # too old: starts may have been missed; the test says so
                    self.expired = True
                    return
            finally:
                stream.stop()
            if self.halt.is_set():
                return

    def per_node(self) -> dict[str, int]:
        assert not self.expired, "the pod watch expired: some starts were not seen"
        counts: dict[str, int] = {}
        for node in self.node_of.values():
            counts[node] = counts.get(node, 0) + 1
        return counts

    def stop(self) -> None:
        """Stop counting once every event up to now is in (a stream or two: seconds)."""
        self.halt.set()
        self.join(timeout=30)
        assert not self.is_alive(), "the pod watch did not end"


PATIENCE = 2.0
"""How much longer than on a quiet machine a wait for a policy's phase may take."""


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
        """Wait for one of ``phases``; a timeout says where the policy was at the end (its
        phase, message and last history entries), not where it was when the wait began.

        ``timeout`` is what the wait takes on a quiet machine; the deadline is ``PATIENCE``
        times that, since ``make test`` runs its workers' sandboxes side by side on 2 cores.
        A deadline ends a wait that would never end; it is not a judgement of speed."""
        try:
            return eventually(
                lambda: (st := self.status(name)).get("phase") in phases and st,
                timeout=timeout * PATIENCE,
                interval=0.5,
                what=f"policy {name} to reach {phases}",
            )
        except AssertionError as e:
            st = self.status(name)
            tail = [
                f"{h.get('time')} {h.get('phase')} {h.get('stage') or '-'} {h.get('reason')}"
                for h in (st.get("history") or [])[-6:]
            ]
            raise AssertionError(
                f"{e}; at the end: {st.get('phase')}: {st.get('message')}; history: {tail}"
            ) from e

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


def with_exclusion_term(affinity: dict[str, Any], target: str) -> dict[str, Any]:
    """What ``finalizeSourceTemplate: KeepExclusionTerm`` promises for the source's affinity:
    ``proxymode.io/mode NotIn [<target>, switching]`` ANDed into every required term."""
    want = copy.deepcopy(affinity)
    term = {"key": MODE_LABEL, "operator": "NotIn", "values": [target, "switching"]}
    required = want["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for t in required["nodeSelectorTerms"]:
        t["matchExpressions"] = [*t.get("matchExpressions", []), term]
    return want


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


def eventually(
    probe: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Call ``probe`` until it returns a truthy value (returned) or raises no more.

    Exceptions count as "not yet" until the deadline, then the last one is re-raised
    with ``what`` so a failure says what was awaited.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = probe()
            if value:
                return value
            last = None
        except Exception as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}") from last
        time.sleep(interval)


def pods_by_node(core: client.CoreV1Api, namespace: str, selector: str) -> dict[str, Any]:
    """Live (not terminating) pods matching ``selector``, keyed by node name."""
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return {
        p.spec.node_name: p
        for p in pods
        if p.metadata.deletion_timestamp is None and p.spec.node_name
    }
