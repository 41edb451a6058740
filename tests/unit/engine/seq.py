"""The sequence-test harness: one policy driven through ``sim.Sim``, invariants every step.

A step is: observe, ``advance``, carry out the actions, let the controllers run. Faults
are injected between steps: a status write lost (the operator died after acting),
actions cut short (it died mid-way), an action conflict.

Assertions on status fields that the engine v2 restructure changes (``rollbackReason``
becoming a code plus a message, paused reasons becoming enums) live in the small
``*_code`` / ``*_text`` helpers at the bottom, so adapting them is one edit here.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import yaml

from proxymode.api.models import Phase, PolicyStatus, ProxyModePolicy
from proxymode.engine.actions import Decision, EmitEvent
from proxymode.engine.machine import advance
from proxymode.engine.objects import DEFAULT_STRATEGY, STRATEGY_ANNOTATION
from proxymode.engine.observed import MODE_LABEL, Observed
from proxymode.engine.planner import max_unavailable_count
from tests.unit.engine.sim import FAST_LOADER, Sim

Hook = Callable[[int, Sim, ProxyModePolicy], None]
THREE_STAGES: list[dict[str, Any]] = [
    {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}, "bakeSeconds": 20},
    {"name": "half", "percent": 50, "bakeSeconds": 20},
    {"name": "all", "percent": 100, "bakeSeconds": 20},
]
CANARY_THEN_ALL: list[dict[str, Any]] = [
    {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}, "bakeSeconds": 60},
    {"name": "all", "percent": 100, "bakeSeconds": 0},
]
"""Two stages: the canary pool bakes a minute, then every other node at once."""
ANALYSIS: dict[str, Any] = {
    "prometheus": {"url": "http://prometheus.invalid:9090"},
    "intervalSeconds": 10,
    # Short, so a round taken 10 s after the latest switch holds only the new proxy's
    # samples and counts (decision 0015); item 27's test sets a 300 s window itself.
    "windowSeconds": 10,
    "warmupSeconds": 0,
    "failureLimit": 2,
    "inconclusiveLimit": 2,
    "minPassingRounds": 1,
    "checks": [{"name": "sync-latency", "template": "SyncLatencyP99", "maxSeconds": 1}],
}


def make_policy(name: str = "to-nft", uid: str = "uid-1", **spec: Any) -> ProxyModePolicy:
    body = {"targetMode": "nftables", "stages": THREE_STAGES, **spec}
    return ProxyModePolicy.model_validate(
        {"metadata": {"name": name, "uid": uid, "generation": 1}, "spec": body}
    )


def with_spec(policy: ProxyModePolicy, **wire: Any) -> ProxyModePolicy:
    """The policy after a person edited its spec (wire names, as in kubectl edit)."""
    body = {**policy.spec.wire(), **wire}
    spec = ProxyModePolicy.model_validate({"metadata": policy.metadata, "spec": body}).spec
    return policy.model_copy(update={"spec": spec})


class Run:
    """Drives one policy through the simulated cluster, checking invariants every step."""

    def __init__(self, sim: Sim, policy: ProxyModePolicy, *, check: bool = True) -> None:
        self.sim = sim
        self.policy = policy
        self.name = str(policy.metadata["name"])
        self.decisions: list[Decision] = []
        self.original_ds = json.dumps(sim.get("DaemonSet", "kube-proxy")["spec"], sort_keys=True)
        self.original_cm = dict(sim.get("ConfigMap", "kube-proxy")["data"])
        self.source_mode = config_mode(sim)
        self.labels_before = {n: v.labels.get(MODE_LABEL) for n, v in sim.nodes.items()}
        self.deleting = False
        self.checking = check
        self.budget = max_unavailable_count(policy.spec.max_unavailable, len(sim.nodes))
        self._publish()

    def _publish(self) -> None:
        self.sim.policies[self.name] = {
            "spec": self.policy.spec.wire(),
            "status": json.loads(self.policy.status.model_dump_json(by_alias=True)),
        }

    def observe(self) -> Observed:
        return self.sim.observe(generation=1, deleting=self.deleting, policy=self.name)

    def step(
        self,
        *,
        lose_status: bool = False,
        stop_after: int | None = None,
        tick: bool = True,
        observed: Observed | None = None,
    ) -> Decision:
        """One look; ``observed`` (taken earlier) models two operators' looks at one moment."""
        obs = observed or self.observe()
        decision = advance(self.policy, obs)
        self.decisions.append(decision)
        self.sim.execute(decision.actions, stop_after=stop_after)
        if not lose_status:
            self.policy = self.policy.model_copy(update={"status": decision.status})
            self._publish()
        if tick:
            self.sim.tick(min(decision.requeue_seconds, 5.0))
        if self.checking:
            self.check()
        return decision

    def until(
        self,
        done: Callable[[ProxyModePolicy], bool],
        *,
        limit: int = 400,
        hook: Hook | None = None,
        rng: random.Random | None = None,
    ) -> None:
        for i in range(limit):
            if hook:
                hook(i, self.sim, self.policy)
            lose = bool(rng and rng.random() < 0.15)
            cut = rng.randrange(0, 3) if rng and rng.random() < 0.15 else None
            decision = self.step(lose_status=lose, stop_after=cut)
            if done(self.policy) or (self.deleting and decision.release_finalizer):
                return
        raise AssertionError(
            f"not done after {limit} steps; phase {self.policy.status.phase}:"
            f" {self.policy.status.message}"
        )

    def steps(self, count: int) -> None:
        for _ in range(count):
            self.step()

    # -- invariants -----------------------------------------------------------------------

    def check(self) -> None:
        check_world(self.sim, self.policy.status, self.budget, self.labels_before)

    def phases(self) -> list[str]:
        return [h.phase for h in self.policy.status.history]

    def events(self, reason: str) -> list[EmitEvent]:
        return [
            a
            for d in self.decisions
            for a in d.actions
            if isinstance(a, EmitEvent) and a.reason == reason
        ]

    # -- end states ------------------------------------------------------------------------

    def settle(self, steps: int = 3) -> None:
        """A few more looks at a finished policy: it tidies up, then does nothing."""
        phase = self.policy.status.phase
        for _ in range(steps):
            self.step()
        assert self.policy.status.phase == phase
        assert not list(self.decisions[-1].actions), "a settled policy acts no more"

    def assert_restored(self) -> None:
        """Exactly the world before the policy: spec, data, labels, objects, running modes."""
        self.settle()
        ds = self.sim.get("DaemonSet", "kube-proxy")
        assert json.dumps(ds["spec"], sort_keys=True) == self.original_ds
        assert self.sim.get("ConfigMap", "kube-proxy")["data"] == self.original_cm
        labels = {n: v.labels.get(MODE_LABEL) for n, v in self.sim.nodes.items()}
        assert labels == {n: self.labels_before.get(n) for n in labels}, "labels as before"
        assert self.sim.get("DaemonSet", "kube-proxy-nftables") is None
        assert self.sim.get("ConfigMap", "kube-proxy-nftables") is None
        assert not [k for k in self.sim.objects if k[1].startswith("proxymode-backup")]
        for node in self.sim.nodes:
            pods = self.sim.proxies_on(node)
            assert len(pods) == 1 and pods[0].owner == "kube-proxy" and pods[0].ready, node
            assert pods[0].mode == self.source_mode, (
                f"{node} runs {pods[0].mode}, read from the ConfigMap when it started"
            )


