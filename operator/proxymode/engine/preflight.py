"""Preflight and inventory (DESIGN §6): can this policy run here, and what does the cluster hold?

Pure: a :class:`~proxymode.api.models.PolicySpec` and an
:class:`~proxymode.engine.observed.Observed` snapshot in, a :class:`PreflightResult` out. The
result carries the findings written to ``status.preflight``, the nodes the policy may move, the
nodes left out because they cannot run the target mode, the rendered target
KubeProxyConfiguration and the inventory written to ``status.baseline``.

Rules, with the facts from ``reference/kube-proxy.md``:

* proxymode drives a kube-proxy DaemonSet and its ConfigMap (kubeadm's shape, §6). Static-pod
  kube-proxies (RKE2, old kube-up) and k3s's embedded one cannot be split per node this way:
  preflight names the case and stops.
* A node is *eligible* when it is not being deleted, the source DaemonSet would run on it
  (its pod template's ``nodeSelector`` and required node affinity, ignoring the
  ``proxymode.io/mode`` expressions the operator itself adds) and the policy's
  ``nodeSelector`` matches it. kube-proxy tolerates every taint, so taints do not matter.
* The target mode must exist in the running kube-proxy version (§3.1), nodes must have a
  kernel the mode accepts (§4: nftables needs 5.13), and the derived target config must be
  valid (``proxymode.kubeproxy.render_target_config``).
* Objects managed by Helm or Argo CD, and another policy driving the same DaemonSet, are
  reported, because they would fight the operator's changes.

Every finding says which objects it is about and what a person should do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from proxymode.api.models import (
    Baseline,
    Count,
    Finding,
    IncompatibleNodes,
    PolicySpec,
    Severity,
)
from proxymode.engine.observed import MANAGED_BY, MODE_LABEL, NodeView, Observed
from proxymode.engine.planner import PlanNode, plan_stages, selector_matches
from proxymode.kubeproxy import (
    ConfigError,
    KubeProxyConfig,
    KubeVersion,
    TargetConfig,
    kernel_supports,
    minimum_kernel,
    mode_support,
    parse_config,
    parse_version,
    render_target_config,
    version_from_image,
)
from proxymode.kubeproxy.versions import NFTABLES

# -- finding codes ---------------------------------------------------------------------------

SOURCE_DAEMON_SET_MISSING: Final = "SourceDaemonSetMissing"
STATIC_POD_KUBE_PROXY: Final = "StaticPodKubeProxy"
EMBEDDED_KUBE_PROXY: Final = "EmbeddedKubeProxy"
SOURCE_CONFIG_MAP_MISSING: Final = "SourceConfigMapMissing"
CONFIG_KEY_MISSING: Final = "ConfigKeyMissing"
DAEMON_SET_DOES_NOT_USE_CONFIG_MAP: Final = "DaemonSetDoesNotUseConfigMap"
CONFIG_INVALID: Final = "ConfigInvalid"
ALREADY_IN_TARGET_MODE: Final = "AlreadyInTargetMode"
MODE_UNSUPPORTED: Final = "ModeUnsupported"
MODE_DEPRECATED: Final = "ModeDeprecated"
FEATURE_GATE_ADDED: Final = "FeatureGateAdded"
CONFIG_OVERRIDES_INVALID: Final = "ConfigOverridesInvalid"
TARGET_CONFIG_INVALID: Final = "TargetConfigInvalid"
TARGET_CONFIG_NOTE: Final = "TargetConfigNote"
KERNEL_TOO_OLD: Final = "KernelTooOld"
KERNEL_UNKNOWN: Final = "KernelUnknown"
MANAGED_BY_GITOPS: Final = "ManagedByGitOps"
ANOTHER_POLICY_IN_FLIGHT: Final = "AnotherPolicyInFlight"
NO_ELIGIBLE_NODES: Final = "NoEligibleNodes"
STAGE_SELECTS_NOTHING: Final = "StageSelectsNothing"
PARTIAL_COVERAGE: Final = "PartialCoverage"
NODES_NOT_READY: Final = "NodesNotReady"

# -- marks of the tools that would fight the operator ------------------------------------------

HELM_MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
HELM_RELEASE_ANNOTATION: Final = "meta.helm.sh/release-name"
ARGOCD_TRACKING_ANNOTATION: Final = "argocd.argoproj.io/tracking-id"
ARGOCD_INSTANCE_LABEL: Final = "app.kubernetes.io/instance"

EMBEDDED_DISTRIBUTIONS: Final[Mapping[str, str]] = {"+k3s": "k3s", "+rke2": "RKE2"}
"""Markers in a kubelet version (``v1.30.4+k3s1``) of distributions that run kube-proxy
from their agent rather than from a DaemonSet (reference §6)."""

KUBE_PROXY_CONTAINER: Final = "kube-proxy"
NAMES_IN_MESSAGE: Final = 10
"""A message names at most this many nodes; the finding's ``nodes`` lists all of them."""

