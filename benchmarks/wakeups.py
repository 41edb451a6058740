"""Reaction latency and one look's observe(), this build vs another, side by side on a sandbox.

    PROXYMODE_SANDBOX_NODE_NET=127.0.46 .venv/bin/python -m benchmarks.wakeups \
        [--before v2] [--nodes 6] [--rounds 1] [--looks 10]

Starts a sandbox of its own (``--nodes`` kwok nodes), then, alternating the builds in one
run (the machine is shared and noisy: compare the ratios): runs ``--before`` (a git
revision, checked out with ``git archive`` into a temporary directory) and this worktree
as the operator process, and times pause, resume, a stage edit and abort to the phase each
causes (``tests.sandbox.reactions``). Then one look's ``observe()``: listing nodes and
pods (what every look did before) vs the watch-fed cache (``kube.cache``), median of
``--looks``, and the requests the cache made.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kubernetes import client, config

from proxymode.api.models import ProxyModePolicy
from proxymode.kube.cache import ClusterCache
from proxymode.kube.observe import Observer
from proxymode_sandbox import Sandbox, SandboxConfig
from proxymode_sandbox import process as proc
from tests.sandbox.harness import Policies, install_kube_proxy
from tests.sandbox.reactions import Reactions, measure

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "proxymode.io_proxymodepolicies.yaml"


def p95(values: list[float]) -> float:
    """The 95th percentile, nearest rank (with few samples: the largest but the top 5 %)."""
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) * 95 // 100) - 1)]


def _checkout(revision: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "operator"], check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "operator"


def _operator(box: Sandbox, source: Path, log: Path) -> proc.ProcessRecord:
    env = {"PYTHONPATH": f"{source}{os.pathsep}{ROOT}"}
    return proc.start(
        "bench-operator",
        [sys.executable, "-m", "proxymode", f"--kubeconfig={box.kubeconfig}"],
        log,
        env=env,
    )


def _reactions(box: Sandbox, api: client.ApiClient, source: Path, log: Path) -> Reactions:
    core = client.CoreV1Api(api)
    namespace = f"b-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    record = _operator(box, source, log)
    policies = Policies(api)
    try:
        proxy = install_kube_proxy(api, namespace)
        return measure(policies, proxy.namespace)
    finally:
        policies.delete_all()
        proc.stop_pids([record.pid])
        core.delete_namespace(namespace)


def _observe_ms(
    api: client.ApiClient, looks: int, namespace: str | None = None
) -> tuple[float, float, dict[str, int]]:
    """Median ms of observe() listing, and with the cache; the cache's requests.

    On the kube-proxy of ``namespace`` (the sandbox's own), or on one installed for this.
    """
    core = client.CoreV1Api(api)
    installed = namespace is None
    if namespace is None:
        namespace = f"o-{uuid.uuid4().hex[:6]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        if installed:
            install_kube_proxy(api, namespace, include_legacy=True)
        policy = ProxyModePolicy.model_validate(
            {
                "apiVersion": "proxymode.io/v1alpha1",
                "kind": "ProxyModePolicy",
                "metadata": {"name": "bench", "generation": 1},
                "spec": {
                    "targetMode": "nftables",
                    "kubeProxy": {"namespace": namespace},
                    "stages": [{"name": "all", "percent": 100}],
                },
                "status": {"phase": "Analyzing"},
            }
        )
        listing = Observer(api)
        cache = ClusterCache(api, on_change=lambda: None)
        cached = Observer(api, cache)
        cached.observe(policy)  # the cold start lists once
        timed: dict[str, list[float]] = {"list": [], "cache": []}
        for _ in range(looks):
            for key, observer in (("list", listing), ("cache", cached)):
                started = time.perf_counter()
                observed = observer.observe(policy)
                timed[key].append((time.perf_counter() - started) * 1000)
                assert observed.nodes and observed.pods, "nothing observed"
        requests = cache.requests()
        cache.close()
        return statistics.median(timed["list"]), statistics.median(timed["cache"]), requests
    finally:
        if installed:
            core.delete_namespace(namespace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.wakeups", description=__doc__)
    parser.add_argument("--before", default="main")
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--looks", type=int, default=10)
    parser.add_argument("--no-reactions", action="store_true")
    parser.add_argument(
        "--kubeconfig", help="only observe(), on a running sandbox (e.g. `up --nodes 1000`)"
    )
    args = parser.parse_args(argv)
    if args.kubeconfig:
        api = config.new_client_from_config(config_file=args.kubeconfig)
        nodes = len(client.CoreV1Api(api).list_node().items)
        listing, cached, requests = _observe_ms(api, args.looks, "kube-system")
        print(
            f"observe() at {nodes} nodes, median of {args.looks}: list {listing:.1f} ms,"
            f" cache {cached:.1f} ms ({listing / max(cached, 1e-3):.0f}x);"
            f" cache requests {requests}"
        )
        return 0
    with tempfile.TemporaryDirectory(prefix="pm-bench-") as tmp:
        work = Path(tmp)
        before = _checkout(args.before, work)
        box = Sandbox(
            SandboxConfig(
                state_dir=work / "state", nodes=args.nodes, canary_nodes=2, legacy_nodes=1
            )
        )
        try:
            box.up()
            api = config.new_client_from_config(config_file=str(box.kubeconfig))
            box.install_crd()
            if not args.no_reactions:
                rows: dict[str, list[Reactions]] = {args.before: [], "this": []}
                for i in range(args.rounds):
                    for label, source in ((args.before, before), ("this", ROOT / "operator")):
                        log = work / f"operator-{label}-{i}.log"
                        rows[label].append(_reactions(box, api, source, log))
                print("reaction to the phase change, seconds (median of rounds; p95 of all)")
                print(
                    f"{'build':>8} {'pause':>7} {'resume':>7} {'spec edit':>9} {'abort':>7}"
                    f" {'p95':>7}"
                )
                for label, got in rows.items():
                    med = {k: statistics.median(getattr(r, k) for r in got) for k in vars(got[0])}
                    every = [v for r in got for v in vars(r).values()]
                    print(
                        f"{label:>8} {med['pause']:7.2f} {med['resume']:7.2f}"
                        f" {med['spec_edit']:9.2f} {med['abort']:7.2f} {p95(every):7.2f}"
                    )
            listing, cached, requests = _observe_ms(api, args.looks)
            print(
                f"observe() at {args.nodes} nodes, median of {args.looks}: list {listing:.1f} ms,"
                f" cache {cached:.1f} ms ({listing / max(cached, 1e-3):.0f}x);"
                f" cache requests {requests}"
            )
        finally:
            box.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
