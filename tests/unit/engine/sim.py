"""A small, deterministic model of the cluster for engine sequence tests (pure logic only).

It plays the parts the engine relies on, with the rules the real ones follow (the
sandbox tests check those rules against the real controllers):

- DaemonSet controller: a pod on every node matching the current template's node
  selector and required affinity, deleted from nodes that stop matching whatever the
  update strategy; with RollingUpdate (surge 0), a pod of an older template is deleted
  only while fewer than ``maxUnavailable`` wanted nodes lack a Ready pod of the DaemonSet,
  so the next stale pod waits until the previous one's replacement is Ready, as the real
  controller does; with OnDelete, never.
- kubelet: a new pod reads its ConfigMap when it starts (``SimPod.mode``: the mode it
  runs, whatever the ConfigMap says later) and is Ready one tick after it appears; a
  deleted pod terminates for one tick, then is gone. Pods can be told to crash-loop.
- Other policies (``Sim.policies``): the rivals each policy's adapter would report in
  ``ClusterFacts.other_policies`` (same source DaemonSet, in flight or mixed mode).
- Analysis (``Sim.verdict``): when set, a fresh round of that verdict every
  ``round_every`` seconds, as the Prometheus adapter would hand the engine.
- Job controller: a cleanup Job succeeds one tick after it is created (or fails, if asked).
  A verification Job ends one tick after it is created: Succeeded when the node runs one
  Ready, not crash-looping kube-proxy in the mode the Job names and is not in
  ``unverifiable``, else Failed; with a report as its termination message.
- API server: JSON patches with a failing ``test`` and label changes with a stale
  ``expect`` are refused (ConflictError), like a real precondition failure.

It is deliberately independent of the engine's own code (its own affinity matcher), so
one bug cannot hide in both.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonpatch
import yaml

from proxymode.engine import naming
from proxymode.engine.actions import (
    Action,
    ApplyObject,
    ClearAction,
    CreateJob,
    CreateObject,
    DeleteObject,
    EmitEvent,
    PatchObject,
    SaveBackup,
    SetNodeMode,
)
from proxymode.engine.look import PREFLIGHT_OBSERVED
from proxymode.engine.observed import (
    CONFIG_HASH_ANNOTATION,
    JOB_KIND_LABEL,
    MODE_LABEL,
    AnalysisRound,
    CheckOutcome,
    CleanupJobView,
    ClusterFacts,
    JobKind,
    NodeView,
    Observed,
    ProxyKind,
    ProxyPod,
)
from proxymode.kube.execute import label_run
from proxymode.verify import NodeReading, ProbeOutcome, judge
from proxymode_sandbox import kubeadm_proxy

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
FAST_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader: the pure-Python one took most of a generated-spec run's time."""
NS = "kube-system"
IN_FLIGHT = ("Preflight", "Progressing", "Analyzing", "Paused", "Finalizing", "RollingBack")


class ConflictError(Exception):
    """A precondition failed, as a 409/422 from the API server would say."""


@dataclass
class SimPod:
    name: str
    node: str
    owner: str  # DaemonSet name
    template: str  # template hash it was created from
    age: int = 0
    terminating: int = 0  # ticks left; 0 = not terminating
    crashloop: bool = False
    unready: int = 0  # ticks left of a passing not-Ready spell (a failed probe)
    restarts: int = 0
    born: datetime = T0
    mode: str | None = None  # the proxy mode read from its ConfigMap when it started
    config: str | None = None  # the ConfigMap it read
    was_ready: bool = False
    ready_changed: datetime | None = None  # the Ready condition's lastTransitionTime
    config_hash: str | None = None  # its template's proxymode.io/config-hash annotation
    template_generation: int | None = None  # its pod-template-generation label
    last_terminated: datetime | None = None  # when its container last ended

    def note_readiness(self, now: datetime) -> None:
        """What the kubelet does: stamp the Ready condition's transition time."""
        if self.ready_changed is None:
            self.ready_changed = self.born
        if self.ready != self.was_ready:
            self.was_ready = self.ready
            self.ready_changed = now

    @property
    def ready(self) -> bool:
        return self.age >= 1 and not self.crashloop and not self.terminating and not self.unready


