"""Preflight and inventory (DESIGN §6): can this policy run here, and what does the cluster hold?

Pure: a :class:`~proxymode.api.models.PolicySpec` and an
:class:`~proxymode.engine.observed.Observed` snapshot in, a :class:`PreflightResult` out. The
result carries the findings written to ``status.preflight``, the nodes the policy may move, the
nodes left out because they cannot run the target mode (``status.preflight.excludedNodes``,
which the engine plans from), the rendered target KubeProxyConfiguration and the inventory
written to ``status.baseline``.

Preflight is a chain of small named checks (``CHAIN``), each a pure function of the shared
``Facts`` returning findings; a check whose input is missing (no DaemonSet, an unreadable
config) returns none, because an earlier check already said why. Any Error stops the run.

=================  =========================================================================
check              codes (severity)
=================  =========================================================================
SourceDaemonSet    SourceDaemonSetMissing, StaticPodKubeProxy, EmbeddedKubeProxy,
                   KubeProxyFree, DaemonSetDoesNotUseConfigMap (Error)
ManagedAddon       ManagedAddon (Error; Warning with managedAddon: Proceed): EKS, AKS, the
                   addon manager reconcile kube-proxy back
SourceConfig       SourceConfigMapMissing, ConfigKeyMissing, ConfigInvalid (Error);
                   ConfigFieldIgnored (Warning): fields kube-proxy does not read
TargetMode         AlreadyInTargetMode, ModeUnsupported, ConfigOverridesInvalid,
                   TargetConfigInvalid (Error); ModeDeprecated, TargetConfigNote (Warning);
                   FeatureGateAdded (Info)
Kernels            KernelTooOld (Error, or Warning with incompatibleNodes: Exclude),
                   KernelUnknown (Warning)
Nodes              NoEligibleNodes, StageSelectsNothing for every stage (Error);
                   StageSelectsNothing, NodesNotReady (Warning);
                   PartialCoverage, ControlPlaneLast (Info; Warning when one goes first)
Metrics            MetricsNotScraped (Warning): kube-proxy's metrics on loopback only;
                   MetricSeriesMissing (Error): Prometheus lacks a check's series for
                   eligible nodes (asked before the first move, ``Observed.series``);
                   QueryInvalid (Error): Prometheus refuses a custom query as PromQL
GitOps             ManagedByGitOps (Warning): Helm or Argo CD marks on the source objects
OtherPolicies      AnotherPolicyInFlight (Error)
Labels             NodesAlreadyLabelled (Error): proxymode.io/mode set before the policy
Verify             VerifyServiceMissing (Error): spec.verify.service not found
=================  =========================================================================

Facts from ``reference/kube-proxy.md``: the target mode must exist in the running kube-proxy
version (§3.1), nodes must have a kernel the mode accepts (§4: nftables needs 5.13). Every
finding says which objects it is about and what a person should do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Final

from proxymode.api.models import Baseline, Finding, PolicySpec, Severity
from proxymode.engine.observed import NodeView, Observed
from proxymode.engine.preflight.codes import Code
from proxymode.engine.preflight.config_fields import ignored_fields
from proxymode.engine.preflight.conflicts import gitops, labelled_nodes, other_policies
from proxymode.engine.preflight.distributions import managed_addon
from proxymode.engine.preflight.metrics import (
    is_local,
    metrics_address,
    metrics_reach,
    series_findings,
)
from proxymode.engine.preflight.nodes import eligible_nodes, node_findings, split_kernels
from proxymode.engine.preflight.source import (
    config_map_use,
    kube_proxy_container,
    missing_daemon_set,
    proxy_version,
    read_source_config,
    reads_other_config_map,
)
from proxymode.engine.preflight.target import check_target
from proxymode.engine.preflight.text import get_str, value_counts
from proxymode.engine.preflight.verification import verify_service
from proxymode.kubeproxy import KubeProxyConfig, KubeVersion, TargetConfig

KERNEL_TOO_OLD: Final = Code.KERNEL_TOO_OLD

_SEVERITY_RANK: Final[Mapping[str, int]] = {
    Severity.ERROR: 0,
    Severity.WARNING: 1,
    Severity.INFO: 2,
}

__all__ = [
    "CHAIN",
    "KERNEL_TOO_OLD",
    "Code",
    "Facts",
    "PreflightResult",
    "eligible_nodes",
    "run_preflight",
]


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

    def without(self, code: str) -> PreflightResult:
        """The result with the findings of ``code`` dropped (and ``passed`` re-judged)."""
        kept = tuple(f for f in self.findings if f.code != code)
        passed = not any(f.severity == Severity.ERROR for f in kept)
        return replace(self, findings=kept, passed=passed)


class Facts:
    """What the checks read, each derived once, on first use."""

    def __init__(self, spec: PolicySpec, observed: Observed) -> None:
        self.spec = spec
        self.observed = observed
        self.daemon_set = observed.source_daemon_set

    @cached_property
    def image(self) -> str | None:
        container = kube_proxy_container(self.daemon_set) if self.daemon_set is not None else None
        return get_str(container.get("image")) if container is not None else None

    @cached_property
    def version(self) -> KubeVersion | None:
        return proxy_version(self.image, self.observed.facts.kubernetes_version)

    @cached_property
    def missing(self) -> Finding | None:
        """Why there is no DaemonSet to drive, when there is none."""
        return missing_daemon_set(self.spec, self.observed) if self.daemon_set is None else None

    @cached_property
    def source_read(self) -> tuple[KubeProxyConfig | None, list[Finding]]:
        # A static or embedded kube-proxy has no ConfigMap to look for: one finding says it all.
        if self.missing is not None and self.missing.code != Code.SOURCE_DAEMON_SET_MISSING:
            return None, []
        config_map = self.observed.source_config_map
        if config_map is not None and reads_other_config_map(self.spec, self.daemon_set):
            # kube-proxy reads another ConfigMap: SourceDaemonSet names it and what to set;
            # what this one holds does not matter.
            return None, []
        return read_source_config(self.spec, config_map, self.daemon_set)

    @cached_property
    def target(self) -> tuple[TargetConfig | None, list[Finding]]:
        source = self.source_read[0]
        return check_target(self.spec, source, self.version) if source is not None else (None, [])

    @cached_property
    def candidates(self) -> list[NodeView]:
        if self.daemon_set is None:
            return []
        return eligible_nodes(self.spec, self.daemon_set, self.observed.nodes)

    @cached_property
    def kernels(self) -> tuple[list[NodeView], list[NodeView], list[Finding]]:
        """(eligible, excluded, findings)."""
        if self.daemon_set is None:
            return [], [], []
        return split_kernels(self.spec, self.candidates)


def check_source_daemon_set(facts: Facts) -> list[Finding]:
    if facts.daemon_set is None:
        return [facts.missing] if facts.missing is not None else []
    return config_map_use(facts.spec, facts.daemon_set)


def check_source_config(facts: Facts) -> list[Finding]:
    source = facts.source_read[0]
    ignored = ignored_fields(facts.spec, source) if source is not None else []
    return [*facts.source_read[1], *ignored]


def check_managed_addon(facts: Facts) -> list[Finding]:
    observed = facts.observed
    return managed_addon(facts.spec, facts.daemon_set, observed.source_config_map, observed.nodes)


def check_metrics(facts: Facts) -> list[Finding]:
    source = facts.source_read[0]
    if source is None:
        return []
    target = facts.target[0]
    source_data = source.to_dict()
    target_data = target.data if target is not None else None
    # A NotReady node is scraped by nobody: its missing series are the NodesNotReady
    # warning's business, not a refusal of the whole run.
    eligible = [n.name for n in facts.kernels[0] if n.ready]
    return [
        *metrics_reach(facts.spec, source_data, target_data),
        *series_findings(
            facts.spec,
            eligible,
            facts.observed.series,
            source_local=is_local(metrics_address(source_data)),
            target_local=is_local(metrics_address(target_data or source_data)),
        ),
    ]


def check_target_mode(facts: Facts) -> list[Finding]:
    return facts.target[1]


def check_kernels(facts: Facts) -> list[Finding]:
    return facts.kernels[2]


def check_nodes(facts: Facts) -> list[Finding]:
    if facts.daemon_set is None:
        return []
    eligible, excluded, _ = facts.kernels
    count = len(facts.observed.nodes)
    return node_findings(facts.spec, facts.candidates, eligible, excluded, count)


def check_gitops(facts: Facts) -> list[Finding]:
    return gitops(facts.spec, facts.daemon_set, facts.observed.source_config_map)


def check_other_policies(facts: Facts) -> list[Finding]:
    return other_policies(facts.spec, facts.observed.facts.other_policies)


def check_labels(facts: Facts) -> list[Finding]:
    # Only the nodes this policy may move: another policy's pair on other nodes (its own
    # DaemonSet, its own pool) labels nodes that this one never touches.
    return labelled_nodes(facts.candidates) if facts.daemon_set is not None else []


def check_verify(facts: Facts) -> list[Finding]:
    return verify_service(facts.spec, facts.observed)


Check = Callable[[Facts], list[Finding]]
CHAIN: Final[tuple[tuple[str, Check], ...]] = (
    ("SourceDaemonSet", check_source_daemon_set),
    ("ManagedAddon", check_managed_addon),
    ("SourceConfig", check_source_config),
    ("TargetMode", check_target_mode),
    ("Kernels", check_kernels),
    ("Nodes", check_nodes),
    ("Metrics", check_metrics),
    ("GitOps", check_gitops),
    ("OtherPolicies", check_other_policies),
    ("Labels", check_labels),
    ("Verify", check_verify),
)


def run_preflight(spec: PolicySpec, observed: Observed) -> PreflightResult:
    """Run the chain against the cluster in ``observed`` and take the inventory."""
    facts = Facts(spec, observed)
    findings = [finding for _, check in CHAIN for finding in check(facts)]
    ordered = tuple(sorted(findings, key=lambda f: (_SEVERITY_RANK[f.severity], f.code)))
    source = facts.source_read[0]
    source_mode = source.mode if source is not None else None
    version_text = str(facts.version) if facts.version is not None else None
    eligible, excluded, _ = facts.kernels
    nodes = observed.nodes
    baseline = Baseline(
        kubernetes_version=observed.facts.kubernetes_version,
        kube_proxy_version=version_text,
        kube_proxy_image=facts.image,
        source_mode=source_mode,
        kernels=value_counts(n.kernel for n in nodes),
        os_images=value_counts(n.os_image for n in nodes),
        container_runtimes=value_counts(n.container_runtime for n in nodes),
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
        target_config=facts.target[0],
        baseline=baseline,
    )
