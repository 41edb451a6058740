"""Finalizing: write the target mode into the source ConfigMap, hand every node back to the
source DaemonSet, delete the target pair, restore the source's own update strategy (and,
with ``finalizeSourceTemplate: Exact``, its own affinity: one more rolling restart)."""

from __future__ import annotations

from collections.abc import Mapping

from proxymode.api.models import MoveDirection, Phase, SourceTemplate
from proxymode.api.reasons import EventReason, FailureReason, PauseReason
from proxymode.engine import node_checks, objects, target_roll, walk
from proxymode.engine.look import Look
from proxymode.engine.observed import Object
from proxymode.engine.restore import (
    config_mode,
    delete_target_pair,
    patch_config_data,
    restore_source_spec,
)
from proxymode.engine.settle import not_seen, source_settled, waiting_on
from proxymode.engine.setup import hold_on_bad_config, kube_proxy_version, remake_deleted_target
from proxymode.engine.stages import nodes
from proxymode.kubeproxy import ConfigError, parse_config, with_mode


def look(lk: Look) -> Phase | None:
    backup = lk.obs.backup
    src_ds, src_cm = lk.obs.source_daemon_set, lk.obs.source_config_map
    if backup is None or src_ds is None or src_cm is None:
        lk.fail(FailureReason.FINALIZE_BLOCKED, "the backup or the source objects are missing")
        return None
    # Deleted mid-Finalizing, it took the kube-proxies of every node not yet handed back
    # (a review saw four nodes without one, handed back one batch at a time).
    remake_deleted_target(lk)
    if not _final_config_written(lk, backup, src_cm):
        return None
    failure = walk.drive(lk, MoveDirection.HANDBACK)
    if failure:
        lk.pause(PauseReason.FINALIZE_STUCK, failure)
        return None
    labelled = walk.labelled(lk, lk.planned())
    if labelled or lk.status.moves:
        _hand_back(lk, labelled)
        return None
    if _restore_source(lk, backup, src_ds):
        lk.status.finalized = True
        lk.status.completed_time = lk.now
        lk.transition(
            Phase.COMPLETED,
            EventReason.COMPLETED,
            f"every node runs {lk.spec.target_mode} from the source DaemonSet"
            + not_seen(lk, src_ds),
        )
        lk.requeue = 1  # the next look tidies up the snapshot
    return None


def _final_config_written(lk: Look, backup: Mapping[str, str], src_cm: Object) -> bool:
    """The target mode in the source ConfigMap; True once it is there."""
    key = lk.spec.kube_proxy.config_key
    original = objects.original_config_data(backup)
    # Rendered from the ConfigMap as it is now, not from the snapshot: a person's edit made
    # since the run began (a review: tcpBeLiberal set mid-bake) is kept, and rendering the
    # mode into its own output changes nothing, so later looks write nothing.
    current = {str(k): str(v) for k, v in (src_cm.get("data") or {}).items()}
    base = current if key in current else original
    try:
        final = with_mode(
            parse_config(base[key]),
            lk.target_mode,
            version=kube_proxy_version(lk),
            overrides=lk.spec.config_overrides,
        ).to_yaml()
    except (ConfigError, KeyError) as e:
        # A configOverrides edit mid-Finalizing: hold, the hand-backs in flight finishing
        # while paused. Failing left one at switching with no kube-proxy, and resume refused
        # (a review).
        hold_on_bad_config(lk, "the final configuration", e)
        return False
    desired = {**base, key: final}
    if not _kept_before_finalize(lk, backup, current.get(key), final):
        return False
    if not patch_config_data(
        lk, src_cm, desired, f"write mode {lk.spec.target_mode} into the source ConfigMap"
    ):
        lk.requeue = 1
        return False
    return True


def _kept_before_finalize(
    lk: Look, backup: Mapping[str, str], text: str | None, final: str
) -> bool:
    """Before the target mode is written into the source configuration, the text it
    replaces is kept in the snapshot (``objects.BACKUP_BEFORE_FINALIZE``): a rollback after
    Finalizing puts it back with a person's edit made during the run, not the snapshot's
    text (a review saw such an edit lost). True when kept, or nothing is to be written."""
    if text is None or text == final or backup.get(objects.BACKUP_BEFORE_FINALIZE) == text:
        return True
    original = objects.original_config_data(backup).get(lk.spec.kube_proxy.config_key)
    if original is not None and config_mode(text) != config_mode(original):
        return True  # the operator's write is there already (a person's edit after it)
    lk.actions.append(objects.before_finalize_patch(lk.name, lk.spec.kube_proxy.namespace, text))
    lk.requeue = 1
    return False


def _hand_back(lk: Look, labelled: list[str]) -> None:
    """Hand nodes back within the budget, never beside the target DaemonSet's own rolling
    update (``target_roll``); pause on a roll that does not become Ready."""
    stuck = target_roll.stalled(lk)
    if stuck:
        lk.pause(PauseReason.FINALIZE_STUCK, stuck)
        return
    lk.moves_held = target_roll.rolling(lk, until_ready=True)
    walk.start_moves(lk, labelled, MoveDirection.HANDBACK)
    lk.status.message = (
        f"handing {nodes(len(labelled))} back to the source DaemonSet"
        + (f"; no new hand-back starts: {lk.moves_held}" if lk.moves_held else "")
        + node_checks.kubelets_waited(lk, labelled)
    )
    lk.requeue = 2


def _restore_source(lk: Look, backup: Mapping[str, str], src_ds: Object) -> bool:
    """The source's update strategy back, and its own affinity too when the policy asks
    for the exact template (decision 0014). With ``KeepExclusionTerm`` the pod template
    stays the one every node was just handed back to: no kube-proxy restarts again."""
    if not delete_target_pair(lk):
        return False
    keep = lk.spec.finalize_source_template == SourceTemplate.KEEP_EXCLUSION_TERM
    what = "update strategy" if keep else "affinity and update strategy"
    if not restore_source_spec(
        lk, src_ds, backup, f"restore the source DaemonSet's own {what}", keep_template=keep
    ):
        lk.status.message = (
            "restoring the source DaemonSet's update strategy (its pod template stays)"
            if keep
            else "restoring the source DaemonSet's affinity: one rolling restart follows"
        )
        return False
    if not source_settled(lk, src_ds):
        lk.status.message = "waiting for the source DaemonSet's rolling restart" + waiting_on(
            lk, src_ds
        )
        lk.requeue = 2
        return False
    return True
