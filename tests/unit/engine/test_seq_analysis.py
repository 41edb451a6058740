"""Issue 9 sequences about analysis: baselines, counting rounds, no-data, the window.

The controller model hands the engine an analysis round (``Sim.verdict``) every
``Sim.round_every`` seconds, as the Prometheus adapter would. Each test asserts the
behaviour issue 9 expects; xfail(strict) marks what today's engine gets wrong.
"""

from __future__ import annotations

from typing import Any

from proxymode.api.models import Phase, ProxyModePolicy
from proxymode.engine.actions import EmitEvent
from tests.unit.engine.seq import (
    ANALYSIS,
    THREE_STAGES,
    Run,
    condition,
    history_reasons,
    make_policy,
    nodes_labelled,
    paused_code,
    phase_is,
    rollback_code,
    terminal,
    with_spec,
)
from tests.unit.engine.sim import Sim

TWO_CHECKS: dict[str, Any] = {
    **ANALYSIS,
    "checks": [
        {"name": "sync-latency", "template": "SyncLatencyP99", "maxSeconds": 1},
        {"name": "sync-failures", "template": "SyncFailures", "max": 0},
    ],
}


def _analysed_run(sim: Sim, bake: int = 600, **analysis: Any) -> Run:
    stages = [{**s, "bakeSeconds": bake} for s in THREE_STAGES]
    return Run(sim, make_policy(stages=stages, analysis={**ANALYSIS, **analysis}))


def _feed(run: Run, verdicts: list[str]) -> None:
    """One fresh counted round per verdict, in order, while the stage bakes."""
    for verdict in verdicts:
        run.sim.verdict = verdict
        run.sim._last_round = None  # a fresh round now
        analysis = run.policy.status.analysis
        counted = analysis.rounds if analysis else 0
        for _ in range(10):
            run.step()
            analysis = run.policy.status.analysis
            if (analysis and analysis.rounds > counted) or run.policy.status.phase not in (
                Phase.ANALYZING,
            ):
                break
        run.sim.verdict = None


def _events_text(run: Run) -> str:
    return " ".join(
        f"{a.reason} {a.message}"
        for d in run.decisions
        for a in d.actions
        if isinstance(a, EmitEvent)
    ).lower()


def test_a_baseline_missing_a_check_in_the_first_round_is_completed_later() -> None:
    """issue 9 item 12: the baseline metrics are retried until every check has one."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    sim.checks = ("sync-latency", "sync-failures")
    sim.verdict = "Pass"
    sim.baseline_values = {"sync-latency": 0.4}  # sync-failures timed out
    run = Run(sim, make_policy(analysis=TWO_CHECKS))
    run.until(lambda p: p.status.analysis is not None and p.status.analysis.rounds >= 1)
    sim.baseline_values = {"sync-latency": 0.4, "sync-failures": 0.0}
    run.until(terminal)
    assert run.policy.status.baseline is not None
    assert set(run.policy.status.baseline.metrics) == {"sync-latency", "sync-failures"}


def test_a_single_full_stage_records_its_baseline_before_the_first_move() -> None:
    """issue 9 item 12: the baseline is taken before the first move, while every node still
    runs the source mode (afterwards no baseline group is left)."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.verdict = "Pass"
    sim.baseline_values = {"sync-latency": 0.4}
    run = Run(sim, make_policy(stages=[{"name": "all", "percent": 100}], analysis=ANALYSIS))
    run.until(terminal)
    assert run.policy.status.phase == Phase.COMPLETED, run.policy.status.message
    assert run.policy.status.baseline is not None
    assert run.policy.status.baseline.metrics == {"sync-latency": 0.4}


def test_failing_rounds_count_while_a_newcomer_joins_a_baking_stage() -> None:
    """issue 9 item 19: failing rounds during a newcomer's move count (failureLimit 2):
    the stage rolls back without waiting for every newcomer to arrive."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.verdict = "Pass"
    run = _analysed_run(sim)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    newcomers = {f"canary-{i}" for i in range(3, 9)}
    for name in sorted(newcomers):
        sim.add_node(name, "canary")
    sim.tick()
    sim.tick()
    sim.verdict = "Fail"
    run.until(phase_is(Phase.ROLLING_BACK, Phase.ROLLED_BACK), limit=200)
    assert rollback_code(run.policy.status) == "AnalysisFailed"
    assert not newcomers <= nodes_labelled(sim, "nftables") | nodes_labelled(sim, "switching"), (
        "counted only once every newcomer had arrived"
    )


def test_a_breach_while_paused_without_automatic_rollback_is_reported() -> None:
    """issue 9 item 22: canaries crash-looping during a pause (rollback.automatic false):
    Degraded=True and a Warning naming the node."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    slow = [{**s, "bakeSeconds": 3600} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=slow, rollback={"automatic": False}))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    run.policy = with_spec(run.policy, paused=True)
    run.until(lambda p: p.status.phase == Phase.PAUSED)
    before = len(run.decisions)
    for pod in sim.pods:
        if pod.owner != "kube-proxy":
            pod.crashloop = True
    run.steps(10)
    warnings = [
        a
        for d in run.decisions[before:]
        for a in d.actions
        if isinstance(a, EmitEvent) and a.type == "Warning"
    ]
    assert any("canary-" in w.message for w in warnings), [w.reason for w in warnings]
    assert condition(run.policy.status, "Degraded") == "True"


