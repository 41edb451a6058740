"""The one-shot ``proxymode.io/action`` annotation: abort, resume, promote, retry.

Two looks: the first acts and stores ``handled_action``; the next (which sees that stored)
removes the annotation and forgets it. A lost status write makes the first look happen
again, which is safe; the annotation is never removed before the action is stored, and the
record goes only with the annotation, so the same action set again is a new request.
"""

from __future__ import annotations

from proxymode.api.models import HistoryEntry, Phase, PolicyStatus
from proxymode.api.reasons import EventReason, PauseReason, RollbackReason
from proxymode.engine.actions import ClearAction
from proxymode.engine.look import TERMINAL, Look
from proxymode.engine.setup import run_changed
from proxymode.engine.stages import adopt_new_plan

ACTIONS = ("promote", "abort", "retry", "resume")


def consume_action(look: Look) -> None:
    """Act on the one-shot annotation once, then remove it."""
    action = look.obs.action
    if not action:
        look.status.handled_action = None
        return
    if look.status.handled_action == action:
        # Forgotten in the same look that removes it: a person who sets the same action
        # again before another look (promote, stage after stage) asks anew. The removal runs
        # before this status is stored, so a failed removal keeps the record (no second act).
        look.actions.append(ClearAction(action))
        look.status.handled_action = None
        return
    look.status.handled_action = action
    phase = look.status.phase
    if action == "abort" and phase not in TERMINAL | {Phase.ROLLING_BACK}:
        look.start_rollback(RollbackReason.ABORTED, "aborted by the proxymode.io/action annotation")
    elif action == "resume" and phase == Phase.PAUSED:
        resume(look)
    elif action == "promote":
        promote_by_hand(look)
    elif action == "retry" and phase in (Phase.FAILED, Phase.ROLLED_BACK):
        retry(look)
    elif action in ACTIONS:
        _ignored(look, action, _why_not(look, action))
    else:
        look.event(
            EventReason.UNKNOWN_ACTION,
            f"ignored proxymode.io/action={action!r}; use {', '.join(ACTIONS)}",
            warning=True,
        )


def _why_not(look: Look, action: str) -> str:
    """Why ``action`` means nothing in the current phase, and what would."""
    st = look.status
    if action == "resume":
        return f"the phase is {st.phase}, not Paused: nothing waits for a resume"
    if action == "retry":
        if st.phase == Phase.COMPLETED:
            return (
                "the policy is Completed: retry starts a new run only from Failed or"
                " RolledBack; to move the cluster again, delete this policy"
                + (" (it rolls every node back)" if not st.finalized else "")
                + " or create another"
            )
        return (
            f"the phase is {st.phase}: a run is in flight; retry starts a new run only from"
            " Failed or RolledBack (abort first to roll this one back)"
        )
    key = "mixed" if st.phase == Phase.COMPLETED and not st.finalized else str(st.phase)
    return _ABORT_REFUSALS.get(key, f"the phase is {st.phase}: nothing has been changed yet")


_ABORT_REFUSALS: dict[str, str] = {
    Phase.ROLLING_BACK: "a rollback is already under way",
    Phase.FAILED: "the phase is Failed: nothing is in flight to abort; use retry (it rolls back"
    " what the failed run changed, then starts over) or delete the policy",
    "mixed": "the policy is Completed in mixed mode: nothing is in flight to abort; delete"
    " the policy to move every node back",
    Phase.COMPLETED: "the policy is Completed and finalized: the target mode is the cluster's"
    " mode now",
    Phase.ROLLED_BACK: "the policy is RolledBack: every node is back on the source mode;"
    " retry starts a new run, or delete the policy",
}
"""Why an ``abort`` is refused, by phase (``mixed``: a mixed-mode Completed)."""


def _ignored(look: Look, action: str, why: str) -> None:
    """A one-shot action the phase cannot honour: refused out loud, then removed."""
    look.event(
        EventReason.ACTION_IGNORED,
        f"proxymode.io/action={action} ignored: {why}",
        warning=True,
    )


def promote_by_hand(look: Look) -> None:
    """Skip the rest of the current stage's bake and gate, only while it bakes.

    Anywhere else a promote would mean nothing (nodes are still moving, or nothing is in
    flight), so it is refused out loud rather than remembered for later.
    """
    st = look.status
    baking = st.phase == Phase.ANALYZING or (
        st.phase == Phase.PAUSED and st.resume_phase == Phase.ANALYZING
    )
    plan_changed = st.paused_reason == PauseReason.PLAN_CHANGED
    if not baking or look.spec.paused or plan_changed:
        why = "spec.paused is true" if look.spec.paused else f"the phase is {st.phase}"
        if plan_changed:
            # Promote means "this stage is good enough", not "I accept the new plan":
            # only resume adopts it (decision 0020).
            why = "the stage plan changed; resume adopts the new plan, abort rolls back"
        look.event(
            EventReason.PROMOTE_IGNORED,
            f"promote acts only while a stage bakes (Analyzing); ignored: {why}",
            warning=True,
        )
        return
    look.force_promote = True
    look.event(EventReason.PROMOTE_REQUESTED, f"stage {look.stage_name()} promoted by hand")


def resume(look: Look, reason: EventReason = EventReason.RESUMED, why: str = "") -> None:
    """Resume in the phase the pause interrupted; ``reason``/``why`` say who resumed it
    (``DataReturned`` after a NoData pause goes into history, not only an Event)."""
    if look.spec.paused:
        look.status.message = "cannot resume while spec.paused is true"
        return
    if look.status.paused_reason == PauseReason.PLAN_CHANGED and (
        look.status.resume_phase != Phase.FINALIZING
    ):
        adopt_new_plan(look)
    if look.status.paused_reason == PauseReason.ANALYSIS_FAILED and look.status.analysis:
        # A person chose to go on past a failing gate: the stage needs failureLimit new
        # failing rounds to breach again, not the very next one (decision 0020).
        look.status.analysis.consecutive_failures = 0
    if look.status.paused_reason == PauseReason.NO_DATA and look.status.analysis is not None:
        # A person chose to go on: the no-data count starts again, or the very next
        # inconclusive round would pause once more.
        look.status.analysis.consecutive_inconclusive = 0
    target = look.status.resume_phase or Phase.PROGRESSING
    look.status.paused_reason = None
    look.status.resume_phase = None
    # "goes on from": a resume to Progressing may move on to Analyzing in the same look.
    look.transition(target, reason, f"{why}resumed; the run goes on from phase {target}")


def retry(look: Look) -> None:
    if look.status.phase == Phase.FAILED and run_changed(look):
        # Something was changed before the failure: walk it back first, then start over.
        look.start_rollback(RollbackReason.RETRY, "retry: rolling back what the failed run changed")
        return
    look.status = PolicyStatus(
        history=look.status.history,
        handled_action=look.status.handled_action,
        run=look.status.run + 1,
    )
    look.status.history.append(
        HistoryEntry(
            time=look.now, phase=Phase.PENDING, reason=EventReason.RETRY, message="retrying"
        )
    )
    look.event(EventReason.RETRY, "retrying from preflight")
    look.status.message = "retrying from preflight"
