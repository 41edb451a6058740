"""RollingBack: stages newest first, every node back to the source, then the source restored.

Also the deletion of a policy that changed something: it rolls back before the finalizer
goes, so deleting a policy never leaves a node on a kube-proxy nobody manages.
"""

from __future__ import annotations

from proxymode.api.models import MoveDirection, Phase, StagePhase
from proxymode.api.reasons import EventReason, FailureReason, RollbackReason
from proxymode.engine import moves
from proxymode.engine.look import Look
from proxymode.engine.restore import restore


def look(lk: Look) -> Phase | None:
    failure = moves.drive(lk, MoveDirection.BACK)
    if failure:
        lk.fail(FailureReason.ROLLBACK_STUCK, f"rollback cannot finish: {failure}")
        return None
    for stage in reversed(lk.status.stages):
        pending = moves.labelled(lk, stage.nodes)
        if pending:
            if stage.phase != StagePhase.ROLLING_BACK:
                stage.phase = StagePhase.ROLLING_BACK
                lk.event(
                    EventReason.STAGE_ROLLING_BACK,
                    f"stage {stage.name}: moving {len(pending)} nodes back",
                )
            moves.start_moves(lk, pending, MoveDirection.BACK)
            lk.soon(2)
            return None
        if stage.phase not in (StagePhase.PENDING, StagePhase.ROLLED_BACK):
            stage.phase = StagePhase.ROLLED_BACK
    if lk.status.moves:
        return None
    if restore(lk):
        _finish(lk)
    return None


def _finish(lk: Look) -> None:
    # The backup is deleted on the next look, once this phase is stored: if this status
    # write is lost, the snapshot must still be there to decide from.
    lk.status.completed_time = lk.now
    why = lk.status.rollback_reason or "rolled back"
    detail = f"{why}: {lk.status.rollback_message}" if lk.status.rollback_message else why
    lk.transition(
        Phase.ROLLED_BACK,
        EventReason.ROLLED_BACK,
        f"every node runs {lk.status.source_mode} again ({detail})",
    )
    if lk.obs.deleting:
        lk.release = True
    lk.requeue = 1  # the next look tidies up the snapshot


def on_delete(lk: Look) -> Phase | None:
    """The policy is being deleted: release at once, or roll back first."""
    changed = lk.status.backup is not None or lk.obs.backup is not None
    if lk.status.finalized or lk.status.phase == Phase.ROLLED_BACK or not changed:
        # Nothing of this policy's is left to undo; what it owns goes with it (GC).
        lk.release = True
        return None
    if lk.status.phase != Phase.ROLLING_BACK:
        lk.start_rollback(RollbackReason.POLICY_DELETED, "the policy is being deleted")
    return Phase.ROLLING_BACK
