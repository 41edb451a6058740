"""Putting objects back: the target pair deleted, the source patched back to the snapshot.

Shared by rollback (everything exactly as before) and finalize (the source's own affinity
and update strategy back, its ConfigMap now in the target mode). Each helper asks for what
differs and says whether all is already in place, so a look can stop at the first gap.
"""

from __future__ import annotations

from collections.abc import Mapping

from proxymode.engine import objects
from proxymode.engine.actions import DeleteObject, PatchObject
from proxymode.engine.look import Look
from proxymode.engine.observed import Object


def template_hash(ds: Object | None) -> str | None:
    if ds is None:
        return None
    annotations = ds["spec"]["template"].get("metadata", {}).get("annotations", {})
    return str(annotations.get("proxymode.io/config-hash"))


def generation_observed(ds: Object) -> bool:
    status = ds.get("status") or {}
    return int(status.get("observedGeneration", 0)) >= int(ds["metadata"].get("generation", 0))


def rolled_out(ds: Object) -> bool:
    st = ds.get("status") or {}
    desired = st.get("desiredNumberScheduled", 0)
    return (
        generation_observed(ds)
        and st.get("updatedNumberScheduled", 0) == desired
        and st.get("numberReady", 0) == desired
        and st.get("numberUnavailable", 0) in (0, None)
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


def restore_source_spec(look: Look, src_ds: Object, backup: Mapping[str, str], why: str) -> bool:
    """Patch the source DaemonSet back to the snapshot. True when it already matches."""
    original = objects.original_spec(backup)
    if src_ds["spec"] == original:
        return True
    meta = src_ds["metadata"]
    look.actions.append(
        PatchObject(
            "apps/v1",
            "DaemonSet",
            meta["namespace"],
            meta["name"],
            objects.spec_patch(src_ds, original),
            why=why,
        )
    )
    return False


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
    if backup is None:
        return done
    src_ds, src_cm = look.obs.source_daemon_set, look.obs.source_config_map
    if src_ds is not None and not restore_source_spec(
        look, src_ds, backup, "restore the source DaemonSet from the snapshot"
    ):
        return False
    original_data = objects.original_config_data(backup)
    if src_cm is not None and not patch_config_data(
        look, src_cm, original_data, "restore the source ConfigMap from the snapshot"
    ):
        return False
    if src_ds is not None and not rolled_out(src_ds):
        look.status.message = "waiting for the source DaemonSet to settle"
        look.requeue = 2
        return False
    return done