_SEVERITY_RANK: Final[Mapping[str, int]] = {
    Severity.ERROR: 0,
    Severity.WARNING: 1,
    Severity.INFO: 2,
}


@dataclass(frozen=True)
class PreflightResult:
    """What preflight found, what the policy may move, and the inventory for the baseline."""

    passed: bool
    """No Error finding: the rollout may start."""
    findings: tuple[Finding, ...]
    """Sorted Error, Warning, Info, then by code."""
    eligible: tuple[str, ...]
    """Node names the policy may move (sorted), excluded nodes already removed."""
    excluded: tuple[str, ...]
    """Nodes left out because they cannot run the target mode (``incompatibleNodes: Exclude``)."""
    source_mode: str | None
    """The effective mode of the source config (``""`` reads as iptables); None when unread."""
    kube_proxy_version: str | None
    """e.g. ``v1.37.2``: from the kube-proxy image tag, else the cluster version."""
    target_config: TargetConfig | None
    """The target KubeProxyConfiguration, when it could be derived."""
    baseline: Baseline
    """The inventory for ``status.baseline`` (metrics are added later, from Prometheus)."""


# -- entry points ----------------------------------------------------------------------------


def run_preflight(spec: PolicySpec, observed: Observed) -> PreflightResult:
    """Check ``spec`` against the cluster in ``observed`` and take the inventory."""
    daemon_set = observed.source_daemon_set
    findings: list[Finding] = []

    container = _kube_proxy_container(daemon_set) if daemon_set is not None else None
    image = _str(container.get("image")) if container is not None else None
    version = _kube_proxy_version(image, observed.facts.kubernetes_version)

    check_config = True
    if daemon_set is None:
        missing = _missing_daemon_set(spec, observed)
        findings.append(missing)
        # A static or embedded kube-proxy has no ConfigMap to look for: one finding says it all.
        check_config = missing.code == SOURCE_DAEMON_SET_MISSING
    else:
        findings.extend(_config_map_use(spec, daemon_set))

    source: KubeProxyConfig | None = None
    if check_config:
        source, config_findings = _source_config(spec, observed.source_config_map)
        findings.extend(config_findings)

    target_config: TargetConfig | None = None
    if source is not None:
        target_config, target_findings = _target_checks(spec, source, version)
        findings.extend(target_findings)

    eligible: list[NodeView] = []
    excluded: list[NodeView] = []
    if daemon_set is not None:
        candidates = eligible_nodes(spec, daemon_set, observed.nodes)
        eligible, excluded, kernel_findings = _kernel_checks(spec, candidates)
        findings.extend(kernel_findings)
        findings.extend(_node_checks(spec, candidates, eligible, excluded, len(observed.nodes)))

    findings.extend(_gitops(spec, daemon_set, observed.source_config_map))
    findings.extend(_other_policies(spec, observed.facts.other_policies))

    ordered = tuple(sorted(findings, key=lambda f: (_SEVERITY_RANK[f.severity], f.code)))
    source_mode = source.mode if source is not None else None
    version_text = str(version) if version is not None else None
    baseline = Baseline(
        kubernetes_version=observed.facts.kubernetes_version,
        kube_proxy_version=version_text,
        kube_proxy_image=image,
        source_mode=source_mode,
        kernels=_counts(n.kernel for n in observed.nodes),
        os_images=_counts(n.os_image for n in observed.nodes),
        container_runtimes=_counts(n.container_runtime for n in observed.nodes),
        cni=observed.facts.cni,
        services=observed.facts.services,
        endpoint_slices=observed.facts.endpoint_slices,
        nodes=len(eligible),
        recorded_time=observed.now,
    )
    return PreflightResult(
        passed=not any(f.severity == Severity.ERROR for f in ordered),
        findings=ordered,
        eligible=tuple(sorted(n.name for n in eligible)),
        excluded=tuple(sorted(n.name for n in excluded)),
        source_mode=source_mode,
        kube_proxy_version=version_text,
        target_config=target_config,
        baseline=baseline,
    )


