"""Setting a rollout up, every look: the snapshot, the target pair, the source patch.

Idempotent: each look compares what exists with what should, and asks only for the
difference, so a lost write or a restart between two actions is harmless.
"""

from __future__ import annotations

from proxymode.api.models import BackupRef
from proxymode.api.reasons import FailureReason, PauseReason
from proxymode.engine import naming, objects, target_roll
from proxymode.engine.actions import ApplyObject, PatchObject, SaveBackup
from proxymode.engine.look import Look
from proxymode.engine.observed import Object
from proxymode.engine.restore import own_spec, template_hash
from proxymode.engine.settle import generation_observed
from proxymode.kubeproxy import (
    ConfigError,
    KubeVersion,
    parse_config,
    parse_version,
    render_target_config,
)


def changed_anything(look: Look) -> bool:
    """Evidence in the world that this run already changed something."""
    src = look.obs.source_daemon_set
    return (
        (src is not None and objects.source_is_patched(src, look.target_mode))
        or look.obs.target_daemon_set is not None
        or any(n.mode_label is not None for n in look.obs.nodes)
    )


def run_changed(look: Look) -> bool:
    """This policy's run changed the cluster: its snapshot, taken before any change, exists
    or was recorded. Node labels and a patched source alone are no evidence: another policy
    on the same kube-proxy makes them too (a review: a retry of a policy refused for such a
    rival rolled back, and its rollback undid the rival's patch of the source)."""
    return look.status.backup is not None or look.obs.backup is not None


def backup(look: Look) -> dict[str, str] | None:
    """The snapshot, saving it first when this run has none yet."""
    namespace = look.spec.kube_proxy.namespace
    name = naming.backup_config_map(look.name)
    if look.obs.backup is not None:
        look.status.backup = BackupRef(namespace=namespace, name=name)
        return dict(look.obs.backup)
    if look.status.backup is not None and changed_anything(look):
        look.fail(
            FailureReason.BACKUP_LOST,
            f"the backup ConfigMap {look.status.backup.namespace}/{look.status.backup.name}"
            " was deleted: retry (proxymode.io/action=retry) or delete the policy, and it rolls"
            " back without it",
        )
        return None
    src_ds, src_cm = look.obs.source_daemon_set, look.obs.source_config_map
    if src_ds is None or src_cm is None:
        return None
    labels = {n.name: n.mode_label for n in look.obs.nodes}
    if objects.marked(src_ds) or objects.source_is_patched(src_ds, look.target_mode):
        # A patch left by an earlier run: snapshot the spec as it was before it.
        src_ds = {**src_ds, "spec": objects.unpatched_spec(src_ds, look.target_mode)}
    data = objects.backup_data(src_ds, src_cm, labels, look.status.run)
    look.actions.append(SaveBackup(objects.backup_object(look.name, look.uid, namespace, data)))
    look.status.backup = BackupRef(namespace=namespace, name=name)
    return data


def kube_proxy_version(look: Look) -> KubeVersion | None:
    baseline = look.status.baseline
    text = baseline.kube_proxy_version if baseline else None
    try:
        return parse_version(text) if text else None
    except ValueError:
        return None


def target_text(look: Look, snapshot: dict[str, str]) -> str | None:
    original = objects.original_config_data(snapshot)
    key = look.spec.kube_proxy.config_key
    try:
        rendered = render_target_config(
            parse_config(original[key]),
            look.target_mode,
            version=kube_proxy_version(look),
            overrides=look.spec.config_overrides,
        )
    except (ConfigError, KeyError) as e:
        if look.obs.backup is None:
            look.fail(
                FailureReason.TARGET_CONFIG_INVALID, f"cannot render the target configuration: {e}"
            )
        else:
            # Changed mid-run (preflight rendered the spec it started with): hold, as for
            # any plan edit, rather than fail with moved nodes nobody watches any more.
            hold_on_bad_config(
                look,
                "the target configuration",
                e,
                "the target DaemonSet keeps the configuration it has: ",
            )
        return None
    return rendered.text


def hold_on_bad_config(look: Look, what: str, error: Exception, kept: str = "") -> None:
    """Pause on a ``configOverrides`` edit the configuration cannot be rendered from, mid-run
    (rollout or finalize): moves in flight finish while paused; fix and resume goes on."""
    look.pause(
        PauseReason.TARGET_CONFIG_INVALID,
        f"cannot render {what}: {error}; {kept}fix spec.configOverrides and annotate"
        " proxymode.io/action=resume, or abort to roll back",
    )


