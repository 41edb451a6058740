"""Bad input to the plugin: one clear line on stderr and exit 1, never a traceback.

No cluster is needed: each case fails before the plugin could talk to one, or talks to a
loopback port where nothing listens (a real refused connection, not a mock).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from proxymode.cli.client import ClientError, Prometheus
from proxymode.cli.main import main
from tests.tools import serving


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


def test_plan_of_a_binary_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "policy.yaml"
    f.write_bytes(b"\xfc\xfd\x00\xff binary")
    assert main(["plan", "-f", str(f)]) == 1
    assert str(f) in _one_error_line(capsys)


def test_plan_of_bad_yaml_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "policy.yaml"
    f.write_text("a: [b\n")
    assert main(["plan", "-f", str(f)]) == 1
    assert "not YAML" in _one_error_line(capsys)


def test_a_kubeconfig_that_is_not_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text("foo: [\n")
    assert main(["--kubeconfig", str(kc), "list"]) == 1
    assert "kubeconfig" in _one_error_line(capsys)


def test_an_api_server_that_does_not_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{_closed_port()}',"
        " insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    assert main(["--kubeconfig", str(kc), "list"]) == 1
    assert "127.0.0.1" in _one_error_line(capsys)


def test_a_prometheus_url_that_does_not_parse() -> None:
    with pytest.raises(ClientError, match="did not answer"):
        Prometheus("http://[::1").instant("up")


ANSWERS: dict[str, tuple[int, str, bytes]] = {
    # What the API server's service proxy says for Prometheus (a Status object) ...
    "/forbidden": (
        403,
        "application/json",
        b'{"kind":"Status","status":"Failure","message":"services \\"prometheus-operated\\"'
        b' is forbidden: cannot get resource \\"services/proxy\\"","code":403}',
    ),
    "/no-endpoint": (
        503,
        "application/json",
        b'{"kind":"Status","status":"Failure","message":"no endpoints available for service'
        b' \\"prometheus-operated\\"","code":503}',
    ),
    # ... a gateway's page, and answers that are JSON but not Prometheus's.
    "/gateway": (502, "text/html", b"<html>Bad Gateway</html>"),
    "/list": (200, "application/json", b"[1, 2]"),
    "/no-data": (200, "application/json", b'{"status":"success"}'),
    "/bad-query": (400, "application/json", b'{"status":"error","error":"parse error at 1"}'),
}


@pytest.fixture(scope="module")
def answering() -> Iterator[str]:
    """A loopback HTTP server that answers every POST by its path's first part (ANSWERS)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            code, kind, body = ANSWERS["/" + self.path.split("/")[1]]
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/forbidden", r"HTTP 403: services .*prometheus-operated.* is forbidden"),
        ("/no-endpoint", r"HTTP 503: no endpoints available"),
        ("/gateway", r"did not answer as Prometheus: HTTP 502 Bad Gateway"),
        ("/list", r"did not answer as Prometheus: HTTP 200"),
        ("/no-data", r"answered without a result"),
        ("/bad-query", r"Prometheus refused the query: parse error at 1"),
    ],
)
def test_what_prometheus_or_the_service_proxy_answers_instead_is_said(
    answering: str, path: str, said: str
) -> None:
    """Every answer that is not a result becomes one ClientError that says what came back
    (the proxy's reason, the HTTP code), never "refused the query: None" or a traceback."""
    with pytest.raises(ClientError, match=said):
        Prometheus(answering + path).instant("up")


GOOD_SPEC = "spec: {targetMode: nftables, stages: [{name: all, percent: 100}]}\n"


