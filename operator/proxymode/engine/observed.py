"""What the engine sees: a plain-data snapshot of the cluster, taken by the adapter.

The engine decides from this snapshot and the policy's status alone, so every sequence
(a restart between two steps, a node vanishing, metrics flapping) is a fast unit test.
Kubernetes objects the engine must copy or patch (the source DaemonSet and ConfigMap)
are kept as plain mappings, exactly as the API returned them; everything else is
reduced to the few fields the engine needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Any

MODE_LABEL = "proxymode.io/mode"
SWITCHING = "switching"
POLICY_LABEL = "proxymode.io/policy"
ACTION_ANNOTATION = "proxymode.io/action"
CONFIG_HASH_ANNOTATION = "proxymode.io/config-hash"
SPEC_WRITERS = "proxymode/specWriters"
"""On a kept DaemonSet (a top-level key, never sent back): the field managers other than the
operator's that own fields of its spec (``managedFields``), sorted. On the target DaemonSet,
a person's edit of what the operator renders."""
MANAGED_BY = "proxymode"

Object = Mapping[str, Any]


class ProxyKind(StrEnum):
    """Which DaemonSet a kube-proxy pod belongs to."""

    SOURCE = "source"
    TARGET = "target"


@dataclass(frozen=True)
class NodeView:
    """A node, reduced to what planning and preflight need."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    ready: bool = True
    kernel: str = ""
    os_image: str = ""
    container_runtime: str = ""
    kubelet_version: str = ""
    zone: str = ""
    deleting: bool = False
    ready_since: datetime | None = None
    """When the Ready condition last turned True (None: not Ready, or not said). A move's
    clocks start again there: a kubelet that was down gets its time to stop and start
    pods once it is back, not a deadline that ran out while it was away."""

    @property
    def mode_label(self) -> str | None:
        """The value of ``proxymode.io/mode`` (target mode, ``switching``) or None."""
        return self.labels.get(MODE_LABEL)


@dataclass(frozen=True)
class ProxyPod:
    """A kube-proxy pod of the source or the target DaemonSet."""

    name: str
    node: str
    kind: ProxyKind
    ready: bool
    restarts: int = 0
    terminating: bool = False
    created: datetime | None = None
    ready_changed: datetime | None = None
    """When the pod's Ready condition last changed (its ``lastTransitionTime``): a pod not
    Ready is timed from here, so one failed probe on a pod Ready for an hour is not taken
    for an hour of not being Ready. None: unknown (then its creation time counts)."""
    last_terminated: datetime | None = None
    """When its container last ended (``lastState.terminated.finishedAt``): a restart the
    kubelet made after a reboot ended before the kubelet was back, a crash after it."""
    template_generation: int | None = None
    """The pod's ``pod-template-generation`` label: the DaemonSet template generation it was
    made from (the DaemonSet's ``deprecated.daemonset.template.generation`` annotation)."""
    config_hash: str | None = None
    """The pod's ``proxymode.io/config-hash`` annotation (target pods: the template it was
    made from); a target pod whose hash is not its DaemonSet's is one the DaemonSet
    controller will still replace."""


class JobKind(StrEnum):
    """What a Job of the operator on a node is for (its ``proxymode.io/job`` label)."""

    CLEANUP = "cleanup"
    VERIFY = "verify"


JOB_KIND_LABEL = "proxymode.io/job"


@dataclass(frozen=True)
class CleanupJobView:
    """A Job the operator started on a node: a cleanup (iptables <-> ipvs) or a verification."""

    name: str
    node: str
    succeeded: bool = False
    failed: bool = False
    created: datetime | None = None
    """The Job's creation time: one older than the move it would serve is stale (left from
    before, the node re-registered under the same name) and is never taken as its cleanup."""
    kind: JobKind = JobKind.CLEANUP
    """A Job without the ``proxymode.io/job`` label (made before there were two) is a cleanup."""
    message: str = ""
    """The termination message of the Job's latest finished pod (a verification's report)."""


@dataclass(frozen=True)
class ClusterFacts:
    """Inventory the adapter gathers once per preflight (DESIGN §6)."""

    kubernetes_version: str | None = None
    services: int | None = None
    endpoint_slices: int | None = None
    cni: str | None = None
    static_kube_proxy_pods: tuple[str, ...] = ()
    other_policies: tuple[str, ...] = ()
    """Other in-flight policies that drive the same source DaemonSet."""
    pending_policies: tuple[tuple[str, str], ...] = ()
    """Other policies on the same source DaemonSet that have not started yet (Pending, not
    paused), as ``(creationTimestamp, name)``: the tie-break between policies created
    together (the earliest, then the smallest name, goes first; both looks agree)."""


@dataclass(frozen=True)
class CheckOutcome:
    """One check's values and verdict in one analysis round, as the judge made it."""

    name: str
    verdict: str
    canary: float | None = None
    baseline: float | None = None
    message: str = ""


@dataclass(frozen=True)
class AnalysisRound:
    """The latest analysis round the Prometheus adapter ran."""

    time: datetime
    checks: tuple[CheckOutcome, ...] = ()
    baseline_values: Mapping[str, float] = field(default_factory=dict)
    """Each check's baseline-group value this round; the engine keeps the first ones seen,
    for the last stage, when no baseline group is left."""
    window_start: datetime | None = None
    """Where the canary queries' window began; None means ``time - windowSeconds``. The
    adapter clips the window to the latest switch and says so here (decision 0015)."""


@dataclass(frozen=True)
class CheckSeries:
    """Which nodes Prometheus has one check's input series for, asked before any move."""

    name: str
    nodes: frozenset[str] = frozenset()
    """Values of the node label among the series found."""
    error: str = ""
    """Why Prometheus could not say (unreachable, refused the query); empty when it did."""
    invalid: str = ""
    """A custom query Prometheus refused as PromQL (``bad_data``), in its words: asked
    before the first move for its syntax only (its series may come with the target mode)."""


@dataclass(frozen=True)
class SeriesCoverage:
    """The adapter's look at Prometheus before the first move (issue 15): for each template
    check, the nodes it has series for. Custom queries are asked only whether Prometheus
    takes them as PromQL (they may read series only the target mode exports)."""

    time: datetime
    checks: tuple[CheckSeries, ...] = ()


@dataclass(frozen=True)
class Observed:
    """Everything the engine decides from, taken at ``now``."""

    now: datetime
    generation: int
    nodes: tuple[NodeView, ...] = ()
    pods: tuple[ProxyPod, ...] = ()
    source_daemon_set: Object | None = None
    source_config_map: Object | None = None
    target_daemon_set: Object | None = None
    target_config_map: Object | None = None
    backup: Mapping[str, str] | None = None
    """The data of the backup ConfigMap, None when it does not exist."""
    jobs: tuple[CleanupJobView, ...] = ()
    facts: ClusterFacts = field(default_factory=ClusterFacts)
    analysis: AnalysisRound | None = None
    action: str | None = None
    """A one-shot action from the ``proxymode.io/action`` annotation."""
    deleting: bool = False
    """The policy is being deleted: roll back, then let the finalizer go."""
    series: SeriesCoverage | None = None
    """Prometheus's series for the checks, asked while preflight runs; None: not asked."""
    verify_image: str = ""
    """The image the verification Job runs (the operator's own); empty: the default name."""
    service_ips: Mapping[str, str] = field(default_factory=dict)
    """ClusterIPs of the Services the policy needs, by ``namespace/name`` (``spec.verify``)."""

    # Lookups by node name, indexed once per snapshot: the engine asks them for every planned
    # node on every look, and a scan each time made a look quadratic (2.3 s at 5,000 nodes;
    # see benchmarks/engine_scale.py). cached_property writes to the instance's __dict__,
    # which a frozen dataclass allows; ``dataclasses.replace`` gives a fresh snapshot.

    @cached_property
    def _nodes_by_name(self) -> dict[str, NodeView]:
        index: dict[str, NodeView] = {}
        for n in self.nodes:
            index.setdefault(n.name, n)  # the first one, as the scan it replaces returned
        return index

    @cached_property
    def _pods_by_node(self) -> dict[str, list[ProxyPod]]:
        index: dict[str, list[ProxyPod]] = {}
        for p in self.pods:
            index.setdefault(p.node, []).append(p)
        return index

    @cached_property
    def _jobs_by_node(self) -> dict[str, CleanupJobView]:
        index: dict[str, CleanupJobView] = {}
        for job in self.jobs:
            if job.kind == JobKind.CLEANUP:
                index.setdefault(job.node, job)
        return index

    @cached_property
    def _verify_jobs_by_node(self) -> dict[str, CleanupJobView]:
        index: dict[str, CleanupJobView] = {}
        for job in self.jobs:
            if job.kind == JobKind.VERIFY:
                index.setdefault(job.node, job)
        return index

    def node(self, name: str) -> NodeView | None:
        return self._nodes_by_name.get(name)

    def kubelet_down(self, name: str) -> bool:
        """The node is known and its kubelet not Ready: no pod starts, stops or reports
        there until it is back (decision 0120)."""
        view = self._nodes_by_name.get(name)
        return view is not None and not view.ready

    def pods_on(self, node: str, kind: ProxyKind | None = None) -> list[ProxyPod]:
        return [p for p in self._pods_by_node.get(node, ()) if kind is None or p.kind == kind]

    def job_on(self, node: str) -> CleanupJobView | None:
        """The node's cleanup Job."""
        return self._jobs_by_node.get(node)

    def verify_job_on(self, node: str) -> CleanupJobView | None:
        """The node's verification Job."""
        return self._verify_jobs_by_node.get(node)
