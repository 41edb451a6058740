"""The operator's own metrics: the series a scrape returns after looks driven by the engine.

The policy runs in the engine's cluster model (``tests.unit.engine.sim``) with analysis
rounds fed in, so the statuses and observations behind the metrics are the engine's real
output; the text is parsed back with prometheus_client's own parser.
"""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.engine.actions import EmitEvent
from proxymode.engine.machine import advance
from proxymode.engine.observed import (
    SWITCHING,
    AnalysisRound,
    CheckOutcome,
    NodeView,
    Observed,
    ProxyKind,
    ProxyPod,
)
from proxymode.kube.reconcile import LookTimer
from proxymode.kube.rounds import round_due
from proxymode.telemetry import Telemetry, node_modes, round_result
from tests.unit.engine.sim import Sim

SPEC = {
    "targetMode": "nftables",
    "stages": [
        {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}, "bakeSeconds": 10},
        {"name": "all", "percent": 100, "bakeSeconds": 10},
    ],
    "analysis": {
        "prometheus": {"url": "http://prometheus:9090"},
        # Short: a round 10 s after the switch holds only the new proxy's samples and counts
        # (decision 0015).
        "windowSeconds": 10,
        "warmupSeconds": 0,
        "failureLimit": 2,
        "minPassingRounds": 1,
        "checks": [{"name": "sync", "template": "SyncLatencyP99", "maxSeconds": 1}],
    },
}


