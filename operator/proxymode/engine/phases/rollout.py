"""Progressing / Analyzing: move the current stage's nodes, bake, count the gate, promote."""

from __future__ import annotations

from collections.abc import Sequence

from proxymode.api.models import (
    Analysis,
    AnalysisStatus,
    CheckResult,
    MoveDirection,
    OnNoData,
    Phase,
    StagePhase,
    StageStatus,
    Verdict,
)
from proxymode.api.reasons import EventReason, PauseReason, RollbackReason
from proxymode.engine import gate, moves
from proxymode.engine.gate import GateVerdict
from proxymode.engine.look import Look
from proxymode.engine.observed import CheckOutcome
from proxymode.engine.setup import ensure_setup
from proxymode.engine.stages import covers_every_node, refresh_plan, start_stage


def look(lk: Look) -> Phase | None:
    if not ensure_setup(lk):
        lk.soon(1)
        return None
    refresh_plan(lk)
    index = lk.status.current_stage or 0
    stage = lk.status.stages[index]
    if stage.phase == StagePhase.PENDING:
        start_stage(lk, index)
    failure = moves.drive(lk) or moves.health_failure(lk)
    if failure:
        lk.breach(RollbackReason.KUBE_PROXY_UNHEALTHY, failure)
        return None
    moves.start_moves(lk, moves.forward_todo(lk), MoveDirection.FORWARD)
    done = [
        n for n in stage.nodes if moves.healthy_proxy(lk.obs, n, lk.target_mode) and lk.at_target(n)
    ]
    stage.nodes_done = len(done)
    if len(done) < len(stage.nodes) or lk.status.moves:
        lk.transition(
            Phase.PROGRESSING,
            EventReason.STAGE_PROGRESSING,
            f"stage {stage.name}: {len(done)}/{len(stage.nodes)} nodes moved",
        )
        lk.soon(2)
        return None
    if stage.phase == StagePhase.PROGRESSING:
        stage.phase = StagePhase.BAKING
        stage.baked_since = lk.now
    lk.transition(
        Phase.ANALYZING,
        EventReason.STAGE_BAKING,
        f"stage {stage.name}: all {len(done)} nodes moved; baking",
    )
    return _bake(lk, index)


def _bake(lk: Look, index: int) -> Phase | None:
    stage = lk.status.stages[index]
    spec_stage = lk.spec.stages[index]
    baked = (lk.now - (stage.baked_since or lk.now)).total_seconds()
    # A person's promote overrides the gate (decision 0020), even a failing one. A stage
    # that holds no node while no node runs the target mode yet (an empty first stage) has
    # nothing to bake or measure: it completes at once (as preflight's StageSelectsNothing
    # says), never waiting for data that cannot come.
    empty = not stage.nodes and not any(lk.at_target(n) for n in lk.planned())
    verdict = GateVerdict.OPEN if lk.force_promote or empty else _gate(lk, stage)
    if verdict is None:
        return None  # breached: already acted on
    remaining = 0.0 if empty else spec_stage.bake_seconds - baked
    if not lk.force_promote and (remaining > 0 or verdict == GateVerdict.WAIT):
        lk.soon(max(1.0, remaining) if remaining > 0 else 5.0)
        lk.status.message = (
            f"stage {stage.name}: baking, {max(0, int(remaining))}s left"
            if remaining > 0
            else f"stage {stage.name}: baked; waiting for passing analysis rounds"
        )
        return None
    stage.phase = StagePhase.COMPLETED
    stage.completed_time = lk.now
    lk.event(EventReason.STAGE_COMPLETED, f"stage {stage.name} completed")
    if index + 1 < len(lk.status.stages):
        lk.status.current_stage = index + 1
        lk.transition(
            Phase.PROGRESSING,
            EventReason.STAGE_PROMOTED,
            f"stage {stage.name} promoted; next: {lk.status.stages[index + 1].name}",
        )
        lk.requeue = 1
        return None
    return _end_of_stages(lk)


