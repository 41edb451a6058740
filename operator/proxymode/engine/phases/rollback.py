"""RollingBack: stages newest first, every node back to the source, then the source restored.

Also the deletion of a policy that changed something: it rolls back before the finalizer
goes, so deleting a policy never leaves a node on a kube-proxy nobody manages.
"""

from __future__ import annotations

import json
from datetime import datetime

from proxymode.api.models import MoveDirection, Phase, StagePhase
from proxymode.api.reasons import EventReason, FailureReason, RollbackReason
from proxymode.engine import moves, objects, target_roll, walk
from proxymode.engine.actions import PatchObject, SetNodeMode
from proxymode.engine.look import Look
from proxymode.engine.observed import SWITCHING, ProxyKind
from proxymode.engine.preflight.nodes import scheduled_by
from proxymode.engine.restore import (
    patch_config_data,
    remake_source_config_map,
    restore,
    source_config_to_restore,
    undo_source_patch,
)
from proxymode.engine.settle import generation_observed, not_seen
from proxymode.engine.setup import run_changed
from proxymode.engine.stages import named, nodes

HELD = "the move back of "
"""How the message about moves back held by a down kubelet begins."""


def look(lk: Look) -> Phase | None:
    if lk.obs.source_daemon_set is None or lk.obs.source_config_map is None:
        # A deleted ConfigMap is made again from the snapshot; a deleted DaemonSet is not.
        if lk.obs.source_daemon_set is None or not remake_source_config_map(lk):
            lk.fail(FailureReason.SOURCE_MISSING, f"rollback cannot finish: {_source_gone(lk)}")
        return None
    if not _source_config_first(lk):
        return None
    target_roll.stop(lk)
    failure = walk.drive(lk, MoveDirection.BACK)
    if failure:
        lk.fail(FailureReason.ROLLBACK_STUCK, f"rollback cannot finish: {failure}")
        return None
    held = [m.node for m in lk.status.moves if lk.obs.kubelet_down(m.node)]
    if held:
        whose = "its kubelet" if len(held) == 1 else "their kubelets"
        lk.status.message = (
            f"{HELD}{named(held)} waits for {whose}, not Ready (no pod can stop or start there)"
        )
    elif (lk.status.message or "").startswith(HELD):  # no longer true: the rollback's own words
        lk.status.message = f"rolling back: {lk.status.rollback_message or 'rolling back'}"
    strays = _unrecorded(lk)
    live = [n for n in strays if not lk.obs.kubelet_down(n)]
    if live:
        # Labelled by this run but missing from status.stages (a status write was lost):
        # the labels decide, so they go back first, before any recorded stage.
        walk.start_moves(lk, live, MoveDirection.BACK)
        lk.soon(2)
        return None
    _down_first(lk)
    unreachable = _walk_back(lk, strays)
    if unreachable is None or lk.status.moves or _restart_what_read_the_target_mode(lk):
        return None
    if unreachable:
        _say_unreachable(lk, unreachable)
    elif restore(lk):
        _finish(lk)
    return None


def _walk_back(lk: Look, down_strays: list[str]) -> list[str] | None:
    """The stages newest first, each node on the migration's labels back to the source.
    None while moves start; else the nodes still labelled that cannot go back now.

    A node whose kubelet is down cannot stop its target pod: walked to switching it would
    stay there, without any kube-proxy once the kubelet is back (found by a review). It
    waits on its label (``down_strays``: the unrecorded ones, all down by now), the stages
    before it go back meanwhile, and the rollback says so; the node watch wakes the look
    when the kubelet is back."""
    unreachable = list(down_strays)
    for stage in reversed(lk.status.stages):
        pending = walk.labelled(lk, stage.nodes)
        down = [n for n in pending if lk.obs.kubelet_down(n)]
        unreachable += down
        if pending and stage.phase != StagePhase.ROLLING_BACK:
            stage.phase = StagePhase.ROLLING_BACK
            lk.event(
                EventReason.STAGE_ROLLING_BACK,
                f"stage {stage.name}: moving {nodes(len(pending))} back",
            )
        pending = [n for n in pending if n not in down]
        if pending:
            walk.start_moves(lk, pending, MoveDirection.BACK)
            lk.soon(2)
            return None
        if stage.phase not in (StagePhase.PENDING, StagePhase.ROLLED_BACK) and not down:
            stage.phase = StagePhase.ROLLED_BACK
    return sorted(set(unreachable))


def _say_unreachable(lk: Look, unreachable: list[str]) -> None:
    one = len(unreachable) == 1
    lk.status.message = (
        f"every other node is back; {named(unreachable)} {'is' if one else 'are'} still on"
        f" the migration's label and {'its kubelet is' if one else 'their kubelets are'} not"
        f" Ready: {'it goes back when its kubelet is' if one else 'they go back when theirs are'}"
        " (or delete the Node)"
    )
    lk.soon(10)