@dataclass
class SimNode:
    name: str
    labels: dict[str, str]
    kernel: str = "6.1.0-28-cloud-amd64"
    zone: str = ""


@dataclass
class Sim:
    nodes: dict[str, SimNode] = field(default_factory=dict)
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (kind, name)
    pods: list[SimPod] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    now: datetime = T0
    events: list[EmitEvent] = field(default_factory=list)
    action: str | None = None
    crashloop_target: bool = False
    fail_jobs: bool = False
    hang_jobs: bool = False
    """Cleanup Jobs never finish (a pod stuck Pending, an image that never pulls)."""
    stuck: set[str] = field(default_factory=set)
    """Nodes whose terminating pods never go away (a kubelet that stopped answering)."""
    termination_ticks: dict[str, int] = field(default_factory=dict)
    """Per node, how many ticks a deleted pod takes to terminate (default 2)."""
    down: set[str] = field(default_factory=set)
    """Nodes whose kubelet is not Ready (powered off, cut off): the node reads NotReady, its
    pods are not Ready (the node lifecycle controller marks them), none starts or goes."""
    back: dict[str, datetime] = field(default_factory=dict)
    """When each node that was in ``down`` was first seen out of it: its Ready condition's
    ``lastTransitionTime`` (``NodeView.ready_since``)."""
    _was_down: set[str] = field(default_factory=set)
    _templates: dict[str, str] = field(default_factory=dict)
    broken: set[str] = field(default_factory=set)
    """Nodes whose kube-proxy pods, of either DaemonSet, crash-loop."""
    bad_arg: str | None = None
    """A kube-proxy command-line argument that makes every pod whose template has it
    crash-loop (a flag kube-proxy refuses): a person's broken template edit."""
    server_defaults: dict[str, Any] = field(default_factory=dict)
    """DaemonSet spec fields the API server defaults on every write (a newer server)."""
    unverifiable: set[str] = field(default_factory=set)
    """Nodes whose verification fails (their Service probe times out: a host firewall)."""
    service_ips: dict[str, str] = field(default_factory=lambda: {"default/kubernetes": "10.96.0.1"})
    served: set[str] = field(default_factory=set)
    """Nodes that have had a Ready kube-proxy since they joined."""
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Every policy's last stored wire form (name -> {spec, status}), for rival detection."""
    verdict: str | None = None
    """Each check's verdict in the analysis rounds; None: no round at all."""
    checks: tuple[str, ...] = ("sync-latency",)
    round_every: float = 10.0
    baseline_values: dict[str, float] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    """kube-proxy pods started per node, of either DaemonSet, since the cluster was built."""
    _last_round: datetime | None = None
    _seq: int = 0
    _rv: int = 100
    log: list[str] = field(default_factory=list)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def cluster(cls, pools: dict[str, int], mode: str = "iptables") -> Sim:
        sim = cls()
        zones = ("zone-a", "zone-b", "zone-c")
        for pool, count in pools.items():
            for i in range(1, count + 1):
                name = f"{pool}-{i}"
                kernel = "4.18.0-553.el8_10.x86_64" if pool == "legacy" else "6.1.0-28-cloud-amd64"
                sim.nodes[name] = SimNode(
                    name,
                    {"pool": pool, "kubernetes.io/os": "linux", "kubernetes.io/hostname": name},
                    kernel,
                    zones[(i - 1) % 3],
                )
        for obj in kubeadm_proxy.manifests("https://127.0.0.1:6443", "v1.37.2", mode):
            if obj["kind"] in ("DaemonSet", "ConfigMap"):
                sim._store(copy.deepcopy(obj))
        for _ in range(2):
            sim.tick()
        sim.starts.clear()  # the pods the cluster began with are not starts of a run
        return sim

    def _grace(self, node: str) -> int:
        return self.termination_ticks.get(node, 2)

    def _store(self, obj: dict[str, Any]) -> None:
        if obj["kind"] == "DaemonSet":
            for key, value in self.server_defaults.items():
                obj["spec"].setdefault(key, copy.deepcopy(value))
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", NS)
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        old = self.objects.get((obj["kind"], meta["name"]))
        if obj["kind"] == "DaemonSet":
            generation = old["metadata"].get("generation", 1) if old else 0
            if old is None or old["spec"] != obj["spec"]:
                generation += 1
            meta["generation"] = generation
            # The API server's template generation (the DaemonSet controller labels each pod
            # with it): bumped when the pod template changes.
            key = "deprecated.daemonset.template.generation"
            # (Compared by hash: a caller may have edited the stored object in place.)
            template_gen = int((old or {}).get("metadata", {}).get("annotations", {}).get(key, 0))
            if self._templates.get(meta["name"]) != _hash(obj["spec"]["template"]):
                template_gen += 1
                self._templates[meta["name"]] = _hash(obj["spec"]["template"])
            meta.setdefault("annotations", {})[key] = str(template_gen)
            obj["status"] = old.get("status", {}) if old else {}
        self.objects[(obj["kind"], meta["name"])] = obj

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.objects.get((kind, name))

    # -- the controllers --------------------------------------------------------------------

    def _note_kubelets(self) -> None:
        """A node out of ``down`` since the last note came back now."""
        for name in self._was_down - self.down:
            self.back[name] = self.now
        for name in self.down:
            self.back.pop(name, None)
        self._was_down = set(self.down)

    def tick(self, seconds: float = 5.0) -> None:
        self._note_kubelets()
        self.now += timedelta(seconds=seconds)
        for pod in self.pods:
            pod.age += 1
            if pod.crashloop:
                pod.restarts += 1
                pod.last_terminated = self.now
        frozen = self.stuck | self.down
        self.pods = [
            p
            for p in self.pods
            if not (p.terminating and p.terminating <= 1 and p.node not in frozen)
        ]
        for pod in self.pods:
            if pod.terminating and pod.node not in frozen:
                pod.terminating -= 1
            if pod.unready:
                pod.unready -= 1
            if pod.node in self.down:
                pod.unready = max(pod.unready, 1)
            if pod.node in self.broken and not pod.crashloop:
                pod.crashloop = True
        for (kind, _), ds in list(self.objects.items()):
            if kind == "DaemonSet":
                self._reconcile_daemon_set(ds)
        for job in self.jobs.values():
            if job["node"] in self.down and not job["done"]:
                # Its pod cannot run there; the Job controller still fails it at its deadline.
                limit = job.get("deadline")
                if limit is not None and (self.now - job["created"]).total_seconds() > limit:
                    job["done"] = "failed"
                    job["message"] = "DeadlineExceeded"
                continue
            if job["age"] >= 1 and not job["done"] and job.get("kind") == JobKind.VERIFY:
                self._verify(job)
            elif job["age"] >= 1 and not job["done"] and not self.hang_jobs:
                job["done"] = "failed" if self.fail_jobs else "succeeded"
            job["age"] += 1
        self.served |= {p.node for p in self.pods if p.ready}
        for pod in self.pods:
            pod.note_readiness(self.now)

    def _reconcile_daemon_set(self, ds: dict[str, Any]) -> None:
        name = ds["metadata"]["name"]
        template = _hash(ds["spec"]["template"])
        mine = [p for p in self.pods if p.owner == name and not p.terminating]
        wanted = {n for n, node in self.nodes.items() if _schedulable(ds, node)}
        for pod in mine:
            if pod.node not in wanted or pod.node not in self.nodes:
                pod.terminating = self._grace(pod.node)
        have = {p.node for p in self.pods if p.owner == name}
        for node in sorted(wanted - have):
            self._seq += 1
            config = _config_map_of(ds)
            pod = SimPod(
                f"{name}-{self._seq}",
                node,
                name,
                template,
                born=self.now,
                mode=self._mode_in(config),
                config=config,
                config_hash=(ds["spec"]["template"].get("metadata") or {})
                .get("annotations", {})
                .get(CONFIG_HASH_ANNOTATION),
            )
            if self.crashloop_target and MODE_LABEL in ds["spec"]["selector"]["matchLabels"]:
                pod.crashloop = True
            if node in self.broken:
                pod.crashloop = True
            container = ds["spec"]["template"]["spec"]["containers"][0]
            if self.bad_arg and self.bad_arg in [
                *container.get("command", []),
                *container.get("args", []),
            ]:
                pod.crashloop = True
            pod.template_generation = int(
                ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"]
            )
            self.pods.append(pod)
            self.starts[node] = self.starts.get(node, 0) + 1
        strategy = ds["spec"].get("updateStrategy", {})
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            self._rolling_update(name, template, _max_unavailable(strategy, len(wanted)))
        live = [p for p in self.pods if p.owner == name and not p.terminating]
        ds["status"] = {
            "observedGeneration": ds["metadata"]["generation"],
            "desiredNumberScheduled": len(wanted),
            # A Terminating pod still counts as scheduled (getNodesToDaemonPods skips only
            # terminal ones).
            "currentNumberScheduled": len({p.node for p in self.pods if p.owner == name} & wanted),
            "numberReady": sum(p.ready for p in live),
            "updatedNumberScheduled": sum(p.template == template for p in live),
            "numberUnavailable": len(wanted) - sum(p.ready for p in live),
        }

    def _rolling_update(self, name: str, template: str, budget: int) -> None:
        """One pass of ``rollingUpdate`` (pkg/controller/daemon/update.go, maxSurge 0): per
        node holding a pod of it (wanted or not), a Terminating pod is no pod; a node left
        without one, or with an old and a new one, or whose new pod is not Ready, is
        unavailable. An old pod that is not Ready is
        replaced whatever the budget and counts nothing; a Ready one is replaced while the
        unavailable count leaves room."""
        unavailable, replace, candidates = 0, [], []
        for node in sorted({p.node for p in self.pods if p.owner == name}):  # nodeToDaemonPods
            pods = [p for p in self.pods if p.owner == name and p.node == node]
            pods = [p for p in pods if not p.terminating]
            new = [p for p in pods if p.template == template]
            old = [p for p in pods if p.template != template]
            if not pods or (new and old) or (new and not new[0].ready):
                unavailable += 1
            elif old and not old[0].ready:
                replace.append(old[0])
            elif old and unavailable < budget:
                candidates.append(old[0])
        room = max(0, budget - unavailable)
        for pod in replace + candidates[:room]:
            pod.terminating = self._grace(pod.node)

    def _verify(self, job: dict[str, Any]) -> None:
        """What ``proxymode verify-node`` would find on the node, as its report."""
        node, mode = job["node"], job["mode"]
        running = [p for p in self.pods if p.node == node and not p.terminating]
        ok_pod = len(running) == 1 and running[0].ready and not running[0].crashloop
        reading = NodeReading(
            mode=running[0].mode if running else None,
            started=100.0,
            last_sync=101.5 if ok_pod else 0.0,
            iptables_svc_chains=10 if mode == "iptables" else 0,
            iptables_services_chain=mode in ("iptables", "ipvs"),
            nft_tables=("ip",) if mode == "nftables" else (),
            nft_services=10 if mode == "nftables" else 0,
            ipvs_device=mode == "ipvs",
            probe=ProbeOutcome(
                "default/kubernetes:443",
                "10.96.0.1:443",
                ok=node not in self.unverifiable,
                millis=3.0,
                error="timed out after 1s",
            ),
        )
        report = judge(reading, node, mode, job["previous"], 2.0)
        job["done"] = "succeeded" if report.ok else "failed"
        job["message"] = report.message()

    def _mode_in(self, config_map: str | None) -> str | None:
        cm = self.get("ConfigMap", config_map) if config_map else None
        text = (cm or {}).get("data", {}).get("config.conf")
        if text is None:
            return None
        config = yaml.load(text, Loader=FAST_LOADER)  # noqa: S506 - libyaml's safe loader
        return str((config or {}).get("mode") or "iptables")

    def rivals(self, mine: str) -> tuple[str, ...]:
        """What the adapter reports: other policies on the same source DaemonSet, active."""
        out = []
        for name, wire in sorted(self.policies.items()):
            status = wire.get("status") or {}
            active = status.get("phase") in IN_FLIGHT or (
                status.get("phase") == "Completed" and status.get("finalized") is False
            )
            if name != mine and active:
                out.append(name)
        return tuple(out)

    def pending_rivals(self, mine: str) -> tuple[tuple[str, str], ...]:
        """What the adapter reports for the tie-break: other policies not started yet."""
        out = []
        for name, wire in sorted(self.policies.items()):
            phase = (wire.get("status") or {}).get("phase") or "Pending"
            paused = (wire.get("spec") or {}).get("paused")
            if name != mine and phase == "Pending" and not paused:
                created = (wire.get("metadata") or {}).get("creationTimestamp") or ""
                out.append((str(created), name))
        return tuple(out)

    def analysis_round(self) -> AnalysisRound | None:
        """A fresh round every ``round_every`` seconds while ``verdict`` is set."""
        if self.verdict is None:
            return None
        due = self._last_round is None or (
            (self.now - self._last_round).total_seconds() >= self.round_every
        )
        if due:
            self._last_round = self.now
        assert self._last_round is not None
        return AnalysisRound(
            time=self._last_round,
            checks=tuple(
                CheckOutcome(name, self.verdict, canary=0.5, baseline=0.5, message=self.verdict)
                for name in self.checks
            ),
            # The baseline group is the nodes still on the source mode: none left, no values.
            baseline_values=dict(self.baseline_values)
            if any(MODE_LABEL not in n.labels for n in self.nodes.values())
            else {},
        )

    # -- what the engine sees and does ------------------------------------------------------

    def _stored_phase(self, policy: str) -> str:
        stored = self.policies.get(policy) or {}
        return str((stored.get("status") or {}).get("phase") or "Pending")

    def observe(self, generation: int = 1, deleting: bool = False, policy: str = "") -> Observed:
        for pod in self.pods:  # a test may have flipped readiness since the last tick
            pod.note_readiness(self.now)
        source = self.get("DaemonSet", "kube-proxy")
        # As the adapter reads them: the target pair of this policy's mode (another
        # policy's pair and pods are not this one's); without a known policy, any.
        mode = ((self.policies.get(policy) or {}).get("spec") or {}).get("targetMode")
        mine = f"kube-proxy-{mode}" if mode else None
        target = next(
            (
                o
                for (k, n), o in self.objects.items()
                if k == "DaemonSet" and n != "kube-proxy" and n == (mine or n)
            ),
            None,
        )
        target_cm = next(
            (
                o
                for (k, n), o in self.objects.items()
                if k == "ConfigMap" and n.startswith("kube-proxy-") and n == (mine or n)
            ),
            None,
        )
        pods = tuple(
            ProxyPod(
                name=p.name,
                node=p.node,
                kind=ProxyKind.SOURCE if p.owner == "kube-proxy" else ProxyKind.TARGET,
                ready=p.ready and p.node not in self.down,
                restarts=p.restarts,
                terminating=bool(p.terminating),
                # As the API server keeps it: creationTimestamp has whole seconds.
                created=p.born.replace(microsecond=0),
                ready_changed=p.ready_changed,
                config_hash=p.config_hash,
                template_generation=p.template_generation,
                last_terminated=p.last_terminated,
            )
            for p in self.pods
            if mine is None or p.owner in ("kube-proxy", mine)
        )
        jobs = tuple(
            CleanupJobView(
                name,
                j["node"],
                succeeded=j["done"] == "succeeded",
                failed=j["done"] == "failed",
                created=j.get("created", self.now - timedelta(seconds=5 * j["age"])),
                kind=j.get("kind", JobKind.CLEANUP),
                message=j.get("message", ""),
            )
            for name, j in self.jobs.items()
        )
        backup = next(
            (
                o["data"]
                for (k, n), o in self.objects.items()
                if k == "ConfigMap"
                and n.startswith("proxymode-backup-")
                and (not policy or n == naming.backup_config_map(policy))
            ),
            None,
        )
        self._note_kubelets()
        nodes = tuple(
            NodeView(
                n.name,
                dict(n.labels),
                n.name not in self.down,
                n.kernel,
                "Debian",
                "containerd",
                "v1.37.2",
                n.zone,
                ready_since=self.back.get(n.name),
            )
            for n in self.nodes.values()
        )
        return Observed(
            now=self.now,
            generation=generation,
            nodes=nodes,
            pods=pods,
            source_daemon_set=copy.deepcopy(source),
            source_config_map=copy.deepcopy(self.get("ConfigMap", "kube-proxy")),
            target_daemon_set=copy.deepcopy(target),
            target_config_map=copy.deepcopy(target_cm),
            backup=dict(backup) if backup is not None else None,
            jobs=jobs,
            # As the adapter: the cluster's facts only for a stored Pending or Preflight.
            facts=ClusterFacts(
                kubernetes_version="v1.37.2",
                services=10,
                endpoint_slices=12,
                other_policies=self.rivals(policy),
                pending_policies=self.pending_rivals(policy),
            )
            if self._stored_phase(policy) in PREFLIGHT_OBSERVED
            else ClusterFacts(),
            analysis=self.analysis_round(),
            action=self.action,
            deleting=deleting,
            service_ips=dict(self.service_ips),
        )

    def execute(self, actions: Iterable[Action], stop_after: int | None = None) -> int:
        """Carry out actions as the operator's executor does (``kube/execute.py``): in order,
        but label changes next to each other on distinct nodes side by side, so a refused
        one stops the count and the batch, not the rest of its run. Returns the count.

        ``stop_after`` is a crash after that many actions. Inside a run of label changes,
        the run's last change was in flight too and lands (when it is past the cut): the
        subsets side by side sending makes possible, a later node moved, an earlier not."""
        todo = list(actions)
        done = 0
        i = 0
        while i < len(todo):
            run = label_run(todo, i) or [todo[i]]
            end = i + len(run)
            landed = list(range(i, end))
            if stop_after is not None and stop_after < end:
                landed = [j for j in landed if j < stop_after]
                if len(run) > 1 and end - 1 >= max(stop_after, i + 1):
                    landed.append(end - 1)
            failed: set[int] = set()
            for j in landed:
                try:
                    self._execute(todo[j])
                except ConflictError as e:
                    self.log.append(f"conflict: {e}")
                    failed.add(j)
            for j in range(i, end):
                if j not in landed or j in failed:
                    return done
                done += 1
            i = end
        return done

    def _execute(self, action: Action) -> None:
        if isinstance(action, SetNodeMode):
            node = self.nodes.get(action.node)
            if node is None:
                raise ConflictError(f"node {action.node} is gone")
            if node.labels.get(MODE_LABEL) != action.expect:
                raise ConflictError(f"node {action.node} label is {node.labels.get(MODE_LABEL)!r}")
            if action.value is None:
                node.labels.pop(MODE_LABEL, None)
            else:
                node.labels[MODE_LABEL] = action.value
            self.log.append(f"label {action.node}={action.value}")
        elif isinstance(action, SaveBackup | CreateObject):
            key = (str(action.obj["kind"]), action.obj["metadata"]["name"])
            if key not in self.objects:
                self._store(copy.deepcopy(dict(action.obj)))
        elif isinstance(action, ApplyObject):
            self._store(copy.deepcopy(dict(action.obj)))
        elif isinstance(action, PatchObject):
            current = self.get(action.kind, action.name)
            if current is None:
                raise ConflictError(f"{action.kind} {action.name} is gone")
            try:
                patched = jsonpatch.apply_patch(current, list(action.ops))
            except jsonpatch.JsonPatchTestFailed as e:
                raise ConflictError(str(e)) from e
            self._store(patched)
        elif isinstance(action, CreateJob):
            name = action.job["metadata"]["name"]
            node = action.job["spec"]["template"]["spec"]["nodeName"]
            labels = action.job["metadata"].get("labels") or {}
            kind = JobKind(labels.get(JOB_KIND_LABEL, JobKind.CLEANUP))
            job = {"node": node, "age": 0, "done": None, "created": self.now, "kind": kind}
            job["deadline"] = action.job["spec"].get("activeDeadlineSeconds")
            if kind == JobKind.VERIFY:
                words = action.job["spec"]["template"]["spec"]["containers"][0]["command"]
                flags = dict(w[2:].split("=", 1) for w in words if w.startswith("--"))
                job.update(mode=flags["mode"], previous=flags["previous"])
            self.jobs.setdefault(name, job)
        elif isinstance(action, DeleteObject):
            if action.kind == "Job":
                self.jobs.pop(action.name, None)
            else:
                self.objects.pop((action.kind, action.name), None)
                if action.kind == "DaemonSet":
                    for pod in self.pods:
                        if pod.owner == action.name:
                            pod.terminating = self._grace(pod.node)
        elif isinstance(action, EmitEvent):
            self.events.append(action)
        elif isinstance(action, ClearAction):
            if self.action != action.value:  # the adapter's JSON-patch test of the value
                raise ConflictError(f"the action is {self.action!r}, not {action.value!r}")
            self.action = None

    # -- invariants -----------------------------------------------------------------------------

    def proxies_on(self, node: str) -> list[SimPod]:
        return [p for p in self.pods if p.node == node]

    def without_ready_proxy(self) -> set[str]:
        return {n for n in self.nodes if not any(p.ready for p in self.proxies_on(n))}

    def collect_garbage(self, owner_uid: str) -> None:
        """What the garbage collector does once the owner (the policy) is gone."""
        for key, obj in list(self.objects.items()):
            owners = obj["metadata"].get("ownerReferences", [])
            if any(o.get("uid") == owner_uid for o in owners):
                del self.objects[key]

    def add_node(
        self, name: str, pool: str, zone: str = "zone-a", kernel: str = "6.1.0-28-cloud-amd64"
    ) -> None:
        labels = {"pool": pool, "kubernetes.io/os": "linux", "kubernetes.io/hostname": name}
        self.nodes[name] = SimNode(name, labels, kernel=kernel, zone=zone)

    def remove_node(self, name: str) -> None:
        del self.nodes[name]
        self.served.discard(name)
        self.pods = [p for p in self.pods if p.node != name]


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


