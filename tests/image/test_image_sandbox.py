"""The operator image, run by podman against a real API server (the sandbox's).

The container gets the chart's Deployment as far as podman can give it without a kubelet:
its arguments (bind addresses narrowed to loopback, free ports: ``--network=host`` shares
the host's), its environment, its security context, its /tmp emptyDir and memory limit
(tests/image/conftest.py, ``chart_security_flags``); a kubeconfig mounted read-only stands in
for the ServiceAccount mount. It drives an iptables -> ipvs migration, cleanup Jobs included,
to Completed and finalized, serves kopf's liveness endpoint and its own /metrics, and never
logs a traceback or a write refused by the read-only root. The chart's RBAC with the
ServiceAccount token is tests/chart/test_chart_sandbox.py (from the image's virtualenv); the
pod itself on a real node, helm-installed, is tests/image/test_operator_pod.py.
"""

from __future__ import annotations

import shutil
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from proxymode.api import models
from proxymode_sandbox import Sandbox, SandboxConfig
from proxymode_sandbox.process import free_port
from tests.chart.conftest import ROOT, helm_template, run
from tests.chart.test_chart_sandbox import _install_kube_proxy, ipvs_policy
from tests.image.conftest import (
    BuiltImage,
    chart_security_flags,
    deployment_of,
    load_all,
    podman,
)
from tests.sandbox.harness import eventually

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1800)]
G, V, P = models.GROUP, models.VERSION, models.PLURAL


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A real control plane with 2 kwok nodes (one canary) and no Prometheus."""
    state = tmp_path_factory.mktemp("image-sandbox")
    box = Sandbox(
        SandboxConfig(state_dir=state / "state", nodes=2, canary_nodes=1, prometheus=False)
    )
    try:
        box.up()
        yield box
    finally:
        box.down()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback only
        return str(response.read().decode())


def _healthy(url: str) -> bool:
    try:
        _get(url)
    except OSError:
        return False
    return True


@pytest.fixture
def operator_container(
    built_image: BuiltImage, sandbox: Sandbox, bins: Path
) -> Iterator[tuple[str, int, int]]:
    """The operator running in the image: (container name, liveness port, metrics port)."""
    run([bins / "kubectl", f"--kubeconfig={sandbox.kubeconfig}", "apply", "--server-side",
         "-f", ROOT / "crds"])  # fmt: skip
    rendered = load_all(helm_template(bins).stdout)
    deployment = deployment_of(rendered)
    # The chart runs the operator with --peering: it creates its ClusterKopfPeering object
    # itself (the chart renders none), once the peering CRD from crds/ serves.
    run([bins / "kubectl", f"--kubeconfig={sandbox.kubeconfig}", "wait", "--for",
         "condition=established", "--timeout=60s", "crd/clusterkopfpeerings.kopf.dev"])  # fmt: skip
    assert not [o for o in rendered if o and o.get("kind") == "ClusterKopfPeering"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    live, metrics = free_port(), free_port()
    args = [
        a.replace("//0.0.0.0:8080/", f"//127.0.0.1:{live}/").replace(
            "=0.0.0.0:8000", f"=127.0.0.1:{metrics}"
        )
        for a in container["args"]
    ]
    assert f"--liveness=http://127.0.0.1:{live}/healthz" in args
    assert f"--metrics-address=127.0.0.1:{metrics}" in args
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env |= {"POD_ID": "pm-operator-image-test", "POD_NAMESPACE": "default"}
    # A kubeconfig with everything inline, readable by the image's UID, mounted read-only.
    scratch = Path(tempfile.mkdtemp(prefix="proxymode-image-kube-"))
    scratch.chmod(0o755)
    flat = run([bins / "kubectl", f"--kubeconfig={sandbox.kubeconfig}", "config", "view",
                "--flatten", "--minify"]).stdout  # fmt: skip
    (scratch / "kubeconfig").write_text(flat)
    (scratch / "kubeconfig").chmod(0o644)
    name = f"pm-image-{uuid.uuid4().hex[:6]}"
    podman(
        built_image,
        "run",
        "--detach",
        f"--name={name}",
        "--network=host",
        *chart_security_flags(deployment),
        *[f"--env={k}={v}" for k, v in env.items()],
        f"--volume={scratch}:/var/run/proxymode:ro",
        built_image.name,
        *args,
        "--kubeconfig=/var/run/proxymode/kubeconfig",
    )
    try:
        eventually(
            lambda: _running(built_image, name) and _healthy(f"http://127.0.0.1:{live}/healthz"),
            timeout=90,
            what=f"kopf's liveness endpoint in the container (log: {_logs(built_image, name)})",
        )
        yield name, live, metrics
    finally:
        print(f"--- operator log (last 3000 chars) ---\n{_logs(built_image, name)[-3000:]}")
        podman(built_image, "rm", "--force", "--time=10", name, check=False)
        shutil.rmtree(scratch, ignore_errors=True)


def _running(image: BuiltImage, name: str) -> bool:
    state = podman(image, "inspect", "--format", "{{.State.Running}}", name, check=False)
    return state.stdout.strip() == "true"


def _logs(image: BuiltImage, name: str) -> str:
    out = podman(image, "logs", name, check=False)
    return out.stdout + out.stderr


def test_operator_in_the_image_migrates_the_sandbox(
    built_image: BuiltImage, sandbox: Sandbox, operator_container: tuple[str, int, int]
) -> None:
    name, live, metrics = operator_container
    api = config.new_client_from_config(config_file=str(sandbox.kubeconfig))
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    namespace = f"kp-{uuid.uuid4().hex[:6]}"
    nodes = _install_kube_proxy(api, namespace)
    policy = f"image-{uuid.uuid4().hex[:6]}"
    try:
        custom.create_cluster_custom_object(
            G,
            V,
            P,
            ipvs_policy(policy, namespace),
        )

        def status() -> dict[str, Any]:
            return dict(custom.get_cluster_custom_object(G, V, P, policy).get("status") or {})

        done = eventually(
            lambda: status().get("phase") in {"Completed", "Failed", "RolledBack"} and status(),
            timeout=240,
            what=f"policy {policy} to finish (log: {_logs(built_image, name)[-2000:]})",
        )
        assert done["phase"] == "Completed", yaml.safe_dump(done)
        assert done.get("finalized") is True, yaml.safe_dump(done)
        source = core.read_namespaced_config_map("kube-proxy", namespace)
        assert "mode: ipvs" in source.data["config.conf"]
        assert len(nodes) == 2
        # Still alive after the whole run, probes and metrics served from the container.
        assert _running(built_image, name)
        assert _healthy(f"http://127.0.0.1:{live}/healthz")
        assert f'proxymode_policy_phase{{phase="Completed",policy="{policy}"}} 1.0' in _get(
            f"http://127.0.0.1:{metrics}/metrics"
        )
        log = _logs(built_image, name)
        assert "Traceback" not in log, log[-3000:]
        assert "Read-only file system" not in log, log[-3000:]
        # What it wrote: only the chart's emptyDir can take anything; say what is there.
        listing = podman(built_image, "exec", name, "ls", "-A", "/tmp").stdout.split()  # noqa: S108
        print(f"\n[image] /tmp in the operator's container after a migration: {listing}")
    finally:
        custom.delete_cluster_custom_object(G, V, P, policy)
        eventually(
            lambda: (
                not [
                    o
                    for o in custom.list_cluster_custom_object(G, V, P)["items"]
                    if o["metadata"]["name"] == policy
                ]
            ),
            timeout=120,
            what=f"policy {policy} to be released",
        )
        core.delete_namespace(namespace)
