"""The sandbox's Prometheus as a cluster knows it: ``monitoring/prometheus-operated``.

The examples, like a real cluster with prometheus-operator (kube-prometheus-stack), name
Prometheus ``http://prometheus-operated.monitoring.svc:9090``. The sandbox's Prometheus is a
host process on loopback, so the sandbox publishes it under that name for real
(docs/decisions/0032-in-cluster-urls-from-outside.md):

- a forwarder on the host side of the sandbox's bridge (``<bridge>.1:9090``), because an
  EndpointSlice may not name a loopback address and kube-apiserver would not proxy to one;
- a Pod object ``prometheus-sandbox-0`` that stands for that process (nothing runs it: its
  scheduler does not exist; its status carries the bridge address), because the API server's
  service proxy forwards only to endpoints that are Pods with that IP, as
  prometheus-operator's are;
- the Service itself, headless and selector-less as prometheus-operator makes it, and an
  EndpointSlice naming the Pod at the bridge address, port ``web``.

An operator outside the cluster (``make run``, the sandbox's own) then reaches the URL
through the API server's service proxy, as it would from a laptop against a real cluster.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

NAMESPACE = "monitoring"
SERVICE = "prometheus-operated"
POD = "prometheus-sandbox-0"
PORT = 9090
PORT_NAME = "web"
STAND_IN_SCHEDULER = "proxymode-sandbox-host"
"""No scheduler has this name: the stand-in Pod is never bound, so no kubelet or kwok runs it."""
URL = f"http://{SERVICE}.{NAMESPACE}.svc:{PORT}"
"""The URL the examples use, as it resolves inside a cluster."""


def objects(ip: str) -> list[dict[str, Any]]:
    """The namespace, stand-in Pod, Service and EndpointSlice for Prometheus at ``ip``."""
    labels = {"app.kubernetes.io/name": "prometheus", "operated-prometheus": "true"}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": POD,
                "namespace": NAMESPACE,
                "labels": labels,
                "annotations": {
                    "sandbox.proxymode.io/stands-for": (
                        f"the sandbox's Prometheus, a host process reached at {ip}:{PORT}"
                    )
                },
            },
            "spec": {
                "schedulerName": STAND_IN_SCHEDULER,
                "containers": [
                    {
                        "name": "prometheus",
                        "image": "prometheus",
                        "ports": [{"name": PORT_NAME, "containerPort": PORT}],
                    }
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "clusterIP": "None",
                "ports": [
                    {"name": PORT_NAME, "port": PORT, "targetPort": PORT_NAME, "protocol": "TCP"}
                ],
            },
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{SERVICE}-sandbox",
                "namespace": NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": SERVICE,
                    "endpointslice.kubernetes.io/managed-by": "sandbox.proxymode.io",
                },
            },
            "addressType": "IPv4",
            "endpoints": [
                {
                    "addresses": [ip],
                    "conditions": {"ready": True},
                    "targetRef": {"kind": "Pod", "namespace": NAMESPACE, "name": POD},
                }
            ],
            "ports": [{"name": PORT_NAME, "port": PORT, "protocol": "TCP"}],
        },
    ]


def pod_status(ip: str) -> str:
    """The stand-in Pod's status (a merge patch): Running and Ready at ``ip``."""
    return json.dumps(
        {
            "status": {
                "phase": "Running",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        }
    )


def publish(
    ip: str,
    apply: Callable[[Iterable[dict[str, Any]]], None],
    kubectl: Callable[..., object],
) -> None:
    """Create the objects and mark the stand-in Pod Running at ``ip``."""
    apply(objects(ip))
    kubectl(
        "patch",
        "pod",
        POD,
        "-n",
        NAMESPACE,
        "--subresource=status",
        "--type=merge",
        "-p",
        pod_status(ip),
    )
