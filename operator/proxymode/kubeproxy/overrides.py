"""The policy's ``configOverrides`` merged into a config, and the mode-dependent fields carried.

kube-proxy reads ``syncPeriod``/``minSyncPeriod`` (and, in nftables mode, ``masqueradeAll``/
``masqueradeBit``) only from the sub-struct of its mode (see ``config``); these helpers carry
them across a mode switch unless an override sets them. Pure.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from proxymode.kubeproxy.misplaced import REMOVED_FIELDS, home_for, is_non_field, non_field_home
from proxymode.kubeproxy.schema import (
    IMMUTABLE_BY_OVERRIDES,
    MOVED_FIELDS,
    OVERRIDES_NAME,
    SUB_STRUCT_FIELDS,
    TOP_LEVEL_FIELDS,
    ZERO_DURATION_RE,
    ConfigError,
    MovedField,
    check_feature_gates,
)
from proxymode.kubeproxy.versions import (
    IPTABLES,
    NFTABLES,
)

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


def checked_overrides(
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
    if key in IMMUTABLE_BY_OVERRIDES:
        if value != source.get(key):
            raise ConfigError(f"{path} must not change {key} (got {value!r})")
        return
    _refuse_non_field(str(key), target_mode)
    _require_known(key, TOP_LEVEL_FIELDS | set(source), OVERRIDES_NAME)
    if key == "featureGates":
        check_feature_gates(value, path, allow_none_values=True)
    elif key in SUB_STRUCT_FIELDS and value is not None:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be a mapping of {key} fields, got {value!r}")
        known = SUB_STRUCT_FIELDS[key] | set(source.get(key) or {})
        for sub_key in value:
            _refuse_non_field(f"{key}.{sub_key}", target_mode)
            _require_known(sub_key, known, path)


def _refuse_non_field(path: str, target_mode: str) -> None:
    """A name kube-proxy is known not to read is refused even when the source config has it:
    the override would do nothing (kube-proxy's lenient decoding drops it)."""
    if not is_non_field(path):
        return
    home = non_field_home(path)
    instead = (
        f"; set {OVERRIDES_NAME}.{home_for(home, target_mode)} instead"
        if home is not None
        else f" ({REMOVED_FIELDS[path]})"
    )
    raise ConfigError(
        f"{OVERRIDES_NAME}.{path} is not a KubeProxyConfiguration field kube-proxy reads{instead}"
    )


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
        value.strip() == "" or ZERO_DURATION_RE.fullmatch(value.strip()) is not None
    )


def _override_sets(overrides: Mapping[str, Any], struct: str, field_name: str) -> bool:
    """Does an override decide ``struct.field`` (including deleting it or the whole struct)?"""
    if struct not in overrides:
        return False
    sub = overrides[struct]
    return sub is None or (isinstance(sub, Mapping) and field_name in sub)


def carry_fields(
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
