"""Putting objects back: the target pair deleted, the source's own affinity and strategy back.

Shared by rollback (the operator's changes undone exactly) and finalize (the same, its
ConfigMap now in the target mode). Only what the operator changed is put back: the pod
template's affinity and the update strategy. Whatever else a person changed on the source
DaemonSet meanwhile (an image bump) stays (issue 9 item 15). Each helper asks for what
differs and says whether all is already in place, so a look can stop at the first gap.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping
from typing import Any

from proxymode.engine import objects
from proxymode.engine.actions import DeleteObject, PatchObject
from proxymode.engine.look import Look
from proxymode.engine.observed import Object, ProxyKind
from proxymode.engine.stages import named


def template_hash(ds: Object | None) -> str | None:
    if ds is None:
        return None
    annotations = ds["spec"]["template"].get("metadata", {}).get("annotations", {})
    return str(annotations.get("proxymode.io/config-hash"))


def generation_observed(ds: Object) -> bool:
    status = ds.get("status") or {}
    return int(status.get("observedGeneration", 0)) >= int(ds["metadata"].get("generation", 0))


def rolled_out(ds: Object, excused: int = 0) -> bool:
    """The DaemonSet's controller has seen its spec and every pod is of it and Ready.

    With ``excused`` nodes down (``down_nodes``), up to that many may lack a Ready pod, and
    pods of the previous template may stay: a down node's pod, Terminating for as long as
    its kubelet is gone, counts against the rolling update's ``maxUnavailable``, so the
    controller stops replacing the others until it is back (``rollingUpdate`` in
    pkg/controller/daemon/update.go). Every node that should run a pod must still have one
    (``currentNumberScheduled`` counts a Terminating pod too), and what the pods serve is
    checked pod by pod (``source_settled``)."""
    st = ds.get("status") or {}
    desired = st.get("desiredNumberScheduled", 0)
    return (
        generation_observed(ds)
        and st.get("currentNumberScheduled", 0) >= desired
        and (excused > 0 or st.get("updatedNumberScheduled", 0) >= desired)
        and st.get("numberReady", 0) >= desired - excused
        and (st.get("numberUnavailable") or 0) <= excused
    )


def down_nodes(look: Look) -> list[str]:
    """Nodes with a source kube-proxy pod whose kubelet is not Ready (a node powered off,
    cut off, or gone while the migration ran): no pod starts, stops or reports there until
    it is back.

    Waiting for the source DaemonSet to settle on such a node would never end: the old pod
    stays Terminating and the new one never runs (a review found a rollback that never
    finished). They are left out of the wait and named when the phase ends; the DaemonSet's
    controller starts their kube-proxy when the kubelet returns, from the template put back.
    Only nodes with a pod of the source: a down node the source does not run on (another
    migration's, excluded by its affinity) excuses nothing (found by a review)."""
    mine = {p.node for p in look.obs.pods if p.kind == ProxyKind.SOURCE}
    return sorted(n.name for n in look.obs.nodes if not n.ready and n.name in mine)


def source_settled(look: Look, ds: Object) -> bool:
    """The source DaemonSet rolled out and every node it runs on served by a Ready source
    kube-proxy that is staying, but for the nodes whose kubelet is down."""
    down = down_nodes(look)
    desired = (ds.get("status") or {}).get("desiredNumberScheduled", 0)
    # The DaemonSet's status and the pod cache come from two watches: a status one event
    # behind can still count a pod the cache has already seen go (a review's case). The
    # pods themselves must cover as many nodes as the DaemonSet wants (a node between its
    # old pod and its new one has none).
    covered = {p.node for p in look.obs.pods if p.kind == ProxyKind.SOURCE}
    return (
        rolled_out(ds, excused=len(down))
        and len(covered) >= desired
        and not _unserved(look, set(down))
    )


def waiting_on(look: Look) -> str:
    """``: no Ready kube-proxy that stays on node a`` for the nodes a settle waits on, or ""
    (a crash-looping source kube-proxy on a live node is waited for, and named)."""
    unserved = _unserved(look, set(down_nodes(look)))
    return f": no Ready kube-proxy that stays on {named(unserved)}" if unserved else ""


def not_seen(look: Look, ds: Object | None) -> str:
    """What a terminal message adds for the nodes whose kubelet is down, or ""."""
    down = down_nodes(look)
    if ds is None or not down:
        return ""
    st = ds.get("status") or {}
    desired, updated = st.get("desiredNumberScheduled", 0), st.get("updatedNumberScheduled", 0)
    roll = (
        f"; its rolling update ({updated} of {desired} pods updated) goes on then"
        if updated < desired
        else ""
    )
    return (
        f"; not seen on {named(down)}, whose kubelet is not Ready: the restored DaemonSet"
        f" starts kube-proxy there when it is back{roll}"
    )


def delete_target_pair(look: Look) -> bool:
    """Ask for the target DaemonSet and ConfigMap to go. True when neither exists."""
    gone = True
    for obj, kind, api in (
        (look.obs.target_daemon_set, "DaemonSet", "apps/v1"),
        (look.obs.target_config_map, "ConfigMap", "v1"),
    ):
        if obj is not None:
            meta = obj["metadata"]
            look.actions.append(DeleteObject(api, kind, meta["namespace"], meta["name"]))
            gone = False
    return gone


def covers(current: Any, wanted: Any) -> bool:
    """True when ``current`` holds everything ``wanted`` says: a field the API server began
    defaulting since the snapshot is not a difference worth patching for."""
    if isinstance(wanted, Mapping) and isinstance(current, Mapping):
        return all(k in current and covers(current[k], v) for k, v in wanted.items())
    return bool(current == wanted)


def own_spec(
    current: Mapping[str, Any], snapshot: Mapping[str, Any], keep_template: bool = False
) -> dict[str, Any]:
    """``current`` with what the operator changed put back from ``snapshot``: the pod
    template's affinity and the update strategy. The rest (a person's edits since the
    snapshot) is kept. ``keep_template``: only the strategy, the pod template stays as it
    is (finalize's ``KeepExclusionTerm``: nothing the DaemonSet controller would roll)."""
    spec = copy.deepcopy(dict(current))
    pod_spec = spec["template"]["spec"]
    affinity = snapshot.get("template", {}).get("spec", {}).get("affinity")
    if keep_template:
        pass
    elif affinity:
        pod_spec["affinity"] = copy.deepcopy(affinity)
    else:
        pod_spec.pop("affinity", None)
    strategy = snapshot.get("updateStrategy")
    if strategy:
        spec["updateStrategy"] = copy.deepcopy(strategy)
    elif spec.get("updateStrategy", {}).get("type") == "OnDelete":
        spec["updateStrategy"] = copy.deepcopy(objects.DEFAULT_STRATEGY)
    return spec


def restore_source_spec(
    look: Look, src_ds: Object, backup: Mapping[str, str], why: str, keep_template: bool = False
) -> bool:
    """Put the source DaemonSet's affinity (unless ``keep_template``) and strategy back as
    the snapshot had them, keeping anything else changed since. True when it matches."""
    desired = own_spec(src_ds["spec"], objects.original_spec(backup), keep_template)
    return _patch_source(look, src_ds, desired, why)


def _patch_source(look: Look, src_ds: Object, desired: Mapping[str, object], why: str) -> bool:
    if covers(src_ds["spec"], desired) and not objects.marked(src_ds):
        return True
    meta = src_ds["metadata"]
    look.actions.append(
        PatchObject(
            "apps/v1",
            "DaemonSet",
            meta["namespace"],
            meta["name"],
            objects.restore_patch(src_ds, desired),
            why=why,
        )
    )
    return False


def undo_source_patch(look: Look, src_ds: Object) -> bool:
    """Without a snapshot: take the operator's own patch off. True when it is not there."""
    if not objects.marked(src_ds) and not objects.source_is_patched(src_ds, look.target_mode):
        return True
    return _patch_source(
        look,
        src_ds,
        objects.unpatched_spec(src_ds, look.target_mode),
        "undo the operator's source patch",
    )


def patch_config_data(look: Look, cm: Object, desired: Mapping[str, str], why: str) -> bool:
    """Patch a ConfigMap's data to ``desired``. True when it already matches."""
    if (cm.get("data") or {}) == dict(desired):
        return True
    meta = cm["metadata"]
    look.actions.append(
        PatchObject(
            "v1",
            "ConfigMap",
            meta["namespace"],
            meta["name"],
            objects.data_patch(cm, desired),
            why=why,
        )
    )
    return False


def restore(look: Look) -> bool:
    """Delete the target objects, put the source back exactly. True when all is back."""
    backup = look.obs.backup
    done = delete_target_pair(look)
    for job in look.obs.jobs:
        ns = look.spec.kube_proxy.namespace
        look.actions.append(DeleteObject("batch/v1", "Job", ns, job.name))
    src_ds, src_cm = look.obs.source_daemon_set, look.obs.source_config_map
    if backup is None:
        # The snapshot is lost: nothing to restore exactly, but the operator's own patch
        # (OnDelete, the mode affinity) never outlives the run.
        return (src_ds is None or undo_source_patch(look, src_ds)) and done
    if src_ds is not None and not restore_source_spec(
        look, src_ds, backup, "restore the source DaemonSet from the snapshot"
    ):
        return False
    original_data = objects.original_config_data(backup)
    if src_cm is not None and not patch_config_data(
        look, src_cm, original_data, "restore the source ConfigMap from the snapshot"
    ):
        return False
    if src_ds is not None and not source_settled(look, src_ds):
        look.status.message = "waiting for the source DaemonSet to settle" + waiting_on(look)
        look.requeue = 2
        return False
    return done


def _unserved(look: Look, down: Collection[str] = ()) -> list[str]:
    """Nodes with a source kube-proxy (but those in ``down``) none of which is Ready and
    staying.

    The DaemonSet's status alone can say "rolled out" mid-restart: it counts a node Ready
    while its old pod, terminating, still is, and updated once the new pod exists, not yet
    Ready (a review saw RolledBack while a restored template's restart was still under way
    on a node, with no kube-proxy serving it for a moment)."""
    serving: dict[str, bool] = {}
    for pod in look.obs.pods:
        if pod.kind == ProxyKind.SOURCE and pod.node not in down:
            ok = pod.ready and not pod.terminating
            serving[pod.node] = serving.get(pod.node, False) or ok
    return sorted(node for node, ok in serving.items() if not ok)
