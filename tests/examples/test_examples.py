"""Every file in examples/ is applied to a real API server, and every migration example runs
to its end state with the real operator.

Why it is built like this:

- Examples are what people copy. A field renamed in the models, a CEL rule tightened, a
  typo in an Argo CD Application: each must fail here, not in a user's cluster. So every
  YAML file under examples/ goes through ``kubectl apply --server-side --dry-run=server``
  (schema, CEL rules, defaulting and admission run; nothing is stored), and
  ``test_every_example_is_covered`` fails when a file appears that ``COVERED`` does not
  name, or a policy example that no end-state test runs, so a new example cannot slip in
  untested.
- Valid is not enough: a policy can pass the schema and still never finish (a stage that
  selects nothing, a check that never has data). Each ProxyModePolicy example is therefore
  run by the operator process in the sandbox until its end state, which is then checked
  against the cluster itself (node labels, DaemonSets, the ConfigMap the operator wrote,
  what Prometheus scrapes). The four run at the same time on disjoint nodes (conftest.py).
- The sandbox cannot wait an hour per stage, and each example drives its own kube-proxy.
  ``for_sandbox`` makes exactly those changes and no others, and the changed fields are
  checked against ``SANDBOX_CHANGES``: the stages, pools, checks, thresholds, overrides,
  limits and the Prometheus URL that run are the example's own (the sandbox publishes its
  Prometheus as ``monitoring/prometheus-operated``, docs/decisions/0032; test_as_a_user_*.py
  runs the examples with no change at all, as a person would).
- The custom-query example (custom-success-rate-check.yaml) measures Envoy's upstream
  success rate, a real business metric the sandbox does not have: kwok nodes run no Envoy.
  Its query is replaced by the same shape over a metric the sandbox's simulated kube-proxy
  does export: the share of rule syncs that did not fail on the canary nodes. Same
  placeholder, same one-value-per-group aggregation, same ``min`` threshold; only the
  metric differs, and the test prints both.
"""

from __future__ import annotations

import copy
import json
import re
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client

from proxymode.api import models
from proxymode.engine.observed import MODE_LABEL
from proxymode_sandbox import Sandbox
from tests.examples.conftest import (
    EXAMPLES,
    WORLD_NODES,
    delete_namespace_quietly,
    install_kube_proxy_on,
    node_labels,
)
from tests.sandbox.harness import G, KubeProxy, P, Policies, Sampler, V, eventually, mode_of, raw

F = TypeVar("F", bound=Callable[..., Any])

# A module-wide sandbox, four migrations and their deadlines (Migrations.finish) in one item.
pytestmark = pytest.mark.timeout(1500)

# -- what the examples are ------------------------------------------------------------------------

COVERED: Mapping[str, tuple[str, ...]] = {
    "iptables-to-nftables-canary.yaml": ("ProxyModePolicy",),
    "iptables-to-ipvs-metallb.yaml": ("ProxyModePolicy",),
    "partial-pools-mixed-mode.yaml": ("ProxyModePolicy",),
    "custom-success-rate-check.yaml": ("ProxyModePolicy",),
    "argocd/application-chart.yaml": ("Application",),
    "argocd/application-policies.yaml": ("Application",),
    "argocd/argocd-cm-patch.yaml": ("ConfigMap",),
}
"""Every YAML file under examples/ and the kinds it holds, in order."""

END_STATE_TESTS: dict[str, str] = {}
"""Policy example -> the test that runs it to its end state (filled by ``end_state_of``)."""


def end_state_of(relpath: str) -> Callable[[F], F]:
    """Register a test as the one that runs ``relpath`` to its end state."""

    def register(test: F) -> F:
        END_STATE_TESTS[relpath] = test.__name__
        return test

    return register


def example_files() -> list[str]:
    """Every YAML file under examples/, as a path relative to it."""
    return sorted(
        p.relative_to(EXAMPLES).as_posix()
        for p in EXAMPLES.rglob("*")
        if p.is_file() and p.suffix in {".yaml", ".yml"}
    )


def load(relpath: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / relpath).read_text()) if d]


def load_policy(relpath: str) -> dict[str, Any]:
    (doc,) = load(relpath)
    return doc


def policy_examples() -> list[str]:
    return sorted(f for f, kinds in COVERED.items() if models.KIND in kinds)


# -- the sandbox version of an example ------------------------------------------------------------

