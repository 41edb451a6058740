"""A small kubelet for the sandbox's real nodes (why not virtual-kubelet: decision 0030).

One process serves every real node of one sandbox. For each node it keeps the Node
Ready (conditions with a heartbeat) and renews its Lease in ``kube-node-lease``, as a
kubelet does. For each pod bound to one of its nodes it runs the container as a process
inside the node's network namespace (``podspec``), then reports status the way a kubelet
does: ``Running``; ``Ready`` per the readiness probe (httpGet or tcpSocket) when there is
one, else as soon as the process runs; the restart count; ``CrashLoopBackOff`` with
doubling back-off after an exit under ``restartPolicy: Always``; ``Succeeded`` or
``Failed`` when a ``Never``/``OnFailure`` pod's process ends. A pod being deleted gets
SIGTERM, SIGKILL after its grace period (at most ``MAX_GRACE``), and is then removed.

The fault ``kubelet-down`` (the node's ``sandbox.proxymode.io/fault`` annotation) is a
kubelet that stopped, as ``systemctl stop kubelet`` stops one: the node's status and Lease
are no longer posted, so the node lifecycle controller marks it NotReady after its grace
period; its containers keep running as they were, none is started, stopped or reported,
and a deleted pod stays Terminating. Without the annotation the kubelet is back: it posts
the node at once and reports, starts and stops its pods again.

Back-off starts at 2 s and doubles up to 40 s (the kubelet's is 10 s to 5 min): the
sandbox's crash loops must show within a test's patience, and the shape is the same.

    python -m proxymode_sandbox.kubelet --config DIR/realnodes/kubelet.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from proxymode_sandbox import podrun
from proxymode_sandbox.informer import Informer
from proxymode_sandbox.netns import exec_argv
from proxymode_sandbox.podspec import NodeInfo, PodSpecError, prepare, termination_message
from proxymode_sandbox.probe import Liveness, probe_once
from proxymode_sandbox.realnode import set_blackhole

BACKOFF_START, BACKOFF_MAX = 2.0, 40.0
MAX_GRACE = 30.0
REMOVE_WAIT = 10.0
"""How long a stopped container's `podman run --rm` gets to report its exit code."""
LEASE_SECONDS, LEASE_RENEW, STATUS_EVERY, POLL = 40, 10.0, 30.0, 0.5
FAULT_ANNOTATION = "sandbox.proxymode.io/fault"
KUBELET_DOWN = "kubelet-down"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class PodRun:
    """What the kubelet knows about one pod's (single) container."""

    uid: str
    namespace: str
    name: str
    node: NodeInfo
    pod_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    restarts: int = 0
    ready: bool = False
    waiting: tuple[str, str] | None = None
    terminated: dict[str, Any] | None = None
    last_state: dict[str, Any] = field(default_factory=dict)
    retry_at: float = 0.0
    next_probe: float = 0.0
    probe_failures: int = 0
    phase: str = "Pending"
    stopping: bool = False
    reported: str = ""
    container: str = ""
    """The podman container it runs as (``podrun``); empty: a process (``podspec``)."""
    stopped_code: tuple[subprocess.Popen[bytes], int] | None = None
    """The exit code podman recorded for a container this kubelet stopped, with the
    ``podman run --rm`` process it belongs to: what is reported, not that process's code,
    which is 127 when the container was removed under it before it read the code (a slow,
    loaded machine). Used only for that process: a late answer never lands on the next."""
    liveness: Liveness = field(default_factory=Liveness)


