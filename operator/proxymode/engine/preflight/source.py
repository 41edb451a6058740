"""Checks of the source kube-proxy: a DaemonSet to drive, the ConfigMap it reads, its config.

Static-pod kube-proxies (RKE2, old kube-up) and k3s's embedded one cannot be split per node:
the finding names the case and says what to do instead (reference §6).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from proxymode.api.models import Finding, PolicySpec, Severity
from proxymode.engine.observed import Observed
from proxymode.engine.preflight.codes import Code
from proxymode.engine.preflight.text import (
    get_list,
    get_mapping,
    get_str,
    name_list,
    new_finding,
    plural,
)
from proxymode.kubeproxy import (
    ConfigError,
    KubeProxyConfig,
    KubeVersion,
    parse_config,
    parse_version,
    version_from_image,
)

KUBE_PROXY_CONTAINER: Final = "kube-proxy"
EMBEDDED_DISTRIBUTIONS: Final[Mapping[str, str]] = {"+k3s": "k3s", "+rke2": "RKE2"}
"""Markers in a kubelet version (``v1.30.4+k3s1``) of distributions that run kube-proxy
from their agent rather than from a DaemonSet (reference §6)."""


def missing_daemon_set(spec: PolicySpec, observed: Observed) -> Finding:
    """Why there is no DaemonSet to drive: k3s/RKE2, static pods, or a wrong name."""
    ref = spec.kube_proxy
    target = str(spec.target_mode)
    distributions: dict[str, list[str]] = {}
    for node in observed.nodes:
        for marker, distribution in EMBEDDED_DISTRIBUTIONS.items():
            if marker in node.kubelet_version:
                distributions.setdefault(distribution, []).append(node.name)
    if distributions:
        names = sorted({n for group in distributions.values() for n in group})
        which = " and ".join(sorted(distributions))
        return new_finding(
            Severity.ERROR,
            Code.EMBEDDED_KUBE_PROXY,
            f"This is a {which} cluster (kubelet versions on {name_list(names)}): k3s/RKE2 run "
            f"kube-proxy inside the agent, not from a DaemonSet, so proxymode cannot move it "
            f"node by node. Set kube-proxy-arg: [proxy-mode={target}] in the agent config "
            f"(/etc/rancher/k3s/config.yaml or /etc/rancher/rke2/config.yaml) and restart the "
            f"nodes one at a time.",
            names,
        )
    static = observed.facts.static_kube_proxy_pods
    if static:
        nodes = sorted(
            {n.name for n in observed.nodes for pod in static if pod.endswith(f"-{n.name}")}
        )
        return new_finding(
            Severity.ERROR,
            Code.STATIC_POD_KUBE_PROXY,
            f"kube-proxy runs as static pods on {plural(len(static), 'node')} "
            f"({name_list(sorted(static))}), and there is no DaemonSet "
            f"{ref.namespace}/{ref.daemon_set}; proxymode drives DaemonSet-managed kube-proxy "
            f"only. Change the static pod manifests on each node (mode: {target} in the "
            f"kube-proxy config), one node at a time.",
            nodes,
        )
    return new_finding(
        Severity.ERROR,
        Code.SOURCE_DAEMON_SET_MISSING,
        f"DaemonSet {ref.namespace}/{ref.daemon_set} does not exist. Set "
        f"spec.kubeProxy.namespace and spec.kubeProxy.daemonSet to the DaemonSet that runs "
        f"kube-proxy (kubeadm and EKS: kube-system/kube-proxy).",
    )


def config_map_use(spec: PolicySpec, daemon_set: Mapping[str, Any]) -> list[Finding]:
    """The DaemonSet's pods must read the ConfigMap the policy names, or the switch does nothing."""
    ref = spec.kube_proxy
    mounted = mounted_config_maps(daemon_set)
    if ref.config_map in mounted:
        return []
    if mounted:
        instead = (
            f"It mounts {', '.join(sorted(mounted))}: set spec.kubeProxy.configMap to the one "
            f"holding the KubeProxyConfiguration."
        )
    else:
        instead = (
            "It mounts no ConfigMap, so kube-proxy is configured by flags, which proxymode "
            "cannot change per node; move its settings into a ConfigMap passed with --config."
        )
    return [
        new_finding(
            Severity.ERROR,
            Code.DAEMON_SET_DOES_NOT_USE_CONFIG_MAP,
            f"No volume of DaemonSet {ref.namespace}/{ref.daemon_set} references ConfigMap "
            f"{ref.namespace}/{ref.config_map}. {instead}",
        )
    ]


def mounted_config_maps(daemon_set: Mapping[str, Any]) -> set[str]:
    """ConfigMap names the pod template's volumes reference (plain and projected)."""
    names: set[str] = set()
    for volume in get_list(get_mapping(daemon_set, "spec", "template", "spec").get("volumes")):
        if not isinstance(volume, Mapping):
            continue
        name = get_str(get_mapping(volume, "configMap").get("name"))
        if name:
            names.add(name)
        for source in get_list(get_mapping(volume, "projected").get("sources")):
            if isinstance(source, Mapping):
                projected = get_str(get_mapping(source, "configMap").get("name"))
                if projected:
                    names.add(projected)
    return names


def read_source_config(
    spec: PolicySpec, config_map: Mapping[str, Any] | None
) -> tuple[KubeProxyConfig | None, list[Finding]]:
    """Read the source KubeProxyConfiguration from its ConfigMap."""
    ref = spec.kube_proxy
    where = f"ConfigMap {ref.namespace}/{ref.config_map}"
    if config_map is None:
        return None, [
            new_finding(
                Severity.ERROR,
                Code.SOURCE_CONFIG_MAP_MISSING,
                f"{where} does not exist. Set spec.kubeProxy.configMap to the ConfigMap that "
                f"holds kube-proxy's KubeProxyConfiguration (kubeadm: kube-proxy; EKS: "
                f"kube-proxy-config).",
            )
        ]
    data = get_mapping(config_map, "data")
    if ref.config_key not in data:
        present = ", ".join(sorted(str(k) for k in data)) or "none"
        return None, [
            new_finding(
                Severity.ERROR,
                Code.CONFIG_KEY_MISSING,
                f"{where} has no key {ref.config_key!r} (keys present: {present}). Set "
                f"spec.kubeProxy.configKey to the key that holds the KubeProxyConfiguration.",
            )
        ]
    try:
        return parse_config(data[ref.config_key]), []
    except ConfigError as error:
        return None, [
            new_finding(
                Severity.ERROR,
                Code.CONFIG_INVALID,
                f"{where} key {ref.config_key!r} is not a usable KubeProxyConfiguration: "
                f"{error}. Fix the ConfigMap, or point spec.kubeProxy at the right one.",
            )
        ]


def kube_proxy_container(daemon_set: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container named kube-proxy, else one running a kube-proxy image, else the first."""
    containers = [
        c
        for c in get_list(get_mapping(daemon_set, "spec", "template", "spec").get("containers"))
        if isinstance(c, Mapping)
    ]
    for container in containers:
        if container.get("name") == KUBE_PROXY_CONTAINER:
            return container
    for container in containers:
        image = get_str(container.get("image")) or ""
        repository = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
        if repository.startswith(KUBE_PROXY_CONTAINER):
            return container
    return containers[0] if containers else None


def proxy_version(image: str | None, cluster_version: str | None) -> KubeVersion | None:
    """The image tag's version, else the cluster's; None when neither reads as a version."""
    if image:
        from_image = version_from_image(image)
        if from_image is not None:
            return from_image
    if cluster_version:
        try:
            return parse_version(cluster_version)
        except ValueError:
            return None
    return None
