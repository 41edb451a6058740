"""Progressing / Analyzing: move the current stage's nodes, bake, count the gate, promote."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from proxymode.api.models import (
    MAX_HISTORY,
    Analysis,
    AnalysisStatus,
    CheckResult,
    HistoryEntry,
    MoveDirection,
    OnNoData,
    Phase,
    StagePhase,
    StageStatus,
    Verdict,
)
from proxymode.api.reasons import EventReason, PauseReason, RollbackReason
from proxymode.engine import gate, moves, node_checks, walk
from proxymode.engine.gate import GateVerdict
from proxymode.engine.look import Look
from proxymode.engine.observed import MODE_LABEL, CheckOutcome, ProxyKind
from proxymode.engine.setup import ensure_setup
from proxymode.engine.stages import (
    covers_every_node,
    mixed_mode_words,
    named,
    nodes,
    refresh_plan,
    start_stage,
)


def look(lk: Look) -> Phase | None:
    if not ensure_setup(lk):
        lk.soon(1)
        return None
    refresh_plan(lk)
    index = lk.status.current_stage or 0
    stage = lk.status.stages[index]
    _record_baseline(lk, stage)
    if stage.phase == StagePhase.PENDING:
        start_stage(lk, index)
    failure = walk.drive(lk) or node_checks.health_failure(lk)
    if failure:
        lk.breach(moves.failure_reason(failure), failure)
        return None
    _walk_back_hand_labels(lk)
    held = walk.start_moves(lk, node_checks.forward_todo(lk), MoveDirection.FORWARD)
    done = moves.done(lk, stage.nodes)
    stage.nodes_done = len(done)
    if len(done) < len(stage.nodes) or lk.status.moves:
        # A newcomer joins a stage that bakes: its rounds still count (issue 9 item 19).
        if stage.phase == StagePhase.BAKING and _gate(lk, stage) is None:
            return None
        lk.transition(
            Phase.PROGRESSING,
            EventReason.STAGE_PROGRESSING,
            f"stage {stage.name}: {len(done)}/{len(stage.nodes)} nodes moved",
        )
        waiting = set(done)
        lk.status.message = f"{lk.status.message or ''}" + node_checks.kubelets_waited(
            lk, [n for n in stage.nodes if n not in waiting]
        )
        if lk.moves_held:
            lk.status.message = (
                f"{lk.status.message or ''}; no new node move starts: {lk.moves_held}"
            )
        elif held:
            lk.status.message = f"{lk.status.message or ''}" + (
                f"; maxUnavailable is held by {named(held)}, without a Ready kube-proxy:"
                " no further node moves until that changes"
            )
        lk.soon(2)
        return None
    if stage.phase == StagePhase.PROGRESSING:
        stage.phase = StagePhase.BAKING
        stage.baked_since = lk.now
    lk.transition(
        Phase.ANALYZING,
        EventReason.STAGE_BAKING,
        f"stage {stage.name}: all {nodes(len(done))} moved; baking",
    )
    return _bake(lk, index)


def _walk_back_hand_labels(lk: Look) -> None:
    """A target label a person set (on a node whose stage has not started, or that no move
    of this policy put there) is not a finished move: the node goes back (said once, when
    its move starts) and moves with its stage."""
    hand = node_checks.hand_labelled(lk)
    if not hand:
        return
    walk.start_moves(lk, hand, MoveDirection.BACK)
    started = [m.node for m in lk.status.moves if m.node in hand]
    if started:
        lk.event(
            EventReason.HAND_SET_LABEL,
            f"{named(started)}: {MODE_LABEL}={lk.target_mode} was set outside this policy,"
            f" not by a move of its own; moving back to {lk.status.source_mode or 'the source'}"
            " (through switching, with the cleanup), to move again with the stage",
            warning=True,
        )


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
        # The end time, not a countdown: the same words on every look while the stage
        # bakes, so an idle look writes no status (a countdown rewrote it every look).
        ends = (stage.baked_since or lk.now) + timedelta(seconds=spec_stage.bake_seconds)
        if remaining > 0:
            lk.status.message = (
                f"stage {stage.name}: baking until {ends:%Y-%m-%dT%H:%M:%SZ}"
                f" ({spec_stage.bake_seconds}s)"
            )
        else:
            lk.status.message = _waiting_for_rounds(lk, stage)
        return None
    behind = node_checks.forward_todo(lk)
    if index + 1 == len(lk.status.stages) and (behind or lk.status.moves):
        # The end (and Finalize's rolling restart) only with every planned node on the
        # target: one that lost its label is moved again first, with its cleanup (item 10).
        shown = ", ".join(behind[:5]) or ", ".join(m.node for m in lk.status.moves[:5])
        lk.status.message = (
            f"stage {stage.name}: baked; waiting for {shown} to be on {lk.target_mode} again"
        )
        lk.soon(2)
        return None
    stage.phase = StagePhase.COMPLETED
    stage.completed_time = lk.now
    lk.event(EventReason.STAGE_COMPLETED, f"stage {stage.name} completed")
    if verdict == GateVerdict.NO_DATA and not lk.force_promote:
        _promoted_without_data(lk, stage)
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


def _waiting_for_rounds(lk: Look, stage: StageStatus) -> str:
    """Why a baked stage still waits for its gate, from the status alone (so every look
    between two rounds says the same words and an idle look writes nothing): the warm-up
    (rounds in it do not count, so a person sees the gate is not stuck), a round left out
    because its window reaches back before the stage's last switch, the passing rounds it
    has of those it needs, or, with enough of them, a last round in which a check did not
    pass."""
    analysis = lk.spec.analysis
    status = lk.status.analysis
    head = f"stage {stage.name}: baked;"
    if analysis is None or status is None or stage.baked_since is None:
        return f"{head} waiting for passing analysis rounds"
    warm_until = stage.baked_since + timedelta(seconds=analysis.warmup_seconds)
    if lk.now < warm_until:
        return (
            f"{head} analysis warming up until {warm_until:%Y-%m-%dT%H:%M:%SZ}"
            f" (warmupSeconds {analysis.warmup_seconds}): rounds before then are not counted"
        )
    last = status.last_round_time
    if status.rounds == 0 and last is not None and last >= warm_until:
        return (
            f"{head} round not counted: its {analysis.window_seconds}s window reaches back"
            f" before the stage's last switch at {stage.baked_since:%Y-%m-%dT%H:%M:%SZ}"
            " (old-proxy samples)"
        )
    if status.passing_rounds >= analysis.min_passing_rounds:
        behind = [f"{c.name} {c.verdict}" for c in status.checks if c.verdict != Verdict.PASS]
        return (
            f"{head} waiting for a round in which every check passes"
            f" (last round: {', '.join(behind) or 'no check answered'})"
        )
    return (
        f"{head} waiting for passing analysis rounds"
        f" ({status.passing_rounds} of {analysis.min_passing_rounds})"
    )


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
        warmed = (round_.time - warm_from).total_seconds() >= analysis.warmup_seconds
        clear = gate.window_after_switch(analysis, round_, warm_from)
        if warmed and clear:
            gate.count_round(status, gate.round_verdict(round_.checks))
            _report_round(lk, status, round_.checks, analysis)
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
        # Which checks had no answer, and what they said: Prometheus may answer every other
        # check (a baseline group with no sample, a query that selects nothing).
        silent = "; ".join(
            f"{c.name}: {c.message}" if c.message else c.name
            for c in status.checks
            if c.verdict == Verdict.INCONCLUSIVE
        )
        which = f" ({silent})" if silent else ""
        if analysis.on_no_data == OnNoData.ROLLBACK:
            lk.start_rollback(
                RollbackReason.NO_DATA,
                f"no metric data for {rounds} rounds (onNoData: Rollback){which}",
            )
            return None
        if analysis.on_no_data == OnNoData.PAUSE:
            lk.pause(
                PauseReason.NO_DATA,
                f"no metric data for {rounds} rounds (onNoData: Pause){which};"
                " resume once the data is there",
            )
            return None
        return GateVerdict.NO_DATA  # Continue: open, and said out loud when it promotes
    return verdict


def _record_baseline(lk: Look, stage: StageStatus) -> None:
    """Keep each check's baseline-group value from the first round that measured it
    (issue 9 item 12), for the last stage, when no node is left on the source mode.

    Taken before the first move too (the adapter runs a round then while a value is
    missing: a single 100 % stage has no baseline group afterwards), and retried on every
    round until every check has one: one timed-out query must not leave a check without
    a baseline forever. A value from source kube-proxies still settling (one started within
    ``warmupSeconds + windowSeconds`` of the round: slow first syncs) is provisional and
    replaced by each later round until one from settled proxies keeps it. A round taken
    before the stage bakes is recorded as the last round (so the adapter waits
    ``intervalSeconds`` for the next), never counted."""
    round_, baseline, analysis = lk.obs.analysis, lk.status.baseline, lk.spec.analysis
    if round_ is None or baseline is None or analysis is None:
        return
    settle = analysis.warmup_seconds + analysis.window_seconds
    born = [p.created for p in lk.obs.pods if p.kind == ProxyKind.SOURCE and p.created]
    settled = all((round_.time - b).total_seconds() >= settle for b in born)
    for name, value in round_.baseline_values.items():
        if name in baseline.metrics and name not in baseline.provisional:
            continue
        baseline.metrics[name] = value
        if settled:
            baseline.provisional = [n for n in baseline.provisional if n != name]
        elif name not in baseline.provisional:
            baseline.provisional.append(name)
    if stage.phase != StagePhase.BAKING:
        status = lk.status.analysis or AnalysisStatus()
        lk.status.analysis = status
        if status.last_round_time is None or round_.time > status.last_round_time:
            status.last_round_time = round_.time


def _promoted_without_data(lk: Look, stage: StageStatus) -> None:
    """``onNoData: Continue`` promoted on no evidence: a Warning and a history entry say so
    (issue 9 item 23), never a silent promotion."""
    rounds = lk.status.analysis.consecutive_inconclusive if lk.status.analysis else 0
    message = (
        f"stage {stage.name} promoted without metric data: {rounds} rounds in a row had no"
        " verdict (onNoData: Continue)"
    )
    lk.event(EventReason.PROMOTED_WITHOUT_DATA, message, warning=True)
    lk.status.history.append(
        HistoryEntry(
            time=lk.now,
            phase=lk.status.phase,
            stage=stage.name,
            reason=str(EventReason.PROMOTED_WITHOUT_DATA),
            message=message,
        )
    )
    lk.status.history = lk.status.history[-MAX_HISTORY:]


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
        mixed_mode_words(lk, planned),
    )
    lk.requeue = 60
    return None