class Kubelet:
    def __init__(
        self,
        api: client.ApiClient,
        nodes: list[NodeInfo],
        bin_dir: Path,
        podman: podrun.Podman | None = None,
    ) -> None:
        # Any: the pods are read as raw JSON, and the typed models' Optionals add nothing here.
        self.core: Any = client.CoreV1Api(api)
        self.leases: Any = client.CoordinationV1Api(api)
        self.nodes = {n.name: n for n in nodes}
        self.bin_dir = bin_dir
        self.pods: dict[str, PodRun] = {}
        self.faults: dict[str, str] = {}
        self.last_lease = self.last_status = 0.0
        self.gone: set[str] = set()
        """Nodes whose Node object was deleted: no longer posted. A kubelet registers its
        node once, at start, and does not make it again; the node lifecycle controller's
        pod GC deletes the pods still bound to it, and this kubelet stops them then."""
        self.podman = podman
        """Set: pods whose image is in the local store run under podman (decision 0066)."""
        # Its nodes and the pods bound to them, from watches (``informer``): the loop reads
        # local copies instead of listing every node and bound pod twice a second.
        self.node_informers = [
            Informer(self.core.list_node, field_selector=f"metadata.name={name}")
            for name in self.nodes
        ]
        self.pod_informers = [
            Informer(self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={name}")
            for name in self.nodes
        ]

    def start(self, timeout: float = 60) -> None:
        """Start the watches; return once each has its first list (or after ``timeout``)."""
        informers = [*self.node_informers, *self.pod_informers]
        for informer in informers:
            informer.start()
        deadline = time.monotonic() + timeout
        for informer in informers:
            informer.wait_synced(max(0.0, deadline - time.monotonic()))

    # -- nodes --

    def heartbeat(self) -> None:
        now = time.monotonic()
        if now - self.last_status >= STATUS_EVERY or not self.last_status:
            for name in self._posted():
                self._for_node(name, self._node_status)
            self.last_status = now
        if now - self.last_lease >= LEASE_RENEW or not self.last_lease:
            for name in self._posted():
                self._for_node(name, self._renew_lease)
            self.last_lease = now

    def _posted(self) -> list[str]:
        return [name for name in self.nodes if name not in self.gone and not self._down(name)]

    def _down(self, node: str) -> bool:
        """The node's kubelet is stopped (the ``kubelet-down`` fault)."""
        return self._fault(node) == KUBELET_DOWN

    def _for_node(self, name: str, post: Callable[[str], None]) -> None:
        """``post`` for one node; a 404 for the node itself means it was deleted. That node
        stops being posted and the others go on: one deleted node used to stop this whole
        loop (its read raised on every pass), and with it every pod of every node."""
        try:
            post(name)
        except ApiException as e:
            if e.status != 404 or self._node_exists(name):
                raise
            self.gone.add(name)
            print(
                f"sandbox kubelet: node {name} was deleted: no longer posting its status or"
                " Lease (a kubelet registers its node only when it starts)",
                flush=True,
            )

    def _node_exists(self, name: str) -> bool:
        try:
            self.core.read_node(name)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def _node_status(self, name: str) -> None:
        stamp = _now()

        def cond(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }

        conditions = [
            cond("Ready", "True", "KubeletReady", "sandbox kubelet is posting ready status"),
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "ok"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "ok"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "ok"),
        ]
        node = self.core.read_node(name)
        for old in node.status.conditions or []:
            for new in conditions:
                if new["type"] == old.type and new["status"] == old.status:
                    new["lastTransitionTime"] = old.last_transition_time.strftime(
                        "%Y-%m-%dT%H:%M:%SZ"
                    )
        self.core.patch_node_status(
            name, {"status": {"conditions": conditions, "phase": "Running"}}
        )

    def _renew_lease(self, name: str) -> None:
        body = {
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": _micro_now(),
            },
        }
        try:
            self.leases.patch_namespaced_lease(name, "kube-node-lease", body)
        except ApiException as e:
            if e.status != 404:
                raise
            if not self._node_exists(name):
                raise  # the node went with its Lease (``_for_node``)
            self.leases.create_namespaced_lease("kube-node-lease", body)

    def _fault(self, node: str) -> str:
        return self.faults.get(node, "")

    def sync_faults(self) -> None:
        """Read each node's fault annotation; put a ``blackhole`` in place or take it away.

        ``blackhole`` is a host firewall that disagrees with kube-proxy: an nftables table
        of the sandbox's own, hooked before NAT, drops everything sent to the Service range.
        ``crash`` makes the node's kube-proxy exit as it starts (``_start``).
        ``kubelet-down`` stops this kubelet for the node (the module's docstring); when it
        goes, the node is posted at once and every pod's status is reported again, as a
        restarted kubelet does (the node lifecycle controller marked them not Ready).
        """
        for node in (n for informer in self.node_informers for n in informer.items()):
            name = node["metadata"]["name"]
            if name not in self.nodes:
                continue
            fault = str((node["metadata"].get("annotations") or {}).get(FAULT_ANNOTATION, ""))
            was = self.faults.get(name, "")
            self.faults[name] = fault
            if (fault == "blackhole") != (was == "blackhole"):
                set_blackhole(self.nodes[name].netns, on=fault == "blackhole")
            if was == KUBELET_DOWN and fault != KUBELET_DOWN:
                print(f"sandbox kubelet: {name}: kubelet back", flush=True)
                self.last_status = self.last_lease = 0.0
                for run in self.pods.values():
                    if run.node.name == name:
                        run.reported = ""
            elif fault == KUBELET_DOWN and was != KUBELET_DOWN:
                print(f"sandbox kubelet: {name}: kubelet down (fault)", flush=True)

    # -- pods --

    def sync_pods(self) -> None:
        if not all(i.synced.is_set() for i in self.pod_informers):
            return  # a pod not listed yet is not a pod gone: nothing is stopped on a guess
        seen = set()
        for pod in (p for informer in self.pod_informers for p in informer.items()):
            node = self.nodes.get(pod["spec"].get("nodeName", ""))
            if node is None:
                continue
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            if self._down(node.name):
                continue  # nothing is started, stopped or reported there
            run = self.pods.get(uid)
            if run is None:
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                run = PodRun(
                    uid,
                    pod["metadata"]["namespace"],
                    pod["metadata"]["name"],
                    node,
                    node.root
                    / "pods"
                    / f"{pod['metadata']['namespace']}_{pod['metadata']['name']}_{uid[:8]}",
                )
                self.pods[uid] = run
            if pod["metadata"].get("deletionTimestamp"):
                self._delete(run, pod)
                continue
            self._step(run, pod)
            self._report(run, pod)
        for uid in list(self.pods):
            if uid not in seen and not self._down(self.pods[uid].node.name):
                self._stop(self.pods.pop(uid), 0.0)

    def _step(self, run: PodRun, pod: dict[str, Any]) -> None:
        policy = pod["spec"].get("restartPolicy", "Always")
        if run.phase in ("Succeeded", "Failed") or run.stopping:
            return
        if run.proc is None:
            if time.monotonic() >= run.retry_at:
                self._start(run, pod)
            return
        code = run.proc.poll()
        if code is not None:
            stopped, run.stopped_code = run.stopped_code, None
            if stopped is not None and stopped[0] is run.proc:
                code = stopped[1]
        if code is None:
            self._probe(run, pod)
            if run.container and run.liveness.failed(pod["spec"]["containers"][0], run.node.ip):
                # As a kubelet does: the container is killed and restarted (a restart counts).
                print(
                    f"sandbox kubelet: {run.name}: liveness probe failed"
                    f" {run.liveness.failures} times in a row; killing the container",
                    flush=True,
                )
                threading.Thread(target=self._stop, args=(run, _grace(pod)), daemon=True).start()
            return
        finished = _now()
        if pod["spec"].get("restartPolicy", "Always") == "Always":
            # An exit a test may have to explain (CI's rehearsal of 3c2b74a: two real
            # kube-proxies restarted before they were ever Ready, their logs gone with the
            # sandbox): what the container said last, in this kubelet's own log.
            said = _tail(run.pod_dir / "container.log", 6)
            print(f"sandbox kubelet: {run.name} exited with code {code}; it said: {said}",
                  flush=True)  # fmt: skip
        state = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": run.started_at,
            "finishedAt": finished,
        }
        message = termination_message(run.pod_dir, pod["spec"]["containers"][0], code)
        if message:
            state["message"] = message
        run.proc, run.ready = None, False
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            run.terminated, run.phase = state, ("Succeeded" if code == 0 else "Failed")
            return
        run.last_state = {"terminated": state}
        run.restarts += 1
        delay = min(BACKOFF_START * 2 ** (run.restarts - 1), BACKOFF_MAX)
        run.retry_at = time.monotonic() + delay
        run.waiting = (
            "CrashLoopBackOff",
            f"back-off {delay:.0f}s restarting failed container (exit code {code})",
        )

    def _start(self, run: PodRun, pod: dict[str, Any]) -> None:
        run.pod_dir.mkdir(parents=True, exist_ok=True)
        try:
            argv, env = self._launch(run, pod)
        except (PodSpecError, ApiException) as e:
            run.waiting = ("CreateContainerConfigError", str(e)[:300])
            run.retry_at = time.monotonic() + BACKOFF_START
            return
        log = run.pod_dir / "container.log"
        with log.open("ab") as out:
            run.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        run.liveness = Liveness.start(pod["spec"]["containers"][0])
        run.started_at, run.waiting, run.phase = _now(), None, "Running"
        run.ready = "readinessProbe" not in pod["spec"]["containers"][0]
        run.next_probe = time.monotonic() + float(
            pod["spec"]["containers"][0].get("readinessProbe", {}).get("initialDelaySeconds", 0)
        )

    def _launch(self, run: PodRun, pod: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        """How to start the pod's container: under podman when its image is in the local
        store and the sandbox asked for it, else as a process in the node's namespace."""
        image = str(pod["spec"]["containers"][0].get("image", ""))
        if self.podman is not None and self.podman.has_image(image):
            run.container = self.podman.container_name(run.uid)
            argv = self.podman.launch(self.core, pod, run.node, run.pod_dir)
            return argv, self.podman.env()
        run.container = ""
        launch = prepare(self.core, pod, run.node, run.pod_dir, self.bin_dir)
        argv = launch.argv
        if self._fault(run.node.name) == "crash" and "kube-proxy" in Path(launch.program).name:
            # The fault, in the node's namespace: kube-proxy's process exits as it starts.
            argv = exec_argv(run.node.netns, ["sh", "-c", "echo 'fault crash: exit 1'; exit 1"])
        return argv, launch.env

    def _probe(self, run: PodRun, pod: dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        probe = container.get("readinessProbe")
        if not probe or time.monotonic() < run.next_probe:
            return
        run.next_probe = time.monotonic() + float(probe.get("periodSeconds", 10))
        ok = probe_once(probe, run.node.ip, container)
        if ok:
            run.probe_failures = 0
            run.ready = True
        else:
            run.probe_failures += 1
            if run.probe_failures >= int(probe.get("failureThreshold", 3)) or not run.ready:
                run.ready = False

    def _delete(self, run: PodRun, pod: dict[str, Any]) -> None:
        if run.stopping:
            return
        run.stopping = True
        grace = _grace(pod)

        def finish() -> None:
            self._stop(run, grace)
            try:
                self.core.delete_namespaced_pod(
                    run.name,
                    run.namespace,
                    grace_period_seconds=0,
                    body=client.V1DeleteOptions(
                        grace_period_seconds=0, preconditions=client.V1Preconditions(uid=run.uid)
                    ),
                )
            except ApiException as e:
                if e.status not in (404, 409):  # gone already, or another pod by that name
                    run.stopping = False  # the next sync asks again
            except (HTTPError, OSError) as e:
                # The API server is away (restarted): the process is stopped, the pod's
                # removal is asked again by the next sync, as a kubelet keeps retrying.
                print(f"sandbox kubelet: removing {run.name} failed, again later: {e}", flush=True)
                run.stopping = False

        threading.Thread(target=finish, daemon=True).start()

    def _stop(self, run: PodRun, grace: float) -> None:
        proc = run.proc
        if run.container and self.podman is not None:
            self.podman.stop(run.container, grace)
            code = self.podman.exit_code(run.container)
            if proc is not None and code is not None:
                run.stopped_code = (proc, code)
            if proc is not None:
                # `podman run --rm` reports the container's exit code, then removes it.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=REMOVE_WAIT)
            if run.proc is proc or run.proc is None:
                # Not once a new container of the same name has started (after a restart's
                # back-off): that one is not this stop's to remove.
                self.podman.remove(run.container)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=max(grace, 0.1))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop_all(self) -> None:
        for run in self.pods.values():
            self._stop(run, 5.0)

    def _report(self, run: PodRun, pod: dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        if run.proc is not None:
            state: dict[str, Any] = {"running": {"startedAt": run.started_at}}
        elif run.terminated is not None:
            state = {"terminated": run.terminated}
        else:
            reason, message = run.waiting or ("ContainerCreating", "")
            state = {"waiting": {"reason": reason, "message": message}}
        ready = run.ready and run.proc is not None
        stamp = _now()
        conditions = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": str(ready)},
            {"type": "Ready", "status": str(ready)},
        ]
        status = {
            "phase": run.phase,
            "hostIP": run.node.ip,
            "hostIPs": [{"ip": run.node.ip}],
            "podIP": run.node.ip,
            "podIPs": [{"ip": run.node.ip}],
            "conditions": conditions,
            "containerStatuses": [
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "containerID": _container_id(run),
                    "ready": ready,
                    "started": run.proc is not None,
                    "restartCount": run.restarts,
                    "state": state,
                    "lastState": run.last_state,
                }
            ],
        }
        key = json.dumps(status, sort_keys=True)
        if key == run.reported:
            return
        for c in conditions:
            c["lastTransitionTime"] = stamp
        status["startTime"] = pod.get("status", {}).get("startTime") or stamp
        with contextlib.suppress(ApiException):
            self.core.patch_namespaced_pod_status(run.name, run.namespace, {"status": status})
            run.reported = key


