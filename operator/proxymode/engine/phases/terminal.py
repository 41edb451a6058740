"""Completed and RolledBack, once stored: tidy up, keep mixed mode going, start a retry."""

from __future__ import annotations

from proxymode.api.models import MoveDirection, Phase
from proxymode.api.reasons import EventReason, RollbackReason
from proxymode.engine import moves, naming, node_checks, target_roll, walk
from proxymode.engine.actions import DeleteObject
from proxymode.engine.commands import retry
from proxymode.engine.look import Look
from proxymode.engine.setup import remake_deleted_target
from proxymode.engine.stages import covers_every_node, mixed_mode_words, refresh_plan


def look(lk: Look) -> Phase | None:
    if lk.status.phase == Phase.COMPLETED and not lk.status.finalized:
        _keep_mixed_mode(lk)
        if _finalize_now(lk):
            return Phase.FINALIZING
    if lk.status.phase not in (Phase.ROLLED_BACK, Phase.COMPLETED):
        return None
    _drop_backup(lk)
    if lk.status.phase == Phase.ROLLED_BACK and lk.status.rollback_reason == RollbackReason.RETRY:
        # A retry of a failed run walked it back first; now the new run starts, without
        # asking a second time.
        retry(lk)
    return None


def _keep_mixed_mode(lk: Look) -> None:
    """A finished mixed-mode policy still moves newcomers that join its pools."""
    remake_deleted_target(lk)
    refresh_plan(lk)
    failure = walk.drive(lk)
    if failure:
        lk.status.message = failure
        lk.trouble = failure
    # A newcomer's move never starts beside the target DaemonSet's own rolling update (a
    # person's edit of it: decision 0073), as in the rollout.
    lk.moves_held = lk.moves_held or target_roll.rolling(lk)
    target_roll.report_edit(lk, lk.spec.kube_proxy.daemon_set)
    todo = node_checks.forward_todo(lk, started_only=False)
    walk.start_moves(lk, todo, MoveDirection.FORWARD)
    lk.requeue = 2 if lk.status.moves else 60
    # A newcomer counts once it runs the target: each stage's nodesDone and the summary say
    # what runs now, not what ran when the policy completed (a review saw 4/5 and "6 nodes").
    for stage in lk.status.stages:
        stage.nodes_done = len(moves.done(lk, stage.nodes))
    if not failure:
        done = sum(stage.nodes_done for stage in lk.status.stages)
        lk.status.message = mixed_mode_words(lk, done) + node_checks.kubelets_waited(
            lk, node_checks.forward_todo(lk, started_only=False)
        )
        if lk.moves_held and todo:
            lk.status.message += f"; no new node move starts: {lk.moves_held}"


def _finalize_now(lk: Look) -> bool:
    """``finalize: true`` set on a Completed mixed-mode policy: it finalizes once every node
    runs the target mode (a review set it and nothing happened, without a word); until then
    the message says what it waits for. Not while ``spec.paused`` (a review: it did)."""
    if not lk.spec.finalize or lk.trouble:
        return False
    done = sum(stage.nodes_done for stage in lk.status.stages)
    if not (covers_every_node(lk) and not lk.status.moves and done == len(lk.planned())):
        lk.status.message = (
            f"{lk.status.message or ''}; spec.finalize is true: the policy finalizes once its"
            " stages cover every node and each runs the target mode"
        )
        return False
    if lk.spec.paused:
        lk.status.message = f"{lk.status.message or ''}; spec.finalize is true, held by spec.paused"
        return False
    lk.transition(
        Phase.FINALIZING,
        EventReason.FINALIZING,
        "spec.finalize is true and every node runs the target mode; folding it into the"
        " source objects",
    )
    return True


def _drop_backup(lk: Look) -> None:
    """Delete the snapshot once a stored terminal phase says nothing needs it any more."""
    if lk.status.phase == Phase.COMPLETED and not lk.status.finalized:
        return  # mixed mode: deleting the policy later rolls back from it
    if lk.obs.backup is not None:
        ns, name = lk.spec.kube_proxy.namespace, naming.backup_config_map(lk.name)
        lk.actions.append(DeleteObject("v1", "ConfigMap", ns, name))
    else:
        lk.status.backup = None
