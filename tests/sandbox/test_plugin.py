"""``kubectl proxymode`` as a user runs it: the sandbox's kubectl, the plugin on PATH.

Every command goes through kubectl's plugin lookup (``kubectl proxymode ...`` finds
``kubectl-proxymode`` on PATH), against the sandbox's real API server, operator and Prometheus.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from proxymode_sandbox import Sandbox
from tests.cli.browser import EXTERNAL, check_charts, chromium
from tests.sandbox.harness import STAGES, KubeProxy, Policies, eventually, install_kube_proxy
from tests.sandbox.test_gates import analysis

pytestmark = pytest.mark.sandbox
IN_CLUSTER_PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
"""The sandbox publishes its Prometheus under the name every example uses (decision 0032)."""
IN_CLUSTER_SHORT = "http://prometheus-operated.monitoring:9090"
"""The same as a pod's search path completes it (Flagger's docs name Prometheus so)."""
PLUGIN_DIR = Path(sys.executable).parent  # the venv's bin, where kubectl-proxymode is


def kubectl_proxymode(
    sandbox: Sandbox, *args: str, timeout: float = 120, check: bool = False
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = f"{sandbox.bin_dir}{os.pathsep}{PLUGIN_DIR}{os.pathsep}{env.get('PATH', '')}"
    env["KUBECONFIG"] = str(sandbox.kubeconfig)
    done = subprocess.run(
        [str(sandbox.bin_dir / "kubectl"), "proxymode", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check:
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def policy_file(tmp_path: Path, namespace: str, **spec: Any) -> Path:
    body = {
        "apiVersion": "proxymode.io/v1alpha1",
        "kind": "ProxyModePolicy",
        "metadata": {"name": "planned"},
        "spec": {"targetMode": "nftables", "kubeProxy": {"namespace": namespace}, **spec},
    }
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def versions(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """resourceVersions of everything plan could touch, and every node's labels."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    custom = client.CustomObjectsApi(api)
    return {
        "daemonsets": {
            d.metadata.name: d.metadata.resource_version
            for d in apps.list_namespaced_daemon_set(namespace).items
        },
        "configmaps": {
            c.metadata.name: c.metadata.resource_version
            for c in core.list_namespaced_config_map(namespace).items
        },
        "jobs": [
            j.metadata.name for j in client.BatchV1Api(api).list_namespaced_job(namespace).items
        ],
        "policies": {
            p["metadata"]["name"]: p["metadata"]["resourceVersion"]
            for p in custom.list_cluster_custom_object(
                "proxymode.io", "v1alpha1", "proxymodepolicies"
            )["items"]
        },
        "node_labels": {n.metadata.name: n.metadata.labels for n in core.list_node().items},
    }


def test_version_and_list_through_kubectl(sandbox: Sandbox, operator: Sandbox) -> None:
    done = kubectl_proxymode(sandbox, "version", "-o", "json", check=True)
    data = json.loads(done.stdout)
    assert data["plugin"]["version"]
    assert data["server"].startswith("v1.37")
    assert data["crd"] == {"installed": True, "versions": ["v1alpha1"]}
    text = kubectl_proxymode(sandbox, "version", check=True).stdout
    assert text.startswith("plugin:   kubectl-proxymode")
    assert (
        json.loads(kubectl_proxymode(sandbox, "list", "-o", "json", check=True).stdout) is not None
    )
    helps = kubectl_proxymode(sandbox, "--help", check=True).stdout
    assert helps.startswith("usage: kubectl proxymode")
    for command in (
        "list",
        "status",
        "promote",
        "abort",
        "retry",
        "pause",
        "resume",
        "plan",
        "advise",
        "report",
        "version",
    ):
        assert command in helps
    missing = kubectl_proxymode(sandbox, "status", "no-such-policy")
    assert (
        missing.returncode == 1 and 'proxymodepolicy "no-such-policy" not found' in missing.stderr
    )


def test_plan_shows_the_engine_s_plan_and_changes_nothing(
    sandbox: Sandbox, api: client.ApiClient, namespace: str, operator: Sandbox, tmp_path: Path
) -> None:
    install_kube_proxy(api, namespace, include_legacy=True)
    path = policy_file(tmp_path, namespace, incompatibleNodes="Exclude", stages=STAGES)
    before = versions(api, namespace)
    done = kubectl_proxymode(sandbox, "plan", "-f", str(path), "-o", "json", check=True)
    plan = json.loads(done.stdout)
    text = kubectl_proxymode(sandbox, "plan", "-f", str(path), check=True).stdout
    after = versions(api, namespace)
    assert after == before, "plan changed the cluster"
    assert plan["wouldStart"] is True and plan["sourceMode"] == "iptables"
    stages = [[n["name"] for n in s["nodes"]] for s in plan["stages"]]
    assert stages[0] == ["canary-1", "canary-2"]
    assert sorted(n for s in stages for n in s) == [
        "canary-1",
        "canary-2",
        "general-1",
        "general-2",
        "general-3",
    ]
    left = {n["name"]: n["reason"] for n in plan["leftOut"]}
    assert list(left) == ["legacy-1"] and left["legacy-1"].startswith("KernelTooOld")
    assert "legacy-1" in text.split("Left out")[1] and "nothing was changed" in text
    # A bad file is refused with the reason, and still nothing changes.
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace("nftables", "userspace"))
    refused = kubectl_proxymode(sandbox, "plan", "-f", str(bad))
    assert refused.returncode == 1 and "spec.targetMode" in refused.stderr
    # A run preflight would refuse (legacy-1's kernel, incompatibleNodes left at Fail): the
    # plan is still printed, and the exit code says so, as `status` says Failed.
    (tmp_path / "strict").mkdir()
    strict = policy_file(tmp_path / "strict", namespace, stages=STAGES)
    would_not = kubectl_proxymode(sandbox, "plan", "-f", str(strict))
    assert would_not.returncode == 4, would_not
    assert "REFUSED" in would_not.stdout and "legacy-1" in would_not.stdout
    assert versions(api, namespace) == before