def _gate(lk: Look, stage: StageStatus) -> GateVerdict | None:
    """Record a fresh round, then act on the gate's verdict. None when it breached."""
    analysis = lk.spec.analysis
    if analysis is None:
        return GateVerdict.OPEN
    lk.soon(float(analysis.interval_seconds))
    status = lk.status.analysis or AnalysisStatus()
    lk.status.analysis = status
    round_ = lk.obs.analysis
    warm_from = stage.baked_since
    fresh = round_ is not None and (
        status.last_round_time is None or round_.time > status.last_round_time
    )
    if round_ is not None and fresh and warm_from is not None:
        status.last_round_time = round_.time
        status.checks = [
            CheckResult(
                name=c.name,
                canary=c.canary,
                baseline=c.baseline,
                verdict=Verdict(c.verdict),
                message=c.message,
            )
            for c in round_.checks
        ]
        if (round_.time - warm_from).total_seconds() >= analysis.warmup_seconds:
            gate.count_round(status, gate.round_verdict(round_.checks))
            _report_round(lk, status, round_.checks, analysis)
            # Kept from the first counted round (past warm-up), for the last stage, when
            # no node is left on the source mode to compare with.
            baseline = lk.status.baseline
            if baseline is not None and round_.baseline_values and not baseline.metrics:
                baseline.metrics = dict(round_.baseline_values)
    verdict = gate.gate_verdict(analysis, status)
    if verdict == GateVerdict.FAILED:
        failing = [c.name for c in status.checks if c.verdict == Verdict.FAIL]
        lk.breach(
            RollbackReason.ANALYSIS_FAILED,
            f"checks failing {status.consecutive_failures} rounds in a row: {', '.join(failing)}",
        )
        return None
    if verdict == GateVerdict.NO_DATA:
        rounds = status.consecutive_inconclusive
        if analysis.on_no_data == OnNoData.ROLLBACK:
            lk.start_rollback(
                RollbackReason.NO_DATA,
                f"no metric data for {rounds} rounds (onNoData: Rollback)",
            )
            return None
        if analysis.on_no_data == OnNoData.PAUSE:
            lk.pause(
                PauseReason.NO_DATA,
                f"no metric data for {rounds} rounds (onNoData: Pause);"
                " resume when Prometheus answers",
            )
            return None
        return GateVerdict.OPEN  # Continue: said loudly in the condition, never silently
    return verdict


def _report_round(
    lk: Look, status: AnalysisStatus, checks: Sequence[CheckOutcome], analysis: Analysis
) -> None:
    """One Warning Event per counted round that did not pass, naming what and how far.

    Passing rounds stay quiet (status shows them); a failing or inconclusive round is what
    an operator watching ``kubectl get events`` needs to see before the limit hits.
    """
    verdict = gate.round_verdict(checks)
    if verdict == Verdict.PASS:
        return
    if verdict == Verdict.FAIL:
        count, limit, kind = status.consecutive_failures, analysis.failure_limit, "failing"
        shown = [c for c in checks if c.verdict == Verdict.FAIL]
        reason = EventReason.ANALYSIS_ROUND_FAILED
    else:
        count, limit, kind = (
            status.consecutive_inconclusive,
            analysis.inconclusive_limit,
            "inconclusive",
        )
        shown = [c for c in checks if c.verdict == Verdict.INCONCLUSIVE]
        reason = EventReason.ANALYSIS_ROUND_INCONCLUSIVE
    detail = "; ".join(f"{c.name}: {c.message}" for c in shown) or "no checks answered"
    lk.event(
        reason,
        f"stage {lk.stage_name() or '-'} round {status.rounds}: {detail} ({count} of {limit}"
        f" {kind} rounds in a row)",
        warning=True,
    )


def _end_of_stages(lk: Look) -> Phase | None:
    if lk.spec.finalize and covers_every_node(lk):
        lk.transition(
            Phase.FINALIZING,
            EventReason.FINALIZING,
            "every node runs the target mode; folding it into the source objects",
        )
        return Phase.FINALIZING
    planned = len(lk.planned())
    lk.status.finalized = False
    lk.status.completed_time = lk.now
    lk.transition(
        Phase.COMPLETED,
        EventReason.COMPLETED,
        f"{planned} nodes run {lk.spec.target_mode}; the others stay on"
        f" {lk.status.source_mode}, both DaemonSets kept (mixed mode)",
    )
    lk.requeue = 60
    return None
