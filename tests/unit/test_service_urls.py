"""Which Prometheus URLs an operator outside the cluster sends through the API server's
service proxy, and where to (operator/proxymode/kube/reach.py, decision 0032)."""

from __future__ import annotations

from pathlib import Path

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
    "url",
    [
        "http://127.0.0.1:9090",
        "http://prometheus.example:9090",
        "http://prometheus-operated.monitoring:9090",  # no .svc: not a Service name for sure
        "http://a.b.c.svc:9090",  # a Service name has exactly two labels before .svc
        "ftp://prometheus-operated.monitoring.svc",
    ],
)
def test_other_urls_are_used_as_they_are(url: str) -> None:
    assert reach.service_url(url) is None


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
