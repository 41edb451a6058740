"""The target DaemonSet's own rolling update, kept apart from the operator's moves.

The target's template follows the source's (``setup``: a person's image bump reaches it),
and its ``RollingUpdate`` has the DaemonSet controller replace one target pod at a time.
That node is between proxies by the controller's hand, not the operator's; a move started
beside it put two nodes down where maxUnavailable was 1 (the fault matrix's image-finalize
case, docs/reliability.md finding 12). So the roll is treated like one more move:

- ``apply_held``: a changed template is applied only when the budget has room for the
  node the controller will take down: no move in flight, no node at ``switching`` (a lost
  status write can hide a move), fewer nodes without a Ready kube-proxy than the budget;
- ``rolling``: while the controller has not taken the template up, or a pod of an older
  template still runs or terminates, no move starts (with ``until_ready``, the hand-backs
  of finalize, also while a node at the target has no Ready pod of the new template: the
  hand-back budget counts only the nodes being moved);
- ``stalled``: a pod of the new template not Ready for readyTimeoutSeconds; finalize pauses
  on it (rollout's health checks roll back on it), rather than hold for ever;
- ``stop``: a rollback turns the target's strategy to ``OnDelete``. Its moves back are not
  held (a roll that never becomes Ready, a bad image, would hold the very rollback that
  mends it), and each node walked back leaves the target's set and frees the controller's
  budget: it would put the template it rolls on the next node, beside the walk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxymode.api.reasons import EventReason
from proxymode.engine import moves, node_checks, walk
from proxymode.engine.actions import PatchObject
from proxymode.engine.look import Look
from proxymode.engine.objects import template_generation
from proxymode.engine.observed import SPEC_WRITERS, SWITCHING, Object, ProxyKind, ProxyPod
from proxymode.engine.restore import template_hash
from proxymode.engine.settle import generation_observed
from proxymode.engine.stages import named


def apply_held(look: Look) -> str | None:
    """Why a changed target template must wait before it is applied; None: apply it."""
    if look.status.moves:
        return "the target DaemonSet follows it once the moves in flight end"
    planned = look.planned()
    switching = [n for n in planned if (v := look.obs.node(n)) and v.mode_label == SWITCHING]
    if switching:
        return f"the target DaemonSet follows it once {named(switching)} ends switching"
    down = [n for n in planned if not moves.healthy_proxy(look.obs, n, look.target_mode)]
    if len(down) >= walk.budget(look):
        return (
            "the target DaemonSet follows it once maxUnavailable has room for the node its"
            f" rolling update takes down (held by {named(down)}, without a Ready kube-proxy)"
        )
    return None


def rolling(look: Look, *, until_ready: bool = False) -> str | None:
    """Why no move may start while the target DaemonSet rolls a changed template out;
    None when no roll is under way."""
    ds = look.obs.target_daemon_set
    if ds is None:
        return None
    if not generation_observed(ds):
        return "the target DaemonSet's changed template is not yet taken up by its controller"
    older = sorted({p.node for p in _target_pods(look) if _older(p, ds)})
    if older:
        return (
            "the target DaemonSet is rolling a changed template out, one node at a time"
            f" (still to replace: {named(older)})" + _kubelets_down(look, older)
        )
    if until_ready:
        waiting = _not_ready_at_target(look)
        if waiting:
            return (
                f"the target DaemonSet's rolling update waits for {named(waiting)} to be Ready"
                + _kubelets_down(look, waiting)
            )
    return None


def stalled(look: Look) -> str | None:
    """A node at the target whose pod of the current template has not been Ready for
    readyTimeoutSeconds: what finalize pauses on, named (a roll's stalled node, or any
    other: a hand-back restarts every node's kube-proxy, never beside a broken one)."""
    ds = look.obs.target_daemon_set
    if ds is None:
        return None
    limit = look.spec.ready_timeout_seconds
    for pod in _target_pods(look):
        if pod.terminating or pod.ready or _older(pod, ds):
            continue
        since = pod.ready_changed or pod.created
        if since is not None and (look.now - since).total_seconds() > limit:
            if look.obs.kubelet_down(pod.node):
                return (
                    f"the target kube-proxy pod {pod.name} on node {pod.node} has not been"
                    f" Ready for {(look.now - since).total_seconds():.0f}s"
                    f" (readyTimeoutSeconds {limit}): the node's kubelet is not Ready;"
                    " handing nodes back restarts every kube-proxy, so none starts until it"
                    " is (bring the node back, or delete it, and resume once its kube-proxy"
                    " is Ready)"
                )
            return (
                f"the target kube-proxy pod {pod.name} on node {pod.node} has not been Ready"
                f" for {(look.now - since).total_seconds():.0f}s (readyTimeoutSeconds {limit});"
                " handing nodes back restarts every kube-proxy, so none starts until it is"
                " (after a changed source template: a bad image? fix it, then resume)"
            )
    return None


def stop(look: Look) -> None:
    """Turn the target DaemonSet's update strategy to ``OnDelete`` (see the module)."""
    ds = look.obs.target_daemon_set
    if ds is None or (ds["spec"].get("updateStrategy") or {}).get("type") == "OnDelete":
        return
    # Unguarded (no resourceVersion test): the operator owns the target DaemonSet and
    # writes this one field, and a failed action stops the look's batch, so a guard that
    # lost a race with the controller's status writes would hold the walk back behind it.
    _patch(
        look,
        ds,
        {"op": "add", "path": "/spec/updateStrategy", "value": {"type": "OnDelete"}},
        "stop the target DaemonSet's own rolling update: the rollback walks nodes back",
    )


EDIT_REPORTED = "proxymode.io/edit-reported"
"""On the target DaemonSet: the template generation whose edit by someone else was said."""


def report_edit(look: Look, source: str) -> None:
    """Say once per template generation that the target DaemonSet carries someone else's
    change: it rolls out (paced, see ``rolling``) but is overwritten where the source's
    template changes and lost when the migration ends, which people editing the wrong
    DaemonSet would not expect (decision 0073)."""
    ds = look.obs.target_daemon_set
    writers = (ds or {}).get(SPEC_WRITERS) or []
    if ds is None or not writers:
        return
    generation = str(template_generation(ds))
    meta = ds["metadata"]
    if (meta.get("annotations") or {}).get(EDIT_REPORTED) == generation:
        return
    name = f"{meta['namespace']}/{meta['name']}"
    look.event(
        EventReason.TARGET_EDITED,
        f"the target DaemonSet {name} carries changes by {', '.join(writers)}, not rendered"
        " by the operator: its controller rolls them out, one node at a time, and no move"
        " starts meanwhile; they are overwritten where the source DaemonSet's template"
        " changes, and lost when the migration ends (finalize and rollback delete the"
        f" target); make them on the source DaemonSet {meta['namespace']}/{source}, which"
        " the target follows",
        warning=True,
    )
    op: dict[str, Any] = {"op": "add", "path": "/metadata/annotations"}
    if meta.get("annotations"):
        op.update(path="/metadata/annotations/proxymode.io~1edit-reported", value=generation)
    else:
        op.update(value={EDIT_REPORTED: generation})
    _patch(look, ds, op, "remember that this edit of the target DaemonSet was said")


def _patch(look: Look, ds: Object, op: Mapping[str, Any], why: str) -> None:
    """One unguarded JSON-patch op on the target DaemonSet (the operator's own: see stop)."""
    meta = ds["metadata"]
    look.actions.append(
        PatchObject("apps/v1", "DaemonSet", meta["namespace"], meta["name"], [op], why=why)
    )


def report_deleted(look: Look, desired: Object) -> None:
    """Say that the target DaemonSet was deleted under nodes this run moved (its pods went
    with it) and is made again: deleting it is no way to stop a migration (decision 0073)."""
    moved = [n for s in look.status.stages for n in s.moved or [] if look.at_target(n)]
    if not moved:
        return  # not made yet in this run
    meta = desired["metadata"]
    look.event(
        EventReason.TARGET_DELETED,
        f"the target DaemonSet {meta['namespace']}/{meta['name']} was deleted, and the"
        f" kube-proxies of {named(moved)} with it: it is made again from the source's"
        " template; to stop the migration, abort it (proxymode.io/action=abort) or delete"
        " the policy, which rolls every node back",
        warning=True,
    )


NOTHING_MOVES = "no pod starts or stops there"


def _kubelets_down(look: Look, nodes: list[str]) -> str:
    """Why a roll's wait on these nodes may be long (a review saw it unexplained)."""
    return node_checks.kubelets_down(look, nodes, (NOTHING_MOVES, NOTHING_MOVES))


def _target_pods(look: Look) -> list[ProxyPod]:
    return [p for p in look.obs.pods if p.kind == ProxyKind.TARGET]


def _older(pod: ProxyPod, ds: Object) -> bool:
    """A pod made from an earlier template than the DaemonSet's. The config hash tells the
    operator's own renderings apart; the template generation every change, a person's edit
    of the target DaemonSet too (its controller rolls that one out as well: no move may
    start beside it)."""
    want = template_hash(ds)
    if pod.config_hash is not None and pod.config_hash != want:
        return True
    current = template_generation(ds)
    return (
        current is not None
        and pod.template_generation is not None
        and pod.template_generation < current
        and _not_all_updated(ds)
    )


def _not_all_updated(ds: Object) -> bool:
    """The DaemonSet's controller has pods left to replace. It calls a pod updated when its
    generation or its revision hash is current, so after a template reverted mid-roll
    (A, B, A) the pods still on A are current with their old generation: generation alone
    held every move for ever (a review)."""
    st = ds.get("status") or {}
    return int(st.get("updatedNumberScheduled") or 0) < int(st.get("desiredNumberScheduled") or 0)


def _not_ready_at_target(look: Look) -> list[str]:
    moving = {m.node for m in look.status.moves}
    return [
        n
        for n in look.planned()
        if n not in moving
        and (v := look.obs.node(n)) is not None
        and v.mode_label == look.target_mode
        and not moves.healthy_proxy(look.obs, n, look.target_mode)
    ]