def eligible_nodes(
    spec: PolicySpec, source_daemon_set: Mapping[str, Any], nodes: Sequence[NodeView]
) -> list[NodeView]:
    """Nodes the policy may touch, sorted by name.

    A node qualifies when it is not being deleted, the source DaemonSet would schedule a pod
    on it (pod template ``nodeSelector`` and required node affinity, minus the
    ``proxymode.io/mode`` expressions the operator adds itself) and ``spec.nodeSelector``
    matches it. Taints are ignored: kube-proxy tolerates them all.
    """
    pod_spec = _mapping(source_daemon_set, "spec", "template", "spec")
    node_selector = _mapping(pod_spec, "nodeSelector")
    terms = _required_terms(pod_spec)
    chosen = [
        node
        for node in nodes
        if not node.deleting
        and all(node.labels.get(k) == v for k, v in node_selector.items())
        and _terms_match(terms, node)
        and selector_matches(spec.node_selector, node.labels)
    ]
    return sorted(chosen, key=lambda n: n.name)


# -- the source kube-proxy -------------------------------------------------------------------


def _missing_daemon_set(spec: PolicySpec, observed: Observed) -> Finding:
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
        return _finding(
            Severity.ERROR,
            EMBEDDED_KUBE_PROXY,
            f"This is a {which} cluster (kubelet versions on {_names(names)}): k3s/RKE2 run "
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
        return _finding(
            Severity.ERROR,
            STATIC_POD_KUBE_PROXY,
            f"kube-proxy runs as static pods on {_plural(len(static), 'node')} "
            f"({_names(sorted(static))}), and there is no DaemonSet "
            f"{ref.namespace}/{ref.daemon_set}; proxymode drives DaemonSet-managed kube-proxy "
            f"only. Change the static pod manifests on each node (mode: {target} in the "
            f"kube-proxy config), one node at a time.",
            nodes,
        )
    return _finding(
        Severity.ERROR,
        SOURCE_DAEMON_SET_MISSING,
        f"DaemonSet {ref.namespace}/{ref.daemon_set} does not exist. Set "
        f"spec.kubeProxy.namespace and spec.kubeProxy.daemonSet to the DaemonSet that runs "
        f"kube-proxy (kubeadm and EKS: kube-system/kube-proxy).",
    )


def _config_map_use(spec: PolicySpec, daemon_set: Mapping[str, Any]) -> list[Finding]:
    """The DaemonSet's pods must read the ConfigMap the policy names, or the switch does nothing."""
    ref = spec.kube_proxy
    mounted = _mounted_config_maps(daemon_set)
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
        _finding(
            Severity.ERROR,
            DAEMON_SET_DOES_NOT_USE_CONFIG_MAP,
            f"No volume of DaemonSet {ref.namespace}/{ref.daemon_set} references ConfigMap "
            f"{ref.namespace}/{ref.config_map}. {instead}",
        )
    ]


def _mounted_config_maps(daemon_set: Mapping[str, Any]) -> set[str]:
    """ConfigMap names the pod template's volumes reference (plain and projected)."""
    names: set[str] = set()
    for volume in _list(_mapping(daemon_set, "spec", "template", "spec").get("volumes")):
        if not isinstance(volume, Mapping):
            continue
        name = _str(_mapping(volume, "configMap").get("name"))
        if name:
            names.add(name)
        for source in _list(_mapping(volume, "projected").get("sources")):
            if isinstance(source, Mapping):
                projected = _str(_mapping(source, "configMap").get("name"))
                if projected:
                    names.add(projected)
    return names


