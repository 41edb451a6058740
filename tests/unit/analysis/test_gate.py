"""The judge's outcomes through the engine's gate: limits, warm-up and the no-data policies.

The engine (``machine._gate``) counts the rounds; these tests feed it rounds the judge made
from measured samples, in the simulated cluster of the engine tests, so the two agree on
what a Fail, an Inconclusive and a Pass mean. A round is taken at every step (5 s apart).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from proxymode.analysis.judge import Sample, judge
from proxymode.analysis.templates import clipped_window
from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.engine.actions import EmitEvent
from proxymode.engine.machine import advance
from proxymode.engine.observed import AnalysisRound
from tests.unit.engine.sim import Sim

# What the adapter measured, given the policy's status and the time (seconds since the
# current stage started baking, None before that).
World = Callable[[float | None], Sample]

STAGES = [
    {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}, "bakeSeconds": 30},
    {"name": "all", "percent": 100, "bakeSeconds": 30},
]


def policy_with(**analysis: Any) -> ProxyModePolicy:
    spec = {
        "targetMode": "nftables",
        "stages": STAGES,
        "analysis": {
            "prometheus": {"url": "http://prometheus:9090"},
            "warmupSeconds": 0,
            "failureLimit": 2,
            "inconclusiveLimit": 3,
            "minPassingRounds": 2,
            "checks": [{"name": "sync", "template": "SyncLatencyP99", "maxSeconds": 1}],
            **analysis,
        },
    }
    return ProxyModePolicy.model_validate(
        {"metadata": {"name": "to-nft", "uid": "uid-1", "generation": 1}, "spec": spec}
    )


def _baked_for(policy: ProxyModePolicy, now: Any) -> float | None:
    index = policy.status.current_stage
    if index is None or index >= len(policy.status.stages):
        return None
    since = policy.status.stages[index].baked_since
    return None if since is None else (now - since).total_seconds()


def drive(
    policy: ProxyModePolicy,
    world: World,
    limit: int = 300,
    events: list[EmitEvent] | None = None,
) -> ProxyModePolicy:
    """Step until the policy completes, rolls back, fails or pauses (Events into ``events``)."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    analysis = policy.spec.analysis
    assert analysis is not None
    for _ in range(limit):
        obs = sim.observe(generation=1)
        baked = _baked_for(policy, obs.now)
        sample = world(baked)
        # As the adapter measures: the window clipped to the stage's switch (decision 0015).
        window = clipped_window(analysis.window_seconds, baked)
        round_ = AnalysisRound(
            obs.now,
            tuple(judge(c, sample) for c in analysis.checks),
            window_start=obs.now - timedelta(seconds=window),
        )
        decision = advance(policy, dataclasses.replace(obs, analysis=round_))
        sim.execute(decision.actions)
        if events is not None:
            events.extend(a for a in decision.actions if isinstance(a, EmitEvent))
        policy = policy.model_copy(update={"status": decision.status})
        if policy.status.phase in (Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED, Phase.PAUSED):
            return policy
        sim.tick(min(decision.requeue_seconds, 5.0))
    raise AssertionError(f"still {policy.status.phase} after {limit} steps")


def history(policy: ProxyModePolicy) -> str:
    """The policy's history, reasons and messages, as one text."""
    return "\n".join(f"{h.reason}: {h.message}" for h in policy.status.history)


def test_passing_rounds_promote_every_stage() -> None:
    done = drive(policy_with(), lambda _: Sample(0.2))
    assert done.status.phase == Phase.COMPLETED, done.status.message
    assert done.status.analysis is not None and done.status.analysis.consecutive_failures == 0


def test_failed_rounds_roll_back_at_the_failure_limit() -> None:
    done = drive(policy_with(), lambda _: Sample(1.84))
    assert done.status.phase == Phase.ROLLED_BACK
    assert done.status.rollback_reason == "AnalysisFailed"
    assert done.status.rollback_message == "checks failing 2 rounds in a row: sync"
    analysis = done.status.analysis
    assert analysis is not None and (analysis.rounds, analysis.consecutive_failures) == (2, 2)
    assert [(c.verdict, c.canary, c.message) for c in analysis.checks] == [
        ("Fail", 1.84, "p99 sync 1.840s > maxSeconds 1s")
    ]


