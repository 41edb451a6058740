"""Which ConfigMap key the source kube-proxy really reads: its ``--config`` path, resolved.

kubeadm runs ``--config=/var/lib/kube-proxy/config.conf`` from ConfigMap ``kube-proxy`` key
``config.conf``; EKS runs ``--config=/var/lib/kube-proxy-config/config`` from ConfigMap
``kube-proxy-config`` key ``config`` (ConfigMap ``kube-proxy`` there holds only the
kubeconfig); aks-engine mounts ``kube-proxy-config`` key ``config.yaml`` with a ``subPath``.
Resolving the path through the container's volumeMounts (``subPath``, a directory mount)
and the volume (a plain or projected ConfigMap, with or without ``items``) names exactly
what a policy's ``spec.kubeProxy`` must say, so preflight can say it. Pure.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from proxymode.engine.preflight.text import get_list, get_mapping, get_str

CONFIG_FLAG: Final = "--config"


@dataclass(frozen=True)
class ConfigSource:
    """Where the kube-proxy container's ``--config`` file comes from."""

    path: str
    """The ``--config`` path, as the container sees it."""
    config_map: str | None
    """The ConfigMap behind it; None when the path is not on a ConfigMap volume."""
    key: str | None
    """The ConfigMap key that is the file; None when it cannot be told."""
    volume: str | None = None
    """The pod volume the file is on."""


def config_flag(container: Mapping[str, Any]) -> str | None:
    """The ``--config`` value from command and args (``--config=x`` or ``--config x``)."""
    words = [
        str(w) for w in [*get_list(container.get("command")), *get_list(container.get("args"))]
    ]
    # A shell wrapper (sh -c "exec kube-proxy --config=... ") hides flags in one word.
    words = [part for word in words for part in word.split()]
    for index, word in enumerate(words):
        if word.startswith(f"{CONFIG_FLAG}="):
            return word.split("=", 1)[1].strip("'\"") or None
        if word == CONFIG_FLAG and index + 1 < len(words):
            return words[index + 1].strip("'\"") or None
    return None


def config_source(
    container: Mapping[str, Any], volumes: Sequence[Mapping[str, Any]]
) -> ConfigSource | None:
    """Resolve ``--config`` to a volume and, when that is a ConfigMap, its key; None when the
    container has no ``--config`` (kube-proxy is configured by flags)."""
    path = config_flag(container)
    if path is None:
        return None
    path = posixpath.normpath(path)
    mount, relative = _mount_for(path, container)
    if mount is None:
        return ConfigSource(path, None, None)
    volume_name = get_str(mount.get("name"))
    volume = next((v for v in volumes if get_str(v.get("name")) == volume_name), None)
    if volume is None:
        return ConfigSource(path, None, None, volume_name)
    sub_path = get_str(mount.get("subPath"))
    inside = posixpath.normpath(posixpath.join(sub_path, relative)) if sub_path else relative
    name, key = _file_in(inside, _config_maps(volume))
    return ConfigSource(path, name, key, volume_name)


def _file_in(
    inside: str, sources: list[tuple[str, list[Mapping[str, Any]]]]
) -> tuple[str | None, str | None]:
    """(ConfigMap, key) of the file at ``inside``. A projected volume may merge several
    ConfigMaps: the one that lists the file wins, else the first that writes all its keys."""
    for name, items in sources:
        if items and _key_for(inside, items) is not None:
            return name, _key_for(inside, items)
    for name, items in sources:
        if not items:
            return name, _key_for(inside, items)
    return (sources[0][0], None) if sources else (None, None)


def _mount_for(path: str, container: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, str]:
    """The volumeMount holding ``path`` (the longest mountPath that is it or a parent), and
    the path inside that mount (``""`` when the mount is the file itself)."""
    best: Mapping[str, Any] | None = None
    best_len = -1
    relative = ""
    for mount in get_list(container.get("volumeMounts")):
        if not isinstance(mount, Mapping):
            continue
        mount_path = get_str(mount.get("mountPath"))
        if mount_path is None:
            continue
        mount_path = posixpath.normpath(mount_path)
        if path == mount_path:
            rest = ""
        elif path.startswith(mount_path.rstrip("/") + "/"):
            rest = path[len(mount_path.rstrip("/")) + 1 :]
        else:
            continue
        if len(mount_path) > best_len:
            best, best_len, relative = mount, len(mount_path), rest
    return best, relative


def _config_maps(volume: Mapping[str, Any]) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """(ConfigMap name, items) of a configMap volume or of a projected volume's sources."""
    found: list[tuple[str, list[Mapping[str, Any]]]] = []
    plain = get_mapping(volume, "configMap")
    name = get_str(plain.get("name"))
    if name:
        found.append((name, [i for i in get_list(plain.get("items")) if isinstance(i, Mapping)]))
    for source in get_list(get_mapping(volume, "projected").get("sources")):
        if not isinstance(source, Mapping):
            continue
        projected = get_mapping(source, "configMap")
        projected_name = get_str(projected.get("name"))
        if projected_name:
            items = [i for i in get_list(projected.get("items")) if isinstance(i, Mapping)]
            found.append((projected_name, items))
    return found


def _key_for(inside: str, items: list[Mapping[str, Any]]) -> str | None:
    """The key whose file is ``inside`` the volume: through ``items`` (key -> path), else the
    file name is the key (a ConfigMap volume writes each key as a file of that name)."""
    if not inside or inside == ".":
        return None
    for item in items:
        if posixpath.normpath(str(item.get("path", ""))) == inside:
            return get_str(item.get("key"))
    if items:
        return None  # only the listed keys are in the volume
    return inside if "/" not in inside else None
