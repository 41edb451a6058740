"""Turn a policy's stages into concrete node batches. Pure: data in, data out.

Rules (DESIGN §4):

- Only *eligible* nodes are planned: those the source DaemonSet runs on, matching the
  policy's ``nodeSelector``, minus nodes excluded by preflight.
- Stages are cumulative. A stage with a ``nodeSelector`` takes the not-yet-planned
  eligible nodes that match it; a stage with a ``percent`` grows the planned total to
  ``ceil(percent% * eligible)``; with both, the percent is filled from the matching
  nodes only. ``maxNodes`` caps a stage.
- The order is stable and spreads a stage across zones (round-robin over zones,
  names sorted within a zone), so a canary of three lands in three zones, and the
  same inputs always give the same plan. Control-plane nodes (``node-role.kubernetes.io/
  control-plane`` or the old ``master`` role) come after every worker, so a percent stage
  never takes one as its first canary: a control plane that loses its Service rules takes
  the cluster's API path with it.
- Stages already started keep their recorded nodes (``fixed``): re-planning after a
  restart, a node joining or a spec change never moves a node between started stages.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from proxymode.api.models import PolicySpec, Stage
from proxymode.engine.matching import selector_matches

__all__ = [
    "PlanNode",
    "max_unavailable_count",
    "plan_hash",
    "plan_stages",
    "selector_matches",
    "zone_spread",
]


@dataclass(frozen=True)
class PlanNode:
    """What the planner needs to know about a node."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    zone: str = ""

    @property
    def control_plane(self) -> bool:
        return any(role in self.labels for role in CONTROL_PLANE_ROLES)


CONTROL_PLANE_ROLES = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")


def zone_spread(nodes: Sequence[PlanNode]) -> list[PlanNode]:
    """Workers first, then control-plane nodes; each part round-robin over zones (sorted),
    names sorted within each zone."""
    workers = [n for n in nodes if not n.control_plane]
    control = [n for n in nodes if n.control_plane]
    return _spread(workers) + _spread(control)


def _spread(nodes: Sequence[PlanNode]) -> list[PlanNode]:
    by_zone: dict[str, list[PlanNode]] = defaultdict(list)
    for node in sorted(nodes, key=lambda n: n.name):
        by_zone[node.zone].append(node)
    queues = [by_zone[z] for z in sorted(by_zone)]
    out: list[PlanNode] = []
    depth = 0
    while len(out) < len(nodes):
        for queue in queues:
            if depth < len(queue):
                out.append(queue[depth])
        depth += 1
    return out


def plan_stages(
    stages: Sequence[Stage],
    eligible: Sequence[PlanNode],
    fixed: Mapping[int, Sequence[str]] | None = None,
) -> list[list[str]]:
    """The node names of every stage, in move order.

    ``fixed`` maps a stage index to the nodes it already holds (a started stage); those
    lists are kept as they are, minus nodes no longer eligible, and count towards the
    cumulative percents of later stages.
    """
    fixed = fixed or {}
    eligible_names = {n.name for n in eligible}
    ordered = zone_spread(eligible)
    total = len(ordered)
    taken: set[str] = set()
    for names in fixed.values():
        taken.update(n for n in names if n in eligible_names)
    plan: list[list[str]] = []
    planned = 0
    for index, stage in enumerate(stages):
        if index in fixed:
            kept = [n for n in fixed[index] if n in eligible_names]
            plan.append(kept)
            planned += len(kept)
            continue
        candidates = [
            n
            for n in ordered
            if n.name not in taken and selector_matches(stage.node_selector, n.labels)
        ]
        if stage.percent is not None:
            want = max(0, math.ceil(stage.percent * total / 100) - planned)
            candidates = candidates[:want]
        if stage.max_nodes is not None:
            candidates = candidates[: stage.max_nodes]
        names = [n.name for n in candidates]
        taken.update(names)
        planned += len(names)
        plan.append(names)
    return plan


def max_unavailable_count(value: int | str, total: int) -> int:
    """``maxUnavailable`` as a node count: percents round up (as a DaemonSet does), at least 1."""
    if isinstance(value, int):
        return max(1, value)
    percent = int(value.rstrip("%"))
    return max(1, math.ceil(percent * total / 100))


def plan_hash(spec: PolicySpec) -> str:
    """A short hash of everything that decides which nodes move where and how.

    A change of this hash mid-rollout pauses the run (DESIGN §2: ``planHash``); bake
    times, analysis thresholds and ``paused`` are left out, since changing them never
    changes what has been done.
    """
    relevant = {
        "targetMode": spec.target_mode,
        "kubeProxy": spec.kube_proxy.wire(),
        "nodeSelector": spec.node_selector.wire() if spec.node_selector else None,
        "configOverrides": spec.config_overrides,
        "incompatibleNodes": spec.incompatible_nodes,
        "stages": [{k: v for k, v in s.wire().items() if k != "bakeSeconds"} for s in spec.stages],
    }
    digest = hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()
    return digest[:16]
