"""The metric gate, pure and in one place (DESIGN §5).

Three questions, each answered once, for the engine, the reconciler and the telemetry:

- ``round_due``: is a round due now? While the current stage bakes (or a NoData pause
  waits for data), and while moving as long as a check lacks its baseline value, every
  ``analysis.intervalSeconds``.
- ``groups``: which nodes form the canary (planned nodes on the target mode) and the
  baseline (planned nodes still on the source mode; none at the last stage, where the
  recorded ``status.baseline.metrics`` stand in).
- ``round_verdict`` / ``count_round`` / ``gate_verdict``: how a round's checks count
  (any Fail fails the round; else any Inconclusive, or no check at all, makes it
  inconclusive; else it passes), and what the counters say about the stage: open,
  wait, failed (``failureLimit``) or no data (``inconclusiveLimit``).

The engine acts on a ``GateVerdict`` (promote, wait, breach, onNoData); nothing here acts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from proxymode.api.models import (
    Analysis,
    AnalysisStatus,
    Phase,
    ProxyModePolicy,
    StagePhase,
    Verdict,
)
from proxymode.api.reasons import PauseReason
from proxymode.engine.observed import AnalysisRound, CheckOutcome, Observed


class GateVerdict(StrEnum):
    OPEN = "Open"
    """Enough passing rounds and the last one passed: the stage may be promoted."""
    WAIT = "Wait"
    """Not enough passing rounds yet."""
    FAILED = "Failed"
    """``failureLimit`` failing rounds in a row: a breach."""
    NO_DATA = "NoData"
    """``inconclusiveLimit`` inconclusive rounds in a row: ``onNoData`` decides."""


@dataclass(frozen=True)
class Groups:
    canary: list[str]
    baseline: list[str]


def round_due(policy: ProxyModePolicy, now: datetime) -> bool:
    """A round is due while the current stage bakes (or waits for data), every interval."""
    analysis, status = policy.spec.analysis, policy.status
    waiting_for_data = status.phase == Phase.PAUSED and status.paused_reason == PauseReason.NO_DATA
    if analysis is None or (
        status.phase not in (Phase.PROGRESSING, Phase.ANALYZING) and not waiting_for_data
    ):
        return False
    index = status.current_stage
    if index is None or not (0 <= index < len(status.stages)):
        return False
    if status.stages[index].phase != StagePhase.BAKING and not (
        status.phase == Phase.PROGRESSING and baseline_missing(policy)
    ):
        return False
    last = status.analysis.last_round_time if status.analysis else None
    return last is None or (now - last).total_seconds() >= analysis.interval_seconds


def baseline_missing(policy: ProxyModePolicy) -> bool:
    """A check still lacks its recorded baseline value (issue 9 item 12): a round is due
    before the stage bakes too, to measure the source-mode nodes while some are left."""
    analysis, baseline = policy.spec.analysis, policy.status.baseline
    if analysis is None or baseline is None:
        return False
    return any(c.name not in baseline.metrics for c in analysis.checks)


def groups(policy: ProxyModePolicy, observed: Observed) -> Groups:
    """The canary (planned nodes on the target mode) and the baseline (still on the source).

    A node mid-move is in neither (issue 9 item 27): its samples are the old proxy's, or
    a target proxy not Ready yet."""
    mode = str(policy.spec.target_mode)
    moving = {m.node for m in policy.status.moves}
    canary, baseline = [], []
    for name in (n for s in policy.status.stages for n in s.nodes):
        node = observed.node(name)
        if node is None or name in moving:
            continue
        if node.mode_label == mode:
            canary.append(name)
        elif node.mode_label is None:
            baseline.append(name)
    return Groups(canary, baseline)


def window_start(analysis: Analysis, round_: AnalysisRound) -> datetime:
    """Where the round's canary window began: as the adapter clipped it, else a full window."""
    if round_.window_start is not None:
        return round_.window_start
    return round_.time - timedelta(seconds=analysis.window_seconds)


def window_after_switch(
    analysis: Analysis, round_: AnalysisRound, last_switch: datetime | None
) -> bool:
    """No sample from before a canary's switch counts (issue 9 item 27, decision 0015): a
    round counts only when its window starts at or after ``last_switch``, the moment the
    stage's last node arrived on the target mode (``baked_since``). A 300 s window taken
    60 s after it still holds 240 s of the old proxy's samples. Newcomers that arrive while
    the stage bakes are left out of the canary group by the adapter until their own window
    is clean (``kube.rounds``), so they do not hold the count back."""
    return last_switch is None or window_start(analysis, round_) >= last_switch


def round_verdict(outcomes: Iterable[CheckOutcome | Verdict | str]) -> Verdict:
    """A round's verdict: Fail if any check fails, Pass only if every check passes (and there
    is at least one), Inconclusive otherwise."""
    verdicts = [o.verdict if isinstance(o, CheckOutcome) else o for o in outcomes]
    if Verdict.FAIL in verdicts:
        return Verdict.FAIL
    if verdicts and all(v == Verdict.PASS for v in verdicts):
        return Verdict.PASS
    return Verdict.INCONCLUSIVE


def count_round(status: AnalysisStatus, verdict: Verdict) -> None:
    """Count one round past warm-up into the streaks the limits compare with."""
    status.rounds += 1
    if verdict == Verdict.FAIL:
        status.consecutive_failures += 1
        status.consecutive_inconclusive = 0
    elif verdict == Verdict.INCONCLUSIVE:
        status.consecutive_inconclusive += 1
    else:
        status.passing_rounds += 1
        status.consecutive_failures = 0
        status.consecutive_inconclusive = 0


def gate_verdict(analysis: Analysis, status: AnalysisStatus) -> GateVerdict:
    """What the counted rounds say about the current stage."""
    if status.consecutive_failures >= analysis.failure_limit:
        return GateVerdict.FAILED
    if status.consecutive_inconclusive >= analysis.inconclusive_limit:
        return GateVerdict.NO_DATA
    passed = (
        status.passing_rounds >= analysis.min_passing_rounds
        and bool(status.checks)
        and all(c.verdict == Verdict.PASS for c in status.checks)
    )
    return GateVerdict.OPEN if passed else GateVerdict.WAIT
