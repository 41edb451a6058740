"""In-cluster Service URLs from outside the cluster, through the API server's service proxy.

A policy names Prometheus as the cluster sees it,
``http://prometheus-operated.monitoring.svc:9090``. In a pod that name resolves; an operator
run elsewhere (``make run``, a laptop against a real cluster, the sandbox's own) cannot
resolve it. Such an operator sends the same request to

    <API server>/api/v1/namespaces/monitoring/services/http:prometheus-operated:9090/proxy/...

with its own kubeconfig credentials: the API server forwards it to one of the Service's
ready endpoints. Why this and not something else
(docs/decisions/0032-in-cluster-urls-from-outside.md): it is Kubernetes' own, works against
any cluster the kubeconfig reaches (the endpoints need not be routable from here), and needs
only ``get`` on ``services/proxy``.

What it cannot do: carry Prometheus's own credentials. The API server takes the
``Authorization`` header as its own and removes it before forwarding, so a policy with
``bearerToken`` or ``basicAuth`` is refused here with a message that says so; and the hop
from the API server to Prometheus is not verified against the policy's ``ca``.

When: a URL whose host is ``NAME.NAMESPACE.svc`` (optionally followed by the cluster
domain, ``.cluster.local``), or the short ``NAME.NAMESPACE`` that a pod's DNS search path
completes (``http://prometheus.monitoring:9090``, Flagger's own default) when this machine
cannot resolve it, while the operator is not in a pod (no ``KUBERNETES_SERVICE_HOST``).
``PROXYMODE_SERVICE_PROXY=off`` turns it off (the name resolves here, e.g. through a VPN
into the cluster network).
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
from kubernetes import client

SWITCH_ENV = "PROXYMODE_SERVICE_PROXY"
_SERVICE_HOST = re.compile(
    r"^(?P<name>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.(?P<namespace>[a-z0-9]([-a-z0-9]*[a-z0-9])?)"
    r"\.svc(\.[a-z0-9.-]+)?\.?$"
)
_SHORT_SERVICE_HOST = re.compile(
    r"^(?P<name>[a-z]([-a-z0-9]*[a-z0-9])?)\.(?P<namespace>[a-z0-9]([-a-z0-9]*[a-z0-9])?)\.?$"
)
"""``NAME.NAMESPACE``: a Service only if it does not resolve here (``prometheus.io`` is a
public name of the same shape); a Service name starts with a letter (DNS-1035)."""


def resolves(host: str) -> bool:
    """Whether this machine's resolver knows ``host``."""
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return True


@dataclass(frozen=True)
class ServiceURL:
    """An ``http(s)://NAME.NAMESPACE.svc[.domain][:PORT]/path`` URL, taken apart."""

    scheme: str
    namespace: str
    name: str
    port: int
    path: str

    def through(self, api_server: str) -> str:
        """The same URL through ``api_server``'s service proxy."""
        return (
            f"{api_server.rstrip('/')}/api/v1/namespaces/{self.namespace}/services/"
            f"{self.scheme}:{self.name}:{self.port}/proxy{self.path}"
        )


def service_url(url: str, *, known: Callable[[str], bool] = resolves) -> ServiceURL | None:
    """The in-cluster Service ``url`` names, or None for any other URL.

    ``known`` says whether a short ``NAME.NAMESPACE`` host resolves here: one that does is
    used as it is (a VPN's search domain, a public name), one that does not is taken for
    the Service a pod's search path would make of it."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https"):
        return None
    match = _SERVICE_HOST.match(host)
    if match is None:
        match = _SHORT_SERVICE_HOST.match(host)
        if match is None or known(host.rstrip(".")):
            return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return ServiceURL(parts.scheme, match["namespace"], match["name"], port, parts.path.rstrip("/"))


def use_service_proxy(url: str, *, in_pod_too: bool = False) -> ServiceURL | None:
    """The Service to reach through the API server, when this process must (see module).

    ``in_pod_too``: for a client whose kubeconfig may name another cluster than the pod it
    runs in (the plugin in a CI pod): the name would resolve, in the wrong cluster."""
    if os.environ.get(SWITCH_ENV) == "off":
        return None
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not in_pod_too:
        return None
    return service_url(url)


def api_server_session(api: client.ApiClient, session: requests.Session) -> bool | str:
    """Give ``session`` the kubeconfig's credentials for the API server; returns what
    ``verify`` must be on each request (the API server's CA, or False when the kubeconfig
    says insecure)."""
    cfg = api.configuration
    if cfg.cert_file and cfg.key_file:
        session.cert = (cfg.cert_file, cfg.key_file)
    # The client keeps a kubeconfig's token (plain, exec plugin, OIDC) under "BearerToken";
    # "authorization" is the older name. Read through the hook, so exec plugins refresh it.
    token = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    if token:
        session.headers["Authorization"] = token
    if not cfg.verify_ssl:
        return False
    return str(cfg.ssl_ca_cert) if cfg.ssl_ca_cert else True


class PrometheusAnswerError(RuntimeError):
    """What came back instead of a Prometheus result, as a phrase whose subject is
    Prometheus ("did not answer: HTTP 404: ...", "refused the query: ...")."""


def prometheus_data(response: requests.Response) -> dict[str, Any]:
    """The ``data`` of a Prometheus API answer, or ``PrometheusAnswerError`` saying what came
    back instead: the service proxy's Status (403 without ``get`` on ``services/proxy``, 404
    for a missing Service, 503 with no endpoint), Prometheus's own refusal (a bad query), a
    gateway's page, JSON that is not Prometheus's. The operator's rounds and the plugin read
    answers through this one function."""
    code = f"HTTP {response.status_code}"
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise PrometheusAnswerError(
            f"did not answer as Prometheus: {code} {response.reason}: {response.text[:200]!r}"
        )
    if body.get("kind") == "Status":
        said = body.get("message") or body.get("reason") or "no message"
        raise PrometheusAnswerError(
            f"did not answer: {code}: {said} (said the API server's service proxy)"
        )
    if body.get("status") == "error":
        said = f"{body.get('errorType', '')} {body.get('error', '')}".strip()
        raise PrometheusAnswerError(f"refused the query: {said} ({code})")
    data = body.get("data")
    if body.get("status") != "success" or not isinstance(data, dict):
        raise PrometheusAnswerError(f"answered without a result: {body!r:.200}")
    return data
