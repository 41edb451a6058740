"""kube-proxy's KubeProxyConfiguration: parse it, and derive the config for another mode.

The target kube-proxy of a migration runs from its own ConfigMap (DESIGN §3 step 2). Changing
``mode`` alone is not enough, because kube-proxy reads several fields only from the sub-struct
that matches the mode (``pkg/proxy/apis/config/v1alpha1/conversion.go``):

* ``syncPeriod`` and ``minSyncPeriod`` come from ``iptables.*``, ``ipvs.*`` or ``nftables.*``;
* ``masqueradeAll`` and ``masqueradeBit`` come from ``nftables.*`` in nftables mode and from
  ``iptables.*`` in iptables *and* ipvs mode.

A kubeadm config holds ``iptables.syncPeriod: 30s`` but ``nftables.syncPeriod: 0s``, so a mode
switch that does not carry these fields over silently changes behaviour (or fails validation).
This module carries them, merges the policy's overrides, adds the feature gates the version
needs, and refuses what cannot work, with a message a person can act on.

Unknown fields of the source config are kept untouched: kube-proxy grows fields every release,
and the operator must never drop what it does not understand. Everything here is pure.

The config itself is in ``schema``, the overrides and carried fields in ``overrides``;
this module derives the target config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import yaml

from proxymode.kubeproxy.overrides import (
    carry_fields,
    checked_overrides,
    deep_merge,
    struct_read_for,
)
from proxymode.kubeproxy.schema import (
    MODE_STRUCTS,
    MOVED_FIELDS,
    OVERRIDES_NAME,
    ConfigError,
    KubeProxyConfig,
    MovedField,
    TargetConfig,
    dump_yaml,
    parse_config,
)
from proxymode.kubeproxy.versions import (
    GATE_INTRODUCED,
    IPTABLES,
    IPVS,
    NFTABLES,
    KubeVersion,
    ModeSupport,
    mode_support,
    normalize_mode,
)

__all__ = [
    "ConfigError",
    "KubeProxyConfig",
    "MovedField",
    "TargetConfig",
    "deep_merge",
    "dump_yaml",
    "parse_config",
    "render_target_config",
    "with_mode",
]


# --- Feature gates --------------------------------------------------------------------------


def _apply_gates(
    data: dict[str, Any],
    target_mode: str,
    version: KubeVersion,
    overrides: Mapping[str, Any],
    source_gates: Mapping[str, bool],
) -> tuple[dict[str, bool], list[str]]:
    """Set the gates ``version`` needs for ``target_mode``; refuse when that cannot work."""
    support = mode_support(target_mode, version, data.get("featureGates") or {})
    if not support.supported:
        raise ConfigError(support.reason)
    override_gates = overrides.get("featureGates") or {}
    gates = dict(data.get("featureGates") or {})
    changed: dict[str, bool] = {}
    warnings: list[str] = []
    for gate, value in support.feature_gates_needed.items():
        if gate in override_gates and override_gates[gate] != value:
            raise ConfigError(
                f"{OVERRIDES_NAME}.featureGates.{gate} is {_yaml(override_gates[gate])}, but "
                f"{target_mode} mode in kube-proxy {version.minor_release} needs it "
                f"{_yaml(value)}"
            )
        if gates.get(gate) != value:
            if gate in source_gates:
                warnings.append(
                    f"featureGates.{gate} was {_yaml(source_gates[gate])} in the source config "
                    f"and is set to {_yaml(value)}, because {target_mode} mode needs it."
                )
            gates[gate] = value
            changed[gate] = value
    if changed:
        data["featureGates"] = gates
    _refuse_unknown_gates(gates, version)
    return changed, [*warnings, *_support_warnings(support)]


def _support_warnings(support: ModeSupport) -> list[str]:
    """A deprecated mode's reason is the warning. The notes are left out: they describe the
    gates that :func:`_apply_gates` has just set and reported itself.
    """
    return [support.reason] if support.deprecated else []


def _yaml(value: Any) -> str:
    """A value as it reads in the YAML a person edits (``true``, not ``True``)."""
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()


def _refuse_unknown_gates(gates: Mapping[str, bool], version: KubeVersion) -> None:
    """kube-proxy refuses to start on a gate its release does not know."""
    for gate in sorted(gates):
        introduced = GATE_INTRODUCED.get(gate)
        if introduced is not None and version < introduced:
            raise ConfigError(
                f"featureGates.{gate} does not exist in kube-proxy {version.minor_release} "
                f"(it appeared in {introduced.minor_release}); kube-proxy would refuse to start"
            )


# --- Warnings -------------------------------------------------------------------------------


def _reads_in_mode(struct: str, field_name: str, mode: str) -> bool:
    if struct == mode:
        return True
    return struct == IPTABLES and mode == IPVS and field_name in ("masqueradeAll", "masqueradeBit")


def _ignored_override_warnings(overrides: Mapping[str, Any], target_mode: str) -> list[str]:
    """Overrides in a sub-struct the target mode does not read do nothing: say so."""
    warnings = []
    for struct in MODE_STRUCTS:
        sub = overrides.get(struct)
        if not isinstance(sub, Mapping):
            continue
        for name in sorted(sub):
            if not _reads_in_mode(struct, name, target_mode):
                hint = struct_read_for(name, target_mode)
                instead = f"; set {hint}.{name} instead" if name in MOVED_FIELDS else ""
                warnings.append(
                    f"{OVERRIDES_NAME} sets {struct}.{name}, which kube-proxy ignores in "
                    f"{target_mode} mode{instead}."
                )
    return warnings


def _nftables_warnings(data: Mapping[str, Any], source_mode: str) -> list[str]:
    """Behaviour that changes silently when iptables/ipvs nodes move to nftables (§5, §8.1)."""
    warnings = []
    if not data.get("nodePortAddresses"):
        warnings.append(
            "nodePortAddresses is unset: in nftables mode NodePorts listen only on the node's "
            f"primary IPs (in {source_mode} mode: all local IPs)."
        )
    if source_mode == IPTABLES:
        warnings.append(
            "nftables mode has no localhost NodePorts and adds no NodePort firewall-accept "
            "rules: check kubeproxy_iptables_localhost_nodeports_accepted_packets_total and "
            "let the host firewall allow the NodePort range."
        )
        if (data.get("conntrack") or {}).get("tcpBeLiberal") is not True:
            warnings.append(
                "nftables mode does not drop conntrack-INVALID packets like iptables mode does: "
                "if kubeproxy_iptables_ct_state_invalid_dropped_packets_total grows, set "
                "conntrack.tcpBeLiberal: true."
            )
    return warnings


def _ipvs_warnings(data: Mapping[str, Any], _source_mode: str) -> list[str]:
    """MetalLB L2 plus ipvs without strictARP drops connections (§8.1)."""
    if (data.get(IPVS) or {}).get("strictARP") is True:
        return []
    return [
        "ipvs mode with MetalLB L2 needs ipvs.strictARP: true: kube-ipvs0 carries every "
        "LoadBalancer IP, so without it every node answers ARP for them."
    ]


def _no_warnings(_data: Mapping[str, Any], _source_mode: str) -> list[str]:
    return []


_MODE_WARNINGS: Final[Mapping[str, Callable[[Mapping[str, Any], str], list[str]]]] = {
    NFTABLES: _nftables_warnings,
    IPVS: _ipvs_warnings,
}


# --- The transformation ---------------------------------------------------------------------


@dataclass
class _Derived:
    data: dict[str, Any]
    moved: list[MovedField]
    gates: dict[str, bool]
    warnings: list[str]


def _derive(
    source: KubeProxyConfig,
    target_mode: str,
    version: KubeVersion | None,
    overrides: Mapping[str, Any] | None,
) -> _Derived:
    """Mode set, fields carried, overrides merged, gates added: the shared core of both APIs."""
    try:
        target = normalize_mode(target_mode)
    except ValueError as error:
        raise ConfigError(str(error)) from error
    base = source.to_dict()
    checked = checked_overrides(overrides, base, target)
    base["mode"] = target
    moved = carry_fields(base, source.mode, target, checked)
    data = deep_merge(base, checked)
    warnings: list[str] = []
    gates: dict[str, bool] = {}
    if version is None:
        warnings.append(
            "The kube-proxy version is unknown, so it was not checked that it has "
            f"{target} mode or which feature gates that needs."
        )
    else:
        gates, gate_warnings = _apply_gates(data, target, version, checked, source.feature_gates)
        warnings.extend(gate_warnings)
    warnings.extend(_ignored_override_warnings(checked, target))
    return _Derived(data, moved, gates, warnings)


def _validated(data: Mapping[str, Any]) -> tuple[str, KubeProxyConfig]:
    """Dump and parse back, so what goes into the ConfigMap is proven to read as ``data``."""
    try:
        text = dump_yaml(data)
    except yaml.YAMLError as error:
        raise ConfigError(f"the derived config cannot be written as YAML: {error}") from error
    parsed = parse_config(text)
    if parsed.to_dict() != data:
        raise ConfigError("the derived config does not read back as written (unsupported values)")
    return text, parsed


def render_target_config(
    source: KubeProxyConfig,
    target_mode: str,
    *,
    version: KubeVersion | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> TargetConfig:
    """The KubeProxyConfiguration the target kube-proxy runs with (DESIGN §3 step 2).

    Raises ConfigError when the result could not work: the version lacks the mode, the
    overrides are malformed, name unknown fields or change mode/apiVersion/kind, or the source
    already runs ``target_mode`` (there is nothing to migrate).
    """
    try:
        target = normalize_mode(target_mode)
    except ValueError as error:
        raise ConfigError(str(error)) from error
    if target == source.mode:
        raise ConfigError(f"the source kube-proxy already runs in {target} mode")
    derived = _derive(source, target, version, overrides)
    text, _ = _validated(derived.data)
    mode_warnings = _MODE_WARNINGS.get(target, _no_warnings)(derived.data, source.mode)
    return TargetConfig(
        mode=target,
        data=derived.data,
        text=text,
        warnings=[*derived.warnings, *mode_warnings],
        moved=derived.moved,
        feature_gates_set=derived.gates,
    )


def with_mode(
    source: KubeProxyConfig,
    mode: str,
    *,
    version: KubeVersion | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> KubeProxyConfig:
    """The source config switched to ``mode`` by the same rules, for the finalize write-back.

    Unlike :func:`render_target_config` it accepts the source's own mode (returning it with only
    overrides and gates applied), so finalize can be repeated after an operator restart. Pass
    the policy's ``version`` and ``overrides`` so the source ConfigMap ends up running the same
    configuration the canaries were judged on.
    """
    return _validated(_derive(source, mode, version, overrides).data)[1]
