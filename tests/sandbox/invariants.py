"""The operator's promises, sampled against the API while migrations run under faults.

One ``Invariants`` thread serves every migration ("world") of a sandbox: each round it lists
the kube-proxy pods, the nodes, the DaemonSets and the ConfigMaps once, and checks for every
world

- never two kube-proxies on one of its nodes (a terminating pod still counts: it still runs);
- at most ``budget`` (maxUnavailable) of its nodes between proxies: labelled ``switching``,
  or with no kube-proxy pod at all;
- nothing outside the snapshot touched: its decoys (a second kube-proxy-like DaemonSet and
  ConfigMap beside the real ones, as kubeadm's Windows DaemonSet would be) keep their spec,
  data, labels and annotations; its source DaemonSet changes only in the fields the operator
  records (the template's node affinity and the update strategy) besides what the test
  itself changed as "a person" (``World.expect``);

and for the whole cluster: no node's own labels change (only ``proxymode.io/`` labels, and
those only on nodes some world migrates), and the sandbox's kube-system kube-proxy keeps its
spec and config. Rollback exactness is checked at the end of a case (``assert_exact``).

A round that the API does not answer (kube-apiserver or etcd restarting) is counted as
``missed``, never as a pass. Violations are kept with the time they were seen.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

MODE_PREFIX = "proxymode.io/"
MODE_LABEL = "proxymode.io/mode"
PROXY_PODS = "k8s-app=kube-proxy"
OPERATOR_FIELDS = ("updateStrategy",)
"""Source DaemonSet spec fields the operator may change (besides the template's affinity)."""


def comparable_source_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The source DaemonSet's spec without the fields the operator snapshots and changes."""
    out = copy.deepcopy(spec)
    for key in OPERATOR_FIELDS:
        out.pop(key, None)
    out.get("template", {}).get("spec", {}).pop("affinity", None)
    return out


def _identity(obj: dict[str, Any], body: str) -> tuple[Any, ...]:
    meta = obj.get("metadata", {})
    return (obj.get(body), meta.get("labels"), meta.get("annotations"))


@dataclass
class World:
    """One migration of the matrix: its kube-proxy's namespace, nodes and budget."""

    name: str
    namespace: str
    nodes: set[str]
    budget: int = 1
    source_spec: dict[str, Any] = field(default_factory=dict)
    """The source DaemonSet's spec as a person left it (``expect`` follows their edits)."""
    decoys: dict[tuple[str, str], tuple[Any, ...]] = field(default_factory=dict)
    samples: int = 0
    max_between: int = 0
    violations: list[str] = field(default_factory=list)

    editing: dict[str, Any] | None = None
    """The spec a person's edit in flight leaves (``edited``): until their write returns, a
    sample may show the source either way."""

    @contextmanager
    def edited(self, edit: Callable[[dict[str, Any]], None]) -> Iterator[None]:
        """A person changes the source DaemonSet inside this block: ``edit`` applies the same
        change to the spec the sampler expects (the operator must keep it, never revert it).
        While the write is in flight both specs are right; after it only the edited one."""
        spec = copy.deepcopy(self.source_spec)
        edit(spec)
        self.editing = spec
        try:
            yield
        finally:
            self.source_spec, self.editing = spec, None

    def accepted(self) -> list[dict[str, Any]]:
        """The source specs a sample may show now: the last one, and an edit's in flight."""
        return [self.source_spec] + ([self.editing] if self.editing is not None else [])

    def forget_node(self, node: str) -> None:
        """The test deleted ``node``: it no longer counts."""
        self.nodes.discard(node)


class Invariants(threading.Thread):
    """Samples every world's invariants a few times a second until ``stop``."""

    def __init__(self, api: client.ApiClient, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.core, self.apps = client.CoreV1Api(api), client.AppsV1Api(api)
        self.interval = interval
        self.worlds: dict[str, World] = {}
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.samples = 0
        self.missed = 0
        self.errors: list[str] = []
        self.pod_events = 0
        self.watch_restarts = 0
        self.doubles: set[tuple[str, str, frozenset[str]]] = set()
        """Samples that failed for another reason than the API being down (a test bug)."""
        self.violations: list[str] = []
        self.started = time.monotonic()
        self.node_labels: dict[str, dict[str, str]] = {}
        self.system: tuple[Any, ...] = ()

    # -- setup --

    def baseline(self) -> None:
        """What must not change: every node's own labels, kube-system's kube-proxy."""
        for node in self.core.list_node().items:
            self.node_labels[node.metadata.name] = _own_labels(node.metadata.labels)
        dss = {
            _key(d): d for d in _raw(self.apps.list_namespaced_daemon_set, "kube-system")["items"]
        }
        cms = {
            _key(c): c for c in _raw(self.core.list_namespaced_config_map, "kube-system")["items"]
        }
        self.system = self._system(dss, cms)

    def add(self, world: World) -> World:
        """Start checking ``world`` (its kube-proxy and decoys installed, see ``snapshot``)."""
        with self.lock:
            self.worlds[world.name] = world
        return world

    def remove(self, world: World) -> None:
        with self.lock:
            self.worlds.pop(world.name, None)

    def node_labelled(self, node: str, labels: dict[str, str | None]) -> None:
        """The test changed a node's own labels as a person would: expect them."""
        own = self.node_labels.setdefault(node, {})
        for key, value in labels.items():
            if key.startswith(MODE_PREFIX):
                continue
            if value is None:
                own.pop(key, None)
            else:
                own[key] = value

    # -- sampling --

    def forget_node(self, node: str) -> None:
        """The test deleted ``node`` (a node added again later is a new node)."""
        self.node_labels.pop(node, None)

    def run(self) -> None:
        pods = threading.Thread(target=self._watch_pods, daemon=True)
        pods.start()
        self._poll()
        pods.join(timeout=40)

    def _watch_pods(self) -> None:
        """ "Never two kube-proxies on a node" from a watch on the pods too: every ADDED and
        DELETED event in order, so a second pod that lives for less than a polling interval
        (a person's label edit makes both DaemonSets react within milliseconds) is still
        seen. A pod counts from its ADDED until its DELETED event (a terminating pod still
        runs). After an API outage the watch starts again from a fresh list."""
        while not self.halt.is_set():
            stream = watch.Watch()
            try:
                listed = _raw(self.core.list_pod_for_all_namespaces, label_selector=PROXY_PODS)
                where = {_key(p): p["spec"].get("nodeName") for p in listed["items"]}
                self._two_on_a_node(where)
                for event in stream.stream(
                    self.core.list_pod_for_all_namespaces,
                    label_selector=PROXY_PODS,
                    resource_version=listed["metadata"]["resourceVersion"],
                    timeout_seconds=30,
                ):
                    pod = event["object"]
                    key = (pod.metadata.namespace, pod.metadata.name)
                    if event["type"] == "DELETED":
                        where.pop(key, None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        where[key] = pod.spec.node_name
                    self.pod_events += 1
                    self._two_on_a_node(where)
                    if self.halt.is_set():
                        break
            except (ApiException, HTTPError, OSError):  # an outage under test: list again
                self.watch_restarts += 1
                self.halt.wait(0.5)
            except Exception as e:  # a bug here must not end the watch silently
                self.errors.append(f"pod watch: {e!r}")
                self.halt.wait(0.5)
            finally:
                stream.stop()

    def _two_on_a_node(self, where: dict[tuple[str, str], str | None]) -> None:
        with self.lock:
            worlds = list(self.worlds.values())
        for world in worlds:
            per_node: dict[str, list[str]] = {}
            for (namespace, name), node in where.items():
                if namespace == world.namespace and node in world.nodes:
                    per_node.setdefault(node, []).append(name)
            for node, names in per_node.items():
                seen = (world.name, node, frozenset(names))
                if len(names) > 1 and seen not in self.doubles:
                    self.doubles.add(seen)
                    found = f"two kube-proxies on {node} (pod watch): {sorted(names)}"
                    world.violations.append(found)
                    stamp = f"{time.monotonic() - self.started:.1f}s"
                    self.violations.append(f"[{stamp}] {world.name}: {found}")

    def _poll(self) -> None:
        while not self.halt.is_set():
            try:
                self.sample()
            except (ApiException, HTTPError, OSError):
                self.missed += 1  # the API is down (a restart under test): not a pass
            except Exception as e:  # a bug here must not end the sampling silently
                self.errors.append(repr(e))
            self.halt.wait(self.interval)

    def sample(self) -> None:
        """One consistent look: the nodes, then the pods, DaemonSets and ConfigMaps as they
        were at the nodes' resourceVersion (etcd's revision is one counter for every kind, so
        ``resourceVersionMatch=Exact`` reads all four at the same instant: a pod list taken a
        second after the node list would show a move that never happened)."""
        # The worlds are taken before the lists: a world added while they are read (its
        # decoys made after the revision read) would otherwise be judged on a revision from
        # before its objects existed.
        with self.lock:
            worlds = list(self.worlds.values())
            before = {id(w): w.accepted() for w in worlds}
        node_list = _raw(self.core.list_node)
        at = {"resource_version": node_list["metadata"]["resourceVersion"]}
        at["resource_version_match"] = "Exact"
        pods = _raw(self.core.list_pod_for_all_namespaces, label_selector=PROXY_PODS, **at)
        dss = {
            _key(d): d for d in _raw(self.apps.list_daemon_set_for_all_namespaces, **at)["items"]
        }
        cms = {
            _key(c): c
            for c in _raw(self.core.list_config_map_for_all_namespaces, label_selector="app", **at)[
                "items"
            ]
        }
        nodes = {n["metadata"]["name"]: n for n in node_list["items"]}
        found: list[str] = []
        system = self._system(dss, cms)
        if system != self.system:
            found.append("the kube-system kube-proxy DaemonSet or ConfigMap changed")
        migrated = set().union(*(w.nodes for w in worlds)) if worlds else set()
        for name, node in nodes.items():
            labels = node["metadata"].get("labels") or {}
            expected = self.node_labels.get(name)
            if expected is not None and _own_labels(labels) != expected:
                found.append(f"node {name}'s own labels changed: {_own_labels(labels)}")
            stray = [k for k in labels if k.startswith(MODE_PREFIX)]
            if stray and name not in migrated and name in self.node_labels:
                found.append(f"node {name} is in no migration but has {stray}")
        for world in worlds:
            # A person's edit may land between the two reads: either side's specs are right.
            accepted = before.get(id(world), []) + world.accepted()
            world_found = self._check(world, pods["items"], nodes, dss, cms, accepted)
            world.samples += 1
            world.violations.extend(world_found)
            found.extend(f"{world.name}: {v}" for v in world_found)
        stamp = f"{time.monotonic() - self.started:.1f}s"
        self.violations.extend(f"[{stamp}] {v}" for v in found)
        self.samples += 1

    @staticmethod
    def _system(
        dss: dict[tuple[str, str], Any], cms: dict[tuple[str, str], Any]
    ) -> tuple[Any, ...]:
        ds, cm = dss.get(("kube-system", "kube-proxy")), cms.get(("kube-system", "kube-proxy"))
        return ((ds or {}).get("spec"), (cm or {}).get("data"))

    def _check(
        self,
        world: World,
        pods: Iterable[dict[str, Any]],
        nodes: dict[str, dict[str, Any]],
        dss: dict[tuple[str, str], dict[str, Any]],
        cms: dict[tuple[str, str], dict[str, Any]],
        accepted: list[dict[str, Any]],
    ) -> list[str]:
        found: list[str] = []
        mine = set(world.nodes) & set(nodes)
        per_node: dict[str, list[str]] = {}
        for pod in pods:
            where = pod["spec"].get("nodeName")
            if pod["metadata"]["namespace"] == world.namespace and where in mine:
                per_node.setdefault(where, []).append(pod["metadata"]["name"])
        found += [f"two kube-proxies on {n}: {p}" for n, p in per_node.items() if len(p) > 1]
        between = sorted(
            n
            for n in mine
            if n not in per_node
            or (nodes[n]["metadata"].get("labels") or {}).get(MODE_LABEL) == "switching"
        )
        world.max_between = max(world.max_between, len(between))
        if len(between) > world.budget:
            found.append(f"{len(between)} nodes between proxies (budget {world.budget}): {between}")
        for key, identity in world.decoys.items():
            kind, name = key
            obj = (dss if kind == "DaemonSet" else cms).get((world.namespace, name))
            body = "spec" if kind == "DaemonSet" else "data"
            if obj is None or _identity(obj, body) != identity:
                found.append(f"the decoy {kind} {name} was touched")
        source = dss.get((world.namespace, "kube-proxy"))
        if source is None:
            found.append("the source DaemonSet is gone")
        elif (now := comparable_source_spec(source["spec"])) not in (
            wanted := [comparable_source_spec(spec) for spec in accepted]
        ):
            found.append(
                "the source DaemonSet changed outside the recorded fields: "
                + _diff(wanted[-1], now)
            )
        return found

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)


def _raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(call(*args, _preload_content=False, **kwargs).data)
    return data


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return (obj["metadata"]["namespace"], obj["metadata"]["name"])


def _diff(was: Any, now: Any, path: str = "") -> str:
    """Where two JSON values first differ, and how (for a violation's message)."""
    if isinstance(was, dict) and isinstance(now, dict):
        for key in sorted(set(was) | set(now)):
            if was.get(key) != now.get(key):
                return _diff(was.get(key), now.get(key), f"{path}.{key}")
    if isinstance(was, list) and isinstance(now, list) and len(was) == len(now):
        for i, (a, b) in enumerate(zip(was, now, strict=True)):
            if a != b:
                return _diff(a, b, f"{path}[{i}]")
    return f"{path}: {str(was)[:120]} -> {str(now)[:120]}"


def _own_labels(labels: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (labels or {}).items() if not k.startswith(MODE_PREFIX)}


def decoy_identities(
    api: client.ApiClient, namespace: str, daemonsets: Iterable[str], configmaps: Iterable[str]
) -> dict[tuple[str, str], tuple[Any, ...]]:
    """What the decoys look like now (``World.decoys``)."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    out: dict[tuple[str, str], tuple[Any, ...]] = {}
    for name in daemonsets:
        out["DaemonSet", name] = _identity(
            _raw(apps.read_namespaced_daemon_set, name, namespace), "spec"
        )
    for name in configmaps:
        out["ConfigMap", name] = _identity(
            _raw(core.read_namespaced_config_map, name, namespace), "data"
        )
    return out
