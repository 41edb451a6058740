"""Putting objects back: the target pair deleted, the source's own affinity and strategy back.

Shared by rollback (the operator's changes undone exactly) and finalize (the same, its
ConfigMap now in the target mode). Only what the operator changed is put back: the pod
template's affinity and the update strategy. Whatever else a person changed on the source
DaemonSet meanwhile (an image bump) stays (issue 9 item 15). Each helper asks for what
differs and says whether all is already in place, so a look can stop at the first gap.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from proxymode.api.reasons import EventReason
from proxymode.engine import objects
from proxymode.engine.actions import CreateObject, DeleteObject, PatchObject
from proxymode.engine.look import Look
from proxymode.engine.observed import Object
from proxymode.engine.settle import source_settled, waiting_on
from proxymode.kubeproxy import ConfigError, parse_config


def template_hash(ds: Object | None) -> str | None:
    if ds is None:
        return None
    annotations = ds["spec"]["template"].get("metadata", {}).get("annotations", {})
    return str(annotations.get("proxymode.io/config-hash"))


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


def source_config_to_restore(look: Look, cm: Object, backup: Mapping[str, str]) -> dict[str, str]:
    """The source ConfigMap's data as a rollback leaves it: the operator's own change undone,
    a person's kept.

    The operator writes the source ConfigMap only in Finalizing (the target mode, and the
    overrides, into its configuration key). While that key's mode is still the snapshot's,
    the write is not there and every difference is a person's edit (a review saw an abort
    put back a ``tcpBeLiberal`` a person had set mid-bake): nothing changes. Once it is
    there, that key goes back to the text Finalizing found (kept in the snapshot before it
    wrote: a person's edit made during the run stays), else to the snapshot's; other keys
    keep what they hold now."""
    original = objects.original_config_data(backup)
    current = {str(k): str(v) for k, v in (cm.get("data") or {}).items()}
    key = look.spec.kube_proxy.config_key
    if key not in original:
        return original
    if key in current and config_mode(current[key]) == config_mode(original[key]):
        return current
    found = backup.get(objects.BACKUP_BEFORE_FINALIZE)
    return {**current, key: found if found is not None else original[key]}


def config_mode(text: str) -> str | None:
    """The mode a kube-proxy configuration text sets (None when it does not parse)."""
    try:
        return parse_config(text).mode
    except ConfigError:
        return None


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
    if src_cm is not None and not patch_config_data(
        look,
        src_cm,
        source_config_to_restore(look, src_cm, backup),
        "restore the source ConfigMap's mode from the snapshot",
    ):
        return False
    if src_ds is not None and not source_settled(look, src_ds):
        look.status.message = "waiting for the source DaemonSet to settle" + waiting_on(
            look, src_ds
        )
        look.requeue = 2
        return False
    return done


def remake_source_config_map(look: Look) -> bool:
    """The source ConfigMap deleted under a run: made again from the snapshot, so that the
    rollback can bring every node back to a kube-proxy that starts. Without it, a rollback
    failed, and a deletion took every node's label at once, over a source DaemonSet whose
    pods cannot start without their ConfigMap (a review: nodes left with no kube-proxy).
    True when it is asked for."""
    backup = look.obs.backup
    if look.obs.source_config_map is not None or backup is None:
        return False
    try:
        saved = json.loads(backup[objects.BACKUP_CONFIG_MAP])
    except (KeyError, ValueError):
        return False
    meta = saved.get("metadata") or {}
    look.actions.append(
        CreateObject(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": look.spec.kube_proxy.config_map,
                    "namespace": look.spec.kube_proxy.namespace,
                    **{k: meta[k] for k in ("labels", "annotations") if meta.get(k)},
                },
                "data": saved.get("data") or {},
            }
        )
    )
    look.event(
        EventReason.SOURCE_CONFIG_MAP_RESTORED,
        f"the source ConfigMap {look.spec.kube_proxy.namespace}/{look.spec.kube_proxy.config_map}"
        " was deleted; made again from the snapshot so that the rollback can bring every node"
        " back to a kube-proxy that starts",
        warning=True,
    )
    look.soon(1)
    return True
