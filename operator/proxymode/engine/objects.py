"""The Kubernetes objects a policy creates or changes, built as plain data (DESIGN §3).

- the target ConfigMap: the source ConfigMap with the rendered target configuration;
- the target DaemonSet: a clone of the source that mounts the target ConfigMap, carries the
  ``proxymode.io/mode`` pod label and selector, and runs only where a node's label says
  ``<target>``;
- the source patch: ``OnDelete`` plus ``proxymode.io/mode NotIn [<target>, switching]``, in one
  JSON patch guarded by the resourceVersion it was computed from, so no existing pod restarts
  and no concurrent change is overwritten;
- the restore patch: whatever turns the source back into the snapshot, exactly;
- the cleanup Job for iptables <-> ipvs (kube-proxy itself cleans up only when nftables is
  on one side);
- the backup: the snapshot of everything the operator will change.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jsonpatch

from proxymode.engine import naming
from proxymode.engine.actions import PatchObject
from proxymode.engine.observed import (
    CONFIG_HASH_ANNOTATION,
    MANAGED_BY,
    MODE_LABEL,
    POLICY_LABEL,
    SWITCHING,
    Object,
)

BACKUP_DAEMON_SET = "daemonset.json"
BACKUP_CONFIG_MAP = "configmap.json"
BACKUP_NODES = "nodes.json"
BACKUP_RUN = "run"
BACKUP_BEFORE_FINALIZE = "config-before-finalize"
"""The source ConfigMap's configuration text as Finalizing found it, kept before it writes
the target mode there: a rollback after Finalizing puts this back, with a person's edit
made during the run, rather than the snapshot's text."""
JOB_NODE_LABEL = "proxymode.io/node"
"""On the operator's Jobs and their pods: the node, as a label value (for people's selectors).
A node name may be 253 characters, a label value 63: a longer one is shortened with a hash
(``naming.label_value``) and the exact name is in the annotation of the same key, which is
what the operator reads back."""
JOB_NODE_ANNOTATION = "proxymode.io/node"
STRATEGY_ANNOTATION = "proxymode.io/original-update-strategy"
"""Set on the source DaemonSet by the source patch: its update strategy before ``OnDelete``,
so the operator's own patch can be undone even when the backup ConfigMap is lost."""
DEFAULT_STRATEGY = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
_SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields")


def owner_reference(policy: str, uid: str) -> dict[str, Any]:
    """The policy as owner: deleting it garbage-collects what it created."""
    return {
        "apiVersion": "proxymode.io/v1alpha1",
        "kind": "ProxyModePolicy",
        "name": policy,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


# Labels a GitOps tool uses to claim an object: copied onto the target objects they would
# make Argo CD (label tracking) or Helm treat them as theirs, and prune them mid-migration.
_TRACKING_LABELS = ("app.kubernetes.io/instance", "argocd.argoproj.io/instance", "helm.sh/chart")


def _labels(policy: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    kept = {k: v for k, v in (extra or {}).items() if k not in _TRACKING_LABELS}
    return {**kept, "app.kubernetes.io/managed-by": MANAGED_BY, POLICY_LABEL: policy}


def job_node_metadata(
    policy: str, node: str, extra: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A Job's (or its pod's) labels and annotations naming ``node`` (see JOB_NODE_LABEL)."""
    return {
        "labels": _labels(policy, {JOB_NODE_LABEL: naming.label_value(node), **(extra or {})}),
        "annotations": {JOB_NODE_ANNOTATION: node},
    }


def job_node(meta: Mapping[str, Any]) -> str:
    """The node a Job of the operator is for, from its metadata (annotation, else label)."""
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    return str(annotations.get(JOB_NODE_ANNOTATION) or labels.get(JOB_NODE_LABEL, ""))


def _clean_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k not in _SERVER_FIELDS}


def config_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def target_config_map(
    policy: str, uid: str, source: Object, *, config_key: str, target_text: str, mode: str
) -> dict[str, Any]:
    """The source ConfigMap (every key kept) with ``config_key`` replaced by the target config."""
    meta = source["metadata"]
    data = dict(source.get("data") or {})
    data[config_key] = target_text
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": naming.target_config_map(meta["name"], mode),
            "namespace": meta["namespace"],
            "labels": _labels(policy, meta.get("labels")),
            "ownerReferences": [owner_reference(policy, uid)],
        },
        "data": data,
    }


def _strip_mode_expressions(
    affinity: Mapping[str, Any] | None, only: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The affinity without ``proxymode.io/mode`` expressions: every one, or ``only`` that
    one (the source keeps another policy's exclusion: dropping it would bring the source
    kube-proxy back onto that policy's nodes, next to its target kube-proxy)."""
    result: dict[str, Any] = copy.deepcopy(dict(affinity or {}))
    required = result.get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return result
    terms = []
    for term in required.get("nodeSelectorTerms", []):
        exprs = [
            e
            for e in term.get("matchExpressions", [])
            if e.get("key") != MODE_LABEL or (only is not None and e != only)
        ]
        new_term = {**term, "matchExpressions": exprs}
        if not exprs:
            del new_term["matchExpressions"]
        if new_term:
            terms.append(new_term)
    if terms:
        required["nodeSelectorTerms"] = terms
    else:
        del result["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        if not result["nodeAffinity"]:
            del result["nodeAffinity"]
    return result


def with_mode_requirement(
    affinity: Mapping[str, Any] | None,
    operator: str,
    values: Sequence[str],
    keep_others: bool = False,
) -> dict[str, Any]:
    """``affinity`` with ``proxymode.io/mode <operator> <values>`` ANDed into every term.

    Required node-affinity terms are ORed, their expressions ANDed, so the requirement is
    added to each term (or becomes the only term when there is none). Other mode
    expressions go, unless ``keep_others`` (the source patch: each only excludes more).
    """
    requirement = {"key": MODE_LABEL, "operator": operator, "values": list(values)}
    result = _strip_mode_expressions(affinity, requirement if keep_others else None)
    node_affinity = result.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []}
    )
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**t, "matchExpressions": [*t.get("matchExpressions", []), requirement]} for t in terms
    ]
    return result


