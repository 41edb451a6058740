"""P1: the node walk done by a bare watch-driven script vs the operator, side by side.

    PROXYMODE_SANDBOX_NODE_NET=127.0.46 .venv/bin/python -m benchmarks.walk \
        [--before main] [--nodes 6] [--rounds 2]

One sandbox (``--nodes`` kwok nodes), one fresh kube-proxy namespace per run, alternating
in one run: the bare script, the operator at ``--before`` (a git revision, ``git archive``
into a temporary directory) and this worktree's operator. The operator runs a policy with
one stage over every node, ``bakeSeconds: 0`` and no analysis; the script does the same
walk with the engine's own objects (``engine.objects``: the target pair, the source
patched to ``OnDelete`` and ``NotIn [target, switching]``), one node at a time as
``maxUnavailable: 1`` does, and waits for each step by watching pods:

- forward: each node labelled ``switching`` until its source pod is gone, then
  ``<target>`` until its target pod is Ready; done when every node is;
- fold back: the source ConfigMap gets the target config, each node ``switching`` until its
  target pod is gone, then unlabelled until a source pod is Ready on it, the source's own
  spec restored and rolled out, the target pair deleted.

Forward is timed from the policy's creation to every node on a Ready target pod; the whole
run to ``Completed`` (finalized). The script's times are the floor of the mechanism.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from benchmarks.wakeups import _checkout
from proxymode.engine import naming, objects
from proxymode.engine.observed import MODE_LABEL, SWITCHING
from proxymode.kubeproxy.config import render_target_config
from proxymode.kubeproxy.schema import parse_config
from proxymode_sandbox import Sandbox, SandboxConfig
from proxymode_sandbox import process as proc
from tests.sandbox.harness import KubeProxy, Policies, eventually, install_kube_proxy

ROOT = Path(__file__).resolve().parents[1]
MODE = "nftables"
Pod = Any


def _ready(pod: Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


class PodWatch:
    """Waits on the kube-proxy pods of one namespace with a watch (no polling)."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace

    def until(self, done: Callable[[dict[str, Pod]], bool], timeout: float = 120) -> None:
        listed = self.core.list_namespaced_pod(self.namespace)
        pods = {p.metadata.name: p for p in listed.items}
        if done(pods):
            return
        stream = watch.Watch()
        deadline = time.monotonic() + timeout
        for event in stream.stream(
            self.core.list_namespaced_pod,
            self.namespace,
            resource_version=listed.metadata.resource_version,
            timeout_seconds=int(timeout),
        ):
            pod = event["object"]
            if event["type"] == "DELETED":
                pods.pop(pod.metadata.name, None)
            else:
                pods[pod.metadata.name] = pod
            if done(pods) or time.monotonic() > deadline:
                stream.stop()
                break
        if not done(pods):
            raise TimeoutError("the pods never got there")


def _on(pods: dict[str, Pod], node: str, prefix: str) -> list[Pod]:
    return [
        p
        for p in pods.values()
        if p.spec.node_name == node
        and p.metadata.name.startswith(prefix)
        and not p.metadata.deletion_timestamp
    ]


def _sources(pods: dict[str, Pod], node: str, target_prefix: str) -> list[Pod]:
    return [
        p for p in _on(pods, node, "kube-proxy-") if not p.metadata.name.startswith(target_prefix)
    ]


def _source_gone(node: str, target: str) -> Callable[[dict[str, Pod]], bool]:
    return lambda pods: (
        not [
            p
            for p in pods.values()
            if p.spec.node_name == node and not p.metadata.name.startswith(target)
        ]
    )


def install_target_pair(
    core: client.CoreV1Api,
    apps: client.AppsV1Api,
    ns: str,
    sources: tuple[dict[str, Any], dict[str, Any]],
    *,
    text: str,
    mode: str,
) -> None:
    """What the operator's setup does, by hand: the target ConfigMap and DaemonSet (the
    engine's own objects, owned by no policy) and the source patched to ``OnDelete`` and
    ``NotIn [mode, switching]``."""
    source, source_cm = sources
    target_cm = objects.target_config_map(
        "bare", "", source_cm, config_key="config.conf", target_text=text, mode=mode
    )
    target_ds = objects.target_daemon_set(
        "bare", "", source, source_config_map="kube-proxy", mode=mode, target_config_text=text
    )
    for made in (target_cm, target_ds):
        del made["metadata"]["ownerReferences"]  # no policy owns them here
    core.create_namespaced_config_map(ns, target_cm)
    apps.patch_namespaced_daemon_set(
        "kube-proxy", ns, {"spec": objects.source_patched_spec(source["spec"], mode)}
    )
    apps.create_namespaced_daemon_set(ns, target_ds)


