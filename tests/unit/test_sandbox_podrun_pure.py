"""Pure parts of running a real node's pod under podman (decision 0066): which images count
as local, and the ``podman run`` flags a pod's spec becomes. The container itself runs in
tests/image/test_operator_pod.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxymode_sandbox import kubelet as kl
from proxymode_sandbox import podrun
from proxymode_sandbox.podspec import NodeInfo, PodSpecError

PODMAN = podrun.Podman(containers_conf="", sandbox="abcde")
LOCAL = "localhost/proxymode/proxymode-operator:0.1.0"
TMP = "/tmp"  # noqa: S108 - the chart's emptyDir mount point, not a file of this test
KUBERNETES = ("10.96.0.1", 443)


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        (LOCAL, LOCAL),
        ("registry.k8s.io/kube-proxy:v1.37.2", "registry.k8s.io/kube-proxy:v1.37.2"),
        ("localhost:5000/kube-proxy:v1", "localhost:5000/kube-proxy:v1"),
        ("proxymode/proxymode-operator:0.1.0", "docker.io/proxymode/proxymode-operator:0.1.0"),
        ("busybox", "docker.io/library/busybox"),
    ],
)  # fmt: skip
def test_an_image_is_read_as_a_cluster_reads_it_not_by_podman_short_name_search(
    image: str, expected: str
) -> None:
    assert podrun.normalized(image) == expected


def test_memory_quantities() -> None:
    assert podrun.quantity_bytes("256Mi") == 256 * 2**20
    assert podrun.quantity_bytes("1G") == 10**9
    assert podrun.quantity_bytes("1000") == 1000


def _pod(container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "op-1", "namespace": "proxymode", "uid": "u-1"},
        "spec": {"nodeName": "general-1", "containers": [container], **spec},
    }


def _node(tmp_path: Path) -> NodeInfo:
    return NodeInfo("general-1", "pm-abcde-general-1", "10.250.62.12", tmp_path / "node")


def _operator() -> dict[str, Any]:
    """The chart's container and pod security context, as rendered."""
    return {
        "name": "operator",
        "image": "localhost/proxymode/proxymode-operator:0.1.0",
        "args": ["--liveness=http://0.0.0.0:8080/healthz", "--peering=$(POD_ID)"],
        "env": [
            {"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "TMPDIR", "value": TMP},
        ],
        "resources": {"limits": {"memory": "256Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [{"name": "tmp", "mountPath": TMP}],
    }


def _argv(tmp_path: Path, pod: dict[str, Any]) -> list[str]:
    pod_dir = tmp_path / "pod"
    pod_dir.mkdir(parents=True, exist_ok=True)
    return podrun.argv(PODMAN, None, pod, _node(tmp_path), pod_dir, kubernetes=KUBERNETES)


def test_the_charts_pod_becomes_podman_flags_in_the_nodes_namespace(tmp_path: Path) -> None:
    psc = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
           "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    pod = _pod(_operator(), securityContext=psc,
               volumes=[{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}])  # fmt: skip
    argv = _argv(tmp_path, pod)
    image = argv.index("localhost/proxymode/proxymode-operator:0.1.0")
    flags, args = argv[:image], argv[image + 1 :]
    assert flags[:3] == ["podman", "run", "--rm"]
    assert "--network=ns:/run/netns/pm-abcde-general-1" in flags
    assert "--name=pm-abcde-u-1" in flags and "--label=io.proxymode.sandbox=abcde" in flags
    for flag in ("--user=10001:10001", "--read-only", "--read-only-tmpfs=false",
                 "--cap-drop=ALL", "--security-opt=no-new-privileges", "--pull=never",
                 f"--memory={256 * 2**20}"):  # fmt: skip
        assert flag in flags, flag
    assert not [f for f in flags if f.startswith(("--cap-add", "--privileged", "--entrypoint"))]
    env = dict(f.removeprefix("--env=").split("=", 1) for f in flags if f.startswith("--env="))
    assert env["POD_ID"] == "op-1" and env["NODE_IP"] == "10.250.62.12"
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("10.96.0.1", "443")
    assert args == ["--liveness=http://0.0.0.0:8080/healthz", "--peering=op-1"]  # $(VAR)
    volumes = [f.removeprefix("--volume=") for f in flags if f.startswith("--volume=")]
    tmp = tmp_path / "pod" / "volumes" / "tmp"
    assert f"{tmp}:/tmp:rw" in volumes
    assert tmp.stat().st_mode & 0o777 == 0o777  # any UID writes an emptyDir
    assert f"{tmp_path / 'pod' / 'termination-log'}:/dev/termination-log:rw" in volumes


def test_the_verify_jobs_pod_keeps_root_with_only_the_capabilities_it_adds(tmp_path: Path) -> None:
    container = {
        "name": "verify",
        "image": "localhost/proxymode/proxymode-operator:0.1.0",
        "command": ["proxymode", "verify-node", "--mode=nftables"],
        "securityContext": {
            "runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]},
        },
    }  # fmt: skip
    argv = _argv(tmp_path, _pod(container, hostNetwork=True))
    assert "--user=0" in argv and "--hostname=general-1" in argv
    caps = [f for f in argv if f.startswith("--cap-")]
    assert caps == ["--cap-drop=ALL", "--cap-add=NET_ADMIN", "--cap-add=NET_RAW"]
    entrypoint = next(f for f in argv if f.startswith("--entrypoint="))
    assert json.loads(entrypoint.removeprefix("--entrypoint=")) == container["command"]
    assert argv[-1] == "localhost/proxymode/proxymode-operator:0.1.0"  # no args: no CMD


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"securityContext": {"runAsNonRoot": True, "runAsUser": 0}}, "runAsNonRoot"),
        ({"envFrom": [{"configMapRef": {"name": "x"}}]}, "envFrom"),
        ({"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
         "secretKeyRef"),
        ({"securityContext": {"seccompProfile": {"type": "Localhost"}}}, "Localhost"),
    ],
)  # fmt: skip
def test_what_the_sandbox_cannot_give_is_refused_with_the_reason(
    tmp_path: Path, change: dict[str, Any], reason: str
) -> None:
    container = {"name": "c", "image": "localhost/x:1", **change}
    with pytest.raises(PodSpecError, match=reason):
        _argv(tmp_path, _pod(container))


