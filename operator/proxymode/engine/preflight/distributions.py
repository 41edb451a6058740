"""How each distribution runs kube-proxy, and that distribution's own way to change its mode.

proxymode drives a DaemonSet kube-proxy node by node. Where a distribution runs kube-proxy
some other way, or owns the DaemonSet and puts it back, the finding says which case this is
and names the way that distribution documents (reference/kube-proxy.md §6):

=============  ==============================================  ===========================
distribution   how kube-proxy runs                             its own way
=============  ==============================================  ===========================
kubeadm        DaemonSet + ConfigMap ``kube-proxy``            (proxymode's case)
EKS            DaemonSet, ConfigMap ``kube-proxy-config``      add-on configuration values
               key ``config``; the add-on owns them            (``mode``), then new nodes
AKS            DaemonSet reconciled by AKS's addon manager     ``az aks update
                                                               --kube-proxy-config``
kops           static pod written by nodeup                    ``spec.kubeProxy.proxyMode``
                                                               + rolling update
GKE            static pod GKE manages (or none: Dataplane V2)  not a GKE setting
RKE2           static pod written by the rke2 agent            ``kube-proxy-arg`` in the
                                                               agent config, restart
k3s            inside the k3s process                          ``--kube-proxy-arg``
Cilium KPR     no kube-proxy at all                            nothing to migrate
=============  ==============================================  ===========================

Pure: reads the objects and node facts the adapter observed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from proxymode.api.models import Finding, ManagedAddon, PolicySpec, Severity
from proxymode.engine.observed import NodeView, Observed
from proxymode.engine.preflight.codes import Code
from proxymode.engine.preflight.text import get_mapping, get_str, new_finding

EKS_COMPONENT_LABEL: Final = "eks.amazonaws.com/component"
ADDON_MANAGER_LABEL: Final = "addonmanager.kubernetes.io/mode"
AKS_MANAGED_BY_LABEL: Final = "kubernetes.azure.com/managedby"
AKS_NODE_LABEL: Final = "kubernetes.azure.com/cluster"
KOPS_NODE_LABEL: Final = "kops.k8s.io/instancegroup"
GKE_NODE_LABEL: Final = "cloud.google.com/gke-nodepool"
KUBE_PROXY_REPLACEMENTS: Final = ("cilium",)
"""CNIs that can serve Services without kube-proxy (Cilium's kube-proxy replacement; GKE
Dataplane V2 is Cilium too)."""


def _any_node(nodes: Sequence[NodeView], label: str) -> bool:
    return any(label in n.labels for n in nodes)


def managed_addon(
    spec: PolicySpec,
    daemon_set: Mapping[str, Any] | None,
    config_map: Mapping[str, Any] | None,
    nodes: Sequence[NodeView],
) -> list[Finding]:
    """A platform that reconciles kube-proxy back would undo the operator mid-run: refuse by
    default (``spec.managedAddon: Refuse``) and name the platform's own way."""
    ref = spec.kube_proxy
    target = str(spec.target_mode)
    objects = [
        (f"DaemonSet {ref.namespace}/{ref.daemon_set}", daemon_set),
        (f"ConfigMap {ref.namespace}/{ref.config_map}", config_map),
    ]
    marks: dict[str, list[str]] = {}
    for name, obj in objects:
        if obj is None:
            continue
        labels = get_mapping(obj, "metadata", "labels")
        if get_str(labels.get(EKS_COMPONENT_LABEL)):
            marks.setdefault("EKS", []).append(
                f"{name} ({EKS_COMPONENT_LABEL}={labels[EKS_COMPONENT_LABEL]})"
            )
        aks = get_str(labels.get(AKS_MANAGED_BY_LABEL))
        reconcile = labels.get(ADDON_MANAGER_LABEL) == "Reconcile"
        if aks or (reconcile and _any_node(nodes, AKS_NODE_LABEL)):
            mark = f"{AKS_MANAGED_BY_LABEL}={aks}" if aks else f"{ADDON_MANAGER_LABEL}=Reconcile"
            marks.setdefault("AKS", []).append(f"{name} ({mark})")
        elif reconcile:
            marks.setdefault("addon-manager", []).append(
                f"{name} ({ADDON_MANAGER_LABEL}=Reconcile)"
            )
    proceed = spec.managed_addon == ManagedAddon.PROCEED
    findings: list[Finding] = []
    for platform, where in sorted(marks.items()):
        why, way = _PLATFORM_WAYS[platform]
        if proceed:
            tail = (
                " spec.managedAddon is Proceed: the migration goes ahead; keep the platform from "
                "updating kube-proxy until it ends."
            )
        else:
            tail = (
                " Refused (spec.managedAddon: Refuse). If the platform no longer manages "
                "kube-proxy here, set spec.managedAddon: Proceed."
            )
        findings.append(
            new_finding(
                Severity.WARNING if proceed else Severity.ERROR,
                Code.MANAGED_ADDON,
                f"{' and '.join(where)}: {why} {way.format(target=target, upper=target.upper())}"
                f"{tail}",
            )
        )
    return findings


