"""Prometheus credentials from Secrets, end to end: TLS with a private CA, basic auth, bearer.

A second real Prometheus runs beside the sandbox's, scraping the same simulated kube-proxies,
but served over HTTPS (a certificate from a CA of the test's own) with basic auth, through
Prometheus's own ``--web.config.file``. Prometheus has no bearer-token check of its own (in
production a proxy in front of it does that, e.g. kube-rbac-proxy or an ingress), so for
the bearer case a small TLS proxy in the test checks ``Authorization: Bearer`` and forwards
to the sandbox's Prometheus. The Secrets are real objects in the operator's namespace, read
by the adapter through the real API server.

- a whole policy is judged through HTTPS + basic auth + CA by the running operator and
  completes on passing rounds;
- the bearer token and the CA reach the proxy, and the query answers;
- wrong credentials, no CA, or a missing Secret key never pass: the round is Inconclusive and
  says why (401, certificate verify failed, the missing key).
"""

from __future__ import annotations

import base64
import http.server
import shutil
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode.api.models import Analysis, ProxyModePolicy
from proxymode.engine.observed import MODE_LABEL, NodeView, Observed
from proxymode.kube.reconcile import Reconciler
from proxymode.kube.rounds import OPERATOR_NAMESPACE_ENV, run_round
from proxymode_sandbox import Sandbox
from proxymode_sandbox.certs import CertificateAuthority
from proxymode_sandbox.process import free_port, stop_popen
from tests.sandbox.harness import STAGES, KubeProxy, Policies, eventually
from tests.tools import serving

OPERATOR_NAMESPACE = "proxymode-system"  # the sandbox's operator runs without POD_NAMESPACE
USER, PASSWORD, TOKEN = "proxymode", "correct horse battery staple", "t0ken-" + "x" * 32
SECRET = "prometheus-credentials"


@dataclass
class Tls:
    """A CA of the test's own and a server certificate for 127.0.0.1 it signed."""

    ca_pem: str
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    ca = CertificateAuthority("proxymode-test-prometheus-ca")
    pair = ca.issue("prometheus", ip_addresses=("127.0.0.1",), server=True)
    cert, key = pair.write(tmp_path_factory.mktemp("prometheus-tls"), "server")
    return Tls(ca.pair.cert_pem.decode(), cert, key)


@pytest.fixture(scope="module")
def secrets(api: client.ApiClient, tls: Tls) -> Iterator[str]:
    """The credentials as one Secret in the operator's namespace (deleted afterwards)."""
    core = client.CoreV1Api(api)
    try:
        core.create_namespace({"metadata": {"name": OPERATOR_NAMESPACE}})
    except ApiException as e:
        if e.status != 409:
            raise
    data = {
        "username": USER,
        "password": PASSWORD,
        "token": TOKEN,
        "wrong-password": "not it",
        "ca.crt": tls.ca_pem,
    }
    core.create_namespaced_secret(
        OPERATOR_NAMESPACE,
        {
            "metadata": {"name": SECRET},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        },
    )
    try:
        yield SECRET
    finally:
        core.delete_namespaced_secret(SECRET, OPERATOR_NAMESPACE)