def _source_config(
    spec: PolicySpec, config_map: Mapping[str, Any] | None
) -> tuple[KubeProxyConfig | None, list[Finding]]:
    """Read the source KubeProxyConfiguration from its ConfigMap."""
    ref = spec.kube_proxy
    where = f"ConfigMap {ref.namespace}/{ref.config_map}"
    if config_map is None:
        return None, [
            _finding(
                Severity.ERROR,
                SOURCE_CONFIG_MAP_MISSING,
                f"{where} does not exist. Set spec.kubeProxy.configMap to the ConfigMap that "
                f"holds kube-proxy's KubeProxyConfiguration (kubeadm: kube-proxy; EKS: "
                f"kube-proxy-config).",
            )
        ]
    data = _mapping(config_map, "data")
    if ref.config_key not in data:
        present = ", ".join(sorted(str(k) for k in data)) or "none"
        return None, [
            _finding(
                Severity.ERROR,
                CONFIG_KEY_MISSING,
                f"{where} has no key {ref.config_key!r} (keys present: {present}). Set "
                f"spec.kubeProxy.configKey to the key that holds the KubeProxyConfiguration.",
            )
        ]
    try:
        return parse_config(data[ref.config_key]), []
    except ConfigError as error:
        return None, [
            _finding(
                Severity.ERROR,
                CONFIG_INVALID,
                f"{where} key {ref.config_key!r} is not a usable KubeProxyConfiguration: "
                f"{error}. Fix the ConfigMap, or point spec.kubeProxy at the right one.",
            )
        ]


