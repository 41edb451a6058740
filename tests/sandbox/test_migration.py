"""Migrations run by the real operator process on the real control plane.

Each test gets its own kubeadm-shaped kube-proxy (DaemonSet, ConfigMap, ServiceAccount)
in its own namespace, so tests share nothing but the nodes; every policy it creates is
deleted (and so rolled back) afterwards. While a migration runs, a sampler checks the
invariants twice a second: never two kube-proxies on a node, never more nodes between
proxies than maxUnavailable allows.
"""

from __future__ import annotations

import subprocess
import time

from kubernetes import client

from proxymode.engine.observed import MODE_LABEL
from proxymode_sandbox import Sandbox, SandboxError
from tests.sandbox.conftest import eventually
from tests.sandbox.harness import (
    NOT_LEGACY,
    STAGES,
    G,
    KubeProxy,
    P,
    PodStarts,
    Policies,
    Sampler,
    V,
    assert_restored,
    install_kube_proxy,
    mode_of,
    node_modes,
    raw,
    with_exclusion_term,
)

# -- (a) ----------------------------------------------------------------------------------


def test_iptables_to_nftables_over_three_stages_completes_and_finalizes(
    api: client.ApiClient,
    proxy: KubeProxy,
    policies: Policies,
    sampler: Sampler,
    sandbox: Sandbox,
) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    starts = PodStarts(api, proxy.namespace)
    starts.start()
    started = time.monotonic()
    name = policies.create(proxy.namespace)
    status = policies.wait_phase(name, "Completed", "Failed", "RolledBack")
    elapsed = time.monotonic() - started
    assert status["phase"] == "Completed", status.get("message")
    assert status["finalized"] is True
    assert [s["phase"] for s in status["stages"]] == ["Completed"] * 3
    assert sum(len(s["nodes"]) for s in status["stages"]) == len(proxy.nodes)
    assert mode_of(core, proxy.namespace) == "nftables"
    assert [d.metadata.name for d in apps.list_namespaced_daemon_set(proxy.namespace).items] == [
        "kube-proxy"
    ]
    cms = {c.metadata.name for c in core.list_namespaced_config_map(proxy.namespace).items}
    assert "kube-proxy-nftables" not in cms
    eventually(
        lambda: (
            "proxymode-backup-" + name
            not in {c.metadata.name for c in core.list_namespaced_config_map(proxy.namespace).items}
        ),
        what="the snapshot to be tidied away",
    )
    assert all(v is None for v in node_modes(core).values()), "no proxymode.io/ label left"
    ds = raw(apps.read_namespaced_daemon_set, "kube-proxy", proxy.namespace)
    assert ds["spec"]["updateStrategy"] == proxy.ds_spec["updateStrategy"]
    # finalizeSourceTemplate: KeepExclusionTerm, the default (decision 0014): the template
    # the nodes were handed back to stays, so nothing rolls and each proxy started twice.
    assert ds["spec"]["template"]["spec"]["affinity"] == with_exclusion_term(NOT_LEGACY, "nftables")
    assert ds["status"]["updatedNumberScheduled"] == len(proxy.nodes), "nothing left to roll"
    pods = core.list_namespaced_pod(proxy.namespace, label_selector="k8s-app=kube-proxy").items
    assert sorted(p.spec.node_name for p in pods) == proxy.nodes, "one kube-proxy per node"
    starts.stop()
    assert starts.per_node() == dict.fromkeys(proxy.nodes, 2), "switch and hand-back only"
    reasons = [
        e.reason
        for e in core.list_namespaced_event("default").items
        if e.involved_object.name == name
    ]
    assert {"RolloutStarted", "StageStarted", "StagePromoted", "Finalizing", "Completed"} <= set(
        reasons
    )
    # `kubectl describe` finds them: it asks for a cluster-scoped object's Events with
    # involvedObject.namespace="" (kopf's event posting named "default": it found none).
    described = subprocess.run(
        [str(sandbox.bin_dir / "kubectl"), f"--kubeconfig={sandbox.kubeconfig}", "describe",
         "proxymodepolicy", name],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    events = described[described.index("\nEvents:") :]
    assert "RolloutStarted" in events and "Completed" in events, events
    assert sampler.samples > 10
    print(
        f"\n(a) {len(proxy.nodes)} nodes, 3 stages: Completed in {elapsed:.1f}s,"
        f" {sampler.samples} invariant samples, max switching {sampler.max_switching},"
        f" kube-proxy starts per node {starts.per_node()}"
    )


# -- (b) ----------------------------------------------------------------------------------


def test_iptables_to_ipvs_runs_a_cleanup_job_on_each_moved_node(
    api: client.ApiClient, proxy: KubeProxy, policies: Policies, sampler: Sampler
) -> None:
    name = policies.create(proxy.namespace, targetMode="ipvs")
    status = policies.wait_phase(name, "Completed", "Failed", "RolledBack")
    assert status["phase"] == "Completed", status.get("message")
    assert sorted(set(sampler.jobs.values())) == proxy.nodes
    assert mode_of(client.CoreV1Api(api), proxy.namespace) == "ipvs"


# -- (c) ----------------------------------------------------------------------------------


def test_abort_mid_stage_restores_everything_exactly(
    api: client.ApiClient, proxy: KubeProxy, policies: Policies, sampler: Sampler
) -> None:
    slow = [{**s, "bakeSeconds": 600} for s in STAGES]
    name = policies.create(proxy.namespace, stages=slow)
    policies.wait_phase(name, "Analyzing")
    assert any(v == "nftables" for v in node_modes(client.CoreV1Api(api)).values())
    policies.act(name, "abort")
    status = policies.wait_phase(name, "RolledBack", "Failed")
    assert status["phase"] == "RolledBack", status.get("message")
    assert status["rollbackReason"] == "Aborted"
    eventually(
        lambda: (
            not policies.get(name)["metadata"].get("annotations", {}).get("proxymode.io/action")
        ),
        what="the action annotation to be consumed",
    )
    assert_restored(api, proxy)


# -- (d) ----------------------------------------------------------------------------------


def test_operator_killed_mid_stage_and_restarted_finishes(
    api: client.ApiClient,
    proxy: KubeProxy,
    policies: Policies,
    sampler: Sampler,
    operator: Sandbox,
) -> None:
    name = policies.create(proxy.namespace)
    eventually(
        lambda: policies.status(name).get("moves"), what="a node move in flight", interval=0.1
    )
    operator.stop_operator(kill=True)
    time.sleep(3)
    frozen = node_modes(client.CoreV1Api(api))
    assert "switching" in frozen.values() or any(v == "nftables" for v in frozen.values())
    operator.start_operator()
    status = policies.wait_phase(name, "Completed", "Failed", "RolledBack")
    assert status["phase"] == "Completed", status.get("message")
    assert mode_of(client.CoreV1Api(api), proxy.namespace) == "nftables"


# -- (e) ----------------------------------------------------------------------------------


def test_crash_looping_canaries_roll_back_automatically(
    api: client.ApiClient,
    proxy: KubeProxy,
    policies: Policies,
    sampler: Sampler,
    sandbox: Sandbox,
) -> None:
    marked: set[str] = set()

    def crash_target_pods(pod: client.V1Pod) -> None:
        labels = pod.metadata.labels or {}
        if labels.get(MODE_LABEL) == "nftables" and pod.metadata.name not in marked:
            marked.add(pod.metadata.name)
            try:
                sandbox.set_crashloop(proxy.namespace, pod.metadata.name)
            except SandboxError as e:  # the pod went between the sample and the annotation
                if "NotFound" not in str(e):
                    raise

    sampler.on_pod = crash_target_pods
    name = policies.create(proxy.namespace)
    status = policies.wait_phase(name, "RolledBack", "Failed", "Completed")
    sampler.on_pod = None
    assert status["phase"] == "RolledBack", status.get("message")
    assert status["rollbackReason"] == "KubeProxyUnhealthy"
    assert "restarted" in status["rollbackMessage"] or "not Ready" in status["rollbackMessage"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    assert_restored(api, proxy)


# -- (g) ----------------------------------------------------------------------------------


def test_a_node_added_to_a_finished_pool_is_migrated(
    api: client.ApiClient,
    proxy: KubeProxy,
    policies: Policies,
    sampler: Sampler,
    sandbox: Sandbox,
) -> None:
    slow = [STAGES[0], {**STAGES[1], "bakeSeconds": 30}, STAGES[2]]
    name = policies.create(proxy.namespace, stages=slow)
    eventually(
        lambda: (policies.status(name).get("currentStage") or 0) >= 1,
        timeout=120,
        what="the canary stage to finish",
    )
    added = sandbox.add_node("canary")
    try:
        eventually(
            lambda: added in policies.status(name)["stages"][0]["nodes"],
            timeout=60,
            what=f"{added} to join the canary stage",
        )
        eventually(
            lambda: node_modes(client.CoreV1Api(api)).get(added) == "nftables",
            timeout=60,
            what=f"{added} to be migrated",
        )
        status = policies.wait_phase(name, "Completed", "Failed", "RolledBack")
        assert status["phase"] == "Completed", status.get("message")
        pods = (
            client.CoreV1Api(api)
            .list_namespaced_pod(proxy.namespace, label_selector="k8s-app=kube-proxy")
            .items
        )
        assert added in {p.spec.node_name for p in pods}
    finally:
        sandbox.remove_node(added)


# -- (h) ----------------------------------------------------------------------------------


def test_policy_deleted_mid_rollout_is_rolled_back_then_released(
    api: client.ApiClient, proxy: KubeProxy, policies: Policies, sampler: Sampler
) -> None:
    slow = [{**s, "bakeSeconds": 600} for s in STAGES]
    name = policies.create(proxy.namespace, stages=slow)
    policies.wait_phase(name, "Analyzing")
    policies.custom.delete_cluster_custom_object(G, V, P, name)
    eventually(
        lambda: not policies._exists(name), timeout=120, what="the policy to roll back and go"
    )
    assert_restored(api, proxy)


# -- (i) ----------------------------------------------------------------------------------


def test_old_kernels_are_refused_or_excluded_by_choice(
    api: client.ApiClient, namespace: str, policies: Policies
) -> None:
    proxy = install_kube_proxy(api, namespace, include_legacy=True)
    refused = policies.create(proxy.namespace)
    status = policies.wait_phase(refused, "Failed", "Progressing", "Completed")
    assert status["phase"] == "Failed"
    finding = next(f for f in status["preflight"]["findings"] if f["code"] == "KernelTooOld")
    assert finding["severity"] == "Error" and finding["nodes"] == ["legacy-1"]
    assert "5.13" in finding["message"]
    assert all(v is None for v in node_modes(client.CoreV1Api(api)).values()), "nothing touched"
    policies.custom.delete_cluster_custom_object(G, V, P, refused)
    eventually(lambda: not policies._exists(refused), what="the refused policy to go")

    excluded = policies.create(proxy.namespace, incompatibleNodes="Exclude")
    status = policies.wait_phase(excluded, "Completed", "Failed", "RolledBack")
    assert status["phase"] == "Completed", status.get("message")
    finding = next(f for f in status["preflight"]["findings"] if f["code"] == "KernelTooOld")
    assert finding["severity"] == "Warning" and finding["nodes"] == ["legacy-1"]
    assert status["finalized"] is False, "legacy-1 stays on iptables: mixed mode, pair kept"
    planned = {n for s in status["stages"] for n in s["nodes"]}
    assert "legacy-1" not in planned
    assert node_modes(client.CoreV1Api(api))["legacy-1"] is None
