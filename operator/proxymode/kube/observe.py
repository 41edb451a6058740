"""Read the world into the engine's ``Observed`` snapshot. The only reads the operator makes.

Objects the engine copies or patches (the source DaemonSet and ConfigMap, the target
pair) are kept exactly as the API returned them (camelCase JSON); everything else is
reduced to the few fields the engine needs. Cluster-wide inventory (Services,
EndpointSlices, CNI, other policies) is gathered only while preflight needs it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode.api import models
from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.engine.look import PREFLIGHT_OBSERVED
from proxymode.engine.objects import job_node
from proxymode.engine.observed import (
    ACTION_ANNOTATION,
    CONFIG_HASH_ANNOTATION,
    JOB_KIND_LABEL,
    POLICY_LABEL,
    AnalysisRound,
    CleanupJobView,
    ClusterFacts,
    JobKind,
    NodeView,
    Object,
    Observed,
    ProxyKind,
    ProxyPod,
)
from proxymode.kube.cache import (
    MIRROR_ANNOTATION,
    TEMPLATE_GENERATION_LABEL,
    ClusterCache,
    PodRecord,
    last_terminated,
)
from proxymode.kube.object_cache import Key, objects_of, read_object
from proxymode.kube.watched import LIST_PAGE

ZONE_LABEL = "topology.kubernetes.io/zone"
VERIFY_IMAGE_ENV = "PROXYMODE_VERIFY_IMAGE"
"""The image of the verification Job: the chart sets it to the operator's own."""
CNI_DAEMON_SETS = {
    "calico-node": "calico",
    "cilium": "cilium",
    "anetd": "cilium",  # GKE Dataplane V2 runs Cilium as anetd
    "kube-flannel-ds": "flannel",
    "kube-flannel": "flannel",
    "weave-net": "weave",
    "aws-node": "aws-vpc-cni",
    "kube-router": "kube-router",
    "antrea-agent": "antrea",
    "canal": "canal",
}


