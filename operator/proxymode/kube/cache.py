"""Watch-fed, informer-style caches of what every look reads: nodes, kube-proxy pods, Jobs
(and, through ``kube.object_cache``, kube-proxy's DaemonSets and ConfigMaps).

A look used to list every node and every kube-proxy pod (at 5,000 nodes, two full lists
and their JSON decoding: seconds per look). Here each kind is listed once (a cold start),
then kept current by a watch from that list's resourceVersion; a watch that expires (410)
or breaks lists again (``kube.watched``). Only the fields the engine needs are kept
(``NodeView``, a reduced pod, ``CleanupJobView``), so memory grows by a few hundred bytes
per node.

A change that the engine could act on (a node's labels or readiness, a pod's readiness,
restarts or deletion, a Job's completion; not a node's heartbeat) calls ``on_change``,
which wakes the daemons. Pods and Jobs are watched per namespace (the chart grants them
only in kube-proxy's namespaces), started the first time a policy there is observed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import client

from proxymode.engine.objects import job_node
from proxymode.engine.observed import (
    JOB_KIND_LABEL,
    MANAGED_BY,
    POLICY_LABEL,
    CleanupJobView,
    JobKind,
    NodeView,
)
from proxymode.kube.object_cache import ObjectCache
from proxymode.kube.watched import Watched

log = logging.getLogger(__name__)
MANAGED_SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"


@dataclass(frozen=True)
class PodRecord:
    """A pod as the engine needs it, plus its controller's uid (which proxy it belongs to)."""

    name: str
    node: str
    owner_uid: str
    ready: bool
    restarts: int
    terminating: bool
    created: str | None
    ready_changed: str | None = None
    """The Ready condition's ``lastTransitionTime``, as the API sent it."""
    job: str = ""
    """The Job a Job's pod belongs to (its ``job-name`` label); empty for other pods."""
    message: str = ""
    """A terminated container's termination message (a verification Job's report)."""
    finished: bool = False
    """The pod ran to its end (phase Succeeded or Failed, or a container terminated)."""


@dataclass(frozen=True)
class JobRecord:
    policy: str
    view: CleanupJobView


def pod_record(pod: Mapping[str, Any]) -> PodRecord:
    meta = pod["metadata"]
    status = pod.get("status") or {}
    ready: Mapping[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    owner = next(
        (r.get("uid", "") for r in meta.get("ownerReferences") or [] if r.get("controller")), ""
    )
    return PodRecord(
        name=meta["name"],
        node=(pod.get("spec") or {}).get("nodeName", "") or "",
        owner_uid=owner,
        ready=ready.get("status") == "True",
        restarts=sum(int(c.get("restartCount", 0)) for c in status.get("containerStatuses") or []),
        terminating=bool(meta.get("deletionTimestamp")),
        created=meta.get("creationTimestamp"),
        ready_changed=ready.get("lastTransitionTime"),
        job=(meta.get("labels") or {}).get("job-name", "") or "",
        finished=status.get("phase") in ("Succeeded", "Failed")
        or any(
            (c.get("state") or {}).get("terminated") for c in status.get("containerStatuses") or []
        ),
        message=next(
            (
                str(m)
                for c in status.get("containerStatuses") or []
                if (m := ((c.get("state") or {}).get("terminated") or {}).get("message"))
            ),
            "",
        ),
    )


def job_record(job: Mapping[str, Any]) -> JobRecord:
    meta = job["metadata"]
    labels = meta.get("labels") or {}
    conditions = {
        c.get("type"): c.get("status") for c in (job.get("status") or {}).get("conditions") or []
    }
    kind = labels.get(JOB_KIND_LABEL, JobKind.CLEANUP.value)
    return JobRecord(
        policy=labels.get(POLICY_LABEL, ""),
        view=CleanupJobView(
            name=meta["name"],
            node=job_node(meta),
            succeeded=conditions.get("Complete") == "True",
            failed=conditions.get("Failed") == "True",
            created=_time(meta.get("creationTimestamp")),
            kind=JobKind(kind) if kind in set(JobKind) else JobKind.CLEANUP,
        ),
    )


def _time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


class ClusterCache:
    """Nodes (cluster-wide), and kube-proxy pods and proxymode Jobs per namespace."""

    def __init__(self, api: client.ApiClient, on_change: Callable[[], None]) -> None:
        from proxymode.kube.observe import node_view  # noqa: PLC0415 - observe imports cache

        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.on_change = on_change
        self._lock = threading.Lock()
        self._node_view = node_view
        self._nodes: Watched[NodeView] | None = None
        self._pods: dict[str, Watched[PodRecord]] = {}
        self._jobs: dict[str, Watched[JobRecord]] = {}
        self.objects = ObjectCache(api, on_change)
        """kube-proxy's DaemonSets and ConfigMaps (``kube.object_cache``)."""

    def nodes(self) -> list[NodeView]:
        with self._lock:
            if self._nodes is None:
                self._nodes = Watched("nodes", self.core.list_node, self._node_view, self.on_change)
            watched = self._nodes
        return watched.items()

    def pods(self, namespace: str) -> list[PodRecord]:
        with self._lock:
            watched = self._pods.get(namespace)
            if watched is None:
                watched = self._pods[namespace] = Watched(
                    f"pods/{namespace}",
                    self.core.list_namespaced_pod,
                    pod_record,
                    self.on_change,
                    namespace,
                )
        return watched.items()

    def jobs(self, namespace: str, policy: str) -> list[CleanupJobView]:
        with self._lock:
            watched = self._jobs.get(namespace)
            if watched is None:
                watched = self._jobs[namespace] = Watched(
                    f"jobs/{namespace}",
                    self.batch.list_namespaced_job,
                    job_record,
                    self.on_change,
                    namespace,
                    label_selector=MANAGED_SELECTOR,
                )
        return [j.view for j in watched.items() if j.policy == policy]

    def all(self) -> list[Watched[Any]]:
        with self._lock:
            nodes: list[Watched[Any]] = [self._nodes] if self._nodes is not None else []
            kept = [*nodes, *self._pods.values(), *self._jobs.values()]
        return [*kept, *self.objects.all()]

    def requests(self) -> dict[str, int]:
        """Lists and watches opened so far, events received, and the GETs of unsettled
        objects (for benchmarks)."""
        out = {"lists": 0, "watches": 0, "events": 0, "gets": self.objects.gets}
        for w in self.all():
            out["lists"] += w.lists
            out["watches"] += w.watches
            out["events"] += w.events
        return out

    def close(self) -> None:
        for watched in self.all():
            watched.close()
