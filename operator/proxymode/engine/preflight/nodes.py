"""Which nodes the policy may move, and checks of them: kernels, stages, readiness (§4, §6).

A node is *eligible* when it is not being deleted, the source DaemonSet would run on it (its
pod template's ``nodeSelector`` and required node affinity, ignoring the
``proxymode.io/mode`` expressions the operator itself adds) and the policy's
``nodeSelector`` matches it. kube-proxy tolerates every taint, so taints do not matter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxymode.api.models import Finding, IncompatibleNodes, PolicySpec, Severity
from proxymode.engine.matching import requirement_holds, selector_matches
from proxymode.engine.observed import MODE_LABEL, NodeView
from proxymode.engine.planner import PlanNode, plan_stages
from proxymode.engine.preflight.codes import Code
from proxymode.engine.preflight.text import (
    get_list,
    get_mapping,
    get_str,
    name_list,
    new_finding,
    plural,
)
from proxymode.kubeproxy import kernel_supports, minimum_kernel


def eligible_nodes(
    spec: PolicySpec, source_daemon_set: Mapping[str, Any], nodes: Sequence[NodeView]
) -> list[NodeView]:
    """Nodes the policy may touch, sorted by name.

    A node qualifies when it is not being deleted, the source DaemonSet would schedule a pod
    on it (pod template ``nodeSelector`` and required node affinity, minus the
    ``proxymode.io/mode`` expressions the operator adds itself) and ``spec.nodeSelector``
    matches it. Taints are ignored: kube-proxy tolerates them all.
    """
    chosen = [
        node
        for node in scheduled_by(source_daemon_set, nodes)
        if not node.deleting and selector_matches(spec.node_selector, node.labels)
    ]
    return sorted(chosen, key=lambda n: n.name)


def scheduled_by(daemon_set: Mapping[str, Any], nodes: Sequence[NodeView]) -> list[NodeView]:
    """Nodes the DaemonSet would schedule a pod on (pod template ``nodeSelector`` and required
    node affinity, minus the ``proxymode.io/mode`` expressions), whatever the policy selects."""
    pod_spec = get_mapping(daemon_set, "spec", "template", "spec")
    node_selector = get_mapping(pod_spec, "nodeSelector")
    terms = required_terms(pod_spec)
    # Read once, then applied to every node (a look at 5,000 nodes does this each time).
    compiled = None if terms is None else [Term.of(t) for t in terms]
    return [
        node
        for node in nodes
        if all(node.labels.get(k) == v for k, v in node_selector.items())
        and terms_match(compiled, node)
    ]


def required_terms(pod_spec: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The required nodeSelectorTerms; None when the DaemonSet sets no required affinity."""
    required = get_mapping(
        pod_spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = [t for t in get_list(required.get("nodeSelectorTerms")) if isinstance(t, Mapping)]
    return terms or None


Requirement = tuple[str, str, tuple[str, ...]]
"""One core/v1 NodeSelectorRequirement: (operator, key, values)."""


@dataclass(frozen=True)
class Term:
    """One nodeSelectorTerm as read from the DaemonSet's JSON: its label requirements
    without the operator's own ``proxymode.io/mode`` ones, its field requirements, and
    whether it was empty as written."""

    labels: tuple[Requirement, ...]
    fields: tuple[Requirement, ...]
    empty: bool

    @staticmethod
    def of(term: Mapping[str, Any]) -> Term:
        expressions = [e for e in get_list(term.get("matchExpressions")) if isinstance(e, Mapping)]
        fields = [f for f in get_list(term.get("matchFields")) if isinstance(f, Mapping)]
        return Term(
            labels=tuple(_requirement(e) for e in expressions if e.get("key") != MODE_LABEL),
            fields=tuple(_requirement(f) for f in fields),
            empty=not expressions and not fields,
        )


def terms_match(terms: Sequence[Term] | None, node: NodeView) -> bool:
    """Terms are ORed; a term's expressions and fields are ANDed (core/v1 NodeSelector).

    An empty term matches nothing, as in Kubernetes, except when it was made empty by
    dropping the operator's own ``proxymode.io/mode`` expressions: that term stands for the
    DaemonSet's own (absent) constraint and matches every node.
    """
    if terms is None:
        return True
    return any(term_matches(term, node) for term in terms)


def term_matches(term: Term, node: NodeView) -> bool:
    if term.empty:
        return False
    name = {"metadata.name": node.name}
    return all(requirement_holds(o, k, v, node.labels) for o, k, v in term.labels) and all(
        requirement_holds(o, k, v, name) for o, k, v in term.fields
    )


def split_kernels(
    spec: PolicySpec, candidates: list[NodeView]
) -> tuple[list[NodeView], list[NodeView], list[Finding]]:
    """Split off nodes whose kernel cannot run the target mode; report unknown kernels."""
    target = str(spec.target_mode)
    too_old = [n for n in candidates if kernel_supports(target, n.kernel) is False]
    unknown = [n for n in candidates if kernel_supports(target, n.kernel) is None]
    findings: list[Finding] = []
    minimum = minimum_kernel(target)
    needed = f"{minimum[0]}.{minimum[1]}" if minimum else "a newer kernel"
    exclude = spec.incompatible_nodes == IncompatibleNodes.EXCLUDE
    if too_old:
        listed = name_list([f"{n.name} ({n.kernel})" for n in too_old])
        why = (
            f"A kernel older than {needed}, the oldest {target} mode accepts (kube-proxy "
            f"would exit there), runs on {plural(len(too_old), 'node')}: {listed}."
        )
        if exclude:
            findings.append(
                new_finding(
                    Severity.WARNING,
                    Code.KERNEL_TOO_OLD,
                    f"{why} They are left out (incompatibleNodes: Exclude) and keep the "
                    f"current mode; upgrade their kernels to move them later.",
                    [n.name for n in too_old],
                )
            )
        else:
            findings.append(
                new_finding(
                    Severity.ERROR,
                    Code.KERNEL_TOO_OLD,
                    f"{why} Upgrade their kernels, narrow spec.nodeSelector, or set "
                    f"spec.incompatibleNodes: Exclude to leave them on the current mode.",
                    [n.name for n in too_old],
                )
            )
    if unknown:
        unreadable = name_list([f"{n.name} ({n.kernel or 'empty'})" for n in unknown])
        findings.append(
            new_finding(
                Severity.WARNING,
                Code.KERNEL_UNKNOWN,
                f"The kernel version of {plural(len(unknown), 'node')} cannot be read "
                f"({unreadable}), so it was not checked against the {needed} that {target} "
                f"mode needs. They stay in the plan; check them by hand, and watch their "
                f"canary closely.",
                [n.name for n in unknown],
            )
        )
    if not exclude:
        return candidates, [], findings
    old = {n.name for n in too_old}
    return [n for n in candidates if n.name not in old], too_old, findings


def node_findings(
    spec: PolicySpec,
    candidates: list[NodeView],
    eligible: list[NodeView],
    excluded: list[NodeView],
    observed_count: int,
) -> list[Finding]:
    """Is there anything to move, does every stage select nodes, are the nodes Ready?"""
    ref = spec.kube_proxy
    target = str(spec.target_mode)
    if not eligible:
        if candidates and excluded:
            why = (
                f"every matching node ({plural(len(excluded), 'node')}) was excluded "
                f"because it cannot run {target} mode"
            )
        else:
            why = (
                f"none of the {plural(observed_count, 'node')} matches both DaemonSet "
                f"{ref.namespace}/{ref.daemon_set}'s nodeSelector and affinity and "
                f"spec.nodeSelector (nodes being deleted do not count)"
            )
        return [
            new_finding(
                Severity.ERROR,
                Code.NO_ELIGIBLE_NODES,
                f"No node is eligible for this policy: {why}. Check spec.nodeSelector and the "
                f"DaemonSet's node placement.",
            )
        ]
    findings: list[Finding] = []
    plan = plan_stages(spec.stages, [PlanNode(n.name, n.labels, n.zone) for n in eligible])
    if not any(plan):
        # Nothing would move, yet the run would patch the source (OnDelete: its image bumps
        # stop rolling) and keep an empty target pair for as long as the policy lives, in
        # a "Completed" mixed mode (a review). Refused: nothing is changed.
        return [
            new_finding(
                Severity.ERROR,
                Code.STAGE_SELECTS_NOTHING,
                f"No stage selects a node: the {plural(len(eligible), 'eligible node')} match"
                " none of the stages' nodeSelectors, so nothing would move, while the source"
                " DaemonSet would stay patched (OnDelete) for as long as the policy lives."
                " Fix the stages' nodeSelectors (a typo in a label?) and retry; check a"
                " policy with `kubectl proxymode plan` before applying it.",
            )
        ]
    for index, (stage, nodes) in enumerate(zip(spec.stages, plan, strict=True)):
        if nodes:
            continue
        if index == 0:
            # The first stage is the canary: without it the first nodes to move are the
            # next stage's, maybe the whole fleet (a typo in the canary's label did that).
            # A Warning, not a refusal: a policy shared by clusters may name a pool one of
            # them lacks, and the empty stage then completes at once (issue 9, item 20).
            after = next((n for n in plan if n), [])
            then = (
                f"The first nodes to move would be the next stage's "
                f"{plural(len(after), 'node')}, with no canary before them."
            )
            findings.append(
                new_finding(
                    Severity.WARNING,
                    Code.STAGE_SELECTS_NOTHING,
                    f"The first stage {stage.name!r} (the canary) selects no node: its "
                    f"nodeSelector matches no eligible node, so it completes at once. {then} "
                    f"If that is not meant (a typo in a label?), set spec.paused or abort now "
                    f"and fix the nodeSelector; check a policy with `kubectl proxymode plan` "
                    f"before applying it.",
                )
            )
            continue
        findings.append(
            new_finding(
                Severity.WARNING,
                Code.STAGE_SELECTS_NOTHING,
                f"Stage {stage.name!r} selects no node: its nodeSelector matches no "
                f"eligible node not taken by an earlier stage, or earlier stages already "
                f"reach its percent. It moves nothing and still bakes ({stage.bake_seconds}s)"
                f" and is judged with the nodes moved before it; fix or remove it.",
            )
        )
    findings.extend(_control_plane(spec, eligible, plan))
    planned = sum(len(nodes) for nodes in plan)
    if planned < len(eligible):
        stay = sorted({n.name for n in eligible} - {name for nodes in plan for name in nodes})
        findings.append(
            new_finding(
                Severity.INFO,
                Code.PARTIAL_COVERAGE,
                f"The stages cover {planned} of {len(eligible)} eligible nodes; the source mode "
                f"stays on {plural(len(stay), 'node')} ({name_list(stay)}). The policy will end "
                f"with both DaemonSets kept (a mixed-mode cluster) and will not finalize; add "
                f"a stage with percent: 100 to move every node.",
                stay,
            )
        )
    not_ready = [n.name for n in eligible if not n.ready]
    if not_ready:
        findings.append(
            new_finding(
                Severity.WARNING,
                Code.NODES_NOT_READY,
                f"Not Ready: {plural(len(not_ready), 'eligible node')} ({name_list(not_ready)}). A "
                f"kube-proxy there may not become ready after the switch and hold up its "
                f"stage; fix or drain them first.",
                not_ready,
            )
        )
    return findings


def _control_plane(
    spec: PolicySpec, eligible: list[NodeView], plan: list[list[str]]
) -> list[Finding]:
    """Control-plane nodes move last in their stages; say so, and warn when one is first."""
    control = sorted(n.name for n in eligible if PlanNode(n.name, n.labels).control_plane)
    if not control:
        return []
    findings = [
        new_finding(
            Severity.INFO,
            Code.CONTROL_PLANE_LAST,
            f"{plural(len(control), 'control-plane node')} ({name_list(control)}) move after "
            f"every worker of their stage, so no percent stage starts on one; nothing to do.",
            control,
        )
    ]
    first = next(
        ((stage, nodes[0]) for stage, nodes in zip(spec.stages, plan, strict=True) if nodes), None
    )
    if first is not None and first[1] in control:
        findings.append(
            new_finding(
                Severity.WARNING,
                Code.CONTROL_PLANE_LAST,
                f"The first node to move, {first[1]} (stage {first[0].name!r}), is a "
                f"control-plane node: the stage selects no worker. Start with a worker pool "
                f"(a first stage with a nodeSelector) so a bad switch hits a worker first.",
                [first[1]],
            )
        )
    return findings


def _requirement(requirement: Mapping[str, Any]) -> Requirement:
    """One core/v1 NodeSelectorRequirement, read leniently from the DaemonSet's JSON."""
    return (
        str(requirement.get("operator")),
        get_str(requirement.get("key")) or "",
        tuple(str(v) for v in get_list(requirement.get("values"))),
    )