SANDBOX_TIMING: Mapping[str, int] = {
    # Rounds every 5s (the schema's minimum) over a 10s window; the sandbox scrapes every 2s.
    "intervalSeconds": 5,
    "windowSeconds": 10,
    # The simulated kube-proxy syncs 8x slower for its first 10s (as a real one does while it
    # programs every Service at once); 16s keeps that out of the first counted window.
    "warmupSeconds": 16,
    "minPassingRounds": 1,
}
SANDBOX_BAKE_SECONDS = 2

SANDBOX_CHANGES = (
    # Each test drives its own kube-proxy in its own namespace instead of kube-system's.
    r"spec\.kubeProxy\.namespace",
    # Minutes and hours of bake become seconds.
    r"spec\.stages\[\d+\]\.bakeSeconds",
    # Shorter rounds, window and warm-up, one passing round per stage.
    r"spec\.analysis\.(intervalSeconds|windowSeconds|warmupSeconds|minPassingRounds)",
    # A custom query over metrics the sandbox does not have (see SANDBOX_QUERIES).
    r"spec\.analysis\.checks\[\d+\]\.query",
)
"""The only fields ``for_sandbox`` may change; every run asserts that nothing else differs."""

SANDBOX_QUERIES: Mapping[str, str] = {
    # custom-success-rate-check.yaml: Envoy's upstream success rate on the canary nodes. The
    # sandbox's stand-in: the share of kube-proxy rule syncs that did not fail on the canary
    # nodes (they run nftables), from the simulated kube-proxy's own counters. One value for
    # the group, judged against the example's own `min`; the range is SANDBOX_TIMING's window.
    "edge-success-rate": (
        "1 - sum(increase(kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ {{nodes}} }"
        "[10s])) / sum(increase(kubeproxy_sync_proxy_rules_duration_seconds_count{ {{nodes}} }"
        "[10s]))"
    ),
}


def for_sandbox(example: Mapping[str, Any], *, namespace: str) -> dict[str, Any]:
    """The example as the sandbox runs it; every change is one of ``SANDBOX_CHANGES``."""
    body = copy.deepcopy(dict(example))
    spec = body["spec"]
    spec.setdefault("kubeProxy", {})["namespace"] = namespace
    for stage in spec["stages"]:
        stage["bakeSeconds"] = SANDBOX_BAKE_SECONDS
    analysis = spec.get("analysis")
    if analysis is not None:
        analysis.update(SANDBOX_TIMING)
        for check in analysis["checks"]:
            if "query" in check:
                check["query"] = SANDBOX_QUERIES[check["name"]]
    return body


def changed_fields(before: Any, after: Any, path: str = "") -> list[str]:
    """Dotted paths of every leaf that differs (added, removed or changed); a mapping added
    as a whole counts by its leaves (``spec.kubeProxy.namespace``, not ``spec.kubeProxy``)."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        out: list[str] = []
        for key in sorted(set(before) | set(after)):
            sub = f"{path}.{key}" if path else str(key)
            missing: Any = {} if isinstance(before.get(key, after.get(key)), Mapping) else None
            out += changed_fields(before.get(key, missing), after.get(key, missing), sub)
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [
            c
            for i, (b, a) in enumerate(zip(before, after, strict=True))
            for c in changed_fields(b, a, f"{path}[{i}]")
        ]
    return [] if before == after else [path]


def unlisted(changes: list[str]) -> list[str]:
    """The changed fields that ``SANDBOX_CHANGES`` does not allow."""
    return [c for c in changes if not any(re.fullmatch(p, c) for p in SANDBOX_CHANGES)]


def timeline(status: Mapping[str, Any]) -> str:
    """The policy's history as seconds since its first entry: where a run spent its time."""
    history = status.get("history") or []
    if not history:
        return "  (no history)"
    times = [datetime.fromisoformat(h["time"].replace("Z", "+00:00")) for h in history]
    return "\n".join(
        f"  {(at - times[0]).total_seconds():6.1f}s {h['phase']:<12} {h.get('stage') or '-':<10}"
        f" {h['reason']}"
        for at, h in zip(times, history, strict=True)
    )


def findings(status: Mapping[str, Any], *severities: str) -> dict[str, str]:
    return {
        f["code"]: f["message"]
        for f in (status.get("preflight") or {}).get("findings", [])
        if f["severity"] in severities
    }


def check_verdicts(status: Mapping[str, Any]) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in (status.get("analysis") or {}).get("checks", [])}


def prometheus_nodes(box: Sandbox, query: str) -> set[str]:
    """The ``node`` labels of an instant query's result on the sandbox's Prometheus."""
    url = f"{box.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback only
        body = json.load(response)
    return {r["metric"].get("node", "") for r in body["data"]["result"]}


