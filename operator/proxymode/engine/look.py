"""One look: the policy, the snapshot, and what this look decided so far. Shared by phases.

A ``Look`` is built by ``machine.advance`` for one call and thrown away after it: nothing
survives between looks but the status it returns. Phase handlers (``engine.phases``) read
and write it; the bookkeeping every phase needs (history, Events, pause, fail, rollback)
lives here so that each is written once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from proxymode.api.models import (
    MAX_HISTORY,
    HistoryEntry,
    Move,
    MoveDirection,
    Phase,
    PolicySpec,
    PolicyStatus,
    ProxyModePolicy,
)
from proxymode.api.reasons import (
    EventReason,
    FailureReason,
    PauseReason,
    RollbackReason,
    paused_event,
)
from proxymode.engine.actions import Action, EmitEvent
from proxymode.engine.observed import Observed

TERMINAL = frozenset({Phase.COMPLETED, Phase.ROLLED_BACK, Phase.FAILED})
PREFLIGHT_OBSERVED = frozenset({Phase.PENDING, Phase.PREFLIGHT})
"""The stored phases for which the adapter gathers what preflight reads besides the objects:
the cluster's facts (rival policies, static pods, the inventory) and Prometheus's series.
A look that started in another phase (a retry from Failed) has neither."""


@dataclass
class Look:
    policy: ProxyModePolicy
    obs: Observed
    actions: list[Action] = field(default_factory=list)
    requeue: float = 30.0
    release: bool = False
    force_promote: bool = False
    trouble: str | None = None
    """A failure this look saw but did not act on (a mixed-mode move that cannot finish):
    the Degraded condition reports it."""
    moves_held: str | None = None
    """Why this look starts no node move (the moves in flight are still stepped): the
    target DaemonSet's own controller is replacing pods, one node at a time, and a move of
    the operator's beside it would put one node more between proxies than maxUnavailable
    allows (``restore.target_rolling``)."""

    def __post_init__(self) -> None:
        self.spec: PolicySpec = self.policy.spec
        self.status: PolicyStatus = self.policy.status.model_copy(deep=True)
        self.name: str = str(self.policy.metadata.get("name", ""))
        self.uid: str = str(self.policy.metadata.get("uid", ""))
        self.now: datetime = self.obs.now

    @property
    def observed_for_preflight(self) -> bool:
        """This look's snapshot carries preflight's facts (see ``PREFLIGHT_OBSERVED``)."""
        return self.policy.status.phase in PREFLIGHT_OBSERVED

    @property
    def target_mode(self) -> str:
        return str(self.spec.target_mode)

    def planned(self) -> list[str]:
        """Every node recorded in ``status.stages``, in stage order."""
        return [n for s in self.status.stages for n in s.nodes]

    def at_target(self, node: str) -> bool:
        view = self.obs.node(node)
        return view is not None and view.mode_label == self.target_mode

    def stage_name(self) -> str | None:
        i = self.status.current_stage
        if i is None or not (0 <= i < len(self.status.stages)):
            return None
        return self.status.stages[i].name

    def soon(self, seconds: float) -> None:
        """Look again within ``seconds`` (never later than already asked)."""
        self.requeue = min(self.requeue, seconds)

    # -- bookkeeping ------------------------------------------------------------------------

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.actions.append(EmitEvent(str(reason), message, "Warning" if warning else "Normal"))

    def transition(self, phase: Phase, reason: str, message: str, warning: bool = False) -> None:
        if self.status.phase != phase:
            self.status.phase = phase
            self.status.history.append(
                HistoryEntry(
                    time=self.now,
                    phase=phase,
                    stage=self.stage_name(),
                    reason=str(reason),
                    message=message,
                )
            )
            self.status.history = self.status.history[-MAX_HISTORY:]
            self.event(reason, message, warning)
        self.status.message = message

    def pause(self, reason: PauseReason, message: str) -> None:
        if self.status.phase != Phase.PAUSED:
            self.status.resume_phase = self.status.phase
        self.status.paused_reason = reason
        self.transition(
            Phase.PAUSED, paused_event(reason), message, warning=reason != PauseReason.SPEC
        )

    def fail(self, reason: FailureReason, message: str) -> None:
        self.transition(Phase.FAILED, reason, message, warning=True)
        self.requeue = 300

    def start_rollback(self, reason: RollbackReason, message: str) -> None:
        if self.status.phase == Phase.ROLLING_BACK:
            return
        self.status.rollback_reason = reason
        self.status.rollback_message = message
        self.status.moves = [
            # A hand-back in flight becomes a move back too: the source ConfigMap returns
            # to the source mode first, so the node now needs its cleanup like any other.
            m
            if m.direction == MoveDirection.BACK
            else Move(node=m.node, direction=MoveDirection.BACK, since=self.now)
            for m in self.status.moves
        ]
        self.status.paused_reason = None
        self.status.resume_phase = None
        self.transition(
            Phase.ROLLING_BACK, EventReason.ROLLBACK_STARTED, f"rolling back: {message}", True
        )
        self.requeue = 1

    def breach(self, reason: RollbackReason, message: str) -> None:
        """A health or analysis breach: roll back, or pause when rollback is not automatic."""
        if self.spec.rollback.automatic:
            self.start_rollback(reason, message)
        else:
            self.pause(PauseReason(str(reason)), f"{message} (rollback.automatic is false)")