class _Proc:
    """A stand-in ``podman run --rm`` process: exits with ``code`` once set."""

    pid = 0

    def __init__(self) -> None:
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code

    def wait(self, timeout: float | None = None) -> int | None:
        return self.code


class _Podman:
    """``podman stop`` ends the process with 127 (removed under it); inspect says 137."""

    def __init__(self, proc: _Proc) -> None:
        self.proc = proc
        self.removed: list[str] = []

    def stop(self, name: str, grace: float) -> None:
        self.proc.code = 127

    def exit_code(self, name: str) -> int | None:
        return 137

    def remove(self, name: str) -> None:
        self.removed.append(name)


def test_a_stopped_container_reports_podman_s_code_and_only_for_its_own_process(
    tmp_path: Path,
) -> None:
    old, new = _Proc(), _Proc()
    k = kl.Kubelet.__new__(kl.Kubelet)
    k.podman = _Podman(old)  # type: ignore[assignment]
    pod: dict[str, Any] = {"spec": {"containers": [{"name": "c", "image": "x"}]}}
    node = NodeInfo(name="n", netns="", ip="127.0.0.1", root=tmp_path)
    run = kl.PodRun("uid", "ns", "p", node, tmp_path, proc=old, container="pm-uid")  # type: ignore[arg-type]
    k._stop(run, 1.0)
    k._step(run, pod)
    assert run.last_state["terminated"]["exitCode"] == 137, "podman's record, not 127"
    assert k.podman.removed == ["pm-uid"]  # type: ignore[attr-defined]
    # A late answer for the old process never lands on the next one.
    run.proc, run.stopped_code = new, (old, 137)  # type: ignore[assignment]
    new.code = 1
    k._step(run, pod)
    assert run.last_state["terminated"]["exitCode"] == 1