def _raw(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
    """Call a typed API method but keep the JSON as the server sent it; None on 404."""
    try:
        response = call(*args, _preload_content=False, **kwargs)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    data: dict[str, Any] = json.loads(response.data)
    return data


def _items(call: Any, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """A list's items, read in pages of ``LIST_PAGE`` (one consistent snapshot): a caller that
    reduces each item as it comes never holds a 5,000-pod list's JSON and objects at once."""
    token = ""
    while True:
        page = {"limit": LIST_PAGE, **({"_continue": token} if token else {})}
        data = _raw(call, *args, **page, **kwargs) or {}
        yield from data.get("items") or []
        token = (data.get("metadata") or {}).get("continue") or ""
        if not token:
            return


def _time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _ready(obj: Object) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _ready_since(obj: Object) -> datetime | None:
    return next(
        (
            _time(c.get("lastTransitionTime"))
            for c in (obj.get("status") or {}).get("conditions") or []
            if c.get("type") == "Ready" and c.get("status") == "True"
        ),
        None,
    )


def node_view(node: Object) -> NodeView:
    meta = node["metadata"]
    info = (node.get("status") or {}).get("nodeInfo") or {}
    labels = meta.get("labels") or {}
    return NodeView(
        name=meta["name"],
        labels=labels,
        ready=_ready(node),
        kernel=info.get("kernelVersion", ""),
        os_image=info.get("osImage", ""),
        container_runtime=info.get("containerRuntimeVersion", ""),
        kubelet_version=info.get("kubeletVersion", ""),
        zone=labels.get(ZONE_LABEL, ""),
        deleting=bool(meta.get("deletionTimestamp")),
        ready_since=_ready_since(node),
    )


def proxy_pod(pod: Object, kind: ProxyKind) -> ProxyPod:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return ProxyPod(
        name=pod["metadata"]["name"],
        node=(pod.get("spec") or {}).get("nodeName", ""),
        kind=kind,
        ready=_ready(pod),
        restarts=sum(int(c.get("restartCount", 0)) for c in statuses),
        terminating=bool(pod["metadata"].get("deletionTimestamp")),
        created=_time(pod["metadata"].get("creationTimestamp")),
        ready_changed=_ready_changed(pod),
        config_hash=(pod["metadata"].get("annotations") or {}).get(CONFIG_HASH_ANNOTATION),
        template_generation=_int(
            (pod["metadata"].get("labels") or {}).get(TEMPLATE_GENERATION_LABEL)
        ),
        last_terminated=_time(last_terminated(pod.get("status") or {})),
    )


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _ready_changed(obj: Object) -> datetime | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return _time(c.get("lastTransitionTime"))
    return None


def _from_record(record: PodRecord, kind: ProxyKind) -> ProxyPod:
    return ProxyPod(
        name=record.name,
        node=record.node,
        kind=kind,
        ready=record.ready,
        restarts=record.restarts,
        terminating=record.terminating,
        created=_time(record.created),
        ready_changed=_time(record.ready_changed),
        config_hash=record.config_hash,
        template_generation=_int(record.template_generation),
        last_terminated=_time(record.last_terminated),
    )


class Observer:
    """Takes ``Observed`` snapshots for policies through one API client.

    With a ``ClusterCache`` (the operator), nodes, kube-proxy pods, Jobs, DaemonSets and
    ConfigMaps come from its watches and a look lists and GETs none of them in steady state;
    without one (tests, tools), each look lists and reads them.
    """

    def __init__(self, api: client.ApiClient, cache: ClusterCache | None = None) -> None:
        self.api = api
        self.cache = cache
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.discovery = client.DiscoveryV1Api(api)

    def observe(
        self,
        policy: ProxyModePolicy,
        *,
        deleting: bool = False,
        analysis: AnalysisRound | None = None,
        now: datetime | None = None,
    ) -> Observed:
        ref = policy.spec.kube_proxy
        ns = ref.namespace
        name = str(policy.metadata.get("name", ""))
        reads = objects_of(policy)
        source_ds = self._object(reads.source_daemon_set)
        target_ds = self._object(reads.target_daemon_set)
        nodes = tuple(
            self.cache.nodes()
            if self.cache is not None
            else (node_view(n) for n in _items(self.core.list_node))
        )
        backup = self._object(reads.backup)
        annotations = policy.metadata.get("annotations") or {}
        return Observed(
            now=now or datetime.now(UTC),
            generation=int(policy.metadata.get("generation", 0)),
            nodes=nodes,
            pods=self._pods(ns, source_ds, target_ds),
            source_daemon_set=source_ds,
            source_config_map=self._object(reads.source_config_map),
            target_daemon_set=target_ds,
            target_config_map=self._object(reads.target_config_map),
            backup=(backup or {}).get("data") if backup is not None else None,
            jobs=self._jobs(ns, name),
            facts=self._facts(policy)
            if policy.status.phase in PREFLIGHT_OBSERVED
            else ClusterFacts(),
            analysis=analysis,
            action=annotations.get(ACTION_ANNOTATION),
            deleting=deleting,
            verify_image=os.environ.get(VERIFY_IMAGE_ENV, ""),
            service_ips=self._verify_service(policy),
        )

    def _object(self, key: Key) -> Object | None:
        """A DaemonSet or ConfigMap: from the cache's watches, or (no cache) a GET."""
        if self.cache is not None:
            return self.cache.objects.get(*key)
        return read_object(self.api, key)

    def _verify_service(self, policy: ProxyModePolicy) -> dict[str, str]:
        """The ClusterIP of ``spec.verify.service`` (one GET; nothing when verify is off)."""
        verify = policy.spec.verify
        if not verify.enabled:
            return {}
        key = verify.service.rsplit(":", 1)[0]
        namespace, _, service = key.partition("/")
        try:
            body = _raw(self.core.read_namespaced_service, service, namespace)
        except ApiException as e:
            if e.status == 404:
                return {}
            # Not "it does not exist": preflight would refuse the run on a passing 500. The
            # look fails, nothing is acted on, and the next one reads it again (a 403 is the
            # refused-read path's, which says what access is missing).
            raise
        ip = str(((body or {}).get("spec") or {}).get("clusterIP") or "")
        return {key: ip} if ip and ip != "None" else {}

    def _list(self, call: Any, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return list(_items(call, *args, **kwargs))

    def _pods(self, ns: str, source: Object | None, target: Object | None) -> tuple[ProxyPod, ...]:
        owners: dict[str, ProxyKind] = {}
        selectors = []
        for ds, kind in ((source, ProxyKind.SOURCE), (target, ProxyKind.TARGET)):
            if ds is None:
                continue
            owners[ds["metadata"]["uid"]] = kind
            match = ds["spec"]["selector"].get("matchLabels") or {}
            selectors.append(",".join(f"{k}={v}" for k, v in sorted(match.items())))
        pods: dict[str, ProxyPod] = {}
        if self.cache is not None:
            # The controller's uid decides which proxy a pod belongs to; the selector only
            # narrowed the list, and there is no list here.
            for record in self.cache.pods(ns):
                owner = owners.get(record.owner_uid)
                if owner is not None:
                    pods[record.name] = _from_record(record, owner)
            return tuple(pods.values())
        for selector in selectors:
            for pod in _items(self.core.list_namespaced_pod, ns, label_selector=selector):
                for ref in pod["metadata"].get("ownerReferences") or []:
                    owner = owners.get(ref.get("uid", ""))
                    if owner is not None and ref.get("controller"):
                        pods[pod["metadata"]["name"]] = proxy_pod(pod, owner)
        return tuple(pods.values())

    def _jobs(self, ns: str, policy: str) -> tuple[CleanupJobView, ...]:
        if self.cache is not None:
            # A verification's report is its pod's termination message: the pod cache holds
            # every pod of the namespace, the Job's among them.
            # The Job watch and the pod watch are separate streams: a Job may show Complete
            # before its pod's terminated status (the report) is in the cache. Until then it
            # is not taken as finished; the pod's update wakes the daemon.
            pods = [r for r in self.cache.pods(ns) if r.job]
            reports = {r.job: r.message for r in pods if r.message}
            running = {r.job for r in pods if not r.finished}
            out = []
            for seen in self.cache.jobs(ns, policy):
                view = seen
                if view.kind is JobKind.VERIFY and not view.message:
                    view = replace(view, message=reports.get(view.name, ""))
                    if (
                        not view.message
                        and view.name in running
                        and (view.succeeded or view.failed)
                    ):
                        view = replace(view, succeeded=False, failed=False)
                out.append(view)
            return tuple(out)
        out = []
        jobs = self._list(
            self.batch.list_namespaced_job, ns, label_selector=f"{POLICY_LABEL}={policy}"
        )
        verify = JOB_KIND_LABEL + "=" + JobKind.VERIFY.value
        finished = any(
            (j["metadata"].get("labels") or {}).get(JOB_KIND_LABEL) == JobKind.VERIFY.value
            and (j.get("status") or {}).get("conditions")
            for j in jobs
        )
        messages = self._job_messages(ns, f"{POLICY_LABEL}={policy},{verify}") if finished else {}
        for job in jobs:
            conditions = {
                c.get("type"): c.get("status")
                for c in (job.get("status") or {}).get("conditions") or []
            }
            labels = job["metadata"].get("labels") or {}
            kind = labels.get(JOB_KIND_LABEL, JobKind.CLEANUP.value)
            out.append(
                CleanupJobView(
                    name=job["metadata"]["name"],
                    node=job_node(job["metadata"]),
                    succeeded=conditions.get("Complete") == "True",
                    failed=conditions.get("Failed") == "True",
                    created=_time(job["metadata"].get("creationTimestamp")),
                    kind=JobKind(kind) if kind in set(JobKind) else JobKind.CLEANUP,
                    message=messages.get(job["metadata"]["name"], ""),
                )
            )
        return tuple(out)

    def _job_messages(self, ns: str, selector: str) -> dict[str, str]:
        """Each verification Job's report: its finished pod's termination message."""
        messages: dict[str, str] = {}
        for pod in self._list(self.core.list_namespaced_pod, ns, label_selector=selector):
            job = (pod["metadata"].get("labels") or {}).get("job-name") or ""
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                message = ((cs.get("state") or {}).get("terminated") or {}).get("message")
                if job and message:
                    messages[job] = str(message)
        return messages

    def _count(self, call: Any) -> int | None:
        try:
            data = _raw(call, limit=1)
        except ApiException:
            return None
        if data is None:
            return None
        remaining = int((data.get("metadata") or {}).get("remainingItemCount") or 0)
        return len(data.get("items") or []) + remaining

    def _facts(self, policy: ProxyModePolicy) -> ClusterFacts:
        version = client.VersionApi(self.api).get_code().git_version
        ref = policy.spec.kube_proxy
        daemon_sets = self._list(self.apps.list_daemon_set_for_all_namespaces)
        cni = sorted(
            {
                CNI_DAEMON_SETS[d["metadata"]["name"]]
                for d in daemon_sets
                if d["metadata"]["name"] in CNI_DAEMON_SETS
            }
        )
        # Static kube-proxy pods show as mirror pods. From the pod cache where there is one
        # (it holds the namespace anyway); a list of kube-proxy's namespace is a pod a node
        # (at 5,000 nodes, read whole, it was the operator's peak memory).
        prefix = f"{ref.daemon_set}-"
        if self.cache is not None:
            static = [r.name for r in self.cache.pods(ref.namespace) if r.mirror]
        else:
            static = [
                p["metadata"]["name"]
                for p in _items(self.core.list_namespaced_pod, ref.namespace)
                if MIRROR_ANNOTATION in (p["metadata"].get("annotations") or {})
            ]
        static = sorted(name for name in static if name.startswith(prefix))
        return ClusterFacts(
            kubernetes_version=version,
            services=self._count(self.core.list_service_for_all_namespaces),
            endpoint_slices=self._count(self.discovery.list_endpoint_slice_for_all_namespaces),
            cni=", ".join(cni) if cni else None,
            static_kube_proxy_pods=tuple(static),
            other_policies=tuple(self._rivals(policy)),
            pending_policies=tuple(self._pending(policy)),
        )

    def _pending(self, policy: ProxyModePolicy) -> list[tuple[str, str]]:
        """Other policies on the same source DaemonSet not started yet, for the tie-break."""
        mine = str(policy.metadata.get("name", ""))
        data = _raw(
            self.custom.list_cluster_custom_object, models.GROUP, models.VERSION, models.PLURAL
        )
        out = []
        for item in (data or {}).get("items", []):
            meta = item.get("metadata") or {}
            spec = item.get("spec") or {}
            ref = spec.get("kubeProxy") or {}
            same = (ref.get("namespace", "kube-system"), ref.get("daemonSet", "kube-proxy")) == (
                policy.spec.kube_proxy.namespace,
                policy.spec.kube_proxy.daemon_set,
            )
            phase = (item.get("status") or {}).get("phase") or Phase.PENDING
            waiting = phase == Phase.PENDING and not spec.get("paused")
            if meta.get("name") != mine and same and waiting and not meta.get("deletionTimestamp"):
                out.append((str(meta.get("creationTimestamp") or ""), str(meta["name"])))
        return out

    def _rivals(self, policy: ProxyModePolicy) -> list[str]:
        """Other policies that drive the same source DaemonSet and have not finished."""
        mine = str(policy.metadata.get("name", ""))
        data = _raw(
            self.custom.list_cluster_custom_object, models.GROUP, models.VERSION, models.PLURAL
        )
        out = []
        for item in (data or {}).get("items", []):
            name = item["metadata"]["name"]
            spec = item.get("spec") or {}
            status = item.get("status") or {}
            ref = spec.get("kubeProxy") or {}
            same = (ref.get("namespace", "kube-system"), ref.get("daemonSet", "kube-proxy")) == (
                policy.spec.kube_proxy.namespace,
                policy.spec.kube_proxy.daemon_set,
            )
            active = status.get("phase") in ({p.value for p in models.IN_FLIGHT_PHASES}) or (
                status.get("phase") == Phase.COMPLETED and status.get("finalized") is False
            )
            if name != mine and same and active:
                out.append(name)
        return out