def _grace(pod: dict[str, Any]) -> float:
    return min(float(pod["spec"].get("terminationGracePeriodSeconds", 30)), MAX_GRACE)


def _container_id(run: PodRun) -> str:
    """``podman://<id>`` for a container, ``sandbox://<pid>`` for a process."""
    if run.proc is None:
        return ""
    return podrun.container_id(run.pod_dir) if run.container else f"sandbox://{run.proc.pid}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", required=True, type=Path)
    args = p.parse_args(argv)
    cfg = json.loads(args.config.read_text())
    api = config.new_client_from_config(config_file=cfg["kubeconfig"])  # type: ignore[no-untyped-call]
    nodes = [NodeInfo(n["name"], n["netns"], n["ip"], Path(n["root"])) for n in cfg["nodes"]]
    images = cfg.get("podman")
    podman = podrun.Podman(images["containersConf"], images["sandbox"]) if images else None
    kubelet = Kubelet(api, nodes, Path(cfg["binDir"]), podman)
    kubelet.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"sandbox kubelet: serving {', '.join(n.name for n in nodes)}", flush=True)
    try:
        while not stop.is_set():
            try:
                kubelet.heartbeat()
                kubelet.sync_faults()
                kubelet.sync_pods()
            except (ApiException, HTTPError, OSError) as e:
                # A kubelet outlives its API server's restarts: say so, and try again.
                print(f"sandbox kubelet: {type(e).__name__}: {e}", flush=True)
            stop.wait(POLL)
    finally:
        kubelet.stop_all()
    return 0


def _tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of ``path`` (empty when it cannot be read)."""
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


if __name__ == "__main__":
    raise SystemExit(main())
