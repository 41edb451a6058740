"""kube-proxy installed exactly as kubeadm installs it.

Mirrors ``cmd/kubeadm/app/phases/addons/proxy/manifests.go``: DaemonSet
``kube-system/kube-proxy`` selected by ``k8s-app: kube-proxy``, ConfigMap
``kube-proxy`` with ``config.conf`` and ``kubeconfig.conf`` mounted at
``/var/lib/kube-proxy``, the ``kube-proxy`` ServiceAccount bound to
``system:node-proxier``, and the Role that lets joining nodes read the ConfigMap.
The operator sees the same shape it meets on a kubeadm cluster.
"""

from __future__ import annotations

import copy
from importlib import resources
from string import Template
from typing import Any

from kubernetes import client

NAMESPACE = "kube-system"
NAME = "kube-proxy"
CONFIG_KEY = "config.conf"
KUBECONFIG_KEY = "kubeconfig.conf"
IMAGE_REPOSITORY = "registry.k8s.io/kube-proxy"

_KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
    server: {server}{tls_server_name}
  name: default
contexts:
- context:
    cluster: default
    namespace: default
    user: default
  name: default
current-context: default
users:
- name: default
  user:
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
"""


def config_conf(mode: str, cluster_cidr: str = "10.244.0.0/16") -> str:
    """The ``config.conf`` kubeadm writes (defaulted KubeProxyConfiguration) in ``mode``."""
    text = resources.files("proxymode_sandbox").joinpath("data/kube-proxy-config.conf").read_text()
    return Template(text).substitute(
        mode=f'"{mode}"' if mode == "" else mode, cluster_cidr=cluster_cidr
    )


def manifests(
    server: str, kubernetes_version: str, mode: str = "iptables", tls_server_name: str = ""
) -> list[dict[str, Any]]:
    """Every object kubeadm's kube-proxy addon phase creates, in apply order.

    ``server`` is the API server as the nodes reach it; ``tls_server_name`` a name in its
    certificate when that address is not (the real nodes' forwarder on the bridge).
    """
    sni = f"\n    tls-server-name: {tls_server_name}" if tls_server_name else ""
    labels = {"k8s-app": NAME}
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubeadm:node-proxier"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:node-proxier",
            },
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [NAME],
                    "verbs": ["get"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Group",
                    "name": "system:bootstrappers:kubeadm:default-node-token",
                }
            ],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"app": NAME}},
            "data": {
                CONFIG_KEY: config_conf(mode),
                KUBECONFIG_KEY: _KUBECONFIG.format(server=server, tls_server_name=sni),
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": dict(labels)},
            "spec": {
                "selector": {"matchLabels": dict(labels)},
                "updateStrategy": {"type": "RollingUpdate"},
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {
                        "priorityClassName": "system-node-critical",
                        "containers": [
                            {
                                "name": NAME,
                                "image": f"{IMAGE_REPOSITORY}:{kubernetes_version}",
                                "imagePullPolicy": "IfNotPresent",
                                "command": [
                                    "/usr/local/bin/kube-proxy",
                                    "--config=/var/lib/kube-proxy/config.conf",
                                    "--hostname-override=$(NODE_NAME)",
                                ],
                                "securityContext": {"privileged": True},
                                "volumeMounts": [
                                    {"mountPath": "/var/lib/kube-proxy", "name": NAME},
                                    {
                                        "mountPath": "/run/xtables.lock",
                                        "name": "xtables-lock",
                                        "readOnly": False,
                                    },
                                    {
                                        "mountPath": "/lib/modules",
                                        "name": "lib-modules",
                                        "readOnly": True,
                                    },
                                ],
                                "env": [
                                    {
                                        "name": "NODE_NAME",
                                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                                    }
                                ],
                            }
                        ],
                        "hostNetwork": True,
                        "serviceAccountName": NAME,
                        "volumes": [
                            {"name": NAME, "configMap": {"name": NAME}},
                            {
                                "name": "xtables-lock",
                                "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"},
                            },
                            {"name": "lib-modules", "hostPath": {"path": "/lib/modules"}},
                        ],
                        "tolerations": [{"operator": "Exists"}],
                        "nodeSelector": {"kubernetes.io/os": "linux"},
                    },
                },
            },
        },
    ]


def install_in(
    api: client.ApiClient,
    namespace: str,
    *,
    mode: str = "iptables",
    affinity: dict[str, Any] | None = None,
    create_namespace: bool = False,
) -> dict[str, dict[str, Any]]:
    """kubeadm's kube-proxy (ServiceAccount, ConfigMap, DaemonSet) in a namespace of its own:
    how the tests and benchmarks give a migration its own kube-proxy in a shared sandbox.

    ``affinity`` replaces the pod template's (where it may run); ``mode`` is the ConfigMap's
    (``""`` as kubeadm leaves it: iptables). The objects are created as they are returned
    (by kind, copies the caller may change); it does not wait for the pods.
    """
    # Any: raw dict bodies, as the manifests are (the typed models add nothing here).
    core: Any = client.CoreV1Api(api)
    apps: Any = client.AppsV1Api(api)
    if create_namespace:
        core.create_namespace({"metadata": {"name": namespace}})
    objs = {o["kind"]: o for o in manifests("https://127.0.0.1:1", "v1.37.2", mode)}
    core.create_namespaced_service_account(namespace, {"metadata": {"name": NAME}})
    cm, ds = objs["ConfigMap"], objs["DaemonSet"]
    cm["metadata"]["namespace"] = ds["metadata"]["namespace"] = namespace
    if affinity is not None:
        ds["spec"]["template"]["spec"]["affinity"] = affinity
    core.create_namespaced_config_map(namespace, copy.deepcopy(cm))
    apps.create_namespaced_daemon_set(namespace, copy.deepcopy(ds))
    return {"ConfigMap": cm, "DaemonSet": ds}