def target_daemon_set(
    policy: str,
    uid: str,
    source: Object,
    *,
    source_config_map: str,
    mode: str,
    target_config_text: str,
) -> dict[str, Any]:
    """A clone of the source DaemonSet that runs the target mode on labelled nodes only."""
    meta = source["metadata"]
    spec = copy.deepcopy(dict(source["spec"]))
    template = spec["template"]
    pod_meta = template.setdefault("metadata", {})
    pod_meta["labels"] = {**pod_meta.get("labels", {}), MODE_LABEL: mode}
    # The hash covers the source template too: an edit of the source re-applies the target.
    source_template = json.dumps(source["spec"]["template"], sort_keys=True)
    pod_meta["annotations"] = {
        **pod_meta.get("annotations", {}),
        CONFIG_HASH_ANNOTATION: config_hash(target_config_text + source_template),
    }
    pod_spec = template["spec"]
    pod_spec["affinity"] = with_mode_requirement(pod_spec.get("affinity"), "In", [mode])
    target_cm = naming.target_config_map(source_config_map, mode)
    for volume in pod_spec.get("volumes", []):
        if volume.get("configMap", {}).get("name") == source_config_map:
            volume["configMap"]["name"] = target_cm
    spec["selector"] = {
        **spec.get("selector", {}),
        "matchLabels": {**spec.get("selector", {}).get("matchLabels", {}), MODE_LABEL: mode},
    }
    spec["updateStrategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": naming.target_daemon_set(meta["name"], mode),
            "namespace": meta["namespace"],
            "labels": _labels(policy, {**meta.get("labels", {}), MODE_LABEL: mode}),
            "ownerReferences": [owner_reference(policy, uid)],
        },
        "spec": spec,
    }


