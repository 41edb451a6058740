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
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

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

API_VERSION: Final = "kubeproxy.config.k8s.io/v1alpha1"
KIND: Final = "KubeProxyConfiguration"
OVERRIDES_NAME: Final = "configOverrides"
"""How error messages name the overrides: the ProxyModePolicy field a person edits."""

TOP_LEVEL_FIELDS: Final = frozenset(
    {
        "apiVersion",
        "kind",
        "featureGates",
        "clientConnection",
        "logging",
        "hostnameOverride",
        "bindAddress",
        "healthzBindAddress",
        "metricsBindAddress",
        "bindAddressHardFail",
        "enableProfiling",
        "showHiddenMetricsForVersion",
        "mode",
        "iptables",
        "ipvs",
        "nftables",
        "winkernel",
        "detectLocalMode",
        "detectLocal",
        "clusterCIDR",
        "nodePortAddresses",
        "oomScoreAdj",
        "conntrack",
        "configSyncPeriod",
        "portRange",
        "windowsRunAsService",
    }
)
"""KubeProxyConfiguration v1alpha1 top-level fields (kube-proxy.md §3)."""

SUB_STRUCT_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    IPTABLES: frozenset(
        {"masqueradeBit", "masqueradeAll", "localhostNodePorts", "syncPeriod", "minSyncPeriod"}
    ),
    IPVS: frozenset(
        {
            "syncPeriod",
            "minSyncPeriod",
            "scheduler",
            "excludeCIDRs",
            "strictARP",
            "tcpTimeout",
            "tcpFinTimeout",
            "udpTimeout",
        }
    ),
    NFTABLES: frozenset({"masqueradeBit", "masqueradeAll", "syncPeriod", "minSyncPeriod"}),
    "conntrack": frozenset(
        {
            "maxPerCore",
            "min",
            "tcpEstablishedTimeout",
            "tcpCloseWaitTimeout",
            "tcpBeLiberal",
            "udpTimeout",
            "udpStreamTimeout",
        }
    ),
    "detectLocal": frozenset({"bridgeInterface", "interfaceNamePrefix"}),
}
"""Sub-structs whose fields are checked, so a typo in an override cannot silently do nothing."""

MODE_STRUCTS: Final = (IPTABLES, IPVS, NFTABLES)
MOVED_FIELDS: Final = ("syncPeriod", "minSyncPeriod", "masqueradeAll", "masqueradeBit")
_IMMUTABLE_BY_OVERRIDES: Final = ("apiVersion", "kind")
_ZERO_DURATION_RE: Final = re.compile(r"(?:0+(?:\.0*)?(?:ns|us|µs|ms|s|m|h))+|0+")


class ConfigError(ValueError):
    """A KubeProxyConfiguration that cannot be used, with the reason in words."""


