"""Pods whose image is in the local image store run as containers, under podman (0066).

Opt-in per sandbox (``SandboxConfig.containers_conf``): the kubelet then asks, for each
pod it starts, whether the container's image is in the local podman store, the reference
read as a cluster's runtime reads it (``normalized``: ``localhost/proxymode/...`` is the
image ``images/build.sh`` made; a short name is Docker Hub's, so podman's short-name search
never turns a pod that runs as a process today into a container). Such a container runs as
a kubelet would run it:

- ``podman run`` with runc, joined to the node's network namespace
  (``--network ns:/run/netns/<node's namespace>``): the pod's IP is the node's, as for
  every pod of a real node; everything else (mounts, PIDs, UTS, IPC) is the container's own;
- the pod's and the container's ``securityContext`` merged: ``runAsUser``/``runAsGroup``
  (``--user``), ``runAsNonRoot`` checked as a kubelet does, ``readOnlyRootFilesystem``
  (``--read-only``, no tmpfs of podman's own), ``capabilities`` drop/add,
  ``allowPrivilegeEscalation: false`` (``no-new-privileges``), ``privileged``, the seccomp
  profile; the memory limit;
- ``command`` replaces the image's ENTRYPOINT (and drops its CMD), ``args`` its CMD, with
  ``$(VAR)`` expansion; env values and the downward-API ``fieldRef``s, plus
  ``KUBERNETES_SERVICE_HOST``/``_PORT`` of the ``default/kubernetes`` Service, as a kubelet
  sets them: an in-cluster client reaches the API server through the ClusterIP that the
  node's own kube-proxy programs;
- the volumes ``podspec`` materialises (the projected ServiceAccount token from the
  TokenRequest API with ``ca.crt`` and ``namespace``, ConfigMaps, Secrets, downward API,
  hostPaths of the node's own directory) bind-mounted at their ``mountPath``; an emptyDir
  is a directory of the pod's (mode 0777, as a kubelet makes it), or a tmpfs with
  ``medium: Memory``; the termination-message file on ``terminationMessagePath``.

Every container is labelled with the sandbox's id, so ``down`` removes what is left of them
even after the kubelet died (``remove_all``).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxymode_sandbox import podspec
from proxymode_sandbox.podspec import NodeInfo, PodSpecError

SANDBOX_LABEL = "io.proxymode.sandbox"
POD_UID_LABEL = "io.proxymode.pod-uid"
NETNS_DIR = Path("/run/netns")
CIDFILE = "container.id"
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}


@dataclass(frozen=True)
class Podman:
    """podman with the image build's ``containers.conf`` (runc, ulimits the host allows)."""

    containers_conf: str
    sandbox: str
    """The sandbox's id (``netns.sandbox_id``): a label on every container it runs."""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "CONTAINERS_CONF"}
        return {**env, "CONTAINERS_CONF": self.containers_conf} if self.containers_conf else env

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args],
            capture_output=True,
            text=True,
            check=False,
            env=self.env(),
            timeout=timeout,
        )

    def has_image(self, image: str) -> bool:
        """Whether ``image`` names an image of the local store, read as containerd reads it
        (``normalized``): podman's own short-name search is not asked."""
        return bool(image) and self.run("image", "exists", normalized(image)).returncode == 0

    def container_name(self, uid: str) -> str:
        return f"pm-{self.sandbox}-{uid}"

    def launch(self, core: Any, pod: dict[str, Any], node: NodeInfo, pod_dir: Path) -> list[str]:
        """``podman run`` for the pod (``argv``), once what is left of an earlier run is gone."""
        self.run(
            "rm", "--force", "--ignore", "--time", "0", self.container_name(pod["metadata"]["uid"])
        )
        service = core.read_namespaced_service("kubernetes", "default")
        kubernetes = (str(service.spec.cluster_ip), int(service.spec.ports[0].port))
        return argv(self, core, pod, node, pod_dir, kubernetes=kubernetes)

    def stop(self, name: str, grace: float) -> None:
        """SIGTERM (the image's stop signal), SIGKILL after ``grace``. Not removed here:
        ``podman run --rm`` reads the exit code and then removes it; a container removed
        under it first makes it exit 127 ("cannot get exit code"), not the container's own
        code (137 after a SIGKILL)."""
        seconds = str(max(int(grace), 0))
        self.run("stop", "--ignore", "--time", seconds, name, timeout=grace + 60)

    def remove(self, name: str) -> None:
        """Remove it, stopped or not: what ``podman run --rm`` has not removed itself."""
        self.run("rm", "--force", "--ignore", "--time", "0", name)

    def remove_all(self) -> list[str]:
        """Remove every container of this sandbox, running or not; returns their names."""
        listed = self.run(
            "ps", "--all", "--filter", f"label={SANDBOX_LABEL}={self.sandbox}",
            "--format", "{{.Names}}",
        )  # fmt: skip
        names = listed.stdout.split() if listed.returncode == 0 else []
        for name in names:
            self.run("rm", "--force", "--time", "0", name)
        return names

    def exit_code(self, name: str) -> int | None:
        """The exit code of a container that has exited; None while it runs or once gone."""
        found = self.inspect(name)
        state = (found or {}).get("State", {})
        if state.get("Running", True) or "ExitCode" not in state:
            return None
        return int(state["ExitCode"])

    def inspect(self, name: str) -> dict[str, Any] | None:
        out = self.run("container", "inspect", name)
        if out.returncode != 0:
            return None
        found: list[dict[str, Any]] = json.loads(out.stdout or "[]")
        return found[0] if found else None