def _guarded(obj: Object, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    version = obj["metadata"].get("resourceVersion")
    test = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
    return test + ops if version else ops


def source_patched_spec(source_spec: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """The source spec with ``OnDelete`` and the ``NotIn [<target>, switching]`` affinity."""
    spec = copy.deepcopy(dict(source_spec))
    pod_spec = spec["template"]["spec"]
    pod_spec["affinity"] = with_mode_requirement(
        pod_spec.get("affinity"), "NotIn", [mode, SWITCHING], keep_others=True
    )
    spec["updateStrategy"] = {"type": "OnDelete"}
    return spec


def source_is_patched(source: Object, mode: str) -> bool:
    """True when the source DaemonSet already stays off target and switching nodes."""
    spec = source["spec"]
    if spec.get("updateStrategy", {}).get("type") != "OnDelete":
        return False
    required = (
        spec["template"]["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
    )
    terms = required.get("nodeSelectorTerms", [])
    want = {"key": MODE_LABEL, "operator": "NotIn", "values": [mode, SWITCHING]}
    return bool(terms) and all(want in t.get("matchExpressions", []) for t in terms)


def _annotated(current: Object, annotations: Mapping[str, str] | None) -> dict[str, Any]:
    meta = {} if annotations is None else {"annotations": dict(annotations)}
    return {"metadata": meta, "spec": current["spec"]}


def source_patch(
    source: Object, mode: str, original_strategy: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The guarded source patch, recording the original update strategy in an annotation."""
    annotations = source["metadata"].get("annotations")
    want = {**(annotations or {}), STRATEGY_ANNOTATION: json.dumps(original_strategy)}
    ops = jsonpatch.make_patch(
        _annotated(source, annotations),
        {"metadata": {"annotations": want}, "spec": source_patched_spec(source["spec"], mode)},
    ).patch
    return _guarded(source, list(ops))


def unpatched_spec(source: Object, mode: str) -> dict[str, Any]:
    """The source spec without the operator's own patch for ``mode`` (its mode affinity,
    ``OnDelete``); another policy's exclusion stays."""
    spec = copy.deepcopy(dict(source["spec"]))
    pod_spec = spec["template"]["spec"]
    ours = {"key": MODE_LABEL, "operator": "NotIn", "values": [mode, SWITCHING]}
    affinity = _strip_mode_expressions(pod_spec.get("affinity"), ours)
    if affinity:
        pod_spec["affinity"] = affinity
    else:
        pod_spec.pop("affinity", None)
    recorded = (source["metadata"].get("annotations") or {}).get(STRATEGY_ANNOTATION)
    if recorded:
        spec["updateStrategy"] = json.loads(recorded)
    elif spec.get("updateStrategy", {}).get("type") == "OnDelete":
        spec["updateStrategy"] = copy.deepcopy(DEFAULT_STRATEGY)
    return spec


def marked(source: Object) -> bool:
    return STRATEGY_ANNOTATION in (source["metadata"].get("annotations") or {})


def restore_patch(current: Object, desired_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A guarded patch to ``desired_spec`` that also drops the strategy annotation."""
    annotations = current["metadata"].get("annotations")
    kept = {k: v for k, v in (annotations or {}).items() if k != STRATEGY_ANNOTATION}
    want = {"metadata": {"annotations": kept} if kept else {}, "spec": dict(desired_spec)}
    ops = jsonpatch.make_patch(_annotated(current, annotations), want).patch
    return _guarded(current, list(ops))


def spec_patch(current: Object, desired_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A guarded JSON patch from the current object's spec to ``desired_spec``."""
    ops = jsonpatch.make_patch({"spec": current["spec"]}, {"spec": dict(desired_spec)}).patch
    return _guarded(current, list(ops))


def data_patch(current: Object, desired_data: Mapping[str, str]) -> list[dict[str, Any]]:
    """A guarded JSON patch from a ConfigMap's data to ``desired_data``."""
    ops = jsonpatch.make_patch(
        {"data": current.get("data") or {}}, {"data": dict(desired_data)}
    ).patch
    return _guarded(current, list(ops))


def backup_data(
    source_daemon_set: Object,
    source_config_map: Object,
    node_labels: Mapping[str, str | None],
    run: int = 1,
) -> dict[str, str]:
    """The snapshot of everything the policy may change, as ConfigMap data."""
    ds = {
        "metadata": _clean_metadata(source_daemon_set["metadata"]),
        "spec": source_daemon_set["spec"],
    }
    cm = {
        "metadata": _clean_metadata(source_config_map["metadata"]),
        "data": source_config_map.get("data") or {},
    }
    return {
        BACKUP_DAEMON_SET: json.dumps(ds, sort_keys=True),
        BACKUP_CONFIG_MAP: json.dumps(cm, sort_keys=True),
        BACKUP_NODES: json.dumps(dict(node_labels), sort_keys=True),
        BACKUP_RUN: str(run),
    }


def backup_object(policy: str, uid: str, namespace: str, data: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": naming.backup_config_map(policy),
            "namespace": namespace,
            "labels": _labels(policy),
            "ownerReferences": [owner_reference(policy, uid)],
        },
        "data": dict(data),
    }


def original_spec(backup: Mapping[str, str]) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(backup[BACKUP_DAEMON_SET])["spec"]
    return spec


def before_finalize_patch(policy: str, namespace: str, text: str) -> PatchObject:
    """Keep ``text`` in the snapshot as what Finalizing found (``BACKUP_BEFORE_FINALIZE``)."""
    return PatchObject(
        "v1",
        "ConfigMap",
        namespace,
        naming.backup_config_map(policy),
        [{"op": "add", "path": f"/data/{BACKUP_BEFORE_FINALIZE}", "value": text}],
        why="keep the source configuration as Finalizing found it, for a rollback",
    )


def original_config_data(backup: Mapping[str, str]) -> dict[str, str]:
    data: dict[str, str] = json.loads(backup[BACKUP_CONFIG_MAP])["data"]
    return data


TEMPLATE_GENERATION_ANNOTATION = "deprecated.daemonset.template.generation"
"""Where the API server keeps a DaemonSet's template generation; the DaemonSet controller
labels each pod it makes with it (``pod-template-generation``)."""


def template_generation(daemon_set: Object) -> int | None:
    """The DaemonSet's current template generation (None when not said)."""
    value = ((daemon_set.get("metadata") or {}).get("annotations") or {}).get(
        TEMPLATE_GENERATION_ANNOTATION
    )
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None
