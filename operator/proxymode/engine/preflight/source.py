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
from proxymode.engine.preflight.config_path import ConfigSource, config_source
from proxymode.engine.preflight.distributions import (
    kube_proxy_free,
    nodes_of_static_pods,
    static_pod_advice,
)
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
K3S_MARKER: Final = "+k3s"
"""In a kubelet version (``v1.30.4+k3s1``): k3s runs kube-proxy inside its own process
(reference §6). RKE2 (``+rke2``) runs it as a static pod instead."""


def missing_daemon_set(spec: PolicySpec, observed: Observed) -> Finding:
    """Why there is no DaemonSet to drive: k3s, static pods (RKE2, kops, GKE), no kube-proxy
    at all (Cilium's replacement), or a wrong name."""
    ref = spec.kube_proxy
    target = str(spec.target_mode)
    static = observed.facts.static_kube_proxy_pods
    k3s = [n.name for n in observed.nodes if K3S_MARKER in n.kubelet_version]
    if k3s and not static:
        return new_finding(
            Severity.ERROR,
            Code.EMBEDDED_KUBE_PROXY,
            f"This is a k3s cluster (kubelet versions on {name_list(sorted(k3s))}): k3s runs "
            f"kube-proxy inside the k3s process, not from a DaemonSet or a pod, so proxymode "
            f"cannot move it node by node. Set kube-proxy-arg: [proxy-mode={target}] in "
            f"/etc/rancher/k3s/config.yaml (or --kube-proxy-arg proxy-mode={target}) on each "
            f"node and restart k3s there, one node at a time.",
            k3s,
        )
    if static:
        on = nodes_of_static_pods(static, observed.nodes)
        return new_finding(
            Severity.ERROR,
            Code.STATIC_POD_KUBE_PROXY,
            f"kube-proxy runs as static pods on {plural(len(static), 'node')} "
            f"({name_list(sorted(static))}), and there is no DaemonSet "
            f"{ref.namespace}/{ref.daemon_set}; proxymode drives DaemonSet-managed kube-proxy "
            f"only. {static_pod_advice(target, on, observed.nodes)}",
            [n.name for n in on],
        )
    free = kube_proxy_free(spec, observed)
    if free is not None:
        return free
    return new_finding(
        Severity.ERROR,
        Code.SOURCE_DAEMON_SET_MISSING,
        f"DaemonSet {ref.namespace}/{ref.daemon_set} does not exist. Set "
        f"spec.kubeProxy.namespace and spec.kubeProxy.daemonSet to the DaemonSet that runs "
        f"kube-proxy (kubeadm and EKS: kube-system/kube-proxy).",
    )


def daemon_set_config(daemon_set: Mapping[str, Any]) -> ConfigSource | None:
    """Where the DaemonSet's kube-proxy reads its ``--config`` from (None: no ``--config``)."""
    container = kube_proxy_container(daemon_set)
    if container is None:
        return None
    pod = get_mapping(daemon_set, "spec", "template", "spec")
    volumes = [v for v in get_list(pod.get("volumes")) if isinstance(v, Mapping)]
    return config_source(container, volumes)


def reads_other_config_map(spec: PolicySpec, daemon_set: Mapping[str, Any] | None) -> bool:
    """Does kube-proxy read its config from a ConfigMap other than the policy's?"""
    if daemon_set is None:
        return False
    source = daemon_set_config(daemon_set)
    return source is not None and source.config_map not in (None, spec.kube_proxy.config_map)


def config_map_use(spec: PolicySpec, daemon_set: Mapping[str, Any]) -> list[Finding]:
    """The DaemonSet's pods must read the ConfigMap key the policy names, or the switch does
    nothing: resolve ``--config`` through the volumes and name exactly what to set."""
    ref = spec.kube_proxy
    where = f"DaemonSet {ref.namespace}/{ref.daemon_set}"
    mounted = mounted_config_maps(daemon_set)
    source = daemon_set_config(daemon_set)
    if source is not None and source.config_map is not None:
        wrong_map = source.config_map != ref.config_map
        if not wrong_map:
            return []  # a wrong key is ConfigKeyMissing's to say, with the key to use
        settings = [f"spec.kubeProxy.configMap: {source.config_map}"]
        if source.key is not None and source.key != ref.config_key:
            settings.append(f"spec.kubeProxy.configKey: {source.key}")
        key = f"key {source.key!r} of " if source.key is not None else ""
        return [
            new_finding(
                Severity.ERROR,
                Code.DAEMON_SET_DOES_NOT_USE_CONFIG_MAP,
                f"kube-proxy in {where} reads --config={source.path}, which is {key}ConfigMap "
                f"{ref.namespace}/{source.config_map} (volume {source.volume!r}), not ConfigMap "
                f"{ref.namespace}/{ref.config_map} as spec.kubeProxy says. It mounts "
                f"{', '.join(sorted(mounted))}. Set {' and '.join(settings)}.",
            )
        ]
    if source is not None:
        held = f"volume {source.volume!r}" if source.volume else "no volume holds it"
        return [
            new_finding(
                Severity.ERROR,
                Code.DAEMON_SET_DOES_NOT_USE_CONFIG_MAP,
                f"kube-proxy in {where} reads --config={source.path}, which is not on a "
                f"ConfigMap volume ({held}); "
                f"proxymode derives the target config from a ConfigMap. Move the "
                f"KubeProxyConfiguration into a ConfigMap mounted at that path.",
            )
        ]
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
            f"No volume of {where} references ConfigMap "
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
    spec: PolicySpec,
    config_map: Mapping[str, Any] | None,
    daemon_set: Mapping[str, Any] | None = None,
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
        source = daemon_set_config(daemon_set) if daemon_set is not None else None
        if source is not None and source.key is not None and source.key in data:
            todo = (
                f"kube-proxy reads key {source.key!r} (--config={source.path}): set "
                f"spec.kubeProxy.configKey: {source.key}."
            )
        else:
            todo = "Set spec.kubeProxy.configKey to the key that holds the KubeProxyConfiguration."
        return None, [
            new_finding(
                Severity.ERROR,
                Code.CONFIG_KEY_MISSING,
                f"{where} has no key {ref.config_key!r} (keys present: {present}). {todo}",
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
