"""Checks for what would fight the operator: Helm, Argo CD, another policy on the same DaemonSet."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from proxymode.api.models import Finding, PolicySpec, Severity
from proxymode.engine.observed import MANAGED_BY, MODE_LABEL, NodeView
from proxymode.engine.preflight.codes import Code
from proxymode.engine.preflight.text import (
    carrying,
    get_mapping,
    get_str,
    name_list,
    new_finding,
    plural,
)

HELM_MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
HELM_RELEASE_ANNOTATION: Final = "meta.helm.sh/release-name"
ARGOCD_TRACKING_ANNOTATION: Final = "argocd.argoproj.io/tracking-id"
ARGOCD_INSTANCE_LABEL: Final = "app.kubernetes.io/instance"


def gitops(
    spec: PolicySpec,
    daemon_set: Mapping[str, Any] | None,
    config_map: Mapping[str, Any] | None,
) -> list[Finding]:
    """Helm or Argo CD managing the source objects would undo the operator's patches."""
    ref = spec.kube_proxy
    objects = [
        (f"DaemonSet {ref.namespace}/{ref.daemon_set}", daemon_set),
        (f"ConfigMap {ref.namespace}/{ref.config_map}", config_map),
    ]
    helm: list[str] = []
    releases: set[str] = set()
    argo: list[str] = []
    apps: set[str] = set()
    for name, obj in objects:
        if obj is None:
            continue
        labels = get_mapping(obj, "metadata", "labels")
        annotations = get_mapping(obj, "metadata", "annotations")
        release = get_str(annotations.get(HELM_RELEASE_ANNOTATION))
        if labels.get(HELM_MANAGED_BY_LABEL) == "Helm" or release:
            helm.append(name)
            if release:
                releases.add(release)
        tracking = get_str(annotations.get(ARGOCD_TRACKING_ANNOTATION))
        instance = get_str(labels.get(ARGOCD_INSTANCE_LABEL))
        if instance is not None and instance == release:
            instance = None  # Helm charts set the instance label to the release name
        if tracking or instance:
            argo.append(name)
            app = tracking.split(":", 1)[0] if tracking else instance
            if app:
                apps.add(app)
    findings: list[Finding] = []
    if helm:
        which = f" (release {', '.join(sorted(releases))})" if releases else ""
        findings.append(
            new_finding(
                Severity.WARNING,
                Code.MANAGED_BY_GITOPS,
                f"{carrying(helm)} Helm's marks{which}. A helm upgrade during the "
                f"migration re-renders them and undoes the operator's node affinity and "
                f"updateStrategy on the DaemonSet, so the source kube-proxy starts again on "
                f"nodes already moved, next to the target one. Do not let Helm upgrade "
                f"kube-proxy mid-migration; afterwards set the mode in the chart's values.",
            )
        )
    if argo:
        which = f" (application {', '.join(sorted(apps))})" if apps else ""
        findings.append(
            new_finding(
                Severity.WARNING,
                Code.MANAGED_BY_GITOPS,
                f"{carrying(argo)} Argo CD's marks{which}. Argo CD will revert the "
                f"operator's changes unless told to ignore them: add ignoreDifferences for the "
                f"DaemonSet's /spec/template/spec/affinity/nodeAffinity and /spec/updateStrategy "
                f"(or managedFieldsManagers: [{MANAGED_BY}]) with the RespectIgnoreDifferences "
                f"sync option, and turn off self-heal for the ConfigMap until the migration "
                f"ends; afterwards set the mode in Git.",
            )
        )
    return findings


def other_policies(spec: PolicySpec, others: Sequence[str]) -> list[Finding]:
    if not others:
        return []
    ref = spec.kube_proxy
    return [
        new_finding(
            Severity.ERROR,
            Code.ANOTHER_POLICY_IN_FLIGHT,
            f"Another ProxyModePolicy is already driving DaemonSet {ref.namespace}/"
            f"{ref.daemon_set}: {', '.join(sorted(others))}. Only one policy may migrate a "
            f"kube-proxy at a time: let it finish, or delete it (deleting rolls it back), then"
            f" retry this one (kubectl proxymode retry NAME, or annotate"
            f" proxymode.io/action=retry): a refused preflight does not run again by itself.",
        )
    ]


def labelled_nodes(nodes: Sequence[NodeView]) -> list[Finding]:
    """Nodes that carry ``proxymode.io/mode`` before the policy changed anything.

    The label is how the operator moves a node: the target DaemonSet would start on such a
    node at setup, next to the source kube-proxy (two proxies), and a rollback that removes
    the operator's labels would remove this one too. So preflight refuses and names them.
    """
    labelled = [n for n in nodes if n.mode_label is not None]
    if not labelled:
        return []
    verb = "carries" if len(labelled) == 1 else "carry"
    listed = name_list([f"{n.name} ({MODE_LABEL}={n.mode_label})" for n in labelled])
    return [
        new_finding(
            Severity.ERROR,
            Code.NODES_ALREADY_LABELLED,
            f"{plural(len(labelled), 'node')} already {verb}"
            f" the label {MODE_LABEL}, which "
            f"the operator uses to move nodes between kube-proxies: {listed}. The target "
            f"DaemonSet would start there next to the current kube-proxy. Remove the label "
            f"(kubectl label node NAME {MODE_LABEL}-), or finish or delete the policy that "
            f"set it, then retry.",
            [n.name for n in labelled],
        )
    ]