def check_world(
    sim: Sim, status: PolicyStatus, budget: int, labels_before: dict[str, str | None]
) -> None:
    """The invariants of DESIGN §3, on the world and the stored status, after any step."""
    for node in sim.nodes:
        assert len(sim.proxies_on(node)) <= 1, f"two kube-proxies on {node}"
    crashing = {p.node for p in sim.pods if p.crashloop}
    # A node that never had a Ready kube-proxy (it just joined) lost nothing to a move, nor
    # did one whose kubelet is down.
    down = (sim.without_ready_proxy() - crashing - sim.down) & sim.served
    assert len(down) <= budget, f"{sorted(down)} without a Ready kube-proxy (budget {budget})"
    # A node whose kubelet is down serves nothing either way: its move back waits at
    # switching without taking a proxy from anyone (kubelet_wait.hold).
    switching = [
        n
        for n, v in sim.nodes.items()
        if v.labels.get(MODE_LABEL) == "switching" and n not in sim.down
    ]
    assert len(switching) <= budget, f"{switching} between proxies at once"
    recorded = {n for s in status.stages for n in s.nodes} | {m.node for m in status.moves}
    labelled = {
        n
        for n, v in sim.nodes.items()
        if MODE_LABEL in v.labels and v.labels[MODE_LABEL] != labels_before.get(n)
    }
    assert labelled <= recorded, f"labelled but not recorded: {sorted(labelled - recorded)}"


