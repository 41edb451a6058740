"""Issue 12 at scale: the walk over N kwok nodes, percent stages, ``maxUnavailable: 10%``.

    PROXYMODE_SANDBOX_NODE_NET=127.0.70 nice .venv/bin/python -m benchmarks.scale \
        --nodes 1000 [--stages 10,50,100] [--max-unavailable 10] [--idle-seconds 60]

One sandbox without Prometheus (no analysis): ``up`` with a few nodes, then the rest of the
``--nodes`` created through the API (``kubectl create`` per node takes minutes at 1,000, and
the sandbox's node addresses are one /24: a node past .254 gets ``127.0.70.300``, which the
API server takes, and its kube-proxy pod then has no pod IP), all kwok. In one run, side by
side, each on a fresh kube-proxy namespace (iptables -> nftables):

- the bare script (``benchmarks.scale_bare``): the engine's own objects, the same stages
  and the same parallelism (a sliding window of 10 % of the nodes, each through
  ``switching``), waiting on one pod watch; then the fold back in the same window and the
  source's update strategy back (the operator's default ``KeepExclusionTerm``);
- this worktree's operator, one policy with those stages, ``bakeSeconds: 0``, no analysis,
  ``verify.enabled: false`` (the script verifies nothing either; ``--verify`` turns it on).

``--order`` says who walks first (the operator, by default); a finished walk's DaemonSets
are orphaned before the next starts (they keep the exclusion term, so they would follow the
next walk's labels and churn their pods beside it).

Measured: forward (to every node on a Ready target pod) and whole-run (to ``Completed``,
finalized) wall time for both; the operator's peak RSS (``VmHWM``) and CPU seconds
(``utime+stime``) from /proc; one look's time from its
``proxymode_reconcile_duration_seconds`` histogram (a look includes its actions: up to
10 % of the nodes' label patches); and its API requests per minute from the API server's
own metrics: the operator runs as a ServiceAccount of its own that a FlowSchema of its own
matches, so ``apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`` counts
exactly its requests (watches included, once each), over the walk and over a window in
which a second policy bakes (``--idle-seconds``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines

from benchmarks.scale_bare import PodIndex, bare_walk, stage_sizes
from benchmarks.wakeups import _observe_ms
from proxymode.engine import naming
from proxymode_sandbox import Sandbox, SandboxConfig, kubeadm_proxy
from proxymode_sandbox import process as proc
from proxymode_sandbox.topology import GENERAL, node_manifest

ROOT = Path(__file__).resolve().parents[1]
MODE = "nftables"
G, V, P = "proxymode.io", "v1alpha1", "proxymodepolicies"
BENCH_NS = "proxymode-bench"
BENCH_SA = "operator"
FLOW_SCHEMA = "proxymode-bench-operator"


def _raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return json.loads(call(*args, _preload_content=False, **kwargs).data)


def _wait(probe: Callable[[], str | None], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    why = probe()
    while why is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: {why}")
        time.sleep(2)
        why = probe()


def add_nodes(box: Sandbox, api: client.ApiClient, total: int) -> None:
    """Kwok nodes up to ``total``, created through the API (four at a time)."""
    core = client.CoreV1Api(api)
    have = {n["metadata"]["name"] for n in _raw(core.list_node)["items"]}
    version = box.kubernetes_version
    wanted = [i for i in range(1, total + 1) if f"general-{i}" not in have][: total - len(have)]

    def create(i: int) -> None:
        name = f"general-{i}"
        body = node_manifest(name, GENERAL, i, version)
        # 127.70.x.y: loopback, never bound (no metrics simulator runs), valid past .254.
        ip = f"127.70.{i // 250}.{i % 250 + 1}"
        body["status"]["addresses"] = [
            {"type": "InternalIP", "address": ip},
            {"type": "Hostname", "address": name},
        ]
        core.create_node(body)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(create, wanted))

    def ready() -> str | None:
        nodes = _raw(core.list_node)["items"]
        ok = sum(
            1
            for n in nodes
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n["status"].get("conditions", [])
            )
        )
        return None if ok == total else f"{ok} of {total} Ready"

    _wait(ready, "the nodes", timeout=600)


def install_proxy(api: client.ApiClient, namespace: str, nodes: int) -> None:
    """The kubeadm kube-proxy (iptables) in ``namespace``, Ready on every node."""
    apps = client.AppsV1Api(api)
    kubeadm_proxy.install_in(api, namespace, mode="", create_namespace=True)

    def ready() -> str | None:
        st = _raw(apps.read_namespaced_daemon_set, "kube-proxy", namespace).get("status", {})
        got = (st.get("desiredNumberScheduled"), st.get("numberReady"))
        return None if got == (nodes, nodes) else f"desired/ready {got}"

    _wait(ready, f"kube-proxy in {namespace}", timeout=900)


def operator_identity(box: Sandbox, api: client.ApiClient, into: Path) -> Path:
    """A kubeconfig for a ServiceAccount of its own (cluster-admin), and a FlowSchema that
    matches only it: the API server then counts the operator's requests apart."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespace({"metadata": {"name": BENCH_NS}})
    core.create_namespaced_service_account(BENCH_NS, {"metadata": {"name": BENCH_SA}})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": FLOW_SCHEMA},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": BENCH_SA, "namespace": BENCH_NS}],
        }
    )
    every = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}
    client.CustomObjectsApi(api).create_cluster_custom_object(
        "flowcontrol.apiserver.k8s.io",
        "v1",
        "flowschemas",
        {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": FLOW_SCHEMA},
            "spec": {
                "priorityLevelConfiguration": {"name": "workload-high"},
                "matchingPrecedence": 100,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [
                    {
                        "subjects": [
                            {
                                "kind": "ServiceAccount",
                                "serviceAccount": {"name": BENCH_SA, "namespace": BENCH_NS},
                            }
                        ],
                        "resourceRules": [
                            {**every, "clusterScope": True, "namespaces": ["*"]},
                        ],
                        "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                    }
                ],
            },
        },
    )
    token = core.create_namespaced_service_account_token(
        BENCH_SA, BENCH_NS, {"spec": {"expirationSeconds": 86400}}
    ).status.token
    kc = json.loads(json.dumps(_yaml(box.kubeconfig)))
    user = kc["contexts"][0]["context"]["user"]
    kc["users"] = [{"name": user, "user": {"token": token}}]
    path = into / "operator.kubeconfig"
    path.write_text(json.dumps(kc))
    return path


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def apiserver_metrics(api: client.ApiClient) -> str:
    resp = api.call_api("GET", f"{api.configuration.host}/metrics")
    return str(resp.read().decode())


def operator_requests(text: str) -> float:
    """The operator's requests so far, as the API server's flow control counted them."""
    name = "apiserver_flowcontrol_dispatched_requests_total"
    pattern = rf'^{name}{{[^}}]*flow_schema="{FLOW_SCHEMA}"[^}}]*}} (\S+)$'
    return sum(float(m) for m in re.findall(pattern, text, re.M))


def client_requests(metrics: str) -> dict[str, float]:
    """The operator's own client's requests so far (``proxymode_api_requests_total``), by
    verb and resource: what the looks and caches send, without kopf's policy watch."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for labels, value in re.findall(r"^proxymode_api_requests_total{([^}]*)} (\S+)$", text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = f"{got.get('verb')} {got.get('resource')}"
        out[key] = out.get(key, 0.0) + float(value)
    return out


def grown(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What grew between two readings of counters keyed alike."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def request_breakdown(before: str, after: str) -> dict[str, float]:
    """``apiserver_request_total`` growth by verb and resource (every client: for reading
    beside the operator's own count, not as it)."""

    def parse(text: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for labels, value in re.findall(r"^apiserver_request_total{([^}]*)} (\S+)$", text, re.M):
            got = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            sub = f"/{got['subresource']}" if got.get("subresource") else ""
            key = f"{got.get('verb')} {got.get('resource')}{sub}"
            out[key] = out.get(key, 0.0) + float(value)
        return out

    return grown(parse(before), parse(after))


class ProcSampler(threading.Thread):
    """The operator's RSS every second (growth, not only the peak)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.halt, self.rss = pid, threading.Event(), [0.0]

    def run(self) -> None:
        while not self.halt.wait(1.0):
            try:
                self.rss.append(status_mib(self.pid, "VmRSS"))
            except OSError:
                return


def status_mib(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def looks(metrics: str) -> dict[str, Any]:
    """The look histograms: the whole look (with its actions), the look without them, and
    each part's mean: count, mean, the share within 250 ms, bucket p50 and p95."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, Any] = dict(histogram(text, "proxymode_reconcile_duration_seconds"))
    out["own"] = histogram(text, "proxymode_look_own_duration_seconds")
    out["cpu"] = histogram(text, "proxymode_look_cpu_seconds")
    part_count = r'^proxymode_look_part_duration_seconds_count{part="([^"]+)"}'
    parts = sorted(set(re.findall(part_count, text, re.M)))
    out["parts_mean_ms"] = {
        part: histogram(text, "proxymode_look_part_duration_seconds", f'part="{part}"')["mean_ms"]
        for part in parts
    }
    return out


def histogram(text: str, name: str, labels: str = "") -> dict[str, float]:
    """One histogram's count, mean, share within 250 ms and bucket p50 / p95, from /metrics."""
    where = f"{{{labels}}}" if labels else ""
    bucket = re.compile(rf"^{name}_bucket{{(.*)}} (\S+)$", re.M)
    buckets = []
    for inside, v in bucket.findall(text):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', inside))
        le = pairs.pop("le")
        if pairs == dict(re.findall(r'(\w+)="([^"]*)"', labels)):
            buckets.append((float(le), float(v)))
    # An operator without the histogram (an older build): zero looks, not an IndexError.
    count = float(next(iter(re.findall(rf"^{name}_count{re.escape(where)} (\S+)$", text, re.M)), 0))
    total = float(next(iter(re.findall(rf"^{name}_sum{re.escape(where)} (\S+)$", text, re.M)), 0))

    def quantile(q: float) -> float:
        return next(le for le, v in buckets if v >= q * count)

    within = next((v for le, v in buckets if le == 0.25), 0.0)
    return {
        "count": count,
        "mean_ms": 1000 * total / count if count else 0.0,
        "within_250ms": within / count if count else 0.0,
        "p50_le_s": quantile(0.5) if count else 0.0,
        "p95_le_s": quantile(0.95) if count else 0.0,
    }


def policy_phases(api: client.ApiClient, name: str) -> Iterator[dict[str, Any]]:
    """The policy's status at each change (one watch, no polling)."""
    custom = client.CustomObjectsApi(api)
    rv = "0"
    while True:
        resp = custom.list_cluster_custom_object(
            G,
            V,
            P,
            field_selector=f"metadata.name={name}",
            watch=True,
            resource_version=rv,
            timeout_seconds=120,
            _preload_content=False,
        )
        for line in iter_resp_lines(resp):
            event = json.loads(line)
            rv = event["object"].get("metadata", {}).get("resourceVersion", rv)
            yield event["object"].get("status") or {}


def _policy(namespace: str, stages: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": "ProxyModePolicy",
        "metadata": {"name": f"scale-{uuid.uuid4().hex[:6]}"},
        "spec": {
            "targetMode": MODE,
            "kubeProxy": {"namespace": namespace},
            "stages": stages,
            "readyTimeoutSeconds": 900,
            **spec,
        },
    }


def operator_run(
    api: client.ApiClient,
    kubeconfig: Path,
    namespace: str,
    args: argparse.Namespace,
    *,
    log: Path,
    others: list[str],
) -> dict[str, Any]:
    """The walk by this worktree's operator, then a baking policy; every figure of it.
    ``others``: namespaces of earlier walks, watched for pods created meanwhile (none
    should be: their kube-proxies are done)."""
    metrics = f"127.0.0.1:{proc.free_port()}"
    env = {"PYTHONPATH": f"{ROOT / 'operator'}{os.pathsep}{ROOT}"}
    argv = [sys.executable, "-m", "proxymode", f"--kubeconfig={kubeconfig}"]
    record = proc.start("bench-operator", [*argv, f"--metrics-address={metrics}"], log, env=env)
    sampler = ProcSampler(record.pid)
    sampler.start()
    custom = client.CustomObjectsApi(api)
    pods = PodIndex(client.CoreV1Api(api), namespace, naming.target_daemon_set("kube-proxy", MODE))
    nodes = [n["metadata"]["name"] for n in _raw(client.CoreV1Api(api).list_node)["items"]]
    out: dict[str, Any] = {}
    try:
        time.sleep(3)  # kopf's start (its CRD and policy watches) is not the walk's
        cpu0, req0, text0 = cpu_seconds(record.pid), 0.0, apiserver_metrics(api)
        req0, own0 = operator_requests(text0), client_requests(metrics)
        stages = [{"name": f"s{p}", "percent": p, "bakeSeconds": 0} for p in args.stage_percents]
        body = _policy(
            namespace,
            stages,
            maxUnavailable=f"{args.max_unavailable}%",
            verify={"enabled": bool(args.verify)},
        )
        pods.start()
        quiet = [PodIndex(client.CoreV1Api(api), ns, "-") for ns in others]
        for q in quiet:
            q.start()
        started = time.monotonic()
        custom.create_cluster_custom_object(G, V, P, body)
        pods.wait(lambda: all(pods.target_ready(n) for n in nodes), timeout=3600)
        out["forward"] = time.monotonic() - started
        for status in policy_phases(api, body["metadata"]["name"]):
            if status.get("phase") in ("Completed", "Failed", "RolledBack"):
                break
        out["whole"] = time.monotonic() - started
        assert status["phase"] == "Completed" and status.get("finalized"), status
        text1 = apiserver_metrics(api)
        out["pods_created"] = pods.created
        out["pods_created_elsewhere"] = {ns: q.created for ns, q in zip(others, quiet, strict=True)}
        for q in quiet:
            q.stop()
        out["cpu"] = cpu_seconds(record.pid) - cpu0
        out["requests"] = operator_requests(text1) - req0
        out["req_per_min"] = out["requests"] * 60 / out["whole"]
        out["breakdown"] = request_breakdown(text0, text1)
        out["client"] = grown(own0, client_requests(metrics))
        out["client_per_min"] = sum(out["client"].values()) * 60 / out["whole"]
        out["looks"] = looks(metrics)
        out["hwm_walk"] = status_mib(record.pid, "VmHWM")
        out["rss_walk_end"] = status_mib(record.pid, "VmRSS")
        out.update(idle(api, namespace, record.pid, args.idle_seconds, metrics))
        out["hwm"] = status_mib(record.pid, "VmHWM")
        out["rss_end"] = status_mib(record.pid, "VmRSS")
        out["rss_samples"] = sampler.rss
        return out
    finally:
        pods.stop()
        sampler.halt.set()
        proc.stop_pids([record.pid])


def idle(
    api: client.ApiClient, namespace: str, pid: int, seconds: float, metrics: str
) -> dict[str, Any]:
    """A policy back to iptables whose canary stage bakes for an hour: the operator's
    requests per minute while nothing changes, at full cache size."""
    body = _policy(
        namespace,
        [
            {"name": "canary", "nodeSelector": {"matchLabels": {"pool": "canary"}}},
            {"name": "all", "percent": 100},
        ],
        verify={"enabled": False},
    )
    body["spec"]["targetMode"] = "iptables"
    body["spec"]["stages"][0]["bakeSeconds"] = 3600
    client.CustomObjectsApi(api).create_cluster_custom_object(G, V, P, body)
    for status in policy_phases(api, body["metadata"]["name"]):
        if status.get("phase") in ("Analyzing", "Failed", "Paused"):
            break
    if status.get("phase") != "Analyzing":
        return {"idle_error": f"{status.get('phase')}: {status.get('message')}"}
    time.sleep(5)  # the look that entered Analyzing is done
    cpu0, text0, own0 = cpu_seconds(pid), apiserver_metrics(api), client_requests(metrics)
    time.sleep(seconds)
    text1, own = apiserver_metrics(api), grown(own0, client_requests(metrics))
    return {
        "idle_client_per_min": sum(own.values()) * 60 / seconds,
        "idle_client": own,
        "idle_req_per_min": (operator_requests(text1) - operator_requests(text0)) * 60 / seconds,
        "idle_cpu_per_min": (cpu_seconds(pid) - cpu0) * 60 / seconds,
        "idle_breakdown": request_breakdown(text0, text1),
    }


def _clock() -> str:
    return time.strftime("%H:%M:%S", time.gmtime())


def _percents(text: str) -> list[int]:
    return [int(p) for p in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.scale", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--stages", dest="stage_percents", type=_percents, default=[10, 50, 100])
    parser.add_argument("--max-unavailable", type=int, default=10, help="percent of the nodes")
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--verify", action="store_true", help="the operator verifies each node")
    parser.add_argument(
        "--order", default="operator,bare", help="who walks, in this order (bare, operator)"
    )
    parser.add_argument(
        "--observe-looks", type=int, default=3, help="observe() timed as benchmarks.wakeups"
    )
    parser.add_argument("--keep", type=Path, help="keep the logs in this directory")
    parser.add_argument(
        "--node-lease-seconds",
        type=int,
        default=40,
        help="kwok's node Lease duration (5,000 nodes on 2 cores: 400)",
    )
    parser.add_argument(
        "--controller-qps",
        type=int,
        default=0,
        help="kube-controller-manager's --kube-api-qps (0: its default, 20)",
    )
    args = parser.parse_args(argv)
    # `timeout` sends SIGTERM: stop the sandbox and the operator on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="pm-scale-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        box = Sandbox(
            SandboxConfig(
                state_dir=Path(tmp) / "state",
                nodes=6,
                canary_nodes=3,
                prometheus=False,
                ready_timeout=900,
                node_lease_seconds=args.node_lease_seconds,
                controller_qps=args.controller_qps,
            )
        )
        started = time.monotonic()
        try:
            box.up()
            api = config.new_client_from_config(config_file=str(box.kubeconfig))
            apps = client.AppsV1Api(api)
            apps.delete_namespaced_daemon_set("kube-proxy", "kube-system")  # one proxy set
            box.install_crd()
            kubeconfig = operator_identity(box, api, work)
            add_nodes(box, api, args.nodes)
            print(f"sandbox: {args.nodes} nodes in {time.monotonic() - started:.0f}s", flush=True)
            rows: dict[str, Any] = {"load": [os.getloadavg()]}
            done: list[str] = []
            for who in args.order.split(","):
                install_proxy(api, who, args.nodes)
                print(f"{_clock()} {who}: kube-proxy Ready on {args.nodes} nodes", flush=True)
                if who == "bare":
                    sizes = stage_sizes(args.nodes, args.stage_percents)
                    rows[who] = bare_walk(api, who, MODE, sizes, args.max_unavailable)
                else:
                    rows[who] = operator_run(
                        api, kubeconfig, who, args, log=work / "op.log", others=done
                    )
                done.append(who)
                if who == "operator" and args.observe_looks:
                    rows["observe"] = _observe_ms(api, args.observe_looks, who)
                    print(f"{_clock()} observe(): {rows['observe']}", flush=True)
                # Its DaemonSets keep the exclusion term: they would follow the next walk's
                # labels (delete and recreate their pods). Orphaned, the pods stay put.
                apps.delete_collection_namespaced_daemon_set(who, propagation_policy="Orphan")
                rows["load"].append(os.getloadavg())
                print(f"{_clock()} {who}: {json.dumps(rows[who], default=str)}", flush=True)
        finally:
            box.down()
    report(args, rows)
    return 0


def report(args: argparse.Namespace, rows: dict[str, Any]) -> None:
    op, bare = rows.get("operator"), rows.get("bare")
    if not op or not bare:
        return
    budget = f"maxUnavailable {args.max_unavailable}%"
    print(f"\n{args.nodes} nodes, stages {args.stage_percents}%, {budget}")
    print(
        f"node Lease {args.node_lease_seconds} s,"
        f" kube-controller-manager qps {args.controller_qps or 'default (20)'}"
    )
    print(f"load averages (start, then after each walk): {rows['load']}")
    for what in ("forward", "whole"):
        floor = bare[what] if bare else float("nan")
        print(
            f"{what:>8}: bare {floor:8.1f} s  operator {op[what]:8.1f} s ({op[what] / floor:.2f}x)"
        )
    if bare:
        print(f"bare script CPU {bare['cpu']:.1f} s")
    rss = op.pop("rss_samples")
    print(f"operator CPU over the walk {op['cpu']:.1f} s; peak RSS {op['hwm']:.0f} MiB")
    print(f"RSS samples (MiB, every ~{max(1, len(rss) // 20)} s): {rss[:: max(1, len(rss) // 20)]}")
    print(json.dumps(op, indent=1, default=str))
    if "observe" in rows:
        listing, cached, requests = rows["observe"]
        print(f"observe() median: listing {listing:.0f} ms, cache {cached:.0f} ms; {requests}")


if __name__ == "__main__":
    sys.exit(main())