def _down_first(lk: Look) -> None:
    """While the target DaemonSet rolls a changed template (or was stopped half-way), its
    nodes whose kube-proxy is not Ready go back before any healthy node.

    The rollback's budget counts only the nodes it moves, so that a broken node never
    blocks its own rescue; but then a healthy node walked back beside a node the roll took
    down (the controller replacing its pod for a person's edit, a bumped image that never
    gets Ready) makes two down. Moving a node that is already down costs the budget
    nothing, so it goes first. Without a roll the stages keep their order: a node down for
    a reason of its own (both proxies crash there, a pod stuck terminating) would fail its
    move and stop the rollback before any healthy node went back (found by a review). A
    node whose kubelet is not Ready keeps its stage's turn too: no pod comes or goes there."""
    if target_roll.rolling(lk) is None:
        return
    down = [
        n
        for n in walk.labelled(lk, lk.planned())
        if (view := lk.obs.node(n)) is not None
        and view.ready
        and view.mode_label == lk.target_mode
        and not moves.healthy_proxy(lk.obs, n, lk.target_mode)
    ]
    if down:
        walk.start_moves(lk, down, MoveDirection.BACK)


def _read_the_target_mode(lk: Look) -> list[str]:
    """Source pods started after Finalizing wrote the target mode into the source ConfigMap
    and before this rollback began: they run the target mode, whatever the ConfigMap now
    says. Read from the history's last Finalizing and RollbackStarted entries of this run."""
    since = _last(lk, EventReason.FINALIZING)
    until = _last(lk, EventReason.ROLLBACK_STARTED)
    run_start = _last(lk, EventReason.ROLLOUT_STARTED)
    if since is None or until is None or until < since or (run_start and since < run_start):
        return []  # this run never finalized: an earlier run's Finalizing says nothing
    # creationTimestamp keeps whole seconds, the history microseconds: a pod created in the
    # second Finalizing began reads as older than it. From the start of that second, then:
    # one more restart of a pod that was made just before is the price of never missing one.
    since = since.replace(microsecond=0)
    return [
        p.name
        for p in lk.obs.pods
        if p.kind == ProxyKind.SOURCE
        and not p.terminating
        and p.created is not None
        and since <= p.created <= until
    ]


def _last(lk: Look, reason: EventReason) -> datetime | None:
    times = [h.time for h in lk.status.history if h.reason == reason]
    return max(times) if times else None


def _restart_what_read_the_target_mode(lk: Look) -> bool:
    """Source pods that run the target mode (Finalizing handed their nodes back, or its
    rolling restart ran) are walked once more through ``switching`` now that the ConfigMap
    is back, with their cleanup where the pair needs one: a rolling restart alone would
    skip any pod whose template is already the final one. The operator's source patch goes
    on again first (OnDelete: nothing restarts) so that ``switching`` empties the node.
    True while that is under way."""
    src_ds = lk.obs.source_daemon_set
    nodes = sorted({p.node for p in lk.obs.pods if p.name in set(_read_the_target_mode(lk))})
    if not nodes or src_ds is None:
        return False
    # A node whose kubelet is down cannot stop its pod: walked to switching it would stay
    # there, without any kube-proxy once the kubelet is back (found by a review). It waits,
    # on its label, until the kubelet is back (the node watch wakes the look), and the
    # rollback says so.
    down = [n for n in nodes if lk.obs.kubelet_down(n)]
    nodes = [n for n in nodes if n not in down]
    whose = "its kubelet, which is" if len(down) == 1 else "their kubelets, which are"
    waiting = (
        f"{named(down)} ran {lk.target_mode} from the source DaemonSet while finalizing and"
        f" must restart in the source mode; waiting for {whose} not Ready"
    )
    if not nodes:
        lk.status.message = waiting
        lk.soon(10)
        return True
    lk.soon(1)
    if not objects.source_is_patched(src_ds, lk.target_mode):
        backup = lk.obs.backup
        strategy = (
            objects.original_spec(backup).get("updateStrategy") if backup else None
        ) or objects.DEFAULT_STRATEGY
        meta = src_ds["metadata"]
        lk.actions.append(
            PatchObject(
                "apps/v1",
                "DaemonSet",
                meta["namespace"],
                meta["name"],
                objects.source_patch(src_ds, lk.target_mode, strategy),
                why="keep the source kube-proxy off switching nodes while restarting the"
                f" {len(nodes)} that run {lk.target_mode}",
            )
        )
        return True
    if not generation_observed(src_ds):
        return True
    walk.start_moves(lk, nodes, MoveDirection.BACK, through_switching=True)
    lk.status.message = (
        f"{proxies(len(nodes), 'source kube-proxy', 'source kube-proxies')} started in"
        f" {lk.target_mode} while finalizing: restarting"
        f" {'it' if len(nodes) == 1 else 'them'} in the source mode"
        + (f"; {waiting}" if down else "")
    )
    return True