def terminal(policy: ProxyModePolicy) -> bool:
    return policy.status.phase in (Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED)


def phase_is(*phases: Phase) -> Callable[[ProxyModePolicy], bool]:
    return lambda p: p.status.phase in phases


def config_mode(sim: Sim) -> str:
    text = sim.get("ConfigMap", "kube-proxy")["data"]["config.conf"]
    return str(yaml.load(text, Loader=FAST_LOADER)["mode"])  # noqa: S506 - a safe loader


def nodes_labelled(sim: Sim, value: str) -> set[str]:
    return {n for n, v in sim.nodes.items() if v.labels.get(MODE_LABEL) == value}


# -- fields the engine v2 restructure changes: adapt here, in one place ------------------------


def rollback_code(status: PolicyStatus) -> str | None:
    """The rollback reason's code (``rollbackReason``, a RollbackReason)."""
    return None if status.rollback_reason is None else str(status.rollback_reason)


def rollback_text(status: PolicyStatus) -> str:
    """The rollback's human message (``rollbackMessage``)."""
    return status.rollback_message or ""


def paused_code(status: PolicyStatus) -> str | None:
    return None if status.paused_reason is None else str(status.paused_reason)


def condition(status: PolicyStatus, kind: str) -> str:
    return {c.type: c.status for c in status.conditions}[kind]


def history_reasons(status: PolicyStatus) -> list[str]:
    return [str(h.reason) for h in status.history]


def with_exclusion_term(spec: dict[str, Any], target: str) -> dict[str, Any]:
    """What KeepExclusionTerm promises: the original spec, the term ANDed into every
    required node-affinity term (kubeadm's DaemonSet has none: it becomes the only one)."""
    want = json.loads(json.dumps(spec))
    term = {"key": MODE_LABEL, "operator": "NotIn", "values": [target, "switching"]}
    pod = want["template"]["spec"]
    required = pod.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    terms = required.setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": [{}]}
    )["nodeSelectorTerms"]
    for t in terms:
        t["matchExpressions"] = [*t.get("matchExpressions", []), term]
    return want


def with_rival(sim: Sim) -> dict[str, Any]:
    """Another migration's ``NotIn [ipvs, switching]`` on the source DaemonSet, as its
    operator leaves it (OnDelete, the original strategy noted); returns that expression."""
    rival = {"key": MODE_LABEL, "operator": "NotIn", "values": ["ipvs", "switching"]}
    ds = sim.get("DaemonSet", "kube-proxy")
    ds["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [rival]}]
            }
        }
    }
    ds["spec"]["updateStrategy"] = {"type": "OnDelete"}
    ds["metadata"]["annotations"] = {STRATEGY_ANNOTATION: json.dumps(DEFAULT_STRATEGY)}
    sim._store(ds)
    return rival


def stray_canary_3() -> tuple[Sim, Run]:
    """A run past its canary on nodes of team a; canary-3 joins the team, its move starts,
    and that look's status write is lost: canary-3 is at switching, recorded nowhere (a
    stray). Invariant checks are off from there (the label is not in the stored status)."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    for node in sim.nodes.values():
        node.labels["team"] = "a"
    run = Run(sim, make_policy(maxUnavailable=3, nodeSelector={"matchLabels": {"team": "a"}}))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.add_node("canary-3", "canary")
    sim.nodes["canary-3"].labels["team"] = "a"
    sim.tick()
    sim.tick()
    run.checking = False
    run.step(lose_status=True)
    return sim, run