def test_plan_refuses_an_apiversion_the_server_does_not_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "policy.yaml"
    head = "apiVersion: proxymode.io/v1beta9\nkind: ProxyModePolicy\nmetadata: {name: x}\n"
    f.write_text(head + GOOD_SPEC)
    assert main(["plan", "-f", str(f)]) == 1
    assert "v1beta9" in _one_error_line(capsys)
    f.write_text("kind: ProxyModePolicy\nmetadata: {name: x}\n" + GOOD_SPEC)
    assert main(["plan", "-f", str(f)]) == 1
    assert "has no apiVersion; use proxymode.io/v1alpha1" in _one_error_line(capsys)


def test_plan_refuses_two_policies_rather_than_planning_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = "apiVersion: proxymode.io/v1alpha1\nkind: ProxyModePolicy\nmetadata: {name: %s}\n"
    f = tmp_path / "policy.yaml"
    f.write_text(one % "a" + GOOD_SPEC + "---\n" + one % "b" + GOOD_SPEC)
    assert main(["plan", "-f", str(f)]) == 1
    assert "plan takes one" in _one_error_line(capsys)


def test_plan_refuses_a_name_the_api_server_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CRD's CEL rule on the name's length, said as the API server says it."""
    name = "a-very-long-policy-name-that-exceeds-forty-chars"
    f = tmp_path / "policy.yaml"
    head = f"apiVersion: proxymode.io/v1alpha1\nkind: ProxyModePolicy\nmetadata: {{name: {name}}}\n"
    f.write_text(head + GOOD_SPEC)
    assert main(["plan", "-f", str(f)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "metadata.name: the policy name must be at most 40 characters" in err, err


def _kubeconfig(path: Path, name: str, port: int) -> Path:
    path.write_text(
        f"apiVersion: v1\nkind: Config\ncurrent-context: {name}\n"
        f"clusters: [{{name: {name}, cluster: {{server: 'https://127.0.0.1:{port}',"
        " insecure-skip-tls-verify: true}}]\n"
        f"users: [{{name: {name}, user: {{token: t}}}}]\n"
        f"contexts: [{{name: {name}, context: {{cluster: {name}, user: {name}}}}}]\n"
    )
    return path


def _plugin(*args: str, kubeconfig: str) -> subprocess.CompletedProcess[str]:
    """The plugin as kubectl runs it: a process of its own ($KUBECONFIG is read at import)."""
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    return subprocess.run(
        [sys.executable, "-m", "proxymode.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_several_kubeconfigs_use_the_context_kubectl_uses(tmp_path: Path) -> None:
    """kubectl takes current-context from the first file that sets it; the Python client
    took the last one's, so the plugin talked to another cluster than kubectl."""
    first_port, second_port = _closed_port(), _closed_port()
    first = _kubeconfig(tmp_path / "first", "first", first_port)
    second = _kubeconfig(tmp_path / "second", "second", second_port)
    files = f"{tmp_path / 'missing'}:{first}:{second}"
    listed = _plugin("list", kubeconfig=files)
    assert listed.returncode == 1, listed
    assert f"port={first_port}" in listed.stderr, listed.stderr
    assert str(second_port) not in listed.stderr, listed.stderr
    chosen = _plugin("--context", "second", "list", kubeconfig=files)  # a flag still wins
    assert f"port={second_port}" in chosen.stderr, chosen.stderr


def test_version_without_a_cluster_still_says_the_plugin_s_own(tmp_path: Path) -> None:
    """As `kubectl version` does: the client's version, then why the server's is missing."""
    done = _plugin("version", kubeconfig=str(tmp_path / "missing"))
    assert done.returncode == 1, done
    assert done.stdout.startswith("plugin:   kubectl-proxymode "), done.stdout
    assert done.stderr.startswith("error: cannot load the kubeconfig"), done.stderr


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: Path) -> None:
    """`kubectl proxymode ... | head -0`: the pipe closes before the plugin writes. It
    ends quietly (an error code, as kubectl does), never with a BrokenPipeError traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the plugin writes a byte
    try:
        done = subprocess.run(
            [sys.executable, "-m", "proxymode.cli.main", "version"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "KUBECONFIG": str(tmp_path / "missing")},
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 1
