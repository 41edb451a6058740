"""The chart against a real API server (the sandbox): what it renders is admitted, and its
RBAC is exactly enough for the operator.

1. For every values set in ci/: the rendered CRDs are applied for real (a dry-run of a
   custom object needs its CRD), then the whole rendering is applied with
   ``kubectl apply --server-side --dry-run=server`` (schema, defaulting and admission run;
   nothing is stored). ServiceMonitor and PrometheusRule are admitted through minimal
   monitoring.coreos.com CRDs (data/monitoring-crds.yaml).
2. The operator runs under the chart's ServiceAccount and nothing else: the chart's RBAC is
   applied for real, a token is minted for the ServiceAccount, and the operator is started from
   the image's virtualenv (the wheel, see test_image.py) with the Deployment's own arguments,
   as UID 10001. It drives an iptables -> ipvs migration (cleanup Jobs included) to Completed,
   finalizes, then handles the policy's deletion; any 403 in its log fails the test.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from proxymode.api import models
from proxymode_sandbox import Sandbox, kubeadm_proxy
from proxymode_sandbox.process import free_port, stop_popen
from tests.chart.conftest import (
    CHART,
    CI_VALUES,
    DATA,
    NAMESPACE,
    RELEASE,
    as_image_user,
    by_kind,
    helm_template,
    image_user_env,
    one,
    run,
)
from tests.sandbox.harness import eventually

pytestmark = pytest.mark.sandbox
G, V, P = models.GROUP, models.VERSION, models.PLURAL
SERVICE_ACCOUNT = "pm-proxymode-operator"


def kubectl(
    box: Sandbox, bins: Path, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return run(
        [bins / "kubectl", f"--kubeconfig={box.kubeconfig}", *args], input=stdin, check=check
    )


def apply_crds_for_real(box: Sandbox, bins: Path, objects: list[dict[str, Any]]) -> None:
    crds = by_kind(objects, "CustomResourceDefinition")
    if not crds:
        return
    kubectl(
        box,
        bins,
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(crds),
    )
    for crd in crds:
        kubectl(
            box,
            bins,
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            f"crd/{crd['metadata']['name']}",
        )


@pytest.fixture(scope="module")
def cluster(sandbox: Sandbox, bins: Path) -> Sandbox:
    """The sandbox with the release namespace and the monitoring CRDs in place."""
    kubectl(sandbox, bins, "create", "namespace", NAMESPACE)
    monitoring = list(yaml.safe_load_all((DATA / "monitoring-crds.yaml").read_text()))
    apply_crds_for_real(sandbox, bins, monitoring)
    return sandbox


@pytest.mark.parametrize("values", CI_VALUES, ids=lambda p: p.name.removesuffix("-values.yaml"))
def test_rendered_chart_passes_server_side_dry_run(
    cluster: Sandbox, bins: Path, values: Path
) -> None:
    rendered = helm_template(bins, values).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    apply_crds_for_real(cluster, bins, objects)
    result = kubectl(
        cluster, bins, "apply", "--server-side", "--dry-run=server", "-f", "-", stdin=rendered
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == len(objects), result.stdout
    assert all("(server dry run)" in line for line in lines), result.stdout


def _healthy(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback only
        return bool(response.status == 200)


@pytest.fixture
def kube_proxy_namespace(cluster: Sandbox) -> Iterator[tuple[str, list[str]]]:
    """A kubeadm-style kube-proxy of its own, Ready on every node: (namespace, nodes)."""
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    namespace = f"kp-{uuid.uuid4().hex[:6]}"
    try:
        yield namespace, _install_kube_proxy(api, namespace)
    finally:
        client.CoreV1Api(api).delete_namespace(namespace)


def helm(box: Sandbox, bins: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run([bins / "helm", f"--kubeconfig={box.kubeconfig}", *args])


@pytest.fixture
def release(
    cluster: Sandbox, bins: Path, kube_proxy_namespace: tuple[str, list[str]]
) -> Iterator[tuple[list[dict[str, Any]], int]]:
    """``helm install`` of the chart (peering on, kube-proxy's namespace set), uninstalled
    after. The Deployment is scaled to 0: kwok nodes run no containers, so the operator runs
    beside the sandbox instead (``operator_as_service_account``), with the Deployment's own
    arguments. Returns the release's manifest (``helm get manifest``) and the liveness port."""
    port = free_port()
    namespace, _ = kube_proxy_namespace
    peering = next(v for v in CI_VALUES if v.name == "peering-on-values.yaml")
    # The CRD is already there from the dry-run tests (applied by kubectl): the release
    # adopts it, as an install over a CRD from a previous install method would.
    helm(
        cluster,
        bins,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--take-ownership",
        "--values",
        str(peering),
        "--set",
        f"liveness.port={port}",
        "--set",
        f"kubeProxy.namespace={namespace}",
        "--set",
        "replicaCount=0",
        "--wait",
        "--timeout=120s",
    )
    try:
        manifest = helm(cluster, bins, "get", "manifest", RELEASE, "--namespace", NAMESPACE)
        yield [o for o in yaml.safe_load_all(manifest.stdout) if o], port
    finally:
        helm(cluster, bins, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")


@pytest.fixture
def operator_as_service_account(
    cluster: Sandbox, bins: Path, image_venv: Path, release: tuple[list[dict[str, Any]], int]
) -> Iterator[tuple[Path, subprocess.Popen[bytes], Path]]:
    """The operator running under the installed release's ServiceAccount token, nothing else:
    (its log, the process, a kubeconfig with that token)."""
    objects, port = release
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 0
    token = kubectl(
        cluster, bins, "create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration=2h"
    ).stdout.strip()
    # Outside pytest's tmp_path: its parents are private to root, and the operator runs as the
    # image's UID.
    scratch = Path(tempfile.mkdtemp(prefix="proxymode-operator-"))
    scratch.chmod(0o777)
    kube = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in kube["users"]:
        user["user"] = {"token": token}
    kubeconfig = scratch / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(kube))
    kubeconfig.chmod(0o644)

    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    # The Deployment's own arguments; only the bind addresses are narrowed to loopback here
    # (the metrics port too: another free one), and --kubeconfig stands in for the in-cluster
    # ServiceAccount mount.
    args = [
        a.replace("//0.0.0.0:", "//127.0.0.1:").replace(
            "--metrics-address=0.0.0.0:8000", f"--metrics-address=127.0.0.1:{free_port()}"
        )
        for a in container["args"]
    ]
    assert any(a.startswith("--peering=") for a in args)
    assert any(a.startswith("--metrics-address=127.0.0.1:") for a in args)
    argv = [str(image_venv / "bin" / "proxymode-operator"), *args, f"--kubeconfig={kubeconfig}"]
    env = image_user_env(
        image_venv, scratch, POD_ID="pm-proxymode-operator-test", POD_NAMESPACE=NAMESPACE
    )
    log = scratch / "operator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(  # the operator exactly as the image runs it, as UID 10001
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd="/",
            **as_image_user(image_venv),
        )
    try:
        path = container["livenessProbe"]["httpGet"]["path"]
        eventually(
            lambda: proc.poll() is None and _healthy(f"http://127.0.0.1:{port}{path}"),
            timeout=60,
            what=f"kopf's liveness endpoint (log: {log.read_text()[-2000:]})",
        )
        yield log, proc, kubeconfig
    finally:
        stop_popen(proc, grace_seconds=30)
        print(f"--- operator log (last 3000 chars) ---\n{log.read_text()[-3000:]}")
        shutil.rmtree(scratch, ignore_errors=True)


