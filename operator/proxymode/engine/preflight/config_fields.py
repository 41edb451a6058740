"""Fields of the source config that kube-proxy ignores: say so, with the place that counts.

The seed's IPVS example puts ``strictARP``, ``minSyncPeriod`` and ``syncPeriod`` at the top
level; old EKS configs keep ``resourceContainer`` and ``udpIdleTimeout``. kube-proxy's strict
decoding fails on them and it falls back to lenient decoding, which drops them: the source
runs without them today, and so would the target. The target config keeps them as they are
(proxymode never drops what the source holds), and this finding is why that is not silent.
"""

from __future__ import annotations

from proxymode.api.models import Finding, PolicySpec, Severity
from proxymode.engine.preflight.codes import Code
from proxymode.engine.preflight.text import new_finding
from proxymode.kubeproxy import KubeProxyConfig
from proxymode.kubeproxy.misplaced import misplaced_fields, unknown_fields


def ignored_fields(spec: PolicySpec, source: KubeProxyConfig) -> list[Finding]:
    ref = spec.kube_proxy
    target = str(spec.target_mode)
    data = source.to_dict()
    misplaced = misplaced_fields(data)
    unknown = unknown_fields(data)
    if not misplaced and not unknown:
        return []
    parts = [m.advice(target) for m in misplaced]
    if unknown:
        parts.append(
            f"{', '.join(unknown)} (not KubeProxyConfiguration fields proxymode knows, up to "
            f"kube-proxy 1.37)"
        )
    homes = [m.advice(target) for m in misplaced if m.home is not None]
    todo = (
        " To have them take effect in the target, set them there through spec.configOverrides "
        "(e.g. configOverrides: {ipvs: {strictARP: true}})."
        if homes
        else ""
    )
    return [
        new_finding(
            Severity.WARNING,
            Code.CONFIG_FIELD_IGNORED,
            f"ConfigMap {ref.namespace}/{ref.config_map} key {ref.config_key!r} holds fields "
            f"kube-proxy does not read: {'; '.join(parts)}. kube-proxy's strict decoding fails "
            f"on them and it falls back to lenient decoding, which drops them, so the source "
            f"kube-proxy runs without them; the target config keeps them as they are, with the "
            f"same (no) effect.{todo}",
        )
    ]