def bare_walk(api: client.ApiClient, proxy: KubeProxy) -> tuple[float, float]:
    """The walk by hand; (forward seconds, whole-run seconds)."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    ns = proxy.namespace
    pods = PodWatch(core, ns)
    target_ds_name = naming.target_daemon_set("kube-proxy", MODE)
    target_cm_name = naming.target_config_map("kube-proxy", MODE)
    started = time.monotonic()
    source = api.sanitize_for_serialization(apps.read_namespaced_daemon_set("kube-proxy", ns))
    source_cm = api.sanitize_for_serialization(core.read_namespaced_config_map("kube-proxy", ns))
    original_spec = copy.deepcopy(source["spec"])
    original_text = source_cm["data"]["config.conf"]
    text = render_target_config(parse_config(original_text), MODE).text
    install_target_pair(core, apps, ns, (source, source_cm), text=text, mode=MODE)
    prefix = f"{target_ds_name}-"
    for node in proxy.nodes:
        core.patch_node(node, {"metadata": {"labels": {MODE_LABEL: SWITCHING}}})
        pods.until(_source_gone(node, prefix))
        core.patch_node(node, {"metadata": {"labels": {MODE_LABEL: MODE}}})
        pods.until(lambda p, n=node: any(_ready(x) for x in _on(p, n, prefix)))
    forward = time.monotonic() - started
    # Fold back: the source takes the target config, then every node is handed back.
    core.patch_namespaced_config_map("kube-proxy", ns, {"data": {"config.conf": text}})
    for node in proxy.nodes:
        core.patch_node(node, {"metadata": {"labels": {MODE_LABEL: SWITCHING}}})
        pods.until(lambda p, n=node: not _on(p, n, prefix))
        core.patch_node(node, {"metadata": {"labels": {MODE_LABEL: None}}})
        pods.until(lambda p, n=node: any(_ready(x) for x in _sources(p, n, prefix)))
    apps.patch_namespaced_daemon_set(
        "kube-proxy", ns, [{"op": "replace", "path": "/spec", "value": original_spec}]
    )
    _rolled_out(apps, ns)
    apps.delete_namespaced_daemon_set(target_ds_name, ns)
    core.delete_namespaced_config_map(target_cm_name, ns)
    return forward, time.monotonic() - started


def _rolled_out(apps: client.AppsV1Api, ns: str, timeout: float = 180) -> None:
    stream = watch.Watch()
    for event in stream.stream(
        apps.list_namespaced_daemon_set,
        ns,
        field_selector="metadata.name=kube-proxy",
        timeout_seconds=int(timeout),
    ):
        ds = event["object"]
        st = ds.status
        if (
            st.observed_generation == ds.metadata.generation
            and st.updated_number_scheduled == st.desired_number_scheduled
            and st.number_ready == st.desired_number_scheduled
        ):
            stream.stop()
            return
    raise TimeoutError("the source never rolled out")


def operator_walk(
    api: client.ApiClient, proxy: KubeProxy, *, verify: bool = False
) -> tuple[float, float]:
    """The same walk by the running operator; (forward seconds, whole-run seconds)."""
    core = client.CoreV1Api(api)
    policies = Policies(api)
    pods = PodWatch(core, proxy.namespace)
    prefix = f"{naming.target_daemon_set('kube-proxy', MODE)}-"
    started = time.monotonic()
    # Verification off: the script verifies nothing either (the verified walk is the
    # verified-moves issue's figure, not this floor's).
    name = policies.create(
        proxy.namespace,
        targetMode=MODE,
        stages=[{"name": "all", "percent": 100, "bakeSeconds": 0}],
        verify={"enabled": verify},
    )
    try:
        pods.until(
            lambda p: all(any(_ready(x) for x in _on(p, n, prefix)) for n in proxy.nodes),
            timeout=300,
        )
        forward = time.monotonic() - started
        status = policies.wait_phase(name, "Completed", "Failed", "RolledBack", timeout=300)
        whole = time.monotonic() - started
        assert status["phase"] == "Completed" and status.get("finalized"), status
        return forward, whole
    finally:
        policies.delete_all()


VERIFIED = "this, verified"
IDLE_SECONDS = 30
"""How long a baking policy is watched for the operator's steady-state API requests."""