def ipvs_policy(name: str, namespace: str) -> dict[str, Any]:
    """An iptables -> ipvs policy over the canary pool, then every node, with short bakes:
    a whole migration, cleanup Jobs included, that the operator under test must finish."""
    return {
        "apiVersion": f"{G}/{V}",
        "kind": models.KIND,
        "metadata": {"name": name},
        "spec": {
            "targetMode": "ipvs",
            "kubeProxy": {"namespace": namespace},
            "readyTimeoutSeconds": 60,
            "stages": [
                {
                    "name": "canary",
                    "nodeSelector": {"matchLabels": {"pool": "canary"}},
                    "bakeSeconds": 1,
                },
                {"name": "all", "percent": 100, "bakeSeconds": 1},
            ],
        },
    }


def _install_kube_proxy(api: client.ApiClient, namespace: str) -> list[str]:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    kubeadm_proxy.install_in(api, namespace, create_namespace=True)
    nodes = sorted(n.metadata.name for n in core.list_node().items)
    eventually(
        lambda: (
            (d := apps.read_namespaced_daemon_set("kube-proxy", namespace).status)
            and d.number_ready == len(nodes) == d.desired_number_scheduled
        ),
        what="the test kube-proxy to be Ready on every node",
    )
    return nodes


def test_operator_under_chart_rbac_migrates_and_releases_with_no_forbidden(
    cluster: Sandbox,
    bins: Path,
    kube_proxy_namespace: tuple[str, list[str]],
    operator_as_service_account: tuple[Path, subprocess.Popen[bytes], Path],
) -> None:
    log, proc, token_kubeconfig = operator_as_service_account
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    namespace, nodes = kube_proxy_namespace
    name = f"rbac-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(
        G,
        V,
        P,
        ipvs_policy(name, namespace),
    )

    def status() -> dict[str, Any]:
        return dict(custom.get_cluster_custom_object(G, V, P, name).get("status") or {})

    done = eventually(
        lambda: status().get("phase") in {"Completed", "Failed", "RolledBack"} and status(),
        timeout=240,
        what=f"policy {name} to finish",
    )
    assert done["phase"] == "Completed", done.get("message")
    assert done["finalized"] is True
    assert sum(len(s["nodes"]) for s in done["stages"]) == len(nodes)
    assert proc.poll() is None, "the operator is still running"
    # kopf's and the engine's Events for a cluster-scoped policy land in "default".
    reasons = {
        e.reason
        for e in core.list_namespaced_event("default").items
        if e.involved_object.name == name
    }
    assert {"RolloutStarted", "Completed"} <= reasons

    custom.delete_cluster_custom_object(G, V, P, name)

    def gone() -> bool:
        try:
            custom.get_cluster_custom_object(G, V, P, name)
        except ApiException as e:
            return e.status == 404
        return False

    eventually(gone, timeout=120, what="the policy's finalizer to be released")

    text = log.read_text()
    # A refusal shows as an HTTP 403 line (urllib3), kopf's APIForbiddenError, or kopf's
    # "Not enough permissions" fallback warnings.
    refusal = re.compile(r'HTTP/1\.1" 403 |status=403|APIForbiddenError|Not enough permissions')
    found = refusal.search(text)
    assert found is None, (
        f"refused in the operator log: {text[found.start() - 300 : found.end() + 600]}"
    )
    # The run went through every write the ClusterRole grants (the log is --verbose).
    seen = {
        (method, resource)
        for method, resource in _requests(text)
        if resource in {"jobs", "nodes", "daemonsets", "configmaps", "events", "status"}
    }
    assert {
        ("POST", "jobs"),
        ("DELETE", "jobs"),
        ("PATCH", "nodes"),
        ("PATCH", "daemonsets"),
        ("DELETE", "daemonsets"),
        ("POST", "configmaps"),
        ("PATCH", "configmaps"),
        ("DELETE", "configmaps"),
        ("PATCH", "status"),
    } <= seen, sorted(seen)

    # Not excessive: the same token, used for real, is refused outside what it needs.
    as_operator = config.new_client_from_config(config_file=str(token_kubeconfig))
    refused = {
        "patch the DaemonSet kube-system/kube-proxy": lambda: client.AppsV1Api(
            as_operator
        ).patch_namespaced_daemon_set(
            "kube-proxy", "kube-system", {"metadata": {"labels": {"x": "y"}}}
        ),
        "create a DaemonSet in default": lambda: client.AppsV1Api(
            as_operator
        ).create_namespaced_daemon_set("default", TINY_DAEMON_SET),
        "create a ConfigMap in default": lambda: client.CoreV1Api(
            as_operator
        ).create_namespaced_config_map("default", {"metadata": {"name": "x"}}),
        "read a Secret in kube-system": lambda: client.CoreV1Api(
            as_operator
        ).list_namespaced_secret("kube-system"),
        "delete a node": lambda: client.CoreV1Api(as_operator).delete_node(nodes[0]),
    }
    for what, attempt in refused.items():
        with pytest.raises(ApiException) as caught:
            attempt()
        assert caught.value.status == 403, (what, caught.value.status)

    # A policy for a kube-proxy outside the granted namespaces: refused by RBAC, said in
    # status and in a Warning Event, and nothing is changed.
    outside = f"rbac-out-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(
        G,
        V,
        P,
        {
            "apiVersion": f"{G}/{V}",
            "kind": models.KIND,
            "metadata": {"name": outside},
            "spec": {
                "targetMode": "nftables",
                "kubeProxy": {"namespace": "kube-system"},
                "stages": [{"name": "all", "percent": 100}],
            },
        },
    )
    try:
        said = eventually(
            lambda: (
                (custom.get_cluster_custom_object(G, V, P, outside).get("status") or {}).get(
                    "message"
                )
                or ""
            ),
            timeout=60,
            what="the operator to report the refusal",
        )
        assert said.startswith("not allowed to read what this policy needs:"), said
        assert "kube-system" in said and "forbidden" in said, said
        status = custom.get_cluster_custom_object(G, V, P, outside)["status"]
        assert status.get("phase", "Pending") == "Pending", status
        # Degraded for this generation, before any look could set observedGeneration (what
        # Argo CD's health script and `kubectl wait --for=condition=Degraded` read).
        (flag,) = [c for c in status["conditions"] if c["type"] == "Degraded"]
        assert (flag["status"], flag["reason"], flag["observedGeneration"]) == (
            "True",
            "Forbidden",
            1,
        ), flag
        assert "observedGeneration" not in status, status
        ds = client.AppsV1Api(api).read_namespaced_daemon_set("kube-proxy", "kube-system")
        assert "proxymode.io/mode" not in str(ds.spec.template.spec.affinity), "untouched"
        warnings = [
            e.reason
            for e in core.list_namespaced_event("default").items
            if e.involved_object.name == outside and e.type == "Warning"
        ]
        assert "Forbidden" in warnings
    finally:
        custom.delete_cluster_custom_object(G, V, P, outside)
        eventually(
            lambda: (
                outside
                not in {
                    o["metadata"]["name"]
                    for o in custom.list_cluster_custom_object(G, V, P)["items"]
                }
            ),
            timeout=120,
            what="the refused policy to go",
        )