def ensure_setup(look: Look) -> bool:
    """Backup, target ConfigMap and DaemonSet, source patch. True once all are in place."""
    src_ds, src_cm = look.obs.source_daemon_set, look.obs.source_config_map
    if src_ds is None or src_cm is None:
        look.fail(
            FailureReason.SOURCE_MISSING,
            f"the source kube-proxy DaemonSet or ConfigMap in {look.spec.kube_proxy.namespace}"
            " disappeared mid-rollout",
        )
        return False
    snapshot = backup(look)
    if snapshot is None:
        return False
    text = target_text(look, snapshot)
    if text is None:
        return False
    mode = look.target_mode
    # The target is a clone of the source as it is now, minus the operator's own patch: a
    # person's later edit of the source (an image bump) reaches the target DaemonSet too.
    original = {
        "metadata": src_ds["metadata"],
        "spec": own_spec(src_ds["spec"], objects.original_spec(snapshot)),
    }
    desired_cm = objects.target_config_map(
        look.name,
        look.uid,
        src_cm,
        config_key=look.spec.kube_proxy.config_key,
        target_text=text,
        mode=mode,
    )
    desired_cm["data"] = {
        **objects.original_config_data(snapshot),
        look.spec.kube_proxy.config_key: text,
    }
    desired_ds = objects.target_daemon_set(
        look.name,
        look.uid,
        original,
        source_config_map=look.spec.kube_proxy.config_map,
        mode=mode,
        target_config_text=text,
    )
    ready = True
    if (look.obs.target_config_map or {}).get("data") != desired_cm["data"]:
        look.actions.append(ApplyObject(desired_cm))
        ready = False
    if template_hash(look.obs.target_daemon_set) != template_hash(desired_ds) or _strategy(
        look.obs.target_daemon_set
    ) not in (None, _strategy(desired_ds)):
        # Applied, its controller replaces a target pod: one more node between proxies,
        # so it waits for the budget like a move, and no move starts meanwhile.
        wait = target_roll.apply_held(look) if look.obs.target_daemon_set is not None else None
        if look.obs.target_daemon_set is None:
            target_roll.report_deleted(look, desired_ds)
        if wait is not None:
            look.moves_held = f"the source DaemonSet's template changed, and {wait}"
        else:
            look.actions.append(ApplyObject(desired_ds))
            ready = False
    else:
        look.moves_held = target_roll.rolling(look)
    target_roll.report_edit(look, look.spec.kube_proxy.daemon_set)
    if not objects.source_is_patched(src_ds, mode):
        look.actions.append(
            PatchObject(
                "apps/v1",
                "DaemonSet",
                src_ds["metadata"]["namespace"],
                src_ds["metadata"]["name"],
                objects.source_patch(
                    src_ds,
                    mode,
                    objects.original_spec(snapshot).get("updateStrategy")
                    or objects.DEFAULT_STRATEGY,
                ),
                why="keep the source kube-proxy off target and switching nodes; OnDelete",
            )
        )
        ready = False
    elif not generation_observed(src_ds):
        ready = False
    return ready


def _strategy(ds: Object | None) -> object:
    """The update strategy's type (a rollback turns the target's to ``OnDelete``; a
    rollout it returns to gets ``RollingUpdate`` back)."""
    return None if ds is None else (ds["spec"].get("updateStrategy") or {}).get("type")


def remake_deleted_target(look: Look) -> None:
    """In a phase that keeps the target pair without walking (Paused, Completed in mixed
    mode): a deleted target DaemonSet took the moved nodes' kube-proxies with it, and only
    the rollout's looks made it again; paused or finished, those nodes stayed without one,
    the status healthy (a review). Made again here, and said (``TargetDeleted``)."""
    if look.obs.target_daemon_set is not None or look.obs.backup is None:
        return
    # This run's nodes only: another migration (another kube-proxy DaemonSet) labels its
    # own the same way, and counting them made a finished target again (CI, 2026-12-07).
    if any(look.at_target(n) for n in look.planned()):
        ensure_setup(look)