def source_pods_ready(core: client.CoreV1Api, namespace: str) -> dict[str, bool]:
    """Node -> Ready, for the live pods of the source DaemonSet (labelled only k8s-app)."""
    pods = core.list_namespaced_pod(namespace, label_selector="k8s-app=kube-proxy").items
    return {
        p.spec.node_name: any(
            c.type == "Ready" and c.status == "True" for c in p.status.conditions or []
        )
        for p in pods
        if p.metadata.deletion_timestamp is None and MODE_LABEL not in (p.metadata.labels or {})
    }


# -- the four migrations, side by side ------------------------------------------------------------


@dataclass
class Run:
    """One migration example running in its own world."""

    relpath: str
    example: dict[str, Any]
    body: dict[str, Any]
    changes: list[str]
    sampler: Sampler
    proxy: KubeProxy
    started: float = 0.0

    @property
    def nodes(self) -> list[str]:
        return self.proxy.nodes

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["spec"]["kubeProxy"]["namespace"])


@dataclass
class Migrations:
    runs: dict[str, Run]
    policies: Policies

    def finish(self, relpath: str, timeout: float = 420) -> tuple[Run, dict[str, Any]]:
        """Wait for the example's policy to settle; anything but Completed fails with the
        operator's own words. The invariants must have held all along.

        The four migrations share 2 cores with the rest of the suite, so the deadline is
        ``PATIENCE`` times ``timeout`` (``Policies.wait_phase``): it ends a run that would
        never settle and judges no speed."""
        run = self.runs[relpath]
        status = self.policies.wait_phase(
            run.name, "Completed", "Failed", "RolledBack", "Paused", timeout=timeout
        )
        print(f"\n{relpath} ({run.name}), sandbox changes: {', '.join(run.changes)}")
        print(timeline(status))
        assert status["phase"] == "Completed", (
            status.get("message"),
            status.get("history", [])[-5:],
        )
        assert run.sampler.samples > 0
        assert run.sampler.violations == [], run.sampler.violations[:5]
        return run, status


@pytest.fixture(scope="module")
def migrations(api: client.ApiClient, operator: Sandbox) -> Iterator[Migrations]:
    """Every migration example, started at once, each against its own kube-proxy on its own
    nodes; afterwards every policy is deleted and waited for, then the namespaces."""
    core = client.CoreV1Api(api)
    policies = Policies(api)
    runs: dict[str, Run] = {}
    namespaces: list[str] = []
    try:
        for relpath, nodes in WORLD_NODES.items():
            namespace = f"ex-{uuid.uuid4().hex[:8]}"
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
            namespaces.append(namespace)
            eventually(
                lambda ns=namespace: core.read_namespaced_service_account("default", ns),
                what=f"the default ServiceAccount of {namespace}",
            )
            proxy = install_kube_proxy_on(api, namespace, nodes)
            example = load_policy(relpath)
            body = for_sandbox(example, namespace=namespace)
            changes = changed_fields(example, body)
            assert not unlisted(changes), f"for_sandbox changed: {unlisted(changes)}"
            budget = body["spec"].get("maxUnavailable", 1)
            assert isinstance(budget, int), "the sampler counts nodes"
            runs[relpath] = Run(
                relpath,
                example,
                body,
                changes,
                Sampler(api, namespace, budget, nodes=nodes),
                proxy,
            )
        for run in runs.values():
            run.sampler.start()
            policies.custom.create_cluster_custom_object(G, V, P, run.body)
            policies.names.append(run.name)
            run.started = time.monotonic()
        yield Migrations(runs, policies)
    finally:
        try:
            policies.delete_all()
        finally:
            for run in runs.values():
                if run.sampler.is_alive():
                    run.sampler.stop()
            for namespace in namespaces:
                delete_namespace_quietly(core, namespace)


def node_modes_of(core: client.CoreV1Api, nodes: list[str]) -> dict[str, str | None]:
    return {name: labels.get(MODE_LABEL) for name, labels in node_labels(core, nodes).items()}


# -- every file, against the API server -----------------------------------------------------------


def test_every_example_is_covered() -> None:
    """A new file under examples/ fails here until it is added to COVERED and, for a policy,
    to WORLD_NODES (conftest.py) with a test that runs it to its end state."""
    assert example_files() == sorted(COVERED)
    for relpath, kinds in COVERED.items():
        assert tuple(d["kind"] for d in load(relpath)) == kinds, relpath
    assert sorted(WORLD_NODES) == policy_examples()
    assert sorted(END_STATE_TESTS) == policy_examples()