def _requests(log: str) -> set[tuple[str, str]]:
    """(method, resource) of the API requests urllib3 logged; a subresource counts as itself
    (PATCH /apis/proxymode.io/v1alpha1/proxymodepolicies/p/status -> ("PATCH", "status"))."""
    out = set()
    for match in re.finditer(r'"(GET|POST|PATCH|PUT|DELETE) (/[^ ?"]+)', log):
        method, path = match.groups()
        parts = path.strip("/").split("/")
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            rest = rest[2:]
        if rest:
            out.add((method, rest[2] if len(rest) >= 3 else rest[0]))
    return out


TINY_DAEMON_SET = {
    "metadata": {"name": "x"},
    "spec": {
        "selector": {"matchLabels": {"app": "x"}},
        "template": {
            "metadata": {"labels": {"app": "x"}},
            "spec": {"containers": [{"name": "x", "image": "x"}]},
        },
    },
}
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


@pytest.fixture(scope="module")
def peering_chart(cluster: Sandbox, bins: Path) -> list[dict[str, Any]]:
    """The chart rendered with peering on, its CRDs in place: the authorizer answers "no"
    for a resource the server does not serve (run alone, no other test had put them in)."""
    peering = [v for v in CI_VALUES if v.name == "peering-on-values.yaml"]
    objects = [o for o in yaml.safe_load_all(helm_template(bins, *peering).stdout) if o]
    apply_crds_for_real(cluster, bins, objects)
    return objects