class KubeProxyConfig:
    """A validated KubeProxyConfiguration; every field, known or not, is kept as parsed.

    The wrapper owns a private deep copy and hands out deep copies, so a config read from a
    ConfigMap cannot be changed behind the snapshot that rollback restores from.
    """

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        _check_config(data)
        self._data: dict[str, Any] = copy.deepcopy(dict(data))

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the whole configuration."""
        return copy.deepcopy(self._data)

    def to_yaml(self) -> str:
        """The configuration as ConfigMap text, keys sorted so equal configs give equal text."""
        return dump_yaml(self._data)

    @property
    def raw_mode(self) -> str:
        """``mode`` exactly as written (``""`` when unset)."""
        return str(self._data.get("mode") or "")

    @property
    def mode(self) -> str:
        """The mode kube-proxy runs in: an empty mode means iptables on Linux."""
        return normalize_mode(self.raw_mode)

    @property
    def feature_gates(self) -> dict[str, bool]:
        """The explicitly set feature gates (empty when none)."""
        return dict(self._data.get("featureGates") or {})

    def sub_struct(self, name: str) -> dict[str, Any]:
        """A copy of one sub-struct (``iptables``, ``conntrack``...); empty when unset."""
        return copy.deepcopy(dict(self._data.get(name) or {}))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KubeProxyConfig):
            return NotImplemented
        return self._data == other._data

    __hash__ = None  # type: ignore[assignment]  # mutable-content wrapper: equal, not hashable

    def __repr__(self) -> str:
        return f"KubeProxyConfig(mode={self.mode!r}, fields={len(self._data)})"


@dataclass(frozen=True)
class MovedField:
    """One field carried from the source mode's sub-struct into the target mode's."""

    field: str
    source: str  # dotted path it came from, e.g. "iptables.syncPeriod"
    target: str  # dotted path it went to, e.g. "nftables.syncPeriod"
    value: Any

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.value})"


@dataclass(frozen=True)
class TargetConfig:
    """The config the target kube-proxy runs with, and what deriving it changed or found."""

    mode: str
    data: dict[str, Any]
    text: str  # exactly what goes into the target ConfigMap
    warnings: list[str] = field(default_factory=list)
    moved: list[MovedField] = field(default_factory=list)
    feature_gates_set: dict[str, bool] = field(default_factory=dict)


# libyaml's safe loader and dumper are ~10x faster than the pure-Python ones and give the
# same result; the engine parses the config on every look, so it matters.
_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_yaml(data: Mapping[str, Any]) -> str:
    """Deterministic YAML: sorted keys (as kubeadm writes them), block style, no line folding."""
    return yaml.dump(
        dict(data),
        Dumper=_Dumper,
        sort_keys=True,
        default_flow_style=False,
        allow_unicode=True,
        width=1 << 20,
    )


def parse_config(text: str) -> KubeProxyConfig:
    """Parse a ConfigMap's KubeProxyConfiguration text; ConfigError says what is wrong."""
    if not isinstance(text, str):
        raise ConfigError(f"the kube-proxy config must be text, got {type(text).__name__}")
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader, libyaml's when present
    except yaml.YAMLError as error:
        raise ConfigError(f"the kube-proxy config is not valid YAML: {error}") from error
    if data is None:
        raise ConfigError("the kube-proxy config is empty")
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"the kube-proxy config must be a YAML mapping, got {type(data).__name__}"
        )
    return KubeProxyConfig(data)


def _check_config(data: Mapping[str, Any]) -> None:
    """Refuse what kube-proxy itself would refuse, or what this module cannot reason about."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a KubeProxyConfiguration must be a mapping, got {type(data).__name__}")
    if data.get("apiVersion") != API_VERSION:
        raise ConfigError(
            f"apiVersion is {data.get('apiVersion')!r}, expected {API_VERSION!r}; "
            "this is not a kube-proxy config proxymode understands"
        )
    if data.get("kind") != KIND:
        raise ConfigError(f"kind is {data.get('kind')!r}, expected {KIND!r}")
    mode = data.get("mode")
    if mode is not None and not isinstance(mode, str):
        raise ConfigError(f"mode must be a string, got {mode!r}")
    try:
        normalize_mode(mode or "")
    except ValueError as error:
        raise ConfigError(str(error)) from error
    for name in SUB_STRUCT_FIELDS:
        if data.get(name) is not None and not isinstance(data[name], Mapping):
            raise ConfigError(f"{name} must be a mapping, got {data[name]!r}")
    _check_feature_gates(data.get("featureGates"), "featureGates", allow_none_values=False)


def _check_feature_gates(gates: Any, path: str, *, allow_none_values: bool) -> None:
    """featureGates is ``map[string]bool``; anything else makes kube-proxy refuse the file."""
    if gates is None:
        return
    if not isinstance(gates, Mapping):
        raise ConfigError(f"{path} must be a mapping of gate names to true/false, got {gates!r}")
    for name, value in gates.items():
        if value is None and allow_none_values:
            continue
        if not isinstance(name, str) or not isinstance(value, bool):
            raise ConfigError(f"{path}.{name} must be true or false, got {value!r}")


# --- Overrides ------------------------------------------------------------------------------


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied: mappings merge key by key, lists and scalars
    replace, and a key set to None is deleted (the only way to unset a field via a merge).
    """
    merged = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        current = merged.get(key)
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(current, Mapping):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = _plain(value, keep_none=False)
    return merged


def _plain(value: Any, *, keep_none: bool) -> Any:
    """Plain dicts and lists, which YAML can write. ``keep_none=False`` drops None-valued keys
    from a mapping that is new in the result: there, "delete this key" means "leave it out".
    """
    if isinstance(value, Mapping):
        return {
            key: _plain(item, keep_none=keep_none)
            for key, item in value.items()
            if keep_none or item is not None
        }
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [_plain(item, keep_none=keep_none) for item in value]
    return copy.deepcopy(value)


