"""Which Prometheus URLs an operator outside the cluster sends through the API server's
service proxy, and where to (operator/proxymode/kube/reach.py, decision 0032)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
import yaml
from kubernetes import config

from proxymode.kube import reach

API = "https://127.0.0.1:6443"


@pytest.mark.parametrize(
    ("url", "proxied"),
    [
        (
            "http://prometheus-operated.monitoring.svc:9090",
            f"{API}/api/v1/namespaces/monitoring/services/http:prometheus-operated:9090/proxy",
        ),
        (
            "https://thanos-query.obs.svc.cluster.local/prom/",
            f"{API}/api/v1/namespaces/obs/services/https:thanos-query:443/proxy/prom",
        ),
        ("http://vm.metrics.svc.", f"{API}/api/v1/namespaces/metrics/services/http:vm:80/proxy"),
    ],
)
def test_a_service_url_goes_through_the_service_proxy(url: str, proxied: str) -> None:
    service = reach.service_url(url)
    assert service is not None
    assert service.through(API + "/") == proxied


@pytest.mark.parametrize(
    ("url", "proxied"),
    [
        (
            "http://prometheus-operated.monitoring:9090",
            f"{API}/api/v1/namespaces/monitoring/services/http:prometheus-operated:9090/proxy",
        ),
        (
            "https://vm.metrics./select",
            f"{API}/api/v1/namespaces/metrics/services/https:vm:443/proxy/select",
        ),
    ],
)
def test_a_short_service_name_that_does_not_resolve_here_goes_through_the_proxy(
    url: str, proxied: str
) -> None:
    """``NAME.NAMESPACE`` is what a pod's search path completes (Flagger's default URL is
    ``http://prometheus.istio-system:9090``): from outside, unresolved, it is that Service;
    resolved (a VPN's search domain, a public name of that shape) it is used as it is."""
    asked: list[str] = []

    def unknown(host: str) -> bool:
        asked.append(host)
        return False

    service = reach.service_url(url, known=unknown)
    assert service is not None
    assert service.through(API) == proxied
    assert asked == [(urlsplit(url).hostname or "").rstrip(".")]
    assert reach.service_url(url, known=lambda _host: True) is None


def test_the_resolver_is_asked_for_real() -> None:
    """``resolves`` is the machine's resolver: loopback's name resolves, a name under the
    reserved ``.invalid`` top-level domain never does (RFC 2606)."""
    assert reach.resolves("localhost")
    assert not reach.resolves("prometheus.invalid")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9090",
        "http://9prometheus.monitoring:9090",  # a Service name starts with a letter
        "http://prometheus.monitoring.example:9090",  # three labels, no .svc
        "http://a.b.c.svc:9090",  # a Service name has exactly two labels before .svc
        "ftp://prometheus-operated.monitoring.svc",
    ],
)
def test_other_urls_are_used_as_they_are(url: str) -> None:
    assert reach.service_url(url, known=lambda _host: False) is None


def test_in_a_pod_or_switched_off_the_url_is_used_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "http://prometheus-operated.monitoring.svc:9090"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv(reach.SWITCH_ENV, raising=False)
    assert reach.use_service_proxy(url) is not None
    monkeypatch.setenv(reach.SWITCH_ENV, "off")
    assert reach.use_service_proxy(url) is None
    monkeypatch.delenv(reach.SWITCH_ENV)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert reach.use_service_proxy(url) is None
    # A client whose kubeconfig may name another cluster (the plugin in a CI pod) goes
    # through the API server all the same, unless switched off.
    assert reach.use_service_proxy(url, in_pod_too=True) is not None
    monkeypatch.setenv(reach.SWITCH_ENV, "off")
    assert reach.use_service_proxy(url, in_pod_too=True) is None


def test_a_token_kubeconfig_s_token_goes_with_the_proxied_request(tmp_path: Path) -> None:
    """The kubernetes client keeps a kubeconfig's token under "BearerToken": read under
    the old name, "authorization", it was missing, and every proxied query of a cluster
    with token logins (EKS, GKE, OIDC, ServiceAccount tokens) went without credentials."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": API}}],
                "users": [{"name": "u", "user": {"token": "s3cret-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    session = requests.Session()
    verify = reach.api_server_session(api, session)
    assert session.headers["Authorization"] == "Bearer s3cret-token"
    assert verify is True and session.cert is None
