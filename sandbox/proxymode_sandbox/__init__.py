"""The proxymode sandbox: a real Kubernetes control plane on loopback.

It runs the real etcd, kube-apiserver, kube-controller-manager and kube-scheduler
(built from the Kubernetes Go modules by ``sandbox/build-binaries.sh``) with kwok
simulating the nodes and their pods, and installs kube-proxy exactly as kubeadm
does. The demo and the integration tests both run against it, so what they show
is how a real API server, DaemonSet controller and scheduler react.
"""

from proxymode_sandbox.cluster import Sandbox, SandboxConfig, SandboxError

__all__ = ["Sandbox", "SandboxConfig", "SandboxError"]
