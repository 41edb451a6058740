"""Real Services for the real nodes: ``sandbox/echo`` with real backends, and N more.

- ``echo`` (TCP 80, ClusterIP ``ECHO_CLUSTER_IP``) has ``BACKENDS`` backends, each an
  HTTP listener (``echo``) in a namespace of its own on the bridge, at
  ``10.250.<X>.101`` and up, port 8080, answering with its name (``echo-1`` ...).
- ``svc-00001`` ... (``--services N``, default 100) have EndpointSlices with the same
  backends, so every rule a kube-proxy writes leads somewhere real, and sync cost grows
  with N. Their ClusterIPs come from the API server's allocator in ``10.96.0.0/16``
  (the sandbox's ``--service-cluster-ip-range``); echo's is fixed in the static band.

The Services have no selector: the sandbox writes their EndpointSlices itself
(``endpointslice.kubernetes.io/managed-by: sandbox.proxymode.io``), as there are no pods.

``default/kubernetes`` gets one too (the API server runs with ``--endpoint-reconciler-type
none``): the API server as the real nodes reach it, the forwarder on the bridge, so a
real node's ``10.96.0.1:443`` goes through its kube-proxy's rules to the API server, as on
a cluster (the operator's node verification probes it by default).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from proxymode_sandbox import netns
from proxymode_sandbox.realnode import RealNodes, Starter, _python

NAMESPACE = "sandbox"
ECHO = "echo"
ECHO_CLUSTER_IP = "10.96.0.80"
ECHO_PORT, BACKEND_PORT = 80, 8080
BACKENDS = 3
MANAGED_BY = "sandbox.proxymode.io"
APPLY_CHUNK = 500
MEASURING_PRIORITY = ("nice", "-n", "-10")
"""Echo's backends (and the samplers that ask them) run ahead of the rest of a 2-core machine:
they are the instrument, not what is measured. A node without echo's Service rules fails
whatever the priority. Once, in CI (four sandboxes and their suites on two cores), two nodes
missed answers together for over a second in a walk that moves one node at a time; starved
backends or samplers are the likeliest cause, not proven (tests/sandbox/reach.py now records
what a node shows after each miss). Unprivileged, ``nice`` says it cannot and runs the
command as it is."""


def start_backends(real: RealNodes, start: Starter, count: int = BACKENDS) -> list[str]:
    """Start ``count`` echo listeners, each in its own namespace; returns their IPs."""
    backends = real.state["real"]["backends"]
    ips = []
    for j in range(1, count + 1):
        name = f"{ECHO}-{j}"
        ip = real.bridge.attach(name, "b", j, netns.BACKEND_OCTETS[j - 1], [])
        backends[name] = {"netns": real.bridge.netns(name), "ip": ip}
        start(
            f"backend-{name}",
            netns.exec_argv(
                real.bridge.netns(name),
                [
                    *MEASURING_PRIORITY,
                    *_python(),
                    "proxymode_sandbox.echo",
                    f"--name={name}",
                    f"--listen={ip}:{BACKEND_PORT}",
                    f"--state-dir={real.state_dir}",
                ],
            ),
        )
        ips.append(ip)
    return ips


def service_name(i: int) -> str:
    return f"svc-{i:05d}"


def kubernetes_endpoints(api_ip: str, api_port: int) -> dict[str, Any]:
    """``default/kubernetes``'s EndpointSlice: the API server at ``api_ip:api_port``."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes-real",
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "https", "port": api_port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [api_ip], "conditions": {"ready": True}}],
    }


def objects(backend_ips: list[str], extra: int) -> Iterator[dict[str, Any]]:
    """The namespace, echo and ``extra`` more Services, each with its EndpointSlice."""
    yield {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    yield from _service(ECHO, backend_ips, ECHO_CLUSTER_IP)
    for i in range(1, extra + 1):
        yield from _service(service_name(i), backend_ips, None)


def _service(name: str, ips: list[str], cluster_ip: str | None) -> Iterator[dict[str, Any]]:
    spec: dict[str, Any] = {
        "type": "ClusterIP",
        "ports": [
            {"name": "http", "port": ECHO_PORT, "targetPort": BACKEND_PORT, "protocol": "TCP"}
        ],
    }
    if cluster_ip:
        spec["clusterIP"] = cluster_ip
    yield {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": name}},
        "spec": spec,
    }
    yield {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{name}-real",
            "namespace": NAMESPACE,
            "labels": {
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": BACKEND_PORT, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}} for ip in ips],
    }


def apply(
    apply_objects: Callable[[list[dict[str, Any]]], None], objs: Iterator[dict[str, Any]]
) -> int:
    """Apply in chunks (thousands of Services in one request are slow to validate)."""
    chunk: list[dict[str, Any]] = []
    count = 0
    for obj in objs:
        chunk.append(obj)
        count += obj["kind"] == "Service"
        if len(chunk) >= APPLY_CHUNK:
            apply_objects(chunk)
            chunk = []
    if chunk:
        apply_objects(chunk)
    return count