def round_events(events: list[EmitEvent]) -> list[tuple[str, str, str]]:
    return [(e.type, e.reason, e.message) for e in events if e.reason.startswith("AnalysisRound")]


def test_each_failing_round_is_an_event_and_passing_rounds_are_quiet() -> None:
    events: list[EmitEvent] = []
    drive(policy_with(), lambda _: Sample(1.84), events=events)
    failing = "sync: p99 sync 1.840s > maxSeconds 1s"
    assert round_events(events) == [
        (
            "Warning",
            "AnalysisRoundFailed",
            f"stage canary round 1: {failing} (1 of 2 failing rounds in a row)",
        ),
        (
            "Warning",
            "AnalysisRoundFailed",
            f"stage canary round 2: {failing} (2 of 2 failing rounds in a row)",
        ),
    ]
    quiet: list[EmitEvent] = []
    drive(policy_with(), lambda _: Sample(0.2), events=quiet)
    assert round_events(quiet) == []


def test_each_inconclusive_round_is_an_event_with_the_reason() -> None:
    events: list[EmitEvent] = []
    drive(policy_with(), lambda _: UNREACHABLE, events=events)
    got = round_events(events)
    assert [(t, r) for t, r, _ in got] == [("Warning", "AnalysisRoundInconclusive")] * 3
    assert got[2][2] == (
        "stage canary round 3: sync: no verdict: Prometheus unreachable: connection refused"
        " (3 of 3 inconclusive rounds in a row)"
    )


def test_warm_up_rounds_are_not_counted() -> None:
    # A fresh kube-proxy is slow for its first 20 s of baking, then fine.
    def slow_start(baked: float | None) -> Sample:
        return Sample(3.0 if baked is not None and baked < 20 else 0.2)

    warm = drive(policy_with(warmupSeconds=25), slow_start)
    assert warm.status.phase == Phase.COMPLETED, warm.status.message
    cold = drive(policy_with(warmupSeconds=0), slow_start)
    assert cold.status.phase == Phase.ROLLED_BACK


def test_a_single_failed_round_below_the_limit_does_not_roll_back() -> None:
    # one bad round right after baking starts; failureLimit 2 needs two in a row
    def one_blip(baked: float | None) -> Sample:
        return Sample(3.0 if baked is not None and baked < 4 else 0.2)

    done = drive(policy_with(), one_blip)
    assert done.status.phase == Phase.COMPLETED, done.status.message


UNREACHABLE = Sample(None, error="Prometheus unreachable: connection refused")


def test_no_data_pauses_by_default() -> None:
    done = drive(policy_with(), lambda _: UNREACHABLE)
    assert done.status.phase == Phase.PAUSED
    assert "NoData" in history(done)
    assert done.status.analysis is not None
    assert done.status.analysis.consecutive_inconclusive == 3
    assert done.status.analysis.checks[0].message.endswith("connection refused")


def test_no_data_rolls_back_when_asked() -> None:
    done = drive(policy_with(onNoData="Rollback"), lambda _: UNREACHABLE)
    assert done.status.phase == Phase.ROLLED_BACK
    assert "NoData" in history(done)


@pytest.mark.parametrize(
    "sample",
    [Sample(float("nan")), Sample(None)],
    ids=["nan", "empty"],
)
def test_nan_and_empty_results_count_as_no_data(sample: Sample) -> None:
    done = drive(policy_with(), lambda _: sample)
    assert done.status.phase == Phase.PAUSED and "NoData" in history(done)
    assert done.status.analysis is not None
    assert all(c.canary is None for c in done.status.analysis.checks)


def test_no_data_continues_when_asked_and_says_so() -> None:
    done = drive(policy_with(onNoData="Continue"), lambda _: UNREACHABLE)
    assert done.status.phase == Phase.COMPLETED, done.status.message


def test_a_missing_baseline_holds_the_stage() -> None:
    checks = [{"name": "sync", "template": "SyncLatencyP99", "maxRatioToBaseline": 2}]
    done = drive(policy_with(checks=checks), lambda _: Sample(0.2, baseline=None))
    assert done.status.phase == Phase.PAUSED and "NoData" in history(done)
    passing = drive(policy_with(checks=checks), lambda _: Sample(0.2, baseline=0.15))
    assert passing.status.phase == Phase.COMPLETED
