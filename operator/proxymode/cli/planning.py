"""What ``plan -f POLICY.yaml`` shows, pure: the engine's own preflight and planner on a snapshot.

Nothing here decides anything new: :func:`proxymode.engine.preflight.run_preflight` says
whether the run would start and which nodes it may move, and
:func:`proxymode.engine.planner.plan_stages` says which nodes each stage takes, in the order
the operator would move them (spread over zones). This module only adds the "why not" for
every node left out, and the text.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from proxymode.api.models import PolicySpec, Stage
from proxymode.engine.observed import Observed
from proxymode.engine.planner import PlanNode, max_unavailable_count, plan_stages, selector_matches
from proxymode.engine.preflight import Code, run_preflight

NOT_SCHEDULED = "the source DaemonSet does not run there (its nodeSelector or affinity)"
NOT_SELECTED = "does not match the policy's nodeSelector"
DELETING = "being deleted"
NO_STAGE = "eligible, but no stage takes it (the stages cover part of the cluster)"


def _stage_rule(stage: Stage) -> str:
    parts = []
    if stage.node_selector is not None:
        labels = stage.node_selector.match_labels or {}
        parts += [f"{k}={v}" for k, v in sorted(labels.items())]
        parts += [
            f"{r.key} {r.operator} {','.join(r.values or [])}".strip()
            for r in stage.node_selector.match_expressions or []
        ]
    if stage.percent is not None:
        parts.append(f"up to {stage.percent}% in all")
    if stage.max_nodes is not None:
        parts.append(f"at most {stage.max_nodes}")
    parts.append(f"bake {stage.bake_seconds}s")
    return ", ".join(parts)


def plan_view(spec: PolicySpec, observed: Observed, name: str = "") -> dict[str, Any]:
    """Preflight, the stages' nodes by zone, and every node left out with the reason."""
    result = run_preflight(spec, observed)
    running = observed.backup is not None
    rival = any(f.code == Code.ANOTHER_POLICY_IN_FLIGHT for f in result.findings)
    if running or rival:
        # As the engine's preflight reads them: a policy of this name with a snapshot has
        # changed the cluster, and the labelled nodes are its own moves; with another policy
        # in flight they are that one's. "Remove the label" would have pointed at moved
        # canaries (two reviews).
        result = result.without(Code.NODES_ALREADY_LABELLED)
    eligible_names = set(result.eligible)
    eligible = [
        PlanNode(n.name, n.labels, n.zone)
        for n in sorted(observed.nodes, key=lambda n: n.name)
        if n.name in eligible_names
    ]
    plan = plan_stages(spec.stages, eligible)
    zones = {n.name: n.zone or "-" for n in observed.nodes}
    stages = []
    for stage, names in zip(spec.stages, plan, strict=True):
        stages.append(
            {
                "name": stage.name,
                "rule": _stage_rule(stage),
                "nodes": [{"name": n, "zone": zones.get(n, "-")} for n in names],
                "zones": dict(sorted(Counter(zones.get(n, "-") for n in names).items())),
            }
        )
    planned = {n for names in plan for n in names}
    by_node: dict[str, list[str]] = {}
    for f in result.findings:
        for n in f.nodes:
            by_node.setdefault(n, []).append(f"{f.code}: {f.message}")
    left_out = []
    for node in sorted(observed.nodes, key=lambda n: n.name):
        if node.name in planned:
            continue
        if node.name in result.excluded:
            reason = "; ".join(by_node.get(node.name, [])) or "cannot run the target mode"
        elif node.name in eligible_names:
            reason = NO_STAGE
        elif node.deleting:
            reason = DELETING
        elif not selector_matches(spec.node_selector, node.labels):
            reason = NOT_SELECTED
        else:
            reason = NOT_SCHEDULED
        left_out.append({"name": node.name, "zone": node.zone or "-", "reason": reason})
    return {
        "name": name,
        "sourceMode": result.source_mode,
        "targetMode": str(spec.target_mode),
        "kubeProxyVersion": result.kube_proxy_version,
        "kubernetesVersion": observed.facts.kubernetes_version,
        "wouldStart": result.passed,
        "eligible": len(eligible),
        "maxUnavailable": max_unavailable_count(spec.max_unavailable, len(eligible)),
        "stages": stages,
        "leftOut": left_out,
        "findings": [f.wire() for f in result.findings],
        "running": running,
    }


def render(v: Mapping[str, Any]) -> str:
    out = [
        f"Plan for ProxyModePolicy {v['name']}: {v['sourceMode'] or '?'} -> {v['targetMode']}"
        f"   (kube-proxy {v['kubeProxyVersion'] or '?'}; nothing was changed)",
        "Preflight: "
        + (
            "passed, the run would start" if v["wouldStart"] else "REFUSED, the run would not start"
        ),
    ]
    if v.get("running"):
        out.insert(
            1,
            f"Note: ProxyModePolicy {v['name']} exists and has changed the cluster (its snapshot"
            " exists): this"
            " is the whole plan as a new run would take it; its nodes on the target label are"
            " its own moves. An edit of its stages pauses it (PlanChanged) until resumed; the"
            " nodes it moved stay in their stages.",
        )
    for f in v["findings"]:
        out.append(f"  {f['severity']:<8} {f['code']:<24} {f['message']}")
    out.append("")
    moved = sum(len(s["nodes"]) for s in v["stages"])
    out.append(
        f"Stages   {moved} of {v['eligible']} eligible nodes, at most {v['maxUnavailable']}"
        " between proxies at once"
    )
    for i, s in enumerate(v["stages"], start=1):
        zones = ", ".join(f"{z} {c}" for z, c in s["zones"].items()) or "no nodes"
        count = len(s["nodes"])
        many = f"{count} node" if count == 1 else f"{count} nodes"
        out.append(f"  {i}. {s['name']:<12} {many} ({zones})   [{s['rule']}]")
        for j, n in enumerate(s["nodes"], start=1):
            out.append(f"       {j:>2}. {n['name']:<22} {n['zone']}")
    if v["leftOut"]:
        out.append("")
        out.append("Left out")
        for n in v["leftOut"]:
            out.append(f"  {n['name']:<22} {n['zone']:<8} {n['reason']}")
    return "\n".join(out) + "\n"


def stage_nodes(v: Mapping[str, Any]) -> Sequence[Sequence[str]]:
    """The node names of each stage, in move order (for scripts and tests)."""
    return [[n["name"] for n in s["nodes"]] for s in v["stages"]]