def _operator(
    box: Sandbox, source: Path, log: Path, metrics: str, *, verbose: bool = False
) -> proc.ProcessRecord:
    """The operator built from ``source``, returned once it is up: a walk is timed from the
    policy's creation, and an operator runs before anyone applies a policy (timing its
    start too put a second or two of Python imports and kopf's start into every walk)."""
    env = {"PYTHONPATH": f"{source}{os.pathsep}{ROOT}"}
    liveness = f"http://127.0.0.1:{proc.free_port()}/healthz"
    argv = [
        sys.executable,
        "-m",
        "proxymode",
        f"--kubeconfig={box.kubeconfig}",
        f"--metrics-address={metrics}",
        f"--liveness={liveness}",
    ]
    record = proc.start("bench-operator", [*argv, "--verbose"] if verbose else argv, log, env=env)
    eventually(lambda: _answers(liveness), timeout=60, interval=0.1, what="the operator to be up")
    return record


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - our loopback
            return bool(r.status == 200)
    except OSError:
        return False


REQUEST = re.compile(r'"(GET|POST|PATCH|PUT|DELETE) (/[^ ?"]+)')


def _requests(text: str) -> dict[str, int]:
    """``verb resource`` of every request the operator's API client logged (``--verbose``:
    urllib3 logs each one); a GET of a collection is a LIST. kopf's own watch of the
    policies goes through aiohttp and is not counted: one long request per minute."""
    out: dict[str, int] = {}
    for method, path in REQUEST.findall(text):
        parts = path.strip("/").split("/")
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            rest = rest[2:]
        if not rest:
            continue
        verb = "LIST" if method == "GET" and len(rest) == 1 else method
        key = f"{verb} {rest[2] if len(rest) >= 3 else rest[0]}"
        out[key] = out.get(key, 0) + 1
    return out


