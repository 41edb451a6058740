"""The rollout state machine: ``advance(policy, observed) -> Decision``. Pure.

Every call reads the policy's status and a fresh snapshot of the world, takes the next
safe steps, and returns the new status and the actions to carry them out. This module only
dispatches: each phase has its handler in ``engine.phases``, which looks once and returns
the phase to run next in the same look (or None); ``_chain`` runs at most
``MAX_PHASES_PER_LOOK`` of them, so phases never call each other. Nothing is
kept in memory between calls: a restart between any two calls resumes where the
status and the node labels say the rollout is. Each phase handler re-checks the world
before acting, so a status written after an action failed is harmless: the next call
sees that the action did not happen and asks again.

Phases (DESIGN §4)::

    Pending -> Preflight -> Progressing(i) <-> Analyzing(i) -> ... -> Finalizing -> Completed
                  |              |                 |                        (or Completed,
                  v              +----> RollingBack -> RolledBack            mixed mode)
                Failed     any in flight <-> Paused

Invariants the unit tests check after every step:

- a node never runs two kube-proxies: a move takes it to ``switching`` (neither DaemonSet)
  and changes the label only once the old pod is gone;
- at most ``maxUnavailable`` nodes are without a Ready kube-proxy because of a move
  (nodes that were already broken do not block moving them back);
- rollback walks stages newest first and ends with the source DaemonSet spec and
  ConfigMap data equal to the snapshot taken before the first change;
- the operator labels only nodes it records in ``status.stages``.
"""

from __future__ import annotations

from collections.abc import Callable

from proxymode.api.models import Phase, PolicyStatus, ProxyModePolicy
from proxymode.api.reasons import PauseReason
from proxymode.engine.actions import Decision, EmitEvent
from proxymode.engine.commands import consume_action
from proxymode.engine.look import PREFLIGHT_OBSERVED, TERMINAL, Look
from proxymode.engine.observed import Observed
from proxymode.engine.phases import finalize, paused, preflight, rollback, rollout, terminal
from proxymode.engine.planner import plan_hash
from proxymode.engine.summary import derive_summary

PLAN_GUARDED = frozenset({Phase.PROGRESSING, Phase.ANALYZING, Phase.PAUSED})
MAX_PHASES_PER_LOOK = 4
"""A look runs at most this many phase handlers in a row (Paused -> Progressing -> Analyzing
-> Finalizing is the longest honest chain); past it the look ends and the next one goes on,
so a bug that bounces between two phases costs a requeue, never a RecursionError."""

Handler = Callable[[Look], Phase | None]
HANDLERS: dict[Phase, Handler] = {
    Phase.PENDING: preflight.look,
    Phase.PREFLIGHT: preflight.look,
    Phase.PROGRESSING: rollout.look,
    Phase.ANALYZING: rollout.look,
    Phase.PAUSED: paused.look,
    Phase.FINALIZING: finalize.look,
    Phase.ROLLING_BACK: rollback.look,
    Phase.COMPLETED: terminal.look,
    Phase.ROLLED_BACK: terminal.look,
}


def advance(policy: ProxyModePolicy, observed: Observed) -> Decision:
    """Decide the next step of ``policy`` given the world as ``observed``."""
    look = Look(policy, observed)
    _run(look)
    return _decision(look)


def _run(look: Look) -> None:
    consume_action(look)
    _forget_old_switches(look)
    if look.obs.deleting:
        _chain(look, rollback.on_delete(look))
        return
    status, spec = look.status, look.spec
    if spec.paused and status.phase == Phase.PENDING:
        # Created paused: not even preflight runs (it writes the snapshot and the target
        # objects), so a paused policy has changed nothing at all.
        status.message = "spec.paused is true: waiting before preflight; nothing changed"
        look.requeue = 10
        return
    quiet = TERMINAL | {Phase.PAUSED, Phase.PENDING, Phase.ROLLING_BACK}
    if spec.paused and status.phase not in quiet:
        look.pause(PauseReason.SPEC, "spec.paused is true")
    if (
        _plan_guarded(status)
        and status.plan_hash
        and plan_hash(spec) != status.plan_hash
        and status.paused_reason != PauseReason.PLAN_CHANGED
    ):
        look.pause(
            PauseReason.PLAN_CHANGED,
            "the stage plan changed mid-rollout; annotate proxymode.io/action=resume to go"
            " on with the new plan, or abort to roll back",
        )
    _chain(look, look.status.phase)
    said = look.status.message or ""
    if spec.paused and look.status.phase == Phase.ROLLING_BACK:
        if NO_PAUSE not in said:
            look.status.message = f"{said or 'rolling back'}{NO_PAUSE}"
    elif NO_PAUSE in said:
        look.status.message = said.replace(NO_PAUSE, "")


NO_PAUSE = "; spec.paused does not hold a rollback: it runs to its end"
"""Said while a rollback runs with ``spec.paused`` true (a review saw the pause ignored
without a word): a half-done rollback is the state a pause must never leave."""


def _forget_old_switches(look: Look) -> None:
    """``recentSwitches`` keeps a node for one analysis window, and only while one runs."""
    analysis = look.spec.analysis
    window = analysis.window_seconds if analysis is not None else 0
    kept = [s for s in look.status.recent_switches if (look.now - s.time).total_seconds() < window]
    if len(kept) != len(look.status.recent_switches):
        look.status.recent_switches = kept


def _plan_guarded(status: PolicyStatus) -> bool:
    """Whether a plan edit pauses the run (PlanChanged) before anything else moves.

    In flight, and in a mixed-mode Completed (which still moves newcomers: an edit that
    extends it runs stage by stage after resume, decision 0020). Not in Finalizing, nor
    paused there: nodes handed back to the source stay there, whatever the stages say.
    """
    if status.phase == Phase.PAUSED:
        return status.resume_phase != Phase.FINALIZING
    if status.phase == Phase.COMPLETED:
        return status.finalized is False
    return status.phase in PLAN_GUARDED


def _chain(look: Look, phase: Phase | None) -> None:
    """Run phase handlers while each hands on to the next, at most MAX_PHASES_PER_LOOK."""
    for _ in range(MAX_PHASES_PER_LOOK):
        handler = HANDLERS.get(phase) if phase is not None else None
        if handler is None:
            return
        if phase in PREFLIGHT_OBSERVED and not look.observed_for_preflight:
            # Retried in this look: its snapshot was taken for the phase before, without
            # the cluster's facts or Prometheus's series, and preflight on it passed what it
            # should have refused (a review: MetricSeriesMissing and a rival policy unseen).
            # The next look, in Pending, gathers them.
            look.soon(0.5)
            return
        phase = handler(look)
    if phase is not None:
        look.soon(1)  # handed on past the bound: the next look carries on


def _decision(look: Look) -> Decision:
    derive_summary(look)
    if any(not isinstance(a, EmitEvent) for a in look.actions):
        look.soon(2.0)  # look again soon to see what they did
    if look.status.handled_action is not None:
        # The action is stored as handled: the next look removes its annotation. Soon, not
        # on an idle policy's minute: it would sit there (ignored, or even honoured) long
        # enough for a person or Argo CD to think it was still pending.
        look.soon(1.0)
    return Decision(
        status=look.status,
        actions=tuple(look.actions),
        requeue_seconds=look.requeue,
        release_finalizer=look.release,
    )
