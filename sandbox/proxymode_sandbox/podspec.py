"""Turn a pod's container into a process inside a real node's network namespace.

What a container runtime would do, done with the host's own tools and the sandbox's
binaries: the pod's volumes become files in the pod's directory (ConfigMaps, Secrets,
the projected ServiceAccount token with ``ca.crt`` and ``namespace``, emptyDirs, and
hostPaths that live in the node's own directory, as each node has its own ``/run``),
and a private mount namespace bind-mounts each onto its ``mountPath``, so the program
reads ``/var/lib/kube-proxy/config.conf`` and its token where the manifest says,
with no path rewritten. The command's first word, when the sandbox built a binary of
that name (``/usr/local/bin/kube-proxy``), is that binary: the image is not pulled.

Mount points that do not exist on this machine are created as empty directories or
files (bind mounts need a target); nothing is written into them outside the pod's
mount namespace.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxymode_sandbox.netns import exec_argv

TOKEN_SECONDS = 3600
TERMINATION_PATH = "/dev/termination-log"
MAX_MESSAGE = 4096
HOST_SHARED_READONLY = ("/lib/modules",)
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class PodSpecError(ValueError):
    """The pod asks for something the sandbox cannot run; the message says what."""


@dataclass(frozen=True)
class NodeInfo:
    name: str
    netns: str
    ip: str
    root: Path
    """This node's own directory: its hostPath volumes live under ``root/host``."""


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    program: str


def prepare(core: Any, pod: dict[str, Any], node: NodeInfo, pod_dir: Path, bin_dir: Path) -> Launch:
    """Materialise the pod's volumes under ``pod_dir`` and return how to start container 0."""
    spec = pod["spec"]
    containers = spec.get("containers", [])
    if len(containers) != 1:
        raise PodSpecError(f"the sandbox runs pods with one container, not {len(containers)}")
    container = containers[0]
    volumes = {v["name"]: _volume(core, pod, v, node, pod_dir) for v in spec.get("volumes", [])}
    env = _env(container, pod, node)
    words = [_expand(w, env) for w in container.get("command", []) + container.get("args", [])]
    if not words:
        raise PodSpecError("the container has no command (the sandbox does not read images)")
    built = bin_dir / Path(words[0]).name
    own = Path(sys.executable).parent / Path(words[0]).name  # the project's venv: proxymode
    words[0] = str(built) if built.is_file() else str(own) if own.is_file() else words[0]
    script = ["set -e"]
    # The termination message: a file of the pod's on the container's path, which the
    # kubelet reads when the process ends (``terminated.message``).
    message = termination_log(pod_dir)
    message.parent.mkdir(parents=True, exist_ok=True)
    message.write_bytes(b"")
    log_target = shlex.quote(container.get("terminationMessagePath") or TERMINATION_PATH)
    # Best effort: a machine where the path cannot be made still runs the pod, without it.
    script.append(
        f"{{ [ -e {log_target} ] || touch {log_target}; "
        f"mount --bind {shlex.quote(str(message))} {log_target}; }} 2>/dev/null || true"
    )
    for mount in container.get("volumeMounts", []):
        source = volumes.get(mount["name"])
        if source is None:
            raise PodSpecError(f"volumeMount {mount['name']!r} names no volume")
        if mount.get("subPath"):
            source = Path(source) / str(mount["subPath"])
        target = shlex.quote(mount["mountPath"])
        if str(source) == mount["mountPath"]:
            continue
        make = "touch" if source.is_file() else "mkdir -p"
        script.append(f"[ -e {target} ] || {make} {target}")
        script.append(f"mount --bind {shlex.quote(str(source))} {target}")
        if mount.get("readOnly"):
            script.append(f"mount -o remount,bind,ro {target}")
    script.append('exec "$@"')
    argv = exec_argv(
        node.netns,
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "; ".join(script)],
    )
    return Launch(argv=[*argv, "sh", *words], env=env, program=words[0])


def termination_log(pod_dir: Path) -> Path:
    return pod_dir / "termination-log"


def termination_message(pod_dir: Path, container: dict[str, Any], code: int) -> str:
    """What a kubelet reports as ``terminated.message``: the file (at most 4096 bytes), or
    with ``FallbackToLogsOnError`` and a failure, the log's tail when the file is empty."""
    path = termination_log(pod_dir)
    text = path.read_bytes()[:MAX_MESSAGE].decode(errors="replace") if path.is_file() else ""
    if text or code == 0 or container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        return text
    log = pod_dir / "container.log"
    tail = log.read_bytes()[-2048:] if log.is_file() else b""
    return tail.decode(errors="replace")


