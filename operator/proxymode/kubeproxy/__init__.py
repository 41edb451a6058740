"""kube-proxy knowledge, pure: its configuration file and what each version can run.

``config`` parses a KubeProxyConfiguration and derives the one for another mode; ``versions``
says which modes a release has, which feature gates they need, which kernels they accept and
which switches need an explicit cleanup. Nothing here talks to a cluster.
"""

from proxymode.kubeproxy.config import (
    ConfigError,
    KubeProxyConfig,
    MovedField,
    TargetConfig,
    parse_config,
    render_target_config,
    with_mode,
)
from proxymode.kubeproxy.versions import (
    MODES,
    KubeVersion,
    ModeSupport,
    cleanup_needed,
    kernel_supports,
    minimum_kernel,
    mode_support,
    parse_version,
    version_from_image,
)

__all__ = [
    "MODES",
    "ConfigError",
    "KubeProxyConfig",
    "KubeVersion",
    "ModeSupport",
    "MovedField",
    "TargetConfig",
    "cleanup_needed",
    "kernel_supports",
    "minimum_kernel",
    "mode_support",
    "parse_config",
    "parse_version",
    "render_target_config",
    "version_from_image",
    "with_mode",
]