def _looks(metrics: str) -> tuple[float, int]:
    """Mean seconds of one look and how many, from the operator's own /metrics."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = float(re.search(r"^proxymode_reconcile_duration_seconds_sum (\S+)$", text, re.M)[1])  # type: ignore[index]
    count = int(
        float(re.search(r"^proxymode_reconcile_duration_seconds_count (\S+)$", text, re.M)[1])
    )  # type: ignore[index]
    return (total / count if count else 0.0), count


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def idle_requests_per_minute(
    box: Sandbox, api: client.ApiClient, source: Path, log: Path
) -> dict[str, float]:
    """A policy baking its first stage for an hour: what the operator asks the API server
    per minute while nothing changes (counted from its own ``--verbose`` log)."""
    proxy, drop = _fresh(api)
    record = _operator(box, source, log, f"127.0.0.1:{proc.free_port()}", verbose=True)
    policies = Policies(api)
    try:
        name = policies.create(
            proxy.namespace,
            targetMode=MODE,
            stages=[
                {
                    "name": "canary",
                    "nodeSelector": {"matchLabels": {"pool": "canary"}},
                    "bakeSeconds": 3600,
                },
                {"name": "all", "percent": 100},
            ],
        )
        policies.wait_phase(name, "Analyzing", timeout=180)
        time.sleep(5)  # the look that entered Analyzing is done
        start = log.stat().st_size
        time.sleep(IDLE_SECONDS)
        with log.open("rb") as f:
            f.seek(start)
            window = f.read().decode(errors="replace")
        return {k: v * 60 / IDLE_SECONDS for k, v in _requests(window).items()}
    finally:
        policies.delete_all()
        proc.stop_pids([record.pid])
        drop()


def _operator_round(
    box: Sandbox,
    api: client.ApiClient,
    source: Path,
    log: Path,
    extra: dict[str, Any],
    *,
    verify: bool = False,
) -> tuple[float, float]:
    """One walk by the operator built from ``source``; its look times and RSS into ``extra``."""
    proxy, drop = _fresh(api)
    metrics = f"127.0.0.1:{proc.free_port()}"
    record = _operator(box, source, log, metrics)
    try:
        walked = operator_walk(api, proxy, verify=verify)
        look, looks = _looks(metrics)
        extra.setdefault("look_ms", []).append(look * 1000)
        extra.setdefault("looks", []).append(looks)
        extra.setdefault("rss", []).append(_peak_rss_mib(record.pid))
        return walked
    finally:
        proc.stop_pids([record.pid])
        drop()


def _fresh(api: client.ApiClient) -> tuple[KubeProxy, Callable[[], None]]:
    core = client.CoreV1Api(api)
    ns = f"w-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))

    def drop() -> None:
        """Delete the run's namespace and wait until it is gone: the namespace controller
        deleting its pods while the next contender walks slowed that walk (an A/A run, the
        same build in both slots, had the second 0.45 s slower forward, 1.5 s whole)."""
        core.delete_namespace(ns)

        def gone() -> bool:
            try:
                core.read_namespace(ns)
            except client.exceptions.ApiException as e:
                if e.status == 404:
                    return True
                raise
            return False

        eventually(gone, timeout=180, interval=0.2, what=f"namespace {ns} to go")

    return install_kube_proxy(api, ns), drop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.walk", description=__doc__)
    parser.add_argument("--before", default="main")
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pm-walk-") as tmp:
        work = Path(tmp)
        before = _checkout(args.before, work)
        box = Sandbox(
            SandboxConfig(
                state_dir=work / "state", nodes=args.nodes, canary_nodes=2, legacy_nodes=1
            )
        )
        rows: dict[str, list[tuple[float, float]]] = {
            "bare script": [],
            args.before: [],
            "this": [],
            VERIFIED: [],
        }
        extra: dict[str, dict[str, Any]] = {args.before: {}, "this": {}, VERIFIED: {}}
        try:
            box.up()
            api = config.new_client_from_config(config_file=str(box.kubeconfig))
            box.install_crd()
            builds = ((args.before, before), ("this", ROOT / "operator"))
            for i in range(args.rounds):
                proxy, drop = _fresh(api)
                try:
                    rows["bare script"].append(bare_walk(api, proxy))
                finally:
                    drop()
                for label, source in builds:
                    rows[label].append(
                        _operator_round(
                            box,
                            api,
                            source,
                            work / f"{label}-{i}.log",
                            extra[label],
                        )
                    )
                # This build again with each node verified (the default): what the proof
                # of a move costs on top of the floor.
                rows[VERIFIED].append(
                    _operator_round(
                        box,
                        api,
                        ROOT / "operator",
                        work / f"verified-{i}.log",
                        extra[VERIFIED],
                        verify=True,
                    )
                )
                print(f"round {i + 1}: {rows} {extra}", flush=True)
            for label, source in builds:
                extra[label]["idle"] = idle_requests_per_minute(
                    box, api, source, work / f"{label}-idle.log"
                )
        finally:
            box.down()
    floor = statistics.median(w for _, w in rows["bare script"])
    floor_fwd = statistics.median(f for f, _ in rows["bare script"])
    print(f"node walk, {len(proxy.nodes)} nodes, median of {args.rounds} rounds (seconds)")
    print(f"{'who':>12} {'forward':>8} {'x':>6} {'whole':>7} {'x':>6}")
    for label, got in rows.items():
        fwd = statistics.median(f for f, _ in got)
        whole = statistics.median(w for _, w in got)
        print(f"{label:>12} {fwd:8.2f} {fwd / floor_fwd:6.2f} {whole:7.2f} {whole / floor:6.2f}")
    for label, got in extra.items():
        if not got:
            continue
        idle = got.get("idle", {})
        print(
            f"{label}: one look {statistics.median(got['look_ms']):.1f} ms (mean per walk, median"
            f" of rounds), {statistics.median(got['looks'])} looks per walk, peak RSS"
            f" {max(got['rss']):.0f} MiB; baking, API requests/min: {sum(idle.values()):.0f}"
            f" {dict(sorted(idle.items()))}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
