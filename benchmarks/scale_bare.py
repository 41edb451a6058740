"""The floor at scale: the operator's walk done by hand, same stages, same parallelism.

A sliding window of ``maxUnavailable`` nodes, as the operator's budget: a node enters the
window labelled ``switching``, is labelled ``<target>`` once its source pod is gone, and
leaves it once a target pod is Ready on it; a stage starts when the one before has every
node done. The fold back runs the same window over every node (``switching`` until the
target pod is gone, then unlabelled until a source pod is Ready), after the source
ConfigMap got the target configuration. Then the source's update strategy comes back (the
template keeps the exclusion term, as the operator's default ``KeepExclusionTerm``: no
rolling restart) and the target pair goes. Every wait is on one pod watch (``PodIndex``).
"""

from __future__ import annotations

import copy
import json
import math
import resource
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

from benchmarks.walk import install_target_pair
from proxymode.engine import naming
from proxymode.engine.observed import MODE_LABEL, SWITCHING
from proxymode.kubeproxy.config import render_target_config
from proxymode.kubeproxy.schema import parse_config


class PodIndex:
    """The kube-proxy pods of one namespace by node, kept by one watch (raw JSON)."""

    def __init__(self, core: client.CoreV1Api, namespace: str, target_ds: str) -> None:
        self.core, self.namespace, self.prefix = core, namespace, f"{target_ds}-"
        self.cond = threading.Condition()
        self.pods: dict[str, tuple[str, bool, bool, bool]] = {}
        """name -> (node, is target, ready, terminating)"""
        self.by_node: dict[str, set[str]] = {}
        self.version = 0
        self.created = 0
        """Pods first seen after the first list (the walk's new kube-proxies)."""
        self._listed = False
        self._seen: set[str] = set()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        with self.cond:
            self.cond.wait_for(lambda: self.version > 0 or self.error is not None, timeout=120)

    def stop(self) -> None:
        self._halt.set()

    def _put(self, pod: dict[str, Any], deleted: bool) -> None:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        name, node = meta["name"], spec.get("nodeName") or ""
        old = self.pods.pop(name, None)
        if old:
            self.by_node.get(old[0], set()).discard(name)
        if deleted:
            return
        if old is None and self._listed and name not in self._seen:
            self.created += 1
        self._seen.add(name)
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        self.pods[name] = (node, name.startswith(self.prefix), ready, "deletionTimestamp" in meta)
        self.by_node.setdefault(node, set()).add(name)

    def _run(self) -> None:
        try:
            while not self._halt.is_set():
                listed = json.loads(
                    self.core.list_namespaced_pod(self.namespace, _preload_content=False).data
                )
                with self.cond:
                    self.pods.clear()
                    self.by_node.clear()
                    for pod in listed["items"]:
                        self._put(pod, False)
                    self._listed = True
                    self.version += 1
                    self.cond.notify_all()
                self._watch(listed["metadata"]["resourceVersion"])
        except BaseException as e:  # surfaced to the waiter
            with self.cond:
                self.error = e
                self.cond.notify_all()

    def _watch(self, rv: str) -> None:
        while not self._halt.is_set():
            resp = self.core.list_namespaced_pod(
                self.namespace,
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=60,
                _preload_content=False,
            )
            for line in iter_resp_lines(resp):
                event = json.loads(line)
                if event["type"] == "ERROR":
                    return  # expired: list again
                rv = event["object"]["metadata"]["resourceVersion"]
                if event["type"] == "BOOKMARK":
                    continue
                with self.cond:
                    self._put(event["object"], event["type"] == "DELETED")
                    self.version += 1
                    self.cond.notify_all()

    def _on(self, node: str) -> list[tuple[str, bool, bool, bool]]:
        return [self.pods[n] for n in self.by_node.get(node, ())]

    def source_gone(self, node: str) -> bool:
        return not [p for p in self._on(node) if not p[1]]

    def target_gone(self, node: str) -> bool:
        return not [p for p in self._on(node) if p[1]]

    def target_ready(self, node: str) -> bool:
        return any(p[1] and p[2] and not p[3] for p in self._on(node))

    def source_ready(self, node: str) -> bool:
        return any(not p[1] and p[2] and not p[3] for p in self._on(node))

    def wait(self, done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not done():
                if self.error is not None:
                    raise RuntimeError("the pod watch failed") from self.error
                if time.monotonic() > deadline:
                    raise TimeoutError("the pods never got there")
                self.cond.wait(timeout=1.0)


Step = tuple[str | None, str]
"""(the label a node gets, the PodIndex predicate that ends this step)"""


def window(
    core: client.CoreV1Api,
    *,
    pods: PodIndex,
    nodes: Sequence[str],
    budget: int,
    steps: Sequence[Step],
    timeout: float = 1800,
    latencies: dict[str, list[float]] | None = None,
) -> None:
    """Every node through ``steps``, at most ``budget`` of them in flight at once;
    each step's seconds from its label patch to its predicate into ``latencies``."""
    pending, active = deque(nodes), {}  # node -> index of its step
    since: dict[str, float] = {}
    latencies = {} if latencies is None else latencies
    deadline = time.monotonic() + timeout

    def label(node: str, value: str | None) -> None:
        core.patch_node(node, {"metadata": {"labels": {MODE_LABEL: value}}})

    while pending or active:
        patches: list[tuple[str, str | None]] = []
        with pods.cond:
            if pods.error is not None:
                raise RuntimeError("the pod watch failed") from pods.error
            seen = pods.version
            for node, i in list(active.items()):
                if getattr(pods, steps[i][1])(node):
                    latencies.setdefault(steps[i][1], []).append(time.monotonic() - since[node])
                    if i + 1 < len(steps):
                        active[node] = i + 1
                        patches.append((node, steps[i + 1][0]))
                    else:
                        del active[node]
            while pending and len(active) < budget:
                node = pending.popleft()
                active[node] = 0
                patches.append((node, steps[0][0]))
            if not patches and active:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"stuck: {dict(list(active.items())[:5])}")
                pods.cond.wait_for(lambda s=seen: pods.version != s, timeout=1.0)
        for node, value in patches:
            label(node, value)
            since[node] = time.monotonic()


