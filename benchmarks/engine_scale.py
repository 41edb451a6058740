"""How the pure engine and the analysis queries grow with the cluster: 100 to 5,000 nodes.

    .venv/bin/python -m benchmarks.engine_scale [--sizes 100,1000,5000] [--looks 20]

For each size, in one run side by side (machines are shared and noisy, so compare the
ratios, not the absolute times): the time of one ``advance()`` look in the middle of a
rollout (best and median of ``--looks``), the stored status's JSON size, and the length of
the canary group's PromQL query (the body the adapter POSTs), and the time to build the node
matcher for every node (the regex a query over all of them carries). The cluster is the engine
tests' model (``tests.unit.engine.sim``), so nothing here measures the API server: the
adapter's own cost of listing nodes and pods on every look is not in these figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from dataclasses import dataclass

from proxymode.analysis import group_query
from proxymode.analysis.templates import node_matcher
from proxymode.api.models import Check, Phase, ProxyModePolicy
from proxymode.engine.machine import advance
from tests.unit.engine.sim import Sim


@dataclass
class Row:
    nodes: int
    look_best_ms: float
    look_median_ms: float
    peak_kib: float
    status_kib: float
    query_kib: float
    matcher_ms: float


def policy() -> ProxyModePolicy:
    return ProxyModePolicy.model_validate(
        {
            "metadata": {"name": "bench", "uid": "uid-bench", "generation": 1},
            "spec": {
                "targetMode": "nftables",
                "maxUnavailable": "10%",
                "stages": [
                    {
                        "name": "canary",
                        "nodeSelector": {"matchLabels": {"pool": "canary"}},
                        "bakeSeconds": 600,
                    },
                    {"name": "half", "percent": 50, "bakeSeconds": 600},
                    {"name": "all", "percent": 100, "bakeSeconds": 600},
                ],
            },
        }
    )


def measure(nodes: int, looks: int) -> Row:
    """Drive a policy into its canary bake, then time looks at that steady state."""
    sim = Sim.cluster({"canary": max(1, nodes // 10), "general": nodes - max(1, nodes // 10)})
    current = policy()
    for _ in range(400):
        observed = sim.observe(generation=1)
        decision = advance(current, observed)
        sim.execute(decision.actions)
        current = current.model_copy(update={"status": decision.status})
        if current.status.phase == Phase.ANALYZING:
            break
        sim.tick(min(decision.requeue_seconds, 5.0))
    else:
        raise RuntimeError(f"{nodes} nodes: never reached the canary bake")
    observed = sim.observe(generation=1)
    times = []
    for _ in range(looks):
        started = time.perf_counter()
        decision = advance(current, observed)
        times.append((time.perf_counter() - started) * 1000)
    tracemalloc.start()
    advance(current, observed)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    status = json.dumps(decision.status.model_dump(by_alias=True, mode="json"))
    canary = [n for s in decision.status.stages for n in s.nodes]
    check = Check.model_validate({"name": "p99", "template": "SyncLatencyP99", "maxSeconds": 1})
    query = group_query(check, nodes=canary or ["x"], node_label="instance", window_seconds=300)
    names = [f"ip-10-{i // 65536}-{i // 256 % 256}-{i % 256}.internal" for i in range(nodes)]
    started = time.perf_counter()
    node_matcher(names, "instance")
    matcher_ms = (time.perf_counter() - started) * 1000
    return Row(
        nodes,
        min(times),
        statistics.median(times),
        peak / 1024,
        len(status) / 1024,
        len(query) / 1024,
        matcher_ms,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--looks", type=int, default=20)
    args = parser.parse_args(argv)
    rows = [measure(int(n), args.looks) for n in args.sizes.split(",")]
    base = rows[0]
    print(
        f"{'nodes':>6} {'look best':>10} {'median':>9} {'x first':>8} {'peak mem':>9}"
        f" {'status':>9} {'query (all planned)':>20}"
    )
    for r in rows:
        print(
            f"{r.nodes:>6} {r.look_best_ms:>8.1f}ms {r.look_median_ms:>7.1f}ms"
            f" {r.look_median_ms / base.look_median_ms:>7.1f}x {r.peak_kib:>6.0f}KiB"
            f" {r.status_kib:>6.1f}KiB {r.query_kib:>17.1f}KiB {r.matcher_ms:>18.1f}ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