def samples(telemetry: Telemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, keyed by name and sorted labels."""
    text = generate_latest(telemetry.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(telemetry: Telemetry, name: str, **labels: str) -> float | None:
    return samples(telemetry).get((name, tuple(sorted(labels.items()))))


def run(canary_p99: float, steps: int = 400) -> tuple[Telemetry, ProxyModePolicy]:
    """Drive a policy to its end, reporting every look to a Telemetry as the reconciler does."""
    telemetry = Telemetry()
    sim = Sim.cluster({"canary": 2, "general": 2})
    policy = ProxyModePolicy.model_validate(
        {"metadata": {"name": "to-nft", "uid": "u1", "generation": 1}, "spec": SPEC}
    )
    for _ in range(steps):
        obs = sim.observe(generation=1)
        check = CheckOutcome(
            "sync",
            "Fail" if canary_p99 > 1 else "Pass",
            canary=canary_p99,
            baseline=0.4,
            message=f"p99 {canary_p99}",
        )
        if round_due(policy, obs.now):  # as the reconciler asks: only while a stage bakes
            obs = dataclasses.replace(obs, analysis=AnalysisRound(obs.now, (check,)))
        decision = advance(policy, obs)
        sim.execute(decision.actions)
        telemetry.looked(
            "to-nft",
            before=policy.status,
            after=decision.status,
            target_mode="nftables",
            observed=obs,
            events=[a for a in decision.actions if isinstance(a, EmitEvent)],
        )
        policy = policy.model_copy(update={"status": decision.status})
        if policy.status.phase in (Phase.COMPLETED, Phase.ROLLED_BACK):
            return telemetry, policy
        sim.tick(min(decision.requeue_seconds, 5.0))
    raise AssertionError(f"still {policy.status.phase}")


def test_a_completed_migration_reads_back_from_the_scrape() -> None:
    telemetry, policy = run(canary_p99=0.3)
    assert policy.status.phase == Phase.COMPLETED
    assert value(telemetry, "proxymode_policy_phase", policy="to-nft", phase="Completed") == 1
    assert value(telemetry, "proxymode_policy_phase", policy="to-nft", phase="Analyzing") == 0
    assert value(telemetry, "proxymode_policy_stages", policy="to-nft") == 2
    assert value(telemetry, "proxymode_policy_stages_completed", policy="to-nft") == 2
    assert value(telemetry, "proxymode_policy_nodes", policy="to-nft", state="planned") == 4
    assert value(telemetry, "proxymode_policy_nodes", policy="to-nft", state="moved") == 4
    assert value(
        telemetry,
        "proxymode_policy_info",
        policy="to-nft",
        source_mode="iptables",
        target_mode="nftables",
    )
    got = samples(telemetry)
    modes = {
        dict(labels)["node"]: dict(labels)["mode"]
        for (name, labels), _ in got.items()
        if name == "proxymode_node_mode_info"
    }
    assert set(modes.values()) == {"nftables"} and len(modes) == 4
    transitions = {
        (dict(labels)["from_phase"], dict(labels)["to_phase"])
        for (name, labels), v in got.items()
        if name == "proxymode_phase_transitions_total" and v > 0
    }
    assert ("Finalizing", "Completed") in transitions
    passed = value(telemetry, "proxymode_analysis_rounds_total", policy="to-nft", result="Pass")
    assert passed is not None and passed >= 2
    assert value(telemetry, "proxymode_analysis_check_value", **_check("canary")) == 0.3


def _check(group: str) -> dict[str, str]:
    return {"policy": "to-nft", "check": "sync", "group": group}


def test_a_breach_shows_the_failing_check_and_the_rollback() -> None:
    telemetry, policy = run(canary_p99=1.8)
    assert policy.status.phase == Phase.ROLLED_BACK
    assert value(telemetry, "proxymode_policy_phase", policy="to-nft", phase="RolledBack") == 1
    verdict = {"policy": "to-nft", "check": "sync"}
    assert value(telemetry, "proxymode_analysis_check_verdict", **verdict, verdict="Fail") == 1
    assert value(telemetry, "proxymode_analysis_check_verdict", **verdict, verdict="Pass") == 0
    assert value(telemetry, "proxymode_analysis_check_value", **_check("canary")) == 1.8
    assert value(telemetry, "proxymode_analysis_check_value", **_check("baseline")) == 0.4
    assert value(telemetry, "proxymode_analysis_rounds_total", policy="to-nft", result="Fail") == 2
    failed = value(
        telemetry,
        "proxymode_events_total",
        policy="to-nft",
        type="Warning",
        reason="AnalysisRoundFailed",
    )
    assert failed == 2
    assert value(telemetry, "proxymode_policy_nodes", policy="to-nft", state="moved") == 0


def test_a_deleted_policy_leaves_no_state_series() -> None:
    telemetry, _ = run(canary_p99=0.3)
    telemetry.forget("to-nft")
    names = {name for name, labels in samples(telemetry) if ("policy", "to-nft") in labels}
    assert not {n for n in names if n.startswith(("proxymode_policy_", "proxymode_analysis_check"))}
    assert "proxymode_phase_transitions_total" in names  # counters are history and stay


NOW = datetime(2026, 11, 1, tzinfo=UTC)


def _pod(node: str, kind: ProxyKind, ready: bool = True) -> ProxyPod:
    return ProxyPod(name=f"{kind}-{node}", node=node, kind=kind, ready=ready)


def test_node_modes_come_from_the_pods_not_the_labels() -> None:
    observed = Observed(
        now=NOW,
        generation=1,
        nodes=(
            NodeView("src"),
            NodeView("tgt", labels={"proxymode.io/mode": "nftables"}),
            NodeView("mid", labels={"proxymode.io/mode": SWITCHING}),
            NodeView("two"),
            NodeView("cold", labels={"proxymode.io/mode": "nftables"}),
        ),
        pods=(
            _pod("src", ProxyKind.SOURCE),
            _pod("tgt", ProxyKind.TARGET),
            _pod("two", ProxyKind.SOURCE),
            _pod("two", ProxyKind.TARGET),
            _pod("cold", ProxyKind.TARGET, ready=False),
        ),
    )
    assert node_modes(observed, "iptables", "nftables") == {
        "src": "iptables",
        "tgt": "nftables",
        "mid": SWITCHING,
        "two": "both",
        "cold": "none",
    }


def test_round_result_is_the_worst_verdict() -> None:
    def round_of(*verdicts: str) -> AnalysisRound:
        return AnalysisRound(NOW, tuple(CheckOutcome(f"c{i}", v) for i, v in enumerate(verdicts)))

    assert round_result(round_of("Pass", "Inconclusive", "Fail")) == "Fail"
    assert round_result(round_of("Pass", "Inconclusive")) == "Inconclusive"
    assert round_result(round_of()) == "Inconclusive"
    assert round_result(round_of("Pass", "Pass")) == "Pass"


def test_a_look_is_timed_in_parts_and_its_own_time_leaves_the_actions_out() -> None:
    """Each part lands in its own series, and only once the look got to the end; the
    own-time histogram sums every part but act."""
    telemetry = Telemetry()
    clock = LookTimer(telemetry)
    waits = {
        "read": 0,
        "observe": 0,
        "measure": 0,
        "decide": 0,
        "act": 0.06,
        "store": 0,
        "record": 0,
    }
    for part, wait in waits.items():
        time.sleep(wait)
        clock.done(part)
    unflushed = generate_latest(telemetry.registry).decode()
    assert "proxymode_look_own_duration_seconds_count 0.0" in unflushed  # a look stopped early
    clock.flush()
    samples = {
        (s.name, s.labels.get("part")): s.value
        for family in text_string_to_metric_families(generate_latest(telemetry.registry).decode())
        for s in family.samples
        if s.name.endswith("_sum") or s.name.endswith("_count")
    }
    for part in waits:
        assert samples[("proxymode_look_part_duration_seconds_count", part)] == 1
    act = samples[("proxymode_look_part_duration_seconds_sum", "act")]
    own = samples[("proxymode_look_own_duration_seconds_sum", None)]
    assert act >= 0.06 > own
    assert samples[("proxymode_look_own_duration_seconds_count", None)] == 1
    parts = sum(samples[("proxymode_look_part_duration_seconds_sum", p)] for p in waits)
    assert abs(parts - act - own) < 1e-6


def test_a_looks_cpu_time_leaves_its_waits_out() -> None:
    """A part that waits (the API server, a busy machine) adds to the look's own time and not
    to its CPU time; a part that works adds to both; act adds to neither."""
    telemetry = Telemetry()
    clock = LookTimer(telemetry)
    time.sleep(0.05)
    clock.done("read")  # waiting, as on a GET
    spin_until = time.thread_time() + 0.03
    while time.thread_time() < spin_until:
        pass
    clock.done("decide")  # working
    spin_until = time.thread_time() + 0.05
    while time.thread_time() < spin_until:
        pass
    clock.done("act")  # left out of both
    clock.flush()
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(generate_latest(telemetry.registry).decode())
        for s in family.samples
        if s.name.endswith("_sum") or s.name.endswith("_count")
    }
    own, cpu = (
        samples["proxymode_look_own_duration_seconds_sum"],
        samples["proxymode_look_cpu_seconds_sum"],
    )
    assert samples["proxymode_look_cpu_seconds_count"] == 1
    assert own >= 0.08
    assert 0.03 <= cpu < 0.05, cpu