def test_on_no_data_continue_says_that_it_promoted_without_data() -> None:
    """issue 9 item 23: a promotion on onNoData: Continue is said in an Event and history."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.verdict = "Inconclusive"
    stages = [{**s, "bakeSeconds": 20} for s in THREE_STAGES]
    run = Run(sim, make_policy(stages=stages, analysis={**ANALYSIS, "onNoData": "Continue"}))
    run.until(lambda p: (p.status.current_stage or 0) >= 1)
    promoted = [h for h in run.policy.status.history if h.reason == "StagePromoted"]
    text = _events_text(run) + " ".join(h.message.lower() for h in promoted)
    assert "no data" in text or "nodata" in text or "no metric data" in text


def test_rounds_whose_window_reaches_before_the_switch_do_not_count() -> None:
    """issue 9 item 27: no sample from before a node's switch counts toward the canary
    group: within windowSeconds of the last canary's switch, a round whose window starts
    before it (round time - windowSeconds) is not counted (decision 0020)."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.verdict = "Fail"  # the window still holds the slow iptables-era samples
    run = _analysed_run(sim, windowSeconds=300)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    baked_since = run.policy.status.stages[0].baked_since
    assert baked_since is not None
    while (sim.now - baked_since).total_seconds() < 200:
        run.step()
    assert run.policy.status.phase == Phase.ANALYZING, run.policy.status.message


def test_an_inconclusive_round_does_not_reset_the_failure_count() -> None:
    """issue 9 Also, decision 0020: Fail, Inconclusive, Fail with failureLimit 2 rolls back:
    no data is not evidence of health, so it neither resets nor adds to the failures."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = _analysed_run(sim, inconclusiveLimit=3)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    _feed(run, ["Fail", "Inconclusive"])
    assert run.policy.status.phase == Phase.ANALYZING
    _feed(run, ["Fail"])
    assert run.policy.status.phase == Phase.ROLLING_BACK
    assert rollback_code(run.policy.status) == "AnalysisFailed"


def test_a_passing_round_resets_the_failure_count() -> None:
    """issue 9 Also, decision 0020: Fail, Pass, Fail with failureLimit 2 does not roll back."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = _analysed_run(sim, inconclusiveLimit=3)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    _feed(run, ["Fail", "Pass", "Fail"])
    assert run.policy.status.phase == Phase.ANALYZING, run.policy.status.message
    assert run.policy.status.analysis is not None
    assert run.policy.status.analysis.consecutive_failures == 1


def test_a_passing_round_resets_the_no_data_count_and_a_failing_one_does_too() -> None:
    """issue 9 Also, decision 0020: Inconclusive rounds in a row pause only when consecutive;
    a round that measured something (pass or fail) starts the no-data count again."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = _analysed_run(sim, inconclusiveLimit=2, failureLimit=3)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    _feed(run, ["Inconclusive", "Pass", "Inconclusive", "Fail", "Inconclusive"])
    assert run.policy.status.phase == Phase.ANALYZING, run.policy.status.message


def test_data_returning_after_a_no_data_pause_is_recorded_in_history() -> None:
    """issue 9 (tests, test_gates.py:136): after a NoData pause, the data returns: the
    policy resumes and status.history records DataReturned."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = _analysed_run(sim)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    _feed(run, ["Inconclusive", "Inconclusive"])
    assert run.policy.status.phase == Phase.PAUSED and paused_code(run.policy.status) == "NoData"
    # The pause names the check that had no answer (Prometheus may answer all the others).
    assert "(onNoData: Pause) (sync-latency" in (run.policy.status.message or "")
    sim.verdict = "Pass"
    run.until(lambda p: p.status.phase == Phase.ANALYZING, limit=30)
    assert "DataReturned" in history_reasons(run.policy.status)