def _volume(
    core: Any,
    pod: dict[str, Any],
    volume: dict[str, Any],
    node: NodeInfo,
    pod_dir: Path,
) -> Path:
    name = str(volume["name"])
    target = pod_dir / "volumes" / name
    ns = pod["metadata"]["namespace"]
    if "configMap" in volume:
        _write_items(target, _config_map(core, ns, volume["configMap"]), volume["configMap"])
    elif "secret" in volume:
        _write_items(target, _secret(core, ns, volume["secret"]), volume["secret"])
    elif "projected" in volume:
        for source in volume["projected"].get("sources", []):
            _write_items(target, _projected(core, pod, source), source)
    elif "emptyDir" in volume:
        target.mkdir(parents=True, exist_ok=True)
    elif "hostPath" in volume:
        return _host_path(volume["hostPath"], node)
    elif "downwardAPI" in volume:
        _write_items(target, _downward(pod, volume["downwardAPI"].get("items", [])), {})
    else:
        kinds = sorted(set(volume) - {"name"})
        raise PodSpecError(f"volume {name!r}: the sandbox cannot provide {kinds}")
    return target


def _write_items(target: Path, data: dict[str, bytes], source: dict[str, Any]) -> None:
    """Write ``data`` (key -> content) into ``target``, honouring a source's ``items``."""
    target.mkdir(parents=True, exist_ok=True)
    body = source.get("configMap") or source.get("secret") or source
    items = body.get("items") if isinstance(body, dict) else None
    paths = {i["key"]: i["path"] for i in items} if items else {k: k for k in data}
    for key, rel in paths.items():
        if key not in data:
            continue
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[key])


def _config_map(core: Any, ns: str, ref: dict[str, Any]) -> dict[str, bytes]:
    cm = core.read_namespaced_config_map(ref["name"], ns)
    return {k: v.encode() for k, v in (cm.data or {}).items()}


def _secret(core: Any, ns: str, ref: dict[str, Any]) -> dict[str, bytes]:
    secret = core.read_namespaced_secret(ref["secretName"], ns)
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def _projected(core: Any, pod: dict[str, Any], source: dict[str, Any]) -> dict[str, bytes]:
    meta = pod["metadata"]
    if "serviceAccountToken" in source:
        sat = source["serviceAccountToken"]
        body = {
            "spec": {
                "audiences": [sat["audience"]] if sat.get("audience") else [],
                "expirationSeconds": max(int(sat.get("expirationSeconds", 0)), TOKEN_SECONDS),
                "boundObjectRef": {"kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
            }
        }
        sa = pod["spec"].get("serviceAccountName") or "default"
        token = core.create_namespaced_service_account_token(sa, meta["namespace"], body)
        return {str(sat.get("path", "token")): str(token.status.token).encode()}
    if "configMap" in source:
        return _config_map(core, meta["namespace"], source["configMap"])
    if "secret" in source:
        return _secret(core, meta["namespace"], {"secretName": source["secret"]["name"]})
    if "downwardAPI" in source:
        return _downward(pod, source["downwardAPI"].get("items", []))
    raise PodSpecError(f"projected source {sorted(source)} is not supported")


def _downward(pod: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, bytes]:
    return {
        i["path"]: _field(pod, i["fieldRef"]["fieldPath"]).encode()
        for i in items
        if "fieldRef" in i
    }


def _host_path(host_path: dict[str, Any], node: NodeInfo) -> Path:
    """Shared read-only system paths come from the machine; the rest is the node's own."""
    path = str(host_path["path"])
    if path in HOST_SHARED_READONLY:
        return Path(path)
    own = node.root / "host" / path.lstrip("/")
    if host_path.get("type") in ("FileOrCreate", "File"):
        own.parent.mkdir(parents=True, exist_ok=True)
        own.touch(exist_ok=True)
    else:
        own.mkdir(parents=True, exist_ok=True)
    return own


def _field(pod: dict[str, Any], path: str, node: NodeInfo | None = None) -> str:
    values = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"]["uid"],
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.hostIP": node.ip if node else "",
        "status.podIP": node.ip if node else "",
    }
    if path not in values:
        raise PodSpecError(f"fieldRef {path!r} is not supported")
    return str(values[path])


def _env(container: dict[str, Any], pod: dict[str, Any], node: NodeInfo) -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "HOME": "/root"}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = _expand(str(item["value"]), env)
        elif "fieldRef" in item.get("valueFrom", {}):
            env[item["name"]] = _field(pod, item["valueFrom"]["fieldRef"]["fieldPath"], node)
    return env


def _expand(word: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (an unknown variable stays as written)."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), word)
