"""How often finalize restarts each kube-proxy, on the real DaemonSet controller.

The default, ``finalizeSourceTemplate: KeepExclusionTerm``, is measured by
``test_migration.py`` (a): two starts per node. This is the other choice, ``Exact``: the
source's original affinity comes back, which the real kube-controller-manager's DaemonSet
controller rolls out (maxUnavailable 1): one more start per node, three in all, never two
proxies on a node, and the source DaemonSet exactly as before apart from the mode.
"""

from __future__ import annotations

from kubernetes import client

from tests.sandbox.harness import KubeProxy, PodStarts, Policies, Sampler, mode_of, raw

ONE_STAGE = [{"name": "all", "percent": 100, "bakeSeconds": 0}]


def test_exact_source_template_costs_one_more_rolling_restart(
    api: client.ApiClient, proxy: KubeProxy, policies: Policies, sampler: Sampler
) -> None:
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    starts = PodStarts(api, proxy.namespace)
    starts.start()
    name = policies.create(proxy.namespace, stages=ONE_STAGE, finalizeSourceTemplate="Exact")
    status = policies.wait_phase(name, "Completed", "Failed", "RolledBack", timeout=240)
    assert status["phase"] == "Completed", status.get("message")
    assert status["finalized"] is True
    starts.stop()
    assert mode_of(core, proxy.namespace) == "nftables"
    ds = raw(apps.read_namespaced_daemon_set, "kube-proxy", proxy.namespace)
    assert ds["spec"] == proxy.ds_spec, "the original template and strategy, exactly"
    assert starts.per_node() == dict.fromkeys(proxy.nodes, 3), "switch, hand-back, roll"
    print(f"\nExact: kube-proxy starts per node {starts.per_node()}")