def _source_config_first(lk: Look) -> bool:
    """The source ConfigMap back to the snapshot before any node walks back: after
    Finalizing wrote the target mode into it, a source pod started on a node walked back
    would read the target mode. True when it holds the snapshot's data (or none is known)."""
    backup, src_cm = lk.obs.backup, lk.obs.source_config_map
    if backup is None or src_cm is None:
        return True
    desired = source_config_to_restore(lk, src_cm, backup)
    if patch_config_data(lk, src_cm, desired, "restore the source ConfigMap's mode first"):
        return True
    lk.soon(1)
    return False


def proxies(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _unrecorded(lk: Look) -> list[str]:
    """Nodes on the target or at switching that no stage records and the snapshot of
    labels did not have so: moved by this run, then forgotten by a lost status write.

    Only nodes this run's source DaemonSet runs on count: another migration (another
    kube-proxy DaemonSet, other nodes) labels its own nodes the same way, and walking those
    back would take their proxy away (found by the fault matrix). Not ``spec.nodeSelector``
    or the kernel exclusions: a node this run labelled and that left the selector since must
    still go back. Without a source DaemonSet every labelled node counts, as before."""
    before = _labels_before(lk)
    planned = set(lk.planned()) | {m.node for m in lk.status.moves}
    source = lk.obs.source_daemon_set
    nodes = lk.obs.nodes if source is None else scheduled_by(source, lk.obs.nodes)
    mine = {n.name for n in nodes}
    return [
        n.name
        for n in lk.obs.nodes
        if n.mode_label in (lk.target_mode, SWITCHING)
        and n.name in mine
        and n.name not in planned
        and before.get(n.name) != n.mode_label
    ]


def _labels_before(lk: Look) -> dict[str, str | None]:
    backup = lk.obs.backup or {}
    try:
        labels: dict[str, str | None] = json.loads(backup.get(objects.BACKUP_NODES, "{}"))
    except ValueError:
        return {}
    return labels


def _finish(lk: Look) -> None:
    # The backup is deleted on the next look, once this phase is stored: if this status
    # write is lost, the snapshot must still be there to decide from.
    lk.status.completed_time = lk.now
    why = lk.status.rollback_reason or "rolled back"
    detail = f"{why}: {lk.status.rollback_message}" if lk.status.rollback_message else why
    source = lk.status.source_mode or "its previous kube-proxy mode"
    lk.transition(
        Phase.ROLLED_BACK,
        EventReason.ROLLED_BACK,
        f"every node runs {source} again ({detail})" + not_seen(lk, lk.obs.source_daemon_set),
    )
    if lk.obs.deleting:
        lk.release = True
    lk.requeue = 1  # the next look tidies up the snapshot


def on_delete(lk: Look) -> Phase | None:
    """The policy is being deleted: release at once, or roll back first."""
    if lk.status.finalized or lk.status.phase == Phase.ROLLED_BACK or not run_changed(lk):
        # Nothing of this policy's is left to undo; what it owns goes with it (GC).
        lk.release = True
        return None
    src_ds = lk.obs.source_daemon_set
    # Only the ConfigMap gone, and the snapshot there: the rollback makes it again from the
    # snapshot (restore.remake_source_config_map) and brings every node back. Releasing here
    # took every label at once over source pods that cannot start (a review).
    remade = src_ds is not None and lk.obs.backup is not None
    if src_ds is None or (lk.obs.source_config_map is None and not remade):
        # Nothing to roll back to: the nodes cannot return to a DaemonSet that is gone. Say
        # so once, take our labels off, and let the policy go (its objects go with it).
        message = f"{_source_gone(lk)}; deleted without a rollback"
        lk.fail(FailureReason.SOURCE_MISSING, message)
        if src_ds is not None:
            # Its own strategy and affinity need nothing else (a review found it left
            # OnDelete, its annotation on).
            undo_source_patch(lk, src_ds)
        for name in walk.labelled(lk, lk.planned()):
            view = lk.obs.node(name)
            lk.actions.append(SetNodeMode(name, None, expect=view.mode_label if view else None))
        lk.release = True
        return None
    deleting_failed = lk.status.rollback_reason == RollbackReason.POLICY_DELETED
    if lk.status.phase == Phase.FAILED and deleting_failed:
        # The deletion's own rollback got stuck: keep trying it, quietly, in Failed. Starting
        # it again would flip Failed <-> RollingBack (and warn) on every look.
        return Phase.ROLLING_BACK
    if lk.status.phase != Phase.ROLLING_BACK:
        lk.start_rollback(RollbackReason.POLICY_DELETED, "the policy is being deleted")
    return Phase.ROLLING_BACK


def _source_gone(lk: Look) -> str:
    what = "DaemonSet" if lk.obs.source_daemon_set is None else "ConfigMap"
    return (
        f"the source kube-proxy {what} in {lk.spec.kube_proxy.namespace} is gone, so no node"
        " can return to it"
    )