@pytest.fixture(scope="module")
def secure_prometheus(
    sandbox: Sandbox, tls: Tls, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A real Prometheus on HTTPS with basic auth, scraping what the sandbox's scrapes."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed; `make system-deps` installs it"
    work = tmp_path_factory.mktemp("secure-prometheus")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    web = {
        "tls_server_config": {"cert_file": str(tls.cert), "key_file": str(tls.key)},
        "basic_auth_users": {USER: hashed},
    }
    (work / "web.yml").write_text(yaml.safe_dump(web))
    port = free_port()
    log = (work / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={sandbox.dir / 'prometheus' / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.config.file={work / 'web.yml'}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"https://127.0.0.1:{port}"
    try:
        auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

        def ready() -> bool:
            request = urllib.request.Request(  # noqa: S310 - https, loopback only
                f"{url}/-/ready", headers={"Authorization": auth}
            )
            try:
                with urllib.request.urlopen(  # noqa: S310 - loopback only
                    request, timeout=2, context=tls.client_context()
                ) as response:
                    return bool(response.status == 200)
            except OSError:
                assert proc.poll() is None, (work / "prometheus.log").read_text()
                return False

        eventually(ready, timeout=60, what="the HTTPS Prometheus to be ready")
        yield url
    finally:
        stop_popen(proc)
        log.close()


@pytest.fixture(scope="module")
def bearer_proxy(sandbox: Sandbox, tls: Tls) -> Iterator[str]:
    """HTTPS in front of the sandbox's Prometheus that lets only ``Bearer <TOKEN>`` through."""
    upstream = sandbox.prometheus_url

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self.send_response(401)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"Unauthorized\n")
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            request = urllib.request.Request(  # noqa: S310 - the sandbox's Prometheus
                upstream + self.path,
                data=body,
                headers={"Content-Type": self.headers.get("Content-Type", "")},
            )
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                payload = response.read()
                self.send_response(response.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler, tls.server_context()) as url:
        yield url


def _ref(key: str) -> dict[str, str]:
    return {"name": SECRET, "key": key}


CANARIES = ("canary-1", "canary-2")


def _round(api: client.ApiClient, prometheus: dict[str, Any]) -> tuple[str, str, float | None]:
    """One real analysis round (``rounds.run_round``) with the canaries as the canary group:
    credentials read from the Secrets, the query sent, the check judged."""
    policy = ProxyModePolicy.model_validate(
        {
            "metadata": {"name": "credentials"},
            "spec": {
                "targetMode": "nftables",
                "stages": [{"name": "canary", "percent": 100}],
                "analysis": {
                    "prometheus": prometheus,
                    "windowSeconds": 10,  # past a fresh kube-proxy's slow first syncs
                    "checks": [{"name": "sync-p99", "template": "SyncLatencyP99", "maxSeconds": 1}],
                },
            },
            "status": {"stages": [{"name": "canary", "nodes": list(CANARIES)}]},
        }
    )
    nodes = tuple(NodeView(n, labels={MODE_LABEL: "nftables"}) for n in CANARIES)
    now = datetime.now(UTC)
    (outcome,) = run_round(api, policy, Observed(now=now, generation=1, nodes=nodes), now).checks
    return outcome.verdict, outcome.message, outcome.canary


def _passing_round(
    api: client.ApiClient, prometheus: dict[str, Any], where: str
) -> tuple[str, str, float | None]:
    def passed() -> tuple[str, str, float | None]:
        result = _round(api, prometheus)
        if result[0] != "Pass":
            raise AssertionError(f"not yet: {result}")  # shown as the cause on timeout
        return result

    return eventually(passed, timeout=60, what=f"a passing round {where}")


@pytest.fixture(autouse=True)
def _operator_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OPERATOR_NAMESPACE_ENV, OPERATOR_NAMESPACE)
    # As on many hosts and images: requests would let this win over a session's CA bundle
    # (the adapter passes its CA with every request, so the policy's CA still counts).
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", ssl.get_default_verify_paths().openssl_cafile)


def test_a_service_that_does_not_exist_is_named_not_pasted_as_json(api: client.ApiClient) -> None:
    """An in-cluster URL whose Service is missing: the API server's service proxy answers
    404 with a Status object; the round says its message, not the raw JSON (a review)."""
    verdict, message, _ = _round(api, {"url": "http://prometheus.monitoring.svc:9090"})
    assert verdict == "Inconclusive", message
    assert 'services "prometheus" not found' in message, message
    assert "service proxy" in message and '{"kind"' not in message, message


@pytest.mark.usefixtures("secrets")
def test_bearer_token_and_ca_from_secrets(api: client.ApiClient, bearer_proxy: str) -> None:
    good = {"url": bearer_proxy, "bearerToken": _ref("token"), "ca": _ref("ca.crt")}
    verdict, message, value = _passing_round(api, good, "through the bearer proxy")
    assert value is not None and value < 1, message
    wrong = {**good, "bearerToken": _ref("password")}
    verdict, message, _ = _round(api, wrong)
    assert verdict == "Inconclusive" and "401" in message, message


@pytest.mark.usefixtures("secrets")
def test_basic_auth_and_ca_from_secrets(api: client.ApiClient, secure_prometheus: str) -> None:
    auth = {"username": _ref("username"), "password": _ref("password")}
    good = {"url": secure_prometheus, "basicAuth": auth, "ca": _ref("ca.crt")}
    verdict, message, value = _passing_round(api, good, "on the HTTPS Prometheus")
    assert value is not None and value < 1, message
    cases = {
        "wrong password": (
            {**good, "basicAuth": {**auth, "password": _ref("wrong-password")}},
            "401",
        ),
        "no CA": ({**good, "ca": None}, "CERTIFICATE_VERIFY_FAILED"),
        "no credentials": ({"url": secure_prometheus, "ca": _ref("ca.crt")}, "401"),
        "missing key": ({**good, "ca": _ref("nope")}, "has no key 'nope'"),
    }
    for what, (prometheus, says) in cases.items():
        verdict, message, _ = _round(api, {k: v for k, v in prometheus.items() if v})
        assert verdict == "Inconclusive", (what, message)
        assert says in message, (what, message)


@pytest.mark.usefixtures("operator", "secrets", "sampler")
def test_the_operator_judges_a_policy_through_tls_and_basic_auth(
    secure_prometheus: str, proxy: KubeProxy, policies: Policies
) -> None:
    """The running operator reads the Secrets itself and promotes on passing rounds."""
    prometheus = {
        "url": secure_prometheus,
        "basicAuth": {"username": _ref("username"), "password": _ref("password")},
        "ca": _ref("ca.crt"),
    }
    analysis = {
        "prometheus": prometheus,
        "intervalSeconds": 5,
        "windowSeconds": 10,
        "warmupSeconds": 16,
        "minPassingRounds": 1,
        "checks": [{"name": "sync-p99", "template": "SyncLatencyP99", "maxSeconds": 1}],
    }
    name = policies.create(proxy.namespace, stages=STAGES[:1], analysis=analysis)
    status = policies.wait_phase(name, "Completed", "RolledBack", "Failed", "Paused", timeout=300)
    assert status["phase"] == "Completed", (status.get("message"), status.get("analysis"))
    (check,) = status["analysis"]["checks"]
    assert check["verdict"] == "Pass" and check["canary"] < 1, check


@pytest.mark.usefixtures("secrets")
def test_prometheus_clients_are_kept_per_policy_and_leave_no_ca_file(
    api: client.ApiClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round used to make a client (reading the Secrets again) and leave its CA file."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    unreachable = {"url": "https://127.0.0.1:1", "ca": _ref("ca.crt")}
    _round(api, unreachable)  # a round without a kept client closes the one it made
    assert list(tmp_path.glob("proxymode-ca-*")) == []

    def analysis(prometheus: dict[str, Any]) -> Analysis:
        spec = {
            "prometheus": prometheus,
            "checks": [{"name": "c", "template": "SyncLatencyP99", "maxSeconds": 1}],
        }
        return Analysis.model_validate(spec)

    reconciler = Reconciler(api)
    first = reconciler.prometheus("p", analysis(unreachable))
    assert reconciler.prometheus("p", analysis(unreachable)) is first, "made again"
    assert first.ca_file is not None and Path(first.ca_file).is_file()
    assert len(list(tmp_path.glob("proxymode-ca-*"))) == 1
    changed = reconciler.prometheus("p", analysis({**unreachable, "timeoutSeconds": 7}))
    assert changed is not first, "new settings, same client"
    assert len(list(tmp_path.glob("proxymode-ca-*"))) == 1, "the old client's CA file stayed"
    reconciler.forget("p")
    assert list(tmp_path.glob("proxymode-ca-*")) == []
