"""Watch-fed, informer-style caches of what every look reads: nodes, kube-proxy pods, Jobs.

A look used to list every node and every kube-proxy pod (at 5,000 nodes, two full lists
and their JSON decoding: seconds per look). Here each kind is listed once (a cold start),
then kept current by a watch from that list's resourceVersion; a watch that expires (410)
or breaks lists again. Only the fields the engine needs are kept (``NodeView``, a reduced
pod, ``CleanupJobView``), so memory grows by a few hundred bytes per node.

A change that the engine could act on (a node's labels or readiness, a pod's readiness,
restarts or deletion, a Job's completion; not a node's heartbeat) calls ``on_change``,
which wakes the daemons. Pods and Jobs are watched per namespace (the chart grants them
only in kube-proxy's namespaces), started the first time a policy there is observed.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from proxymode.engine.objects import job_node
from proxymode.engine.observed import (
    JOB_KIND_LABEL,
    MANAGED_BY,
    POLICY_LABEL,
    CleanupJobView,
    JobKind,
    NodeView,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
WATCH_SECONDS = 240
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


def _backoff(failures: int) -> float:
    """Seconds before listing again after ``failures`` broken watches in a row: 1, 2, 4 … 30."""
    return float(min(30, 2 ** max(0, failures - 1)))


class Watched(Generic[T]):
    """One kind kept current by list-then-watch; ``items`` maps a name to its reduced form."""

    def __init__(
        self,
        what: str,
        call: Callable[..., Any],
        reduce: Callable[[Mapping[str, Any]], T],
        on_change: Callable[[], None],
        *args: Any,
        **kwargs: Any,
    ) -> None:
        self.what = what
        self._call, self._args, self._kwargs = call, args, kwargs
        self._reduce = reduce
        self._on_change = on_change
        self._lock = threading.Lock()
        self._items: dict[str, T] = {}
        self._version = ""
        self._closed = threading.Event()
        self._response: Any = None
        self.lists = 0
        self.watches = 0
        self.events = 0
        self._relist()  # a cold start lists once, before the first look reads
        self._thread = threading.Thread(target=self._run, name=f"watch-{what}", daemon=True)
        self._thread.start()

    def items(self) -> list[T]:
        with self._lock:
            return list(self._items.values())

    def _relist(self) -> None:
        response = self._call(*self._args, _preload_content=False, **self._kwargs)
        data = json.loads(response.data)
        self.lists += 1
        fresh = {i["metadata"]["name"]: self._reduce(i) for i in data.get("items") or []}
        with self._lock:
            changed = fresh != self._items
            self._items = fresh
            self._version = (data.get("metadata") or {}).get("resourceVersion", "")
        if changed and self.lists > 1:
            self._on_change()

    def _run(self) -> None:
        failures = 0
        while not self._closed.is_set():
            try:
                self._watch()
                failures = 0
            except ApiException as e:
                if self._closed.is_set():
                    return
                if e.status == 410:  # too old to resume from: list again at once
                    failures = 0
                    log.info("watch of %s expired; listing again", self.what)
                else:
                    # A refusal (a 403: a watch verb missing from the RBAC) fails again at
                    # once: without a pause this thread spins, list after refused watch,
                    # and starves the looks it feeds. The looks still list as a fallback.
                    failures += 1
                    log.warning(
                        "watch of %s refused (%s %s); listing again in %.0fs",
                        self.what,
                        e.status,
                        e.reason,
                        _backoff(failures),
                    )
                    self._closed.wait(_backoff(failures))
                self._safe_relist()
            except Exception as e:  # a broken connection: list again, then watch on
                if self._closed.is_set():
                    return
                failures += 1
                log.info("watch of %s broke (%s); listing again", self.what, e)
                self._closed.wait(_backoff(failures))
                self._safe_relist()

    def _safe_relist(self) -> None:
        try:
            self._relist()
        except Exception as e:
            log.warning("listing %s failed: %s", self.what, e)
            self._closed.wait(2)

    def _watch(self) -> None:
        self.watches += 1
        self._response = self._call(
            *self._args,
            watch=True,
            resource_version=self._version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
            **self._kwargs,
        )
        try:
            for line in iter_resp_lines(self._response):
                if self._closed.is_set():
                    return
                self._apply(json.loads(line))
        finally:
            self._response.release_conn()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:  # too old: list again from now
                self._relist()
                return
            raise RuntimeError(f"watch error: {obj.get('message', obj)}")
        meta = obj.get("metadata") or {}
        with self._lock:
            if meta.get("resourceVersion"):
                self._version = meta["resourceVersion"]
            if kind == "BOOKMARK":
                return
            self.events += 1
            name = meta["name"]
            before = self._items.get(name)
            if kind == "DELETED":
                self._items.pop(name, None)
                changed = before is not None
            else:
                after = self._reduce(obj)
                self._items[name] = after
                changed = after != before
        if changed:
            self._on_change()

    def close(self) -> None:
        self._closed.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception:  # older urllib3 has no shutdown; the server timeout ends it
                log.debug("could not interrupt the %s watch", self.what)
        self._thread.join(timeout=5)


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
            nodes = [self._nodes] if self._nodes is not None else []
            return [*nodes, *self._pods.values(), *self._jobs.values()]

    def requests(self) -> dict[str, int]:
        """Lists and watches opened so far, and events received (for benchmarks)."""
        out = {"lists": 0, "watches": 0, "events": 0}
        for w in self.all():
            out["lists"] += w.lists
            out["watches"] += w.watches
            out["events"] += w.events
        return out

    def close(self) -> None:
        for watched in self.all():
            watched.close()