def _authorizer_caught_up(cluster: Sandbox, bins: Path, who: str) -> None:
    """Wait until the API server's RBAC authorizer has the objects just applied: it reads
    them from its own informer, a moment behind the write (a CI run saw "no" for the
    first case right after an apply that re-created the Role). One grant of the
    ClusterRole and one of the namespaced Role must answer "yes" first."""
    probes = (["patch", "nodes"], ["get", "secrets", "-n", NAMESPACE])
    deadline = time.monotonic() + 30
    while True:
        answers = [
            kubectl(cluster, bins, "auth", "can-i", *p, who, check=False).stdout.strip()
            for p in probes
        ]
        if answers == ["yes", "yes"] or time.monotonic() > deadline:
            return
        time.sleep(0.2)


@pytest.mark.parametrize(
    "case",
    [
        ("get", "secrets", NAMESPACE, True),
        ("list", "secrets", NAMESPACE, False),
        ("get", "secrets", "kube-system", False),
        ("get", "secrets", "default", False),
        ("patch", "nodes", "", True),
        ("delete", "nodes", "", False),
        ("create", "nodes", "", False),
        ("delete", "pods", "kube-system", False),
        ("update", "daemonsets.apps", "kube-system", False),
        ("patch", "daemonsets.apps", "kube-system", True),
        ("create", "daemonsets.apps", "kube-system", True),
        ("patch", "daemonsets.apps", "default", False),
        ("create", "daemonsets.apps", "default", False),
        ("delete", "daemonsets.apps", "default", False),
        ("list", "daemonsets.apps", "default", True),
        ("create", "configmaps", "default", False),
        ("create", "jobs.batch", "default", False),
        ("list", "pods", "default", False),
        ("create", "events", "default", True),
        ("patch", "proxymodepolicies.proxymode.io/status", "", True),
        ("delete", "proxymodepolicies.proxymode.io", "", False),
        ("patch", "clusterkopfpeerings.kopf.dev", "", True),
        ("create", "clusterkopfpeerings.kopf.dev", "", True),  # made when missing
        ("get", "clusterkopfpeerings.kopf.dev", "", True),  # read first at start
        ("escalate", "clusterroles.rbac.authorization.k8s.io", "", False),
    ],
    ids=lambda c: f"{c[0]}-{c[1]}-{c[2] or 'cluster'}",
)
def test_service_account_can_and_cannot(
    cluster: Sandbox,
    bins: Path,
    peering_chart: list[dict[str, Any]],
    case: tuple[str, str, str, bool],
) -> None:
    """What the API server's authorizer answers for the chart's ServiceAccount (peering on)."""
    verb, resource, namespace, allowed = case
    objects = [o for o in peering_chart if o["kind"] in RBAC_KINDS]
    kubectl(cluster, bins, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(objects))
    who = f"--as=system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
    _authorizer_caught_up(cluster, bins, who)
    args = ["auth", "can-i", verb, resource, who]
    if namespace:
        args += ["-n", namespace]
    result = kubectl(cluster, bins, *args, check=False)
    expected = "yes" if allowed else "no"
    assert result.stdout.strip() == expected, (args, result.stdout, result.stderr)
