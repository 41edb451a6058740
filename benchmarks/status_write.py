"""What one status write and one read of a policy cost the API server, by the status's size.

    PROXYMODE_SANDBOX_NODE_NET=127.0.47 .venv/bin/python -m benchmarks.status_write \
        [--sizes 1000,5000] [--writes 30]

At 5,000 nodes a look's ``store`` (the status merge patch) was its largest part (409 ms of
an 860 ms look, docs/architecture.md). This says where that goes, on a sandbox of its own
with no operator and two nodes, so nothing but these requests loads the API server.

For each size the status is the one the engine writes in the middle of a walk (30 % of the
nodes moved, a tenth of them in flight: ``tests.unit.engine.sim``, as ``engine_scale``),
stored on a policy of its own. Then, interleaved so that the machine's noise falls on all
alike (compare the ratios): the whole status sent with one field changed (what a look
sends), that one field alone (what sending only the changes would cost), a GET (what each
look reads), and the same one-field patch on a policy with an empty status (the floor).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config
from urllib3 import HTTPResponse

from benchmarks.engine_scale import policy
from proxymode.api import models
from proxymode.engine.machine import advance
from proxymode_sandbox import Sandbox, SandboxConfig
from tests.unit.engine.sim import Sim


def mid_walk_status(nodes: int) -> dict[str, Any]:
    """The engine's status once 30 % of ``nodes`` moved, with a tenth of them in flight."""
    sim = Sim.cluster({"canary": nodes // 10, "general": nodes - nodes // 10})
    base = policy()
    stages = [s.model_copy(update={"bake_seconds": 0}) for s in base.spec.stages]
    current = base.model_copy(update={"spec": base.spec.model_copy(update={"stages": stages})})
    for _ in range(5000):
        decision = advance(current, sim.observe(generation=1))
        sim.execute(decision.actions)
        current = current.model_copy(update={"status": decision.status})
        moved = sum(len(s.moved or []) for s in decision.status.stages)
        if moved > nodes * 0.3 and len(decision.status.moves) >= nodes // 20:
            break
        sim.tick(min(decision.requeue_seconds, 2.0))
    return current.status.model_dump(by_alias=True, mode="json", exclude_none=True)


def _drained(answer: object) -> None:
    if isinstance(answer, HTTPResponse):
        answer.drain_conn()
        answer.release_conn()


def _ms(call: Callable[[], None]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def measure(api: client.ApiClient, nodes: int, writes: int) -> dict[str, float]:
    custom = client.CustomObjectsApi(api)
    group, version, plural = models.GROUP, models.VERSION, models.PLURAL
    spec = policy().model_dump(by_alias=True, mode="json", exclude_none=True)["spec"]
    big, small = f"status-{nodes}", f"status-{nodes}-empty"
    for name in (big, small):
        custom.create_cluster_custom_object(
            group,
            version,
            plural,
            {
                "apiVersion": f"{group}/{version}",
                "kind": models.KIND,
                "metadata": {"name": name},
                "spec": {**spec, "paused": True},
            },
        )
    status = mid_walk_status(nodes)
    custom.patch_cluster_custom_object_status(group, version, plural, big, {"status": status})
    count = iter(range(10**9))

    def whole() -> None:
        changed = {**status, "message": f"look {next(count)}"}
        _drained(
            custom.patch_cluster_custom_object_status(
                group, version, plural, big, {"status": changed}, _preload_content=False
            )
        )

    def one_field(name: str) -> Callable[[], None]:
        def patch() -> None:
            _drained(
                custom.patch_cluster_custom_object_status(
                    group,
                    version,
                    plural,
                    name,
                    {"status": {"message": f"look {next(count)}"}},
                    _preload_content=False,
                )
            )

        return patch

    def read() -> None:
        _drained(
            custom.get_cluster_custom_object(group, version, plural, big, _preload_content=False)
        )

    calls = {"whole": whole, "field": one_field(big), "get": read, "floor": one_field(small)}
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(writes):
        for key, call in calls.items():
            times[key].append(_ms(call))
    for name in (big, small):
        custom.delete_cluster_custom_object(group, version, plural, name)
    return {
        "status_kib": len(json.dumps(status)) / 1024,
        "names": float(
            sum(len(s.get("nodes", [])) + len(s.get("moved", [])) for s in status["stages"])
        ),
        **{k: statistics.median(v) for k, v in times.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000")
    parser.add_argument("--writes", type=int, default=30)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pm-bench-") as tmp:
        box = Sandbox(
            SandboxConfig(state_dir=Path(tmp) / "state", nodes=2, canary_nodes=1, prometheus=False)
        )
        try:
            box.up()
            box.install_crd()
            api = config.new_client_from_config(config_file=str(box.kubeconfig))
            rows = [measure(api, int(n), args.writes) for n in args.sizes.split(",")]
        finally:
            box.down()
    print(f"median of {args.writes}, interleaved; ms")
    print(
        f"{'nodes':>6} {'status':>9} {'names':>7} {'whole patch':>12} {'one field':>10}"
        f" {'GET':>7} {'floor':>7} {'one field / floor':>18}"
    )
    for size, r in zip(args.sizes.split(","), rows, strict=True):
        print(
            f"{size:>6} {r['status_kib']:>6.0f}KiB {r['names']:>7.0f} {r['whole']:>12.1f}"
            f" {r['field']:>10.1f} {r['get']:>7.1f} {r['floor']:>7.1f}"
            f" {r['field'] / r['floor']:>17.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