@pytest.mark.sandbox
@pytest.mark.parametrize("relpath", sorted(COVERED))
def test_example_passes_server_side_dry_run(cluster: Sandbox, relpath: str) -> None:
    """Schema, CEL rules, defaulting and admission of the real API server, nothing stored."""
    result = cluster.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=proxymode-examples",
        "-f",
        str(EXAMPLES / relpath),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == len(load(relpath)), result.stdout
    assert all(line.endswith("(server dry run)") for line in lines), result.stdout


@pytest.mark.parametrize("relpath", policy_examples())
def test_policy_example_validates_with_the_models(relpath: str) -> None:
    """The operator refuses to act on a spec its models reject, even one the API stored."""
    policy = models.ProxyModePolicy.model_validate(load_policy(relpath))
    assert len(policy.metadata["name"]) <= 40, "it names the operator's objects; CEL caps it"


@pytest.mark.parametrize("relpath", policy_examples())
def test_sandbox_version_changes_only_the_listed_fields(relpath: str) -> None:
    """``for_sandbox`` changes timing, the kube-proxy's namespace and the stand-in query,
    nothing else (the Prometheus URL is the example's own), and its result is as valid as
    the example."""
    example = load_policy(relpath)
    body = for_sandbox(example, namespace="ns")
    changes = changed_fields(example, body)
    assert "spec.kubeProxy.namespace" in changes
    assert "spec.analysis.prometheus.url" not in changes
    assert not unlisted(changes), unlisted(changes)
    models.ProxyModePolicy.model_validate(body)
    queries = {
        c["name"] for c in example["spec"].get("analysis", {}).get("checks", []) if "query" in c
    }
    assert queries <= set(SANDBOX_QUERIES)


# -- every migration example, to its end state ----------------------------------------------------


@pytest.mark.sandbox
@end_state_of("iptables-to-nftables-canary.yaml")
def test_nftables_canary_completes_and_finalizes(
    migrations: Migrations, operator: Sandbox, api: client.ApiClient
) -> None:
    """(1) Completed and finalized: the original kube-proxy DaemonSet itself now runs nftables
    on every node, and nothing of the operator is left."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    run, status = migrations.finish("iptables-to-nftables-canary.yaml")

    assert status["finalized"] is True
    assert [s["name"] for s in status["stages"]] == ["canary", "quarter", "half", "all"]
    assert all(s["phase"] == "Completed" for s in status["stages"])
    assert all(s["nodes"] for s in status["stages"]), "every stage moved nodes"
    assert sorted(status["stages"][0]["nodes"]) == ["canary-1", "canary-2"]
    assert sorted(n for s in status["stages"] for n in s["nodes"]) == run.nodes
    assert not findings(status, "Error")
    # nftables does not drop conntrack-INVALID packets; preflight notes it (see the example).
    assert set(findings(status, "Warning")) <= {"TargetConfigNote"}
    expected_checks = {c["name"] for c in run.body["spec"]["analysis"]["checks"]}
    assert check_verdicts(status) == dict.fromkeys(expected_checks, "Pass")

    assert mode_of(core, run.namespace) == "nftables", "written into the source ConfigMap"
    names = [d.metadata.name for d in apps.list_namespaced_daemon_set(run.namespace).items]
    assert names == ["kube-proxy"], "the target DaemonSet is gone"
    assert all(v is None for v in node_modes_of(core, run.nodes).values()), "no labels left"
    ready = source_pods_ready(core, run.namespace)
    assert sorted(ready) == run.nodes and all(ready.values())
    ds = raw(apps.read_namespaced_daemon_set, "kube-proxy", run.namespace)["spec"]
    assert ds == run.proxy.ds_spec, "the DaemonSet's spec is exactly what it was"
    # What the metrics say: every node's kube-proxy exports nftables' own failure counter, and
    # none exports iptables' full-sync histogram any more.
    wanted = set(run.nodes)
    eventually(
        lambda: (
            wanted
            <= prometheus_nodes(operator, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total")
            and not wanted
            & prometheus_nodes(operator, "kubeproxy_sync_full_proxy_rules_duration_seconds_count")
        ),
        timeout=30,
        what="Prometheus to see nftables, and no iptables, on every node",
    )
    elapsed = time.monotonic() - run.started
    print(f"(1) {len(run.nodes)} nodes, 4 stages: Completed, finalized after {elapsed:.0f}s")


@pytest.mark.sandbox
@end_state_of("iptables-to-ipvs-metallb.yaml")
def test_ipvs_metallb_completes_with_strict_arp(
    migrations: Migrations, api: client.ApiClient
) -> None:
    """(2) Completed and finalized in ipvs; the kube-proxy ConfigMap the operator wrote has
    strictARP: true, and a cleanup Job ran on every moved node."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    run, status = migrations.finish("iptables-to-ipvs-metallb.yaml")

    assert status["finalized"] is True
    assert sorted(n for s in status["stages"] for n in s["nodes"]) == run.nodes
    conf = yaml.safe_load(
        core.read_namespaced_config_map("kube-proxy", run.namespace).data["config.conf"]
    )
    assert conf["mode"] == "ipvs"
    assert conf["ipvs"]["strictARP"] is True
    # kube-proxy reads syncPeriod from the mode's own struct: the operator carried it over.
    assert conf["ipvs"]["syncPeriod"] == conf["iptables"]["syncPeriod"] == "30s"
    assert sorted(set(run.sampler.jobs.values())) == run.nodes, "a cleanup Job on every node"
    names = [d.metadata.name for d in apps.list_namespaced_daemon_set(run.namespace).items]
    assert names == ["kube-proxy"]
    ready = source_pods_ready(core, run.namespace)
    assert sorted(ready) == run.nodes and all(ready.values())
    assert all(v is None for v in node_modes_of(core, run.nodes).values())
    assert not findings(status, "Error")
    elapsed = time.monotonic() - run.started
    print(
        f"(2) ipvs + strictARP: Completed, finalized after {elapsed:.0f}s;"
        f" {len(run.sampler.jobs)} cleanup Jobs; preflight warnings:"
        f" {sorted(findings(status, 'Warning'))}"
    )


