"""Fields a KubeProxyConfiguration carries that kube-proxy does not read, and where they belong.

kube-proxy decodes its config file strictly first; when that fails on an unknown field it
logs the error and decodes again leniently, which drops every unknown field. So a config
with ``strictARP: true`` at the top level (as a widely copied IPVS example has it) runs
without strict ARP, and one with ``minSyncPeriod: 2s`` at the top level runs with the
default. Old configs also keep fields that were removed: ``resourceContainer`` (gone in
1.16) and ``udpIdleTimeout`` (only the userspace proxier read it; removed with it in 1.26).

The operator keeps such fields where they are (it never drops what the source holds, and
kube-proxy ignores them in the target just as it does in the source), but it says so, with
the place that would take effect; ``configOverrides`` refuses them (``overrides``). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from proxymode.kubeproxy.schema import SUB_STRUCT_FIELDS, TOP_LEVEL_FIELDS
from proxymode.kubeproxy.versions import IPTABLES, IPVS, NFTABLES

MODE_PLACEHOLDER: Final = "<mode>"
"""Stands for the sub-struct of the mode kube-proxy runs in (``iptables``, ``ipvs``...)."""

TOP_LEVEL_HOMES: Final[Mapping[str, str]] = {
    "strictARP": "ipvs.strictARP",
    "scheduler": "ipvs.scheduler",
    "excludeCIDRs": "ipvs.excludeCIDRs",
    "tcpTimeout": "ipvs.tcpTimeout",
    "tcpFinTimeout": "ipvs.tcpFinTimeout",
    "syncPeriod": f"{MODE_PLACEHOLDER}.syncPeriod",
    "minSyncPeriod": f"{MODE_PLACEHOLDER}.minSyncPeriod",
    "masqueradeAll": f"{MODE_PLACEHOLDER}.masqueradeAll",
    "masqueradeBit": f"{MODE_PLACEHOLDER}.masqueradeBit",
    "localhostNodePorts": "iptables.localhostNodePorts",
    "maxPerCore": "conntrack.maxPerCore",
    "tcpBeLiberal": "conntrack.tcpBeLiberal",
}
"""Top-level names that are fields of a sub-struct (where kube-proxy reads them)."""

REMOVED_FIELDS: Final[Mapping[str, str]] = {
    "resourceContainer": "removed in kube-proxy 1.16; kube-proxy runs in its pod's cgroup",
    "udpIdleTimeout": "read only by the userspace proxier, removed with it in 1.26",
    "conntrack.max": "no longer a field; conntrack.maxPerCore and conntrack.min size the table",
    "ipvs.masqueradeAll": "never an ipvs field; ipvs mode reads iptables.masqueradeAll",
    "ipvs.masqueradeBit": "never an ipvs field; ipvs mode reads iptables.masqueradeBit",
    "nftables.localhostNodePorts": "nftables mode has no localhost NodePorts",
}
"""Fields with no place to go: removed from kube-proxy, or never in that sub-struct."""


@dataclass(frozen=True)
class Misplaced:
    """One field kube-proxy ignores: where it is, what it holds, and where it would count."""

    path: str
    """Dotted path where it is, e.g. ``strictARP`` or ``ipvs.masqueradeAll``."""
    value: Any
    home: str | None
    """Where kube-proxy reads it in the mode the sentence is about; None: nowhere."""
    why: str
    """Why it has no effect where it is, in words."""

    def advice(self, mode: str) -> str:
        """``strictARP: true (set ipvs.strictARP)`` or ``resourceContainer (...removed...)``."""
        if self.home is None:
            return f"{self.path} ({self.why})"
        return f"{self.path}: {_text(self.value)} (set {home_for(self.home, mode)} instead)"


def home_for(home: str, mode: str) -> str:
    """The home with ``<mode>`` filled in: the sub-struct ``mode`` reads (conversion.go)."""
    if not home.startswith(MODE_PLACEHOLDER):
        return home
    field_name = home.removeprefix(f"{MODE_PLACEHOLDER}.")
    if field_name in ("masqueradeAll", "masqueradeBit"):
        struct = NFTABLES if mode == NFTABLES else IPTABLES
    else:
        struct = mode if mode in (IPTABLES, IPVS, NFTABLES) else IPTABLES
    return f"{struct}.{field_name}"


def misplaced_fields(data: Mapping[str, Any]) -> list[Misplaced]:
    """The fields of ``data`` that kube-proxy ignores and that proxymode knows to be misplaced
    or removed, in the order they appear. Names it does not know at all are not listed here
    (a newer kube-proxy may have them): see :func:`unknown_fields`."""
    found: list[Misplaced] = []
    for key, value in data.items():
        if key in TOP_LEVEL_FIELDS:
            sub = value if isinstance(value, Mapping) else {}
            for sub_key, sub_value in sub.items():
                path = f"{key}.{sub_key}"
                if path in REMOVED_FIELDS:
                    found.append(Misplaced(path, sub_value, None, REMOVED_FIELDS[path]))
            continue
        if key in TOP_LEVEL_HOMES:
            found.append(Misplaced(key, value, TOP_LEVEL_HOMES[key], "not a top-level field"))
        elif key in REMOVED_FIELDS:
            found.append(Misplaced(key, value, None, REMOVED_FIELDS[key]))
    return found


def unknown_fields(data: Mapping[str, Any]) -> list[str]:
    """Dotted names in ``data`` that are neither KubeProxyConfiguration fields (up to 1.37)
    nor known misplaced ones."""
    known_misplaced = {m.path for m in misplaced_fields(data)}
    out: list[str] = []
    for key, value in data.items():
        if not isinstance(key, str):
            out.append(str(key))
            continue
        if key not in TOP_LEVEL_FIELDS:
            if key not in known_misplaced:
                out.append(key)
            continue
        if key in SUB_STRUCT_FIELDS and isinstance(value, Mapping):
            for sub_key in value:
                path = f"{key}.{sub_key}"
                if sub_key not in SUB_STRUCT_FIELDS[key] and path not in known_misplaced:
                    out.append(path)
    return out


def is_non_field(path: str) -> bool:
    """Is ``path`` a name proxymode knows kube-proxy does not read (misplaced or removed)?"""
    return path in TOP_LEVEL_HOMES or path in REMOVED_FIELDS


def non_field_home(path: str) -> str | None:
    """Where a known non-field belongs (``<mode>`` unresolved), None when nowhere."""
    return TOP_LEVEL_HOMES.get(path)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
