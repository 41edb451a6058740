"""Watch-fed, informer-style caches of what every look reads: nodes, kube-proxy pods, Jobs
(and, through ``kube.object_cache``, kube-proxy's DaemonSets and ConfigMaps).

A look used to list every node and every kube-proxy pod (at 5,000 nodes, two full lists
and their JSON decoding: seconds per look). Here each kind is listed once (a cold start),
then kept current by a watch from that list's resourceVersion; a watch that expires (410)
or breaks lists again (``kube.watched``). Only the fields the engine needs are kept
(``NodeView``, a reduced pod, ``CleanupJobView``), so memory grows by a few hundred bytes
per node.

The node labels the operator writes are read back fresh: a node it wrote (or tried to) is
*unsettled*, and looks read it with a GET until the node watch holds the resourceVersion
that GET shows (``unsettle_nodes``), as ``kube.object_cache`` does for DaemonSets and
ConfigMaps. A look that saw a node's label from before its own write would wait on the
wrong step (a forward move whose node it still saw at ``switching`` takes the new
kube-proxy for the old one that must go first). Versions, not values, settle a node: a
label that went back to an earlier value (switching, then rolled back) would match a
watch still behind the first write.

A write that went through needs no GET: the PATCH answers with the node as stored, and
that copy is served until the node watch has got as far as its resourceVersion
(``wrote_node``; versions compare, KEP-5504). At 5,000 nodes the GETs were one per label
change (20,000 over a walk), inside the looks. A refused or failed write still unsettles
the node.

A change that the engine could act on (a node's labels or readiness, a pod's readiness,
restarts or deletion, a Job's completion; not a node's heartbeat) calls ``on_change``,
which wakes the daemons. Pods and Jobs are watched per namespace (the chart grants them
only in kube-proxy's namespaces), started the first time a policy there is observed.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode.engine.objects import job_node
from proxymode.engine.observed import (
    CONFIG_HASH_ANNOTATION,
    JOB_KIND_LABEL,
    MANAGED_BY,
    POLICY_LABEL,
    CleanupJobView,
    JobKind,
    NodeView,
)
from proxymode.kube.object_cache import ObjectCache
from proxymode.kube.watched import Watched, comparable

log = logging.getLogger(__name__)
MANAGED_SELECTOR = f"app.kubernetes.io/managed-by={MANAGED_BY}"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
TEMPLATE_GENERATION_LABEL = "pod-template-generation"
"""What the DaemonSet controller labels each pod with: its template's generation."""
"""What a kubelet puts on the API's copy of a static pod."""
NODE_READERS = 8
"""Unsettled nodes read side by side, as ``kube.execute.LABEL_WRITERS`` writes them."""


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
    mirror: bool = False
    """A static pod's mirror (``kubernetes.io/config.mirror``): preflight names them."""
    config_hash: str | None = None
    """The pod's ``proxymode.io/config-hash`` annotation (which target template made it)."""
    template_generation: str | None = None
    """The pod's ``pod-template-generation`` label (which DaemonSet template made it)."""
    last_terminated: str | None = None
    """The latest ``lastState.terminated.finishedAt`` of its containers, as the API sent it."""


@dataclass(frozen=True)
class JobRecord:
    policy: str
    view: CleanupJobView