@pytest.mark.sandbox
@end_state_of("partial-pools-mixed-mode.yaml")
def test_partial_pools_end_in_mixed_mode(migrations: Migrations, api: client.ApiClient) -> None:
    """(3) Completed, not finalized: the canary and general nodes on nftables from the target
    DaemonSet, the legacy node still on iptables from the untouched source."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    run, status = migrations.finish("partial-pools-mixed-mode.yaml")

    assert status["finalized"] is False
    assert "mixed mode" in status["message"]
    moved = [n for n in run.nodes if not n.startswith("legacy-")]
    assert "legacy-1" in run.nodes and moved
    assert sorted(n for s in status["stages"] for n in s["nodes"]) == moved
    modes = node_modes_of(core, run.nodes)
    assert {n: modes[n] for n in moved} == dict.fromkeys(moved, "nftables")
    assert modes["legacy-1"] is None, "legacy stays with the source DaemonSet"
    names = {d.metadata.name for d in apps.list_namespaced_daemon_set(run.namespace).items}
    assert names == {"kube-proxy", "kube-proxy-nftables"}, "both DaemonSets kept"
    assert mode_of(core, run.namespace) == "iptables", "the source ConfigMap is untouched"
    target = core.read_namespaced_config_map("kube-proxy-nftables", run.namespace)
    assert yaml.safe_load(target.data["config.conf"])["mode"] == "nftables"
    assert source_pods_ready(core, run.namespace) == {"legacy-1": True}
    assert not findings(status, "Error")
    assert set(findings(status, "Warning")) <= {"TargetConfigNote"}
    elapsed = time.monotonic() - run.started
    print(
        f"(3) mixed mode: {len(moved)} nodes on nftables, legacy-1 on iptables;"
        f" Completed after {elapsed:.0f}s"
    )


@pytest.mark.sandbox
@end_state_of("custom-success-rate-check.yaml")
def test_custom_success_rate_check_gates_the_rollout(
    migrations: Migrations, api: client.ApiClient
) -> None:
    """(4) Completed and finalized, the custom query judged Pass against the example's own
    min (with the sandbox's stand-in metric, see the module docstring)."""
    core = client.CoreV1Api(api)
    relpath = "custom-success-rate-check.yaml"
    original = next(c for c in load_policy(relpath)["spec"]["analysis"]["checks"] if "query" in c)
    print(f"(4) example query: {original['query'].strip()}")
    print(f"    sandbox stand-in: {SANDBOX_QUERIES[original['name']]}")
    run, status = migrations.finish(relpath)

    assert status["finalized"] is True
    assert mode_of(core, run.namespace) == "nftables"
    checks = {c["name"]: c for c in status["analysis"]["checks"]}
    assert check_verdicts(status) == {original["name"]: "Pass", "sync-failures": "Pass"}
    assert checks[original["name"]]["canary"] >= original["min"]
    assert status["analysis"]["passingRounds"] >= 1  # counted per stage: the last one's
    elapsed = time.monotonic() - run.started
    print(f"(4) {checks[original['name']]['message']}; Completed after {elapsed:.0f}s")