_PLATFORM_WAYS: Final[Mapping[str, tuple[str, str]]] = {
    "EKS": (
        "kube-proxy is the EKS kube-proxy add-on, and EKS re-applies the fields it manages "
        "whenever the add-on is updated, which would undo the operator's node affinity, "
        "update strategy and ConfigMap mid-run.",
        "EKS's own way: aws eks update-addon --cluster-name CLUSTER --addon-name kube-proxy "
        '--configuration-values \'{{"mode": "{target}"}}\' (an add-on version that offers '
        "{target}), then replace each node group's nodes (the mode is cluster-wide).",
    ),
    "AKS": (
        "AKS's addon manager owns kube-proxy and reconciles the DaemonSet and its ConfigMap "
        "back to its own manifest within minutes.",
        "AKS's own way: az aks update --resource-group RG --name CLUSTER --kube-proxy-config "
        'kube-proxy.json with {{"enabled": true, "mode": "{upper}"}} (preview feature '
        "KubeProxyConfigurationPreview; NFTABLES needs API version 2025-09-02-preview or "
        "later); AKS rolls it to every node.",
    ),
    "addon-manager": (
        "the Kubernetes addon manager reconciles kube-proxy back to its addon manifest.",
        "Change the mode in the addon manifest on the control plane (the addon manager's "
        "directory, e.g. /etc/kubernetes/addons) instead.",
    ),
}


def static_pod_advice(
    target: str, static_nodes: Sequence[NodeView], all_nodes: Sequence[NodeView]
) -> str:
    """The distribution's own way for a static-pod kube-proxy: kops, GKE, RKE2, or generic."""
    seen = static_nodes or all_nodes
    if any("+rke2" in n.kubelet_version for n in seen):
        return (
            "This is RKE2: the rke2 agent writes the kube-proxy static pod on each node and "
            "rewrites it on restart (an edited manifest is reverted). Set kube-proxy-arg: "
            f"[proxy-mode={target}] in /etc/rancher/rke2/config.yaml on each node and restart "
            "rke2-agent (rke2-server on servers), one node at a time."
        )
    if _any_node(seen, KOPS_NODE_LABEL):
        return (
            "This is kops: nodeup writes the static pod (/etc/kubernetes/manifests/"
            f"kube-proxy.manifest). Set spec.kubeProxy.proxyMode: {target} in the kops cluster "
            "spec (kops edit cluster), then kops update cluster --yes and kops rolling-update "
            "cluster --yes, which replaces the nodes one instance group at a time."
        )
    if _any_node(seen, GKE_NODE_LABEL):
        return (
            "This is GKE: GKE manages the kube-proxy static pod on each node, and its mode is "
            "not a setting GKE offers. GKE Dataplane V2 (chosen when a cluster is created) "
            "replaces kube-proxy altogether."
        )
    return (
        f"Change the static pod manifests on each node (mode: {target} in the kube-proxy "
        "config), one node at a time."
    )


def kube_proxy_free(spec: PolicySpec, observed: Observed) -> Finding | None:
    """No kube-proxy anywhere and a CNI that replaces it: say that, not "wrong name"."""
    cni = observed.facts.cni or ""
    replacement = next((c for c in KUBE_PROXY_REPLACEMENTS if c in cni), None)
    if replacement is None:
        return None
    ref = spec.kube_proxy
    return new_finding(
        Severity.ERROR,
        Code.KUBE_PROXY_FREE,
        f"No kube-proxy runs in this cluster (no DaemonSet {ref.namespace}/{ref.daemon_set}, no "
        f"static kube-proxy pods) and the CNI is {cni}: {replacement.capitalize()}'s kube-proxy "
        f"replacement serves Services here, so there is no kube-proxy mode to migrate. Delete "
        f"this policy; if a kube-proxy does run, set spec.kubeProxy.namespace and "
        f"spec.kubeProxy.daemonSet to its DaemonSet.",
    )


def nodes_of_static_pods(static: Sequence[str], nodes: Sequence[NodeView]) -> list[NodeView]:
    """The nodes whose mirror pod is ``<name>-<node>``."""
    return [n for n in nodes if any(pod.endswith(f"-{n.name}") for pod in static)]