def container_id(pod_dir: Path) -> str:
    """``podman://<id>``, from the cidfile ``podman run`` writes; empty until it has."""
    cid = pod_dir / CIDFILE
    return f"podman://{cid.read_text().strip()}" if cid.is_file() else ""


def normalized(image: str) -> str:
    """The reference as a cluster's runtime reads it: a name without a registry part is
    Docker Hub's (``kube-proxy:v1`` is ``docker.io/library/kube-proxy:v1``,
    ``proxymode/proxymode-operator:0.1.0`` is ``docker.io/proxymode/...``), never the
    ``localhost/`` image podman's short-name search would find."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return image
    return f"docker.io/{image}" if slash else f"docker.io/library/{image}"


def argv(
    podman: Podman,
    core: Any,
    pod: dict[str, Any],
    node: NodeInfo,
    pod_dir: Path,
    *,
    kubernetes: tuple[str, int],
) -> list[str]:
    """``podman run ...`` for the pod's one container, its volumes materialised first."""
    spec = pod["spec"]
    containers = spec.get("containers", [])
    if len(containers) != 1:
        raise PodSpecError(f"the sandbox runs pods with one container, not {len(containers)}")
    container = containers[0]
    uid = pod["metadata"]["uid"]
    netns = NETNS_DIR / node.netns
    name = podman.container_name(uid)
    env = _env(container, pod, node, kubernetes)
    flags = [
        "run", "--rm", "--pull=never", f"--name={name}", f"--network=ns:{netns}",
        f"--label={SANDBOX_LABEL}={podman.sandbox}", f"--label={POD_UID_LABEL}={uid}",
        f"--hostname={node.name if spec.get('hostNetwork') else pod['metadata']['name']}",
        f"--cidfile={pod_dir / CIDFILE}",
    ]  # fmt: skip
    (pod_dir / CIDFILE).unlink(missing_ok=True)
    flags += _security(pod, container, podman)
    flags += _mounts(core, pod, container, node, pod_dir)
    limit = (container.get("resources") or {}).get("limits", {}).get("memory")
    if limit:
        flags.append(f"--memory={quantity_bytes(str(limit))}")
    flags += [f"--env={k}={v}" for k, v in env.items()]
    words_cmd = [podspec._expand(w, env) for w in container.get("command", [])]
    words_args = [podspec._expand(w, env) for w in container.get("args", [])]
    if words_cmd:
        flags.append(f"--entrypoint={json.dumps(words_cmd)}")
    return ["podman", *flags, str(container["image"]), *words_args]