def test_a_round_during_a_newcomers_move_is_recorded_so_the_interval_holds() -> None:
    """issue 9 item 19 (query rate): every fresh round the engine is handed while the stage
    bakes, newcomer or not, is recorded (last round time), so the next one is due only
    ``intervalSeconds`` later, not on every 2 s look."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.verdict = "Pass"
    run = _analysed_run(sim)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.add_node("canary-3", "canary")
    sim.tick()
    sim.tick()
    run.until(lambda p: p.status.phase == Phase.PROGRESSING, limit=10)
    sim._last_round = None  # a fresh round, taken during the newcomer's move
    run.step()
    assert run.policy.status.phase == Phase.PROGRESSING, "still moving the newcomer"
    analysis = run.policy.status.analysis
    assert analysis is not None and analysis.last_round_time == sim._last_round


def test_a_baseline_from_source_proxies_still_settling_is_replaced_once_they_settle() -> None:
    """Fresh source kube-proxies sync slowly at first: a baseline taken from them would be
    high, and ``maxRatioToBaseline`` lenient. Rounds while they settle (warmupSeconds +
    windowSeconds) only provisionally set it; the first round after keeps its value."""
    sim = Sim.cluster({"canary": 2, "general": 4})
    sim.verdict = "Pass"
    sim.baseline_values = {"sync-latency": 2.5}  # the fresh pods' slow first syncs
    slow = [{**s, "bakeSeconds": 120} for s in THREE_STAGES]
    policy = make_policy(stages=slow, analysis={**ANALYSIS, "warmupSeconds": 30})
    run = Run(sim, policy)
    born = sim.now

    def settle(_i: int, s: Sim, _p: ProxyModePolicy) -> None:
        age = (s.now - born).total_seconds()
        if age >= 30 + 10:  # warmupSeconds + windowSeconds: settled
            s.baseline_values = {"sync-latency": 0.3 if age < 70 else 9.9}  # then kept

    run.until(lambda p: p.status.baseline is not None and bool(p.status.baseline.metrics))
    assert run.policy.status.baseline is not None
    assert run.policy.status.baseline.provisional == ["sync-latency"]
    run.until(terminal, hook=settle)
    baseline = run.policy.status.baseline
    assert baseline.metrics == {"sync-latency": 0.3} and baseline.provisional == []


def test_a_baked_stage_says_it_warms_up_then_how_many_passing_rounds_it_has() -> None:
    """A stage that has baked waits for the gate. While the analysis warms up no round
    counts; the status says so with the time it ends (not a countdown: an idle look writes
    nothing), then how many passing rounds it has of those it needs."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.verdict = "Pass"
    run = _analysed_run(sim, bake=0, warmupSeconds=60, minPassingRounds=3)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    baked_since = run.policy.status.stages[0].baked_since
    assert baked_since is not None
    warm = run.policy.status.message
    assert "analysis warming up until" in warm and "warmupSeconds 60" in warm, warm
    run.step()
    assert run.policy.status.message == warm  # the same words on the next look
    run.until(lambda p: "waiting for passing analysis rounds" in p.status.message)
    assert (sim.now - baked_since).total_seconds() >= 60
    assert run.policy.status.message.endswith("(1 of 3)"), run.policy.status.message
    run.until(lambda p: (p.status.current_stage or 0) >= 1)


def test_enough_passing_rounds_but_a_last_round_that_did_not_pass_is_named() -> None:
    """Passing rounds are a running count; the gate also wants the last round to pass. With
    enough of them, the wait names the checks of the last round that did not pass, never
    "9 of 3"."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.verdict = "Pass"
    run = _analysed_run(sim, bake=120, minPassingRounds=3, inconclusiveLimit=50)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    run.until(lambda p: (p.status.analysis.passing_rounds if p.status.analysis else 0) >= 4)
    sim.verdict = "Inconclusive"
    run.until(lambda p: "waiting for a round in which every check passes" in p.status.message)
    message = run.policy.status.message
    assert "last round: sync-latency Inconclusive" in message, message
    assert " of 3)" not in message


def test_a_round_left_out_for_old_proxy_samples_says_so_until_one_counts() -> None:
    """A round whose window reaches back before the stage's last switch is not counted
    (issue 9 item 27); the status says so, on every look until a round counts (it used to be
    overwritten by the next idle look's wait, two writes a round)."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    sim.verdict = "Pass"
    run = _analysed_run(sim, bake=0, windowSeconds=300)
    run.until(lambda p: "round not counted" in p.status.message)
    left_out = run.policy.status.message
    assert "300s window reaches back before the stage's last switch" in left_out, left_out
    seen = set()
    while run.policy.status.phase == Phase.ANALYZING and (
        run.policy.status.analysis is None or run.policy.status.analysis.rounds == 0
    ):
        seen.add(run.policy.status.message)
        run.step()
    assert seen == {left_out}, seen