def stage_sizes(total: int, percents: Sequence[int]) -> list[int]:
    """How many new nodes each cumulative percent stage takes (as the planner: round up)."""
    sizes, planned = [], 0
    for p in percents:
        want = max(0, math.ceil(p * total / 100) - planned)
        sizes.append(want)
        planned += want
    return sizes


def bare_walk(
    api: client.ApiClient, ns: str, mode: str, sizes: Sequence[int], max_unavailable: int
) -> dict[str, Any]:
    """The walk by hand: forward and whole-run seconds, and this process's CPU seconds."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    target_ds_name = naming.target_daemon_set("kube-proxy", mode)
    target_cm_name = naming.target_config_map("kube-proxy", mode)
    nodes = sorted(
        n["metadata"]["name"]
        for n in json.loads(core.list_node(_preload_content=False).data)["items"]
    )
    budget = max(1, math.ceil(max_unavailable * len(nodes) / 100))
    cpu0 = _cpu()
    started = time.monotonic()
    pods = PodIndex(core, ns, target_ds_name)
    pods.start()
    source = api.sanitize_for_serialization(apps.read_namespaced_daemon_set("kube-proxy", ns))
    source_cm = api.sanitize_for_serialization(core.read_namespaced_config_map("kube-proxy", ns))
    original_strategy = copy.deepcopy(source["spec"]["updateStrategy"])
    text = render_target_config(parse_config(source_cm["data"]["config.conf"]), mode).text
    install_target_pair(core, apps, ns, (source, source_cm), text=text, mode=mode)
    forward_steps: list[Step] = [(SWITCHING, "source_gone"), (mode, "target_ready")]
    at, lat = 0, {}
    for size in sizes:
        stage = nodes[at : at + size]
        window(core, pods=pods, nodes=stage, budget=budget, steps=forward_steps, latencies=lat)
        at += size
    forward = time.monotonic() - started
    core.patch_namespaced_config_map("kube-proxy", ns, {"data": {"config.conf": text}})
    back: list[Step] = [(SWITCHING, "target_gone"), (None, "source_ready")]
    window(core, pods=pods, nodes=nodes, budget=budget, steps=back, latencies=lat)
    apps.patch_namespaced_daemon_set(
        "kube-proxy", ns, {"spec": {"updateStrategy": original_strategy}}
    )
    apps.delete_namespaced_daemon_set(target_ds_name, ns)
    core.delete_namespaced_config_map(target_cm_name, ns)
    whole = time.monotonic() - started
    pods.stop()
    steps = {k: round(statistics.median(v), 2) for k, v in lat.items()}
    return {
        "forward": forward,
        "whole": whole,
        "cpu": _cpu() - cpu0,
        "pods_created": pods.created,
        "step_median_s": steps,
    }


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
