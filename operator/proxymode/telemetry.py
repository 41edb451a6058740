"""The operator's own ``/metrics``: what each policy is doing, what its gates measured, and
which kube-proxy mode every node runs — as the operator saw it on its last look.

Two kinds of series:

- **state** (gauges rebuilt from each policy's last stored status and observation): phase,
  stage progress, node counts, each check's canary and baseline values and verdict, and
  node mode info. They come from a custom collector over a snapshot per policy, so a
  deleted policy's series vanish with it instead of lingering at their last value;
- **activity** (counters and a histogram): analysis rounds by result, phase transitions,
  Events by reason, reconcile time and errors.

Names follow Prometheus conventions (``proxymode_`` prefix, base units, ``_total`` for
counters, ``_info`` for 1-valued labels). The chart's ServiceMonitor scrapes them; the
sandbox's Prometheus does too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from proxymode.api.models import Phase, PolicyStatus, Verdict
from proxymode.engine import gate
from proxymode.engine.actions import EmitEvent
from proxymode.engine.observed import SWITCHING, AnalysisRound, Observed, ProxyKind

PHASES = tuple(str(p) for p in Phase)
VERDICTS = tuple(str(v) for v in Verdict)


def node_modes(observed: Observed, source_mode: str | None, target_mode: str) -> dict[str, str]:
    """The mode each node's kube-proxy runs now, from the pods on it (not from the labels).

    A node with a ready target pod runs the target mode, with a ready source pod the source
    mode; one between the two (``switching``) or with no ready proxy is reported as such,
    because that is the state an operator must be able to see and alert on.
    """
    modes: dict[str, str] = {}
    for node in observed.nodes:
        pods = [p for p in observed.pods_on(node.name) if p.ready and not p.terminating]
        kinds = {p.kind for p in pods}
        if ProxyKind.TARGET in kinds and ProxyKind.SOURCE not in kinds:
            modes[node.name] = target_mode
        elif ProxyKind.SOURCE in kinds and ProxyKind.TARGET not in kinds:
            modes[node.name] = source_mode or "unknown"
        elif kinds:
            modes[node.name] = "both"  # two proxies at once: must never last
        elif node.mode_label == SWITCHING:
            modes[node.name] = SWITCHING
        else:
            modes[node.name] = "none"
    return modes


@dataclass
class PolicySnapshot:
    """What one policy looked like on its last look."""

    status: PolicyStatus
    target_mode: str
    nodes: dict[str, str] = field(default_factory=dict)


class _StateCollector(Collector):
    """Yields the state gauges from the latest snapshots (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._policies: dict[str, PolicySnapshot] = {}

    def put(self, name: str, snapshot: PolicySnapshot) -> None:
        with self._lock:
            self._policies[name] = snapshot

    def drop(self, name: str) -> None:
        with self._lock:
            self._policies.pop(name, None)

    def collect(self) -> Iterator[GaugeMetricFamily | InfoMetricFamily]:
        with self._lock:
            policies = dict(self._policies)
        yield from state_families(policies)


def state_families(
    policies: dict[str, PolicySnapshot],
) -> Iterator[GaugeMetricFamily | InfoMetricFamily]:
    """The state gauges for a set of policy snapshots (a pure function of the snapshots)."""
    phase = GaugeMetricFamily(
        "proxymode_policy_phase",
        "1 for the phase the policy is in, 0 for the others.",
        labels=["policy", "phase"],
    )
    info = InfoMetricFamily(
        "proxymode_policy", "The policy's source and target modes.", labels=["policy"]
    )
    stage = GaugeMetricFamily(
        "proxymode_policy_stage",
        "The current stage, counted from 1 (0 before the first stage starts).",
        labels=["policy", "stage"],
    )
    stages = GaugeMetricFamily(
        "proxymode_policy_stages", "How many stages the policy has.", labels=["policy"]
    )
    stages_done = GaugeMetricFamily(
        "proxymode_policy_stages_completed",
        "Stages completed (baked and passed their gate).",
        labels=["policy"],
    )
    nodes = GaugeMetricFamily(
        "proxymode_policy_nodes",
        "Nodes by state: planned (in some stage), moved (on the target mode), switching.",
        labels=["policy", "state"],
    )
    value = GaugeMetricFamily(
        "proxymode_analysis_check_value",
        "The last round's value of each check, for the canary and the baseline group.",
        labels=["policy", "check", "group"],
    )
    verdict = GaugeMetricFamily(
        "proxymode_analysis_check_verdict",
        "1 for each check's verdict in the last round, 0 for the other verdicts.",
        labels=["policy", "check", "verdict"],
    )
    streak = GaugeMetricFamily(
        "proxymode_analysis_consecutive_rounds",
        "Failing and inconclusive rounds in a row, compared with failureLimit and"
        " inconclusiveLimit.",
        labels=["policy", "result"],
    )
    node_mode = InfoMetricFamily(
        "proxymode_node_mode",
        "The kube-proxy mode each node runs, from the pods on it (switching, both, none"
        " when between proxies).",
        labels=["node"],
    )
    seen_nodes: dict[str, str] = {}
    for name, snap in sorted(policies.items()):
        st = snap.status
        for p in PHASES:
            phase.add_metric([name, p], 1.0 if str(st.phase) == p else 0.0)
        info.add_metric(
            [name], {"source_mode": st.source_mode or "", "target_mode": snap.target_mode}
        )
        current = st.current_stage
        if current is not None and 0 <= current < len(st.stages):
            stage.add_metric([name, st.stages[current].name], float(current + 1))
        else:
            stage.add_metric([name, ""], 0.0)
        stages.add_metric([name], float(len(st.stages)))
        stages_done.add_metric(
            [name], float(sum(1 for s in st.stages if str(s.phase) == "Completed"))
        )
        planned = {n for s in st.stages for n in s.nodes}
        moved = sum(1 for n in planned if snap.nodes.get(n) == snap.target_mode)
        switching = sum(1 for n in planned if snap.nodes.get(n) in (SWITCHING, "both", "none"))
        nodes.add_metric([name, "planned"], float(len(planned)))
        nodes.add_metric([name, "moved"], float(moved))
        nodes.add_metric([name, "switching"], float(switching))
        if st.analysis is not None:
            for check in st.analysis.checks:
                if check.canary is not None:
                    value.add_metric([name, check.name, "canary"], check.canary)
                if check.baseline is not None:
                    value.add_metric([name, check.name, "baseline"], check.baseline)
                for v in VERDICTS:
                    verdict.add_metric([name, check.name, v], 1.0 if str(check.verdict) == v else 0)
            streak.add_metric([name, "Fail"], float(st.analysis.consecutive_failures))
            streak.add_metric([name, "Inconclusive"], float(st.analysis.consecutive_inconclusive))
        seen_nodes.update(snap.nodes)
    for node, mode in sorted(seen_nodes.items()):
        node_mode.add_metric([node], {"mode": mode})
    yield from (phase, info, stage, stages, stages_done, nodes, value, verdict, streak, node_mode)


def round_result(round_: AnalysisRound) -> str:
    """A round's overall result, as the engine counts it (the pure gate decides)."""
    return str(gate.round_verdict(round_.checks))


class Telemetry:
    """The operator's metrics registry; the reconciler reports to it after every look."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._state = _StateCollector()
        self.registry.register(self._state)
        self.rounds = Counter(
            "proxymode_analysis_rounds",
            "Analysis rounds the engine counted, by overall result (Pass, Fail, Inconclusive).",
            ["policy", "result"],
            registry=self.registry,
        )
        self.transitions = Counter(
            "proxymode_phase_transitions",
            "Phase changes, by the phase left and the phase entered.",
            ["policy", "from_phase", "to_phase"],
            registry=self.registry,
        )
        self.events = Counter(
            "proxymode_events",
            "Kubernetes Events the operator posted, by type and reason.",
            ["policy", "type", "reason"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "proxymode_reconcile_duration_seconds",
            "Time for one look at one policy: read, observe, query Prometheus, act, store.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.look_part_seconds = Histogram(
            "proxymode_look_part_duration_seconds",
            "One look split in its parts: read (GET and parse the policy), observe (the"
            " caches), measure (Prometheus and the nodes' series), decide (the engine), act"
            " (the actions the engine asked for: label changes, Jobs, Events), store (the"
            " status patch) and record (these metrics). Looks that get to the end only.",
            ["part"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.look_own_seconds = Histogram(
            "proxymode_look_own_duration_seconds",
            "One look without its actions: every part but act, waits on the API server and"
            " Prometheus included; what a look costs whatever the number of label changes.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.look_cpu_seconds = Histogram(
            "proxymode_look_cpu_seconds",
            "The CPU time one look's own thread spent, every part but act: the look's work"
            " without its waits (on the API server, Prometheus, or a busy machine's other"
            " processes and the operator's watch threads). Work a look hands to helper"
            " threads (re-reading nodes it wrote, side by side) counts as waiting. Beside"
            " proxymode_look_own_duration_seconds it says how much of a slow look was waiting.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.api_requests = Counter(
            "proxymode_api_requests",
            "Requests the operator's Kubernetes client sent (its looks, watch caches, label"
            " and status patches, Jobs), by verb, resource and HTTP code; not what kopf sends"
            " (its policy watch, finalizer and annotation patches, the Events) nor Prometheus"
            " queries through the API server's proxy.",
            ["verb", "resource", "code"],
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "proxymode_reconcile_errors",
            "Looks that raised (the daemon logs them and looks again).",
            registry=self.registry,
        )
        self.second_looks = Counter(
            "proxymode_second_looks",
            "Rollbacks, pauses and failures decided on a cache's copy and read again from the"
            " API server before acting, by outcome: confirmed (the server's copy bore the"
            " verdict out), withdrawn (it did not: the look went on as the server showed) or"
            " unread (the read failed: nothing was acted on, the look comes again soon).",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("confirmed", "withdrawn", "unread"):
            self.second_looks.labels(outcome)  # zeros from the start, for rate() and alerts

    def looked(
        self,
        name: str,
        *,
        before: PolicyStatus,
        after: PolicyStatus,
        target_mode: str,
        observed: Observed,
        events: Iterable[EmitEvent],
    ) -> None:
        """Record one look at a policy: its new state and what happened during the look."""
        counted = (after.analysis.rounds if after.analysis else 0) > (
            before.analysis.rounds if before.analysis else 0
        )
        if observed.analysis is not None and counted:
            # Only rounds the engine counted: one whose window reached back before the
            # switch, or taken before the stage bakes, is measured but not counted (0015).
            self.rounds.labels(name, round_result(observed.analysis)).inc()
        if str(before.phase) != str(after.phase):
            self.transitions.labels(name, str(before.phase), str(after.phase)).inc()
        for event in events:
            self.events.labels(name, event.type, event.reason).inc()
        # Once finalized, the source DaemonSet itself runs the target mode.
        running = target_mode if after.finalized else after.source_mode
        modes = node_modes(observed, running, target_mode)
        self._state.put(name, PolicySnapshot(after, target_mode, modes))

    def forget(self, name: str) -> None:
        """The policy is gone: its state series go with it (counters stay, as counters do)."""
        self._state.drop(name)

    def serve(self, address: str) -> None:
        """Serve ``/metrics`` on ``host:port`` from a background thread."""
        host, _, port = address.rpartition(":")
        start_http_server(int(port), addr=host or "0.0.0.0", registry=self.registry)  # noqa: S104
