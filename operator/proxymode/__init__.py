"""proxymode: move a cluster's kube-proxy between iptables, ipvs and nftables, safely.

The package is layered (see docs/architecture.md): ``api`` holds the
ProxyModePolicy models and CRD generation, ``engine`` is the pure rollout core,
``kube`` and ``prometheus`` are thin adapters, and ``handlers`` is the kopf shell.
"""

__version__ = "0.1.0"
