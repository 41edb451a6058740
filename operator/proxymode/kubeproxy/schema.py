"""The KubeProxyConfiguration itself: the fields kube-proxy knows, parsing and checking it.

Unknown fields of the source config are kept untouched: kube-proxy grows fields every release,
and the operator must never drop what it does not understand. Pure.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from proxymode.kubeproxy.versions import (
    IPTABLES,
    IPVS,
    NFTABLES,
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
IMMUTABLE_BY_OVERRIDES: Final = ("apiVersion", "kind")
ZERO_DURATION_RE: Final = re.compile(r"(?:0+(?:\.0*)?(?:ns|us|µs|ms|s|m|h))+|0+")


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
    return _parse_text(text)


@functools.lru_cache(maxsize=64)
def _parse_text(text: str) -> KubeProxyConfig:
    """The parse itself, remembered by text: the engine reads the same source config, and
    reads back the same derived one, on every look, and YAML dominated a look's time. Safe
    to share: a KubeProxyConfig hands out copies only. A ConfigError is not remembered."""
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
    check_feature_gates(data.get("featureGates"), "featureGates", allow_none_values=False)


def check_feature_gates(gates: Any, path: str, *, allow_none_values: bool) -> None:
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