def watch_json(sandbox: Sandbox, name: str, timeout: str) -> tuple[int, list[dict[str, Any]], str]:
    done = kubectl_proxymode(
        sandbox, "status", name, "--watch", "--timeout", timeout, "-o", "json", timeout=1000
    )
    views = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return done.returncode, views, done.stderr


@pytest.mark.timeout(1200)
def test_status_watches_a_gated_migration_to_completed_and_reports_it(
    sandbox: Sandbox, proxy: KubeProxy, policies: Policies, tmp_path: Path
) -> None:
    name = policies.create(proxy.namespace, analysis=analysis(sandbox))
    # A gated run takes a few minutes on a shared machine; the deadline only ends one that
    # would never finish.
    code, views, err = watch_json(sandbox, name, "900s")
    assert code == 0, (views[-1:] if views else None, err)
    phases = [v["phase"] for v in views]
    assert phases[-1] == "Completed"
    assert {"Progressing", "Analyzing"} <= set(phases), phases
    final = views[-1]
    assert all(
        n["mode"] == "nftables" and n["step"].startswith("moved, verified")
        for s in final["stages"]
        for n in s["nodes"]
    )
    assert {c["name"] for c in final["analysis"]["checks"]} == {
        "sync-p99",
        "conntrack",
        "failures",
        "vs-baseline",
    }
    # The view keeps the 10 latest Events: since every move also reports its verification
    # (NodeVerified), the run's early StageStarted is out of that window by the end, and the
    # end of the run is in it.
    reasons = [e["reason"] for e in final["events"]]
    assert 0 < len(reasons) <= 10, reasons
    assert "Completed" in reasons and "NodeVerified" in reasons, reasons
    # The tree, as a person sees it; and --timeout on a finished policy returns at once.
    done = kubectl_proxymode(sandbox, "status", name, "--timeout", "10s")
    assert done.returncode == 0
    assert done.stdout.startswith(f"ProxyModePolicy {name}   iptables -> nftables")
    assert "└── ✔ all" in done.stdout and "Checks" in done.stdout and "Events" in done.stdout
    print(f"\n{done.stdout}")
    # The report of that run: self-contained, and every chart drawn.
    html = tmp_path / "report.html"
    kubectl_proxymode(sandbox, "report", name, "-o", str(html), check=True, timeout=180)
    text = html.read_text()
    assert EXTERNAL.search(text) is None
    assert 'id="chart-nodes"' in text and 'id="chart-checks"' in text
    # The Markdown one with the policy's Prometheus named as a pod knows it (the short
    # NAME.NAMESPACE, which does not resolve here): from outside the cluster the report
    # reaches it as the operator does, through the API server's service proxy, and draws
    # the same charts.
    md = tmp_path / "report.md"
    kubectl_proxymode(
        sandbox,
        "report",
        name,
        "-o",
        str(md),
        "--format",
        "markdown",
        "--prometheus",
        IN_CLUSTER_SHORT,
        check=True,
    )
    assert "through the API server's service proxy" in md.read_text()
    assert md.read_text().count("data:image/svg+xml;base64,") == text.count("<svg")
    if chromium() is None:
        pytest.skip("chromium is not installed: the report was not opened")
    png, charts = check_charts(html, tmp_path)
    print(f"report screenshot: {png}")
    assert {c.ident for c in charts} == {"phases", "nodes", "checks", "kernels"}
    for c in charts:
        assert c.box is not None, f"chart {c.ident} draws nothing"
        assert c.changed > 3000 and c.stddev > 20 and c.colours > 8, c