def _kube_proxy_container(daemon_set: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container named kube-proxy, else one running a kube-proxy image, else the first."""
    containers = [
        c
        for c in _list(_mapping(daemon_set, "spec", "template", "spec").get("containers"))
        if isinstance(c, Mapping)
    ]
    for container in containers:
        if container.get("name") == KUBE_PROXY_CONTAINER:
            return container
    for container in containers:
        image = _str(container.get("image")) or ""
        repository = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
        if repository.startswith(KUBE_PROXY_CONTAINER):
            return container
    return containers[0] if containers else None


def _kube_proxy_version(image: str | None, cluster_version: str | None) -> KubeVersion | None:
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


# -- the target mode and config --------------------------------------------------------------


def _target_checks(
    spec: PolicySpec, source: KubeProxyConfig, version: KubeVersion | None
) -> tuple[TargetConfig | None, list[Finding]]:
    """Is the target mode new, available in this version, and is its config derivable?"""
    ref = spec.kube_proxy
    target = str(spec.target_mode)
    where = f"ConfigMap {ref.namespace}/{ref.config_map}"
    if source.mode == target:
        return None, [
            _finding(
                Severity.ERROR,
                ALREADY_IN_TARGET_MODE,
                f"The source kube-proxy ({where}, key {ref.config_key!r}) already runs in "
                f"{target} mode; there is nothing to migrate. Delete this policy, or set "
                f"spec.targetMode to another mode.",
            )
        ]
    findings: list[Finding] = []
    deprecation: str | None = None
    if version is not None:
        support = mode_support(target, version, _effective_gates(source, spec.config_overrides))
        if not support.supported:
            todo = (
                "Upgrade the cluster (kube-proxy) to 1.29 or later first, or choose another "
                "spec.targetMode."
                if target == NFTABLES
                else "Set any feature gate named above in spec.configOverrides.featureGates, "
                "or choose another spec.targetMode (nftables is the successor)."
            )
            return None, [
                _finding(
                    Severity.ERROR,
                    MODE_UNSUPPORTED,
                    f"kube-proxy {version} cannot run {target} mode: {support.reason} {todo}",
                )
            ]
        if support.deprecated:
            deprecation = support.reason
            findings.append(
                _finding(
                    Severity.WARNING,
                    MODE_DEPRECATED,
                    f"{support.reason} Plan the next migration (to nftables) before the mode "
                    f"goes away.",
                )
            )
    try:
        rendered = render_target_config(
            source, target, version=version, overrides=spec.config_overrides
        )
    except ConfigError as error:
        return None, [*findings, _render_failure(spec, source, version, error)]
    if rendered.feature_gates_set:
        gates = ", ".join(
            f"{gate}: {str(value).lower()}"
            for gate, value in sorted(rendered.feature_gates_set.items())
        )
        release = version.minor_release if version is not None else "this version"
        findings.append(
            _finding(
                Severity.INFO,
                FEATURE_GATE_ADDED,
                f"The target config sets featureGates {{{gates}}}, which {target} mode needs in "
                f"kube-proxy {release}; nothing to do.",
            )
        )
    findings.extend(
        _finding(Severity.WARNING, TARGET_CONFIG_NOTE, note)
        for note in rendered.warnings
        if note != deprecation  # already said by ModeDeprecated
    )
    return rendered, findings


def _render_failure(
    spec: PolicySpec, source: KubeProxyConfig, version: KubeVersion | None, error: ConfigError
) -> Finding:
    """Blame the overrides when the config derives without them; otherwise the derivation."""
    target = str(spec.target_mode)
    if spec.config_overrides:
        try:
            render_target_config(source, target, version=version)
        except ConfigError:
            pass
        else:
            return _finding(
                Severity.ERROR,
                CONFIG_OVERRIDES_INVALID,
                f"spec.configOverrides cannot be applied to the {target} config: {error}. Fix "
                f"spec.configOverrides.",
            )
    ref = spec.kube_proxy
    return _finding(
        Severity.ERROR,
        TARGET_CONFIG_INVALID,
        f"The {target} config cannot be derived from ConfigMap {ref.namespace}/"
        f"{ref.config_map} key {ref.config_key!r}: {error}. Fix the source config.",
    )


def _effective_gates(
    source: KubeProxyConfig, overrides: Mapping[str, Any] | None
) -> dict[str, bool]:
    """The source config's feature gates with the overrides' applied (None deletes a gate)."""
    gates = source.feature_gates
    override_gates = (overrides or {}).get("featureGates")
    if isinstance(override_gates, Mapping):
        for gate, value in override_gates.items():
            if value is None:
                gates.pop(gate, None)
            elif isinstance(value, bool):
                gates[gate] = value
    return gates


# -- nodes -----------------------------------------------------------------------------------


def _required_terms(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The required nodeSelectorTerms; None when the DaemonSet sets no required affinity."""
    required = _mapping(
        pod_spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = [t for t in _list(required.get("nodeSelectorTerms")) if isinstance(t, Mapping)]
    return terms or None


def _terms_match(terms: list[Mapping[str, Any]] | None, node: NodeView) -> bool:
    """Terms are ORed; a term's expressions and fields are ANDed (core/v1 NodeSelector).

    An empty term matches nothing, as in Kubernetes, except when it was made empty by
    dropping the operator's own ``proxymode.io/mode`` expressions: that term stands for the
    DaemonSet's own (absent) constraint and matches every node.
    """
    if terms is None:
        return True
    return any(_term_matches(term, node) for term in terms)


def _term_matches(term: Mapping[str, Any], node: NodeView) -> bool:
    expressions = [e for e in _list(term.get("matchExpressions")) if isinstance(e, Mapping)]
    fields = [f for f in _list(term.get("matchFields")) if isinstance(f, Mapping)]
    kept = [e for e in expressions if e.get("key") != MODE_LABEL]
    if not expressions and not fields:
        return False
    labels_hold = all(_node_requirement(e, node.labels) for e in kept)
    fields_hold = all(_node_requirement(f, {"metadata.name": node.name}) for f in fields)
    return labels_hold and fields_hold


def _node_requirement(requirement: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One NodeSelectorRequirement: In, NotIn, Exists, DoesNotExist, Gt, Lt.

    An operator Kubernetes does not know schedules nowhere.
    """
    key = _str(requirement.get("key")) or ""
    operator = requirement.get("operator")
    values = [str(v) for v in _list(requirement.get("values"))]
    value = labels.get(key)
    if operator in ("Gt", "Lt"):
        return _numeric_requirement(operator == "Gt", value, values)
    checks = {
        "In": value is not None and value in values,
        "NotIn": value is None or value not in values,
        "Exists": value is not None,
        "DoesNotExist": value is None,
    }
    return checks.get(str(operator), False)


def _numeric_requirement(greater: bool, value: str | None, values: Sequence[str]) -> bool:
    """Gt/Lt: one integer bound; a missing or non-integer label never matches."""
    if value is None or len(values) != 1:
        return False
    try:
        have, bound = int(value), int(values[0])
    except ValueError:
        return False
    return have > bound if greater else have < bound


def _kernel_checks(
    spec: PolicySpec, candidates: list[NodeView]
) -> tuple[list[NodeView], list[NodeView], list[Finding]]:
    """Split off nodes whose kernel cannot run the target mode; report unknown kernels."""
    target = str(spec.target_mode)
    too_old = [n for n in candidates if kernel_supports(target, n.kernel) is False]
    unknown = [n for n in candidates if kernel_supports(target, n.kernel) is None]
    findings: list[Finding] = []
    minimum = minimum_kernel(target)
    needed = f"{minimum[0]}.{minimum[1]}" if minimum else "a newer kernel"
    exclude = spec.incompatible_nodes == IncompatibleNodes.EXCLUDE
    if too_old:
        listed = _names([f"{n.name} ({n.kernel})" for n in too_old])
        why = (
            f"A kernel older than {needed}, the oldest {target} mode accepts (kube-proxy "
            f"would exit there), runs on {_plural(len(too_old), 'node')}: {listed}."
        )
        if exclude:
            findings.append(
                _finding(
                    Severity.WARNING,
                    KERNEL_TOO_OLD,
                    f"{why} They are left out (incompatibleNodes: Exclude) and keep the "
                    f"current mode; upgrade their kernels to move them later.",
                    [n.name for n in too_old],
                )
            )
        else:
            findings.append(
                _finding(
                    Severity.ERROR,
                    KERNEL_TOO_OLD,
                    f"{why} Upgrade their kernels, narrow spec.nodeSelector, or set "
                    f"spec.incompatibleNodes: Exclude to leave them on the current mode.",
                    [n.name for n in too_old],
                )
            )
    if unknown:
        unreadable = _names([f"{n.name} ({n.kernel or 'empty'})" for n in unknown])
        findings.append(
            _finding(
                Severity.WARNING,
                KERNEL_UNKNOWN,
                f"The kernel version of {_plural(len(unknown), 'node')} cannot be read "
                f"({unreadable}), so it was not checked against the {needed} that {target} "
                f"mode needs. They stay in the plan; check them by hand, and watch their "
                f"canary closely.",
                [n.name for n in unknown],
            )
        )
    if not exclude:
        return candidates, [], findings
    old = {n.name for n in too_old}
    return [n for n in candidates if n.name not in old], too_old, findings


def _node_checks(
    spec: PolicySpec,
    candidates: list[NodeView],
    eligible: list[NodeView],
    excluded: list[NodeView],
    observed_count: int,
) -> list[Finding]:
    """Is there anything to move, does every stage select nodes, are the nodes Ready?"""
    ref = spec.kube_proxy
    target = str(spec.target_mode)
    if not eligible:
        if candidates and excluded:
            why = (
                f"every matching node ({_plural(len(excluded), 'node')}) was excluded "
                f"because it cannot run {target} mode"
            )
        else:
            why = (
                f"none of the {_plural(observed_count, 'node')} matches both DaemonSet "
                f"{ref.namespace}/{ref.daemon_set}'s nodeSelector and affinity and "
                f"spec.nodeSelector (nodes being deleted do not count)"
            )
        return [
            _finding(
                Severity.ERROR,
                NO_ELIGIBLE_NODES,
                f"No node is eligible for this policy: {why}. Check spec.nodeSelector and the "
                f"DaemonSet's node placement.",
            )
        ]
    findings: list[Finding] = []
    plan = plan_stages(spec.stages, [PlanNode(n.name, n.labels, n.zone) for n in eligible])
    for stage, nodes in zip(spec.stages, plan, strict=True):
        if not nodes:
            findings.append(
                _finding(
                    Severity.WARNING,
                    STAGE_SELECTS_NOTHING,
                    f"Stage {stage.name!r} selects no node: its nodeSelector matches no "
                    f"eligible node not taken by an earlier stage, or earlier stages already "
                    f"reach its percent. It will complete at once; fix or remove it.",
                )
            )
    planned = sum(len(nodes) for nodes in plan)
    if planned < len(eligible):
        stay = sorted({n.name for n in eligible} - {name for nodes in plan for name in nodes})
        findings.append(
            _finding(
                Severity.INFO,
                PARTIAL_COVERAGE,
                f"The stages cover {planned} of {len(eligible)} eligible nodes; the source mode "
                f"stays on {_plural(len(stay), 'node')} ({_names(stay)}). The policy will end "
                f"with both DaemonSets kept (a mixed-mode cluster) and will not finalize; add "
                f"a stage with percent: 100 to move every node.",
                stay,
            )
        )
    not_ready = [n.name for n in eligible if not n.ready]
    if not_ready:
        findings.append(
            _finding(
                Severity.WARNING,
                NODES_NOT_READY,
                f"Not Ready: {_plural(len(not_ready), 'eligible node')} ({_names(not_ready)}). A "
                f"kube-proxy there may not become ready after the switch and hold up its "
                f"stage; fix or drain them first.",
                not_ready,
            )
        )
    return findings


# -- tools and policies that would fight the operator ----------------------------------------


def _gitops(
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
        labels = _mapping(obj, "metadata", "labels")
        annotations = _mapping(obj, "metadata", "annotations")
        release = _str(annotations.get(HELM_RELEASE_ANNOTATION))
        if labels.get(HELM_MANAGED_BY_LABEL) == "Helm" or release:
            helm.append(name)
            if release:
                releases.add(release)
        tracking = _str(annotations.get(ARGOCD_TRACKING_ANNOTATION))
        instance = _str(labels.get(ARGOCD_INSTANCE_LABEL))
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
            _finding(
                Severity.WARNING,
                MANAGED_BY_GITOPS,
                f"{_carrying(helm)} Helm's marks{which}. A helm upgrade during the "
                f"migration re-renders them and undoes the operator's node affinity and "
                f"updateStrategy on the DaemonSet, so the source kube-proxy starts again on "
                f"nodes already moved, next to the target one. Do not let Helm upgrade "
                f"kube-proxy mid-migration; afterwards set the mode in the chart's values.",
            )
        )
    if argo:
        which = f" (application {', '.join(sorted(apps))})" if apps else ""
        findings.append(
            _finding(
                Severity.WARNING,
                MANAGED_BY_GITOPS,
                f"{_carrying(argo)} Argo CD's marks{which}. Argo CD will revert the "
                f"operator's changes unless told to ignore them: add ignoreDifferences for the "
                f"DaemonSet's /spec/template/spec/affinity/nodeAffinity and /spec/updateStrategy "
                f"(or managedFieldsManagers: [{MANAGED_BY}]) with the RespectIgnoreDifferences "
                f"sync option, and turn off self-heal for the ConfigMap until the migration "
                f"ends; afterwards set the mode in Git.",
            )
        )
    return findings


def _other_policies(spec: PolicySpec, others: Sequence[str]) -> list[Finding]:
    if not others:
        return []
    ref = spec.kube_proxy
    return [
        _finding(
            Severity.ERROR,
            ANOTHER_POLICY_IN_FLIGHT,
            f"Another ProxyModePolicy is already driving DaemonSet {ref.namespace}/"
            f"{ref.daemon_set}: {', '.join(sorted(others))}. Only one policy may migrate a "
            f"kube-proxy at a time; wait for it to finish or delete it (deleting rolls it back).",
        )
    ]


# -- small helpers ---------------------------------------------------------------------------


def _finding(severity: Severity, code: str, message: str, nodes: Iterable[str] = ()) -> Finding:
    return Finding(severity=severity, code=code, message=message, nodes=sorted(nodes))


def _names(names: Sequence[str], limit: int = NAMES_IN_MESSAGE) -> str:
    """``a, b, c`` or ``a, b, ... and 7 more``: node lists in messages stay readable."""
    shown = ", ".join(names[:limit])
    rest = len(names) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown


def _carrying(objects: Sequence[str]) -> str:
    """``DaemonSet x carries`` or ``DaemonSet x and ConfigMap y carry``."""
    return f"{' and '.join(objects)} {'carries' if len(objects) == 1 else 'carry'}"


def _plural(count: int, noun: str) -> str:
    """``1 node``, ``3 nodes``; for "are"/"is" the caller picks the phrasing."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _counts(values: Iterable[str]) -> list[Count]:
    """How many nodes share each value, sorted by value; an empty value counts as unknown."""
    counter = Counter(value or "unknown" for value in values)
    return [Count(value=value, count=count) for value, count in sorted(counter.items())]


def _mapping(obj: Mapping[str, Any] | None, *path: str) -> Mapping[str, Any]:
    """``obj[path...]`` when every step is a mapping, else an empty mapping."""
    current: Any = obj
    for key in path:
        if not isinstance(current, Mapping):
            return {}
        current = current.get(key)
    return current if isinstance(current, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