def _checked_overrides(
    overrides: Mapping[str, Any] | None, source: Mapping[str, Any], target_mode: str
) -> dict[str, Any]:
    """Validate overrides against the known fields (plus the source's own, which that kube-proxy
    version evidently knows) and return them as plain data.
    """
    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise ConfigError(
            f"{OVERRIDES_NAME} must be a mapping of KubeProxyConfiguration fields, "
            f"got {type(overrides).__name__}"
        )
    for key, value in overrides.items():
        _check_override_key(key, value, source, target_mode)
    plain: dict[str, Any] = _plain(overrides, keep_none=True)
    return plain


def _check_override_key(key: Any, value: Any, source: Mapping[str, Any], target_mode: str) -> None:
    path = f"{OVERRIDES_NAME}.{key}"
    if key == "mode":
        if value != target_mode:
            raise ConfigError(
                f"{path} must not change the mode (got {value!r}); the policy's targetMode "
                f"({target_mode!r}) decides it"
            )
        return
    if key in _IMMUTABLE_BY_OVERRIDES:
        if value != source.get(key):
            raise ConfigError(f"{path} must not change {key} (got {value!r})")
        return
    _require_known(key, TOP_LEVEL_FIELDS | set(source), OVERRIDES_NAME)
    if key == "featureGates":
        _check_feature_gates(value, path, allow_none_values=True)
    elif key in SUB_STRUCT_FIELDS and value is not None:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be a mapping of {key} fields, got {value!r}")
        known = SUB_STRUCT_FIELDS[key] | set(source.get(key) or {})
        for sub_key in value:
            _require_known(sub_key, known, path)


def _require_known(key: Any, known: set[str] | frozenset[str], where: str) -> None:
    """Unknown keys are refused by name: kube-proxy ignores them, so the override would be lost."""
    if isinstance(key, str) and key in known:
        return
    hint = difflib.get_close_matches(str(key), sorted(known), n=1)
    suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
    raise ConfigError(
        f"{where}: unknown KubeProxyConfiguration field {key!r}{suggestion} "
        f"(known here: {', '.join(sorted(known))})"
    )


# --- Mode-dependent fields ------------------------------------------------------------------


def struct_read_for(field_name: str, mode: str) -> str:
    """Which sub-struct kube-proxy reads ``field_name`` from in ``mode`` (conversion.go)."""
    if field_name in ("syncPeriod", "minSyncPeriod"):
        return mode
    return NFTABLES if mode == NFTABLES else IPTABLES


def _is_unset(field_name: str, value: Any) -> bool:
    """Go's zero value means "not set" for these fields; masqueradeBit is a pointer (0 is set)."""
    if value is None:
        return True
    if field_name == "masqueradeBit":
        return False
    if field_name == "masqueradeAll":
        return value is False
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value == 0
    return isinstance(value, str) and (
        value.strip() == "" or _ZERO_DURATION_RE.fullmatch(value.strip()) is not None
    )


def _override_sets(overrides: Mapping[str, Any], struct: str, field_name: str) -> bool:
    """Does an override decide ``struct.field`` (including deleting it or the whole struct)?"""
    if struct not in overrides:
        return False
    sub = overrides[struct]
    return sub is None or (isinstance(sub, Mapping) and field_name in sub)


def _carry_fields(
    data: dict[str, Any], source_mode: str, target_mode: str, overrides: Mapping[str, Any]
) -> list[MovedField]:
    """Copy mode-dependent fields into the sub-struct the target mode reads.

    A value already set in the target sub-struct wins, and overrides win over both. The source
    sub-struct keeps its values: kube-proxy ignores them in the target mode, and keeping them
    makes a switch back restore exactly what ran before.
    """
    moved: list[MovedField] = []
    for name in MOVED_FIELDS:
        origin = struct_read_for(name, source_mode)
        destination = struct_read_for(name, target_mode)
        if origin == destination or _override_sets(overrides, destination, name):
            continue
        value = (data.get(origin) or {}).get(name)
        target_struct = dict(data.get(destination) or {})
        if _is_unset(name, value) or not _is_unset(name, target_struct.get(name)):
            continue
        target_struct[name] = copy.deepcopy(value)
        data[destination] = target_struct
        moved.append(MovedField(name, f"{origin}.{name}", f"{destination}.{name}", value))
    return moved


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
    checked = _checked_overrides(overrides, base, target)
    base["mode"] = target
    moved = _carry_fields(base, source.mode, target, checked)
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