def test_status_timeout_exit_codes_pause_resume_abort_retry(
    sandbox: Sandbox, proxy: KubeProxy, policies: Policies
) -> None:
    slow = [{**STAGES[0], "bakeSeconds": 600}, *STAGES[1:]]
    name = policies.create(proxy.namespace, stages=slow, paused=True)
    # Created paused: it waits before preflight, so a deadline ends with the timeout code.
    done = kubectl_proxymode(sandbox, "status", name, "--timeout", "3s")
    assert done.returncode == 5 and "timed out after 3s" in done.stderr
    refused = kubectl_proxymode(sandbox, "promote", name)
    assert refused.returncode == 1 and "spec.paused is true" in refused.stderr
    kubectl_proxymode(sandbox, "resume", name, check=True)
    assert policies.get(name)["spec"]["paused"] is False
    policies.wait_phase(name, "Analyzing", timeout=180)
    # -o after an action, as kubectl takes it: the policy as the API server stored the change.
    paused = kubectl_proxymode(sandbox, "pause", name, "-o", "json", check=True)
    assert json.loads(paused.stdout)["spec"]["paused"] is True
    assert "managedFields" not in json.loads(paused.stdout)["metadata"]
    policies.wait_phase(name, "Paused")
    kubectl_proxymode(sandbox, "resume", name, check=True)
    policies.wait_phase(name, "Analyzing")
    kubectl_proxymode(sandbox, "abort", name, check=True)
    done = kubectl_proxymode(sandbox, "status", name, "--timeout", "180s", timeout=240)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "Rollback: Aborted" in done.stdout
    status = policies.status(name)
    assert status["phase"] == "RolledBack"
    again = kubectl_proxymode(sandbox, "abort", name)
    assert again.returncode == 1 and "nothing to abort" in again.stderr
    kubectl_proxymode(sandbox, "retry", name, check=True)
    # The operator took it: a second run starts from preflight (no need to wait it out).
    eventually(lambda: policies.status(name).get("run") == 2, what="the retry to start run 2")


def test_status_timeout_exits_4_on_failed(
    sandbox: Sandbox, api: client.ApiClient, namespace: str, policies: Policies
) -> None:
    install_kube_proxy(api, namespace, include_legacy=True)
    name = policies.create(namespace, incompatibleNodes="Refuse")
    done = kubectl_proxymode(sandbox, "status", name, "--timeout", "120s", timeout=180)
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert "Phase:    Failed" in done.stdout and "REFUSED" in done.stdout
    assert "KernelTooOld" in done.stdout


def test_advise_keeps_the_legacy_pool_on_iptables_and_never_says_ipvs(
    sandbox: Sandbox, operator: Sandbox
) -> None:
    def measured() -> dict[str, Any] | None:
        """advise's answer once Prometheus has kube-proxy's sync histogram to measure: on a
        sandbox only seconds old (this test first on its worker) it has no sample yet."""
        done = kubectl_proxymode(
            sandbox, "advise", "--prometheus", sandbox.prometheus_url, "-o", "json", check=True
        )
        answer: dict[str, Any] = json.loads(done.stdout)
        convergence = next(d for d in answer["dimensions"] if d["name"] == "rule convergence")
        sync = [r for r in convergence["reasons"] if "sync p99 today" in r]
        return answer if sync and "not measured" not in sync[0].split(",")[0] else None

    a = eventually(measured, timeout=60, interval=2, what="a sync p99 measured by advise")
    assert a["currentMode"] == "iptables"
    assert a["recommendation"] == "nftables"
    assert [p["pool"] for p in a["leaveOut"]] == ["legacy"]
    assert a["leaveOut"][0]["nodes"] == ["legacy-1"]
    assert "kernel older than 5.13" in a["leaveOut"][0]["reason"]
    reasons = {d["name"]: d["reasons"] for d in a["dimensions"]}
    assert any(
        "legacy" in r and "keep it on iptables" in r for r in reasons["correctness and semantics"]
    )
    assert any(
        "sync p99 today" in r and "not measured" not in r.split(",")[0]
        for r in reasons["rule convergence"]
    )
    assert any("ipvs is deprecated" in r for r in reasons["operations"])
    # The simulated iptables kube-proxies count no localhost NodePort packets: measured zero.
    assert any("(measured)" in r and "localhost" in r for r in reasons["correctness and semantics"])
    assert a["recommendation"] != "ipvs"
    policy = a["policy"]
    assert policy["spec"]["nodeSelector"]["matchExpressions"][0]["values"] == ["legacy"]
    text = kubectl_proxymode(
        sandbox, "advise", "--prometheus", sandbox.prometheus_url, check=True
    ).stdout
    assert text.startswith("Recommendation: move to nftables")
    assert "pool legacy" in text and "kind: ProxyModePolicy" in text
    # Read on this machine's loopback, the starter policy names Prometheus as the
    # operator's pod reaches it, and says so.
    assert f"Prometheus was read at {sandbox.prometheus_url}" in text
    assert f"url: {IN_CLUSTER_PROMETHEUS}" in text
    # The same Prometheus as a policy names it: reached through the API server's service proxy
    # from here, as the operator reaches it (decision 0032), so the sync figure is measured.
    inside = kubectl_proxymode(
        sandbox, "advise", "--prometheus", IN_CLUSTER_PROMETHEUS, "-o", "json", check=True
    )
    convergence = {d["name"]: d["reasons"] for d in json.loads(inside.stdout)["dimensions"]}
    assert any(
        "sync p99 today" in r and "not measured" not in r.split(",")[0]
        for r in convergence["rule convergence"]
    ), convergence
