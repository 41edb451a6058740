"""Checks of the target mode: new, available in this kube-proxy, its config derivable (§3.1)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxymode.api.models import Finding, PolicySpec, Severity
from proxymode.engine.preflight.codes import Code
from proxymode.engine.preflight.text import new_finding
from proxymode.kubeproxy import (
    ConfigError,
    KubeProxyConfig,
    KubeVersion,
    TargetConfig,
    mode_support,
    render_target_config,
)
from proxymode.kubeproxy.versions import NFTABLES


def check_target(
    spec: PolicySpec, source: KubeProxyConfig, version: KubeVersion | None
) -> tuple[TargetConfig | None, list[Finding]]:
    """Is the target mode new, available in this version, and is its config derivable?"""
    ref = spec.kube_proxy
    target = str(spec.target_mode)
    where = f"ConfigMap {ref.namespace}/{ref.config_map}"
    if source.mode == target:
        return None, [
            new_finding(
                Severity.ERROR,
                Code.ALREADY_IN_TARGET_MODE,
                f"The source kube-proxy ({where}, key {ref.config_key!r}) already runs in "
                f"{target} mode; there is nothing to migrate. Delete this policy, or set "
                f"spec.targetMode to another mode.",
            )
        ]
    findings: list[Finding] = []
    deprecation: str | None = None
    if version is not None:
        support = mode_support(target, version, effective_gates(source, spec.config_overrides))
        if not support.supported:
            todo = (
                "Upgrade the cluster (kube-proxy) to 1.29 or later first, or choose another "
                "spec.targetMode."
                if target == NFTABLES
                else "Set any feature gate named above in spec.configOverrides.featureGates, "
                "or choose another spec.targetMode (nftables is the successor)."
            )
            return None, [
                new_finding(
                    Severity.ERROR,
                    Code.MODE_UNSUPPORTED,
                    f"kube-proxy {version} cannot run {target} mode: {support.reason} {todo}",
                )
            ]
        if support.deprecated:
            deprecation = support.reason
            findings.append(
                new_finding(
                    Severity.WARNING,
                    Code.MODE_DEPRECATED,
                    f"{support.reason} Plan the next migration (to nftables) before the mode "
                    f"goes away.",
                )
            )
    try:
        rendered = render_target_config(
            source, target, version=version, overrides=spec.config_overrides
        )
    except ConfigError as error:
        return None, [*findings, render_failure(spec, source, version, error)]
    if rendered.feature_gates_set:
        gates = ", ".join(
            f"{gate}: {str(value).lower()}"
            for gate, value in sorted(rendered.feature_gates_set.items())
        )
        release = version.minor_release if version is not None else "this version"
        findings.append(
            new_finding(
                Severity.INFO,
                Code.FEATURE_GATE_ADDED,
                f"The target config sets featureGates {{{gates}}}, which {target} mode needs in "
                f"kube-proxy {release}; nothing to do.",
            )
        )
    findings.extend(
        new_finding(Severity.WARNING, Code.TARGET_CONFIG_NOTE, note)
        for note in rendered.warnings
        if note != deprecation  # already said by ModeDeprecated
    )
    return rendered, findings


def render_failure(
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
            return new_finding(
                Severity.ERROR,
                Code.CONFIG_OVERRIDES_INVALID,
                f"spec.configOverrides cannot be applied to the {target} config: {error}. Fix "
                f"spec.configOverrides.",
            )
    ref = spec.kube_proxy
    return new_finding(
        Severity.ERROR,
        Code.TARGET_CONFIG_INVALID,
        f"The {target} config cannot be derived from ConfigMap {ref.namespace}/"
        f"{ref.config_map} key {ref.config_key!r}: {error}. Fix the source config.",
    )


def effective_gates(
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