def _merged_security(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    pod_sc = pod["spec"].get("securityContext") or {}
    own = container.get("securityContext") or {}
    shared = ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile")
    return {**{k: pod_sc[k] for k in shared if k in pod_sc}, **own}


def _security(pod: dict[str, Any], container: dict[str, Any], podman: Podman) -> list[str]:
    sc = _merged_security(pod, container)
    flags: list[str] = []
    user = sc.get("runAsUser")
    if sc.get("runAsNonRoot") and not _non_root(user, str(container["image"]), podman):
        raise PodSpecError(
            "container has runAsNonRoot and its user is root (the kubelet refuses it too)"
        )
    if user is not None:
        group = sc.get("runAsGroup")
        flags.append(f"--user={user}" + (f":{group}" if group is not None else ""))
    elif sc.get("runAsGroup") is not None:
        raise PodSpecError("runAsGroup without runAsUser is not supported by the sandbox")
    if sc.get("privileged"):
        flags.append("--privileged")
    if sc.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--read-only-tmpfs=false"]
    caps = sc.get("capabilities") or {}
    flags += [f"--cap-drop={c}" for c in caps.get("drop", [])]
    flags += [f"--cap-add={c}" for c in caps.get("add", [])]
    if sc.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    seccomp = (sc.get("seccompProfile") or {}).get("type", "RuntimeDefault")
    if seccomp == "Unconfined":
        flags.append("--security-opt=seccomp=unconfined")
    elif seccomp != "RuntimeDefault":
        raise PodSpecError(f"seccompProfile {seccomp!r} is not supported by the sandbox")
    return flags


def _non_root(user: object, image: str, podman: Podman) -> bool:
    """What the kubelet checks for ``runAsNonRoot``: the UID, or the image's numeric USER."""
    if user is not None:
        return int(str(user)) != 0
    out = podman.run("image", "inspect", "--format", "{{.Config.User}}", image)
    name = out.stdout.strip().split(":", 1)[0]
    return name.isdigit() and int(name) != 0


def _mounts(
    core: Any, pod: dict[str, Any], container: dict[str, Any], node: NodeInfo, pod_dir: Path
) -> list[str]:
    volumes = {str(v["name"]): v for v in pod["spec"].get("volumes", [])}
    flags: list[str] = []
    sources: dict[str, Path] = {}
    for name, volume in volumes.items():
        empty = volume.get("emptyDir")
        if empty is not None and empty.get("medium") == "Memory":
            continue  # a tmpfs, at each mount below
        sources[name] = podspec._volume(core, pod, volume, node, pod_dir)
        if empty is not None:
            sources[name].chmod(0o777)  # as the kubelet makes an emptyDir: any UID writes
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"])
        if volume is None:
            raise PodSpecError(f"volumeMount {mount['name']!r} names no volume")
        target = str(mount["mountPath"])
        if mount["name"] not in sources:
            size = volume["emptyDir"].get("sizeLimit")
            options = "rw,nosuid,nodev" + (f",size={quantity_bytes(str(size))}" if size else "")
            flags.append(f"--tmpfs={target}:{options}")
            continue
        source = sources[mount["name"]]
        if mount.get("subPath"):
            source = source / str(mount["subPath"])
        options = "ro" if mount.get("readOnly") else "rw"
        flags.append(f"--volume={source}:{target}:{options}")
    message = podspec.termination_log(pod_dir)
    message.parent.mkdir(parents=True, exist_ok=True)
    message.write_bytes(b"")
    message.chmod(0o666)  # the container's user writes it, whatever its UID
    path = container.get("terminationMessagePath") or podspec.TERMINATION_PATH
    flags.append(f"--volume={message}:{path}:rw")
    return flags


def _env(
    container: dict[str, Any], pod: dict[str, Any], node: NodeInfo, kubernetes: tuple[str, int]
) -> dict[str, str]:
    """The container's environment: the kubelet's Service variables, then its own ``env``."""
    host, port = kubernetes
    env = {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        "KUBERNETES_PORT": f"tcp://{host}:{port}",
    }
    for item in container.get("env", []):
        source = item.get("valueFrom") or {}
        if "value" in item:
            env[item["name"]] = podspec._expand(str(item["value"]), env)
        elif "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            env[item["name"]] = podspec._field(pod, path, node)
        elif source:
            raise PodSpecError(f"env {item['name']!r}: {sorted(source)} is not supported")
        else:
            env[item["name"]] = ""
    if container.get("envFrom"):
        raise PodSpecError("envFrom is not supported by the sandbox")
    return env


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (``64Mi``, ``1G``, ``1000``) in bytes."""
    for suffix, factor in _UNITS.items():
        if quantity.endswith(suffix):
            return int(float(quantity.removesuffix(suffix)) * factor)
    return int(quantity)


def describe(argv_: list[str]) -> str:
    """The command line, for the pod's log (a person can run it by hand)."""
    return shlex.join(argv_)