def last_terminated(status: Mapping[str, Any]) -> str | None:
    """The latest ``lastState.terminated.finishedAt`` of a pod's containers (RFC 3339 text
    of one format compares as time), or None."""
    ends = [
        str(t["finishedAt"])
        for c in status.get("containerStatuses") or []
        if (t := ((c.get("lastState") or {}).get("terminated") or {})).get("finishedAt")
    ]
    return max(ends) if ends else None


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
        mirror=MIRROR_ANNOTATION in (meta.get("annotations") or {}),
        config_hash=(meta.get("annotations") or {}).get(CONFIG_HASH_ANNOTATION),
        template_generation=(meta.get("labels") or {}).get(TEMPLATE_GENERATION_LABEL),
        last_terminated=last_terminated(status),
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
        self._unsettled: dict[str, int] = {}
        """Nodes whose ``proxymode.io/mode`` the operator wrote (or tried to), by mark."""
        self._written: dict[str, tuple[NodeView, str]] = {}
        """Nodes the operator wrote, as the write's answer showed them, and that version."""
        self._marks = 0
        self.node_gets = 0
        """GETs of nodes written and not yet settled (benchmarks)."""

    def unsettle_nodes(self, names: Iterable[str]) -> None:
        """The operator wrote these nodes' mode label (or tried to): ``nodes`` reads each with
        a GET until the node watch holds the version that GET shows.

        Called after the writes, not before: a GET in between would find the version
        before the write and settle the node too early."""
        with self._lock:
            for name in names:
                self._marks += 1
                self._unsettled[name] = self._marks
                self._written.pop(name, None)

    def wrote_node(self, node: Mapping[str, Any]) -> None:
        """A label change went through and the server answered with ``node``: looks take
        this copy, with no GET, until the node watch has got as far as its version."""
        meta = node.get("metadata") or {}
        name, version = str(meta.get("name")), str(meta.get("resourceVersion") or "")
        if not comparable(version):
            self.unsettle_nodes([name])  # an API server whose versions do not compare
            return
        view = self._node_view(node)
        with self._lock:
            self._unsettled.pop(name, None)
            self._written[name] = (view, version)

    def nodes(self) -> list[NodeView]:
        with self._lock:
            if self._nodes is None:
                self._nodes = Watched("nodes", self.core.list_node, self._node_view, self.on_change)
            watched = self._nodes
            pending = dict(self._unsettled)
            written = dict(self._written)
        # Which written copies the watch has caught up with, asked before its items are
        # taken: the items are then at least that new.
        caught_up = {n for n, (_copy, wrote) in written.items() if watched.seen(wrote)}
        views = watched.items()
        if not pending and not written:
            return views
        by_name = {v.name: v for v in views}
        for name, (copy, wrote) in written.items():
            if name not in caught_up:
                by_name[name] = copy
                continue
            with self._lock:
                kept = self._written.get(name)
                if kept is not None and kept[1] == wrote:
                    del self._written[name]
        for name, mark, answer in self._read_nodes(pending) if pending else []:
            if not isinstance(answer, Exception):
                read = answer
            else:
                # Once more; then the look fails (and is tried again) rather than hand on
                # the held copy, which is the state before the write (as ``object_cache``).
                log.warning("could not read node %s again, retrying: %s", name, answer)
                read = self._read_node(name)
            view, version = read
            if version == watched.version(name):
                # The watch holds what the server has (both absent, or the same version):
                # back to the cache, unless another write came after this GET was sent.
                with self._lock:
                    if self._unsettled.get(name) == mark:
                        del self._unsettled[name]
            if view is None:
                by_name.pop(name, None)
            else:
                by_name[name] = view
        return list(by_name.values())

    def _read_nodes(
        self, pending: Mapping[str, int]
    ) -> list[tuple[str, int, tuple[NodeView | None, str | None] | Exception]]:
        """GET each node, ``NODE_READERS`` at a time: a batch writes up to a tenth of a big
        cluster's nodes, and one after another they would add a round trip each to a look."""

        def read(name: str) -> tuple[NodeView | None, str | None] | Exception:
            try:
                return self._read_node(name)
            except Exception as e:  # judged by the caller, per node
                return e

        names = list(pending)
        if len(names) == 1:
            results = [read(names[0])]
        else:
            with ThreadPoolExecutor(
                max_workers=min(NODE_READERS, len(names)), thread_name_prefix="node-reads"
            ) as pool:
                results = list(pool.map(read, names))
        return [(n, pending[n], r) for n, r in zip(names, results, strict=True)]

    def _read_node(self, name: str) -> tuple[NodeView | None, str | None]:
        """The node as the server has it, and its resourceVersion; (None, None) if absent."""
        with self._lock:
            self.node_gets += 1
        try:
            response = self.core.read_node(name, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None, None
            raise
        node = json.loads(response.data)  # type: ignore[attr-defined]
        return self._node_view(node), str(node["metadata"].get("resourceVersion"))

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
        out = {"lists": 0, "watches": 0, "events": 0, "gets": self.objects.gets + self.node_gets}
        for w in self.all():
            out["lists"] += w.lists
            out["watches"] += w.watches
            out["events"] += w.events
        return out

    def close(self) -> None:
        for watched in self.all():
            watched.close()
