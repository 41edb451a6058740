"""Names of the objects a policy creates, derived from the policy and the source (DESIGN §1).

Kubernetes names are at most 63 characters where they become labels or DNS labels;
long inputs are shortened with a hash suffix so two policies never collide.
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 63
_LABEL_VALUE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def _fit(name: str, limit: int = MAX_NAME) -> str:
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def label_value(value: str) -> str:
    """``value`` as a label value: itself when it is one (at most 63 characters of
    ``[-A-Za-z0-9_.]``, alphanumeric at both ends), else shortened with a hash suffix."""
    if len(value) <= MAX_NAME and _LABEL_VALUE.fullmatch(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:10]
    head = re.sub(r"[^-A-Za-z0-9_.]", "-", value)[: MAX_NAME - 11].strip("-_.")
    return f"{head}-{digest}" if head else digest


def target_daemon_set(source: str, mode: str) -> str:
    """``<source-ds>-<mode>``, e.g. ``kube-proxy-nftables``."""
    return _fit(f"{source}-{mode}")


def target_config_map(source: str, mode: str) -> str:
    """``<source-cm>-<mode>``, e.g. ``kube-proxy-nftables``."""
    return _fit(f"{source}-{mode}", 253)


def backup_config_map(policy: str) -> str:
    """Where the snapshot of what the policy changes is kept: ``proxymode-backup-<policy>``."""
    return _fit(f"proxymode-backup-{policy}", 253)


def cleanup_job(policy: str, node: str) -> str:
    """One cleanup Job per policy and node; the node name is hashed to keep it short."""
    digest = hashlib.sha256(f"{policy}/{node}".encode()).hexdigest()[:10]
    return _fit(f"proxymode-cleanup-{policy}", MAX_NAME - 11) + f"-{digest}"


def verify_job(policy: str, node: str) -> str:
    """One verification Job per policy and node, named like the cleanup Job."""
    digest = hashlib.sha256(f"{policy}/{node}".encode()).hexdigest()[:10]
    return _fit(f"proxymode-verify-{policy}", MAX_NAME - 11) + f"-{digest}"