def _schedulable(ds: dict[str, Any], node: SimNode) -> bool:
    spec = ds["spec"]["template"]["spec"]
    for key, value in (spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            return False
    terms = (
        spec.get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms")
    )
    if not terms:
        return True
    for term in terms:
        ok = True
        for expr in term.get("matchExpressions", []):
            value = node.labels.get(expr["key"])
            if expr["operator"] == "In" and value not in expr["values"]:
                ok = False
            if expr["operator"] == "NotIn" and value in expr["values"]:
                ok = False
        if ok:
            return True
    return False


def _max_unavailable(strategy: dict[str, Any], wanted: int) -> int:
    """``rollingUpdate.maxUnavailable`` (int or percent, rounded up, at least 1), default 1."""
    value = (strategy.get("rollingUpdate") or {}).get("maxUnavailable", 1)
    if isinstance(value, str) and value.endswith("%"):
        return max(1, -(-wanted * int(value[:-1]) // 100))
    return max(1, int(value))


def _config_map_of(ds: dict[str, Any]) -> str | None:
    """The ConfigMap the pod template mounts (kube-proxy reads its config from it)."""
    for volume in ds["spec"]["template"]["spec"].get("volumes", []):
        name = (volume.get("configMap") or {}).get("name")
        if name:
            return str(name)
    return None
