"""The plan as the status holds it: eligible nodes, newcomers, starting a stage, plan changes.

``status.stages`` is planned once at preflight; later looks only keep it current: deleted
nodes drop out, nodes that join a started selector (or 100 %) stage are taken, and a plan
edit is adopted on resume without forgetting what already moved.
"""

from __future__ import annotations

from collections.abc import Sequence

from proxymode.api.models import (
    AnalysisStatus,
    LabelSelector,
    MoveDirection,
    Phase,
    Preflight,
    Severity,
    Stage,
    StagePhase,
    StageStatus,
)
from proxymode.api.reasons import EventReason
from proxymode.engine.look import Look
from proxymode.engine.observed import NodeView
from proxymode.engine.planner import PlanNode, plan_hash, plan_stages, selector_matches
from proxymode.engine.preflight import KERNEL_TOO_OLD, eligible_nodes
from proxymode.kubeproxy import kernel_supports


def excluded(preflight: Preflight | None) -> set[str]:
    """The nodes preflight left out (they cannot run the target mode).

    Read from the result preflight stored; a status written before ``excludedNodes``
    existed falls back to the KernelTooOld warning's node list.
    """
    if preflight is None:
        return set()
    if preflight.excluded_nodes is not None:
        return set(preflight.excluded_nodes)
    return {
        n
        for f in preflight.findings
        if f.code == KERNEL_TOO_OLD and f.severity == Severity.WARNING
        for n in f.nodes
    }


def eligible(look: Look, candidates: Sequence[NodeView] | None = None) -> list[PlanNode]:
    """The nodes the plan may use: preflight's eligible nodes, minus those it left out and
    any node (a newcomer preflight never saw) whose kernel cannot run the target mode.
    ``candidates``: ``eligible_nodes`` already worked out for this look (5,000 nodes' worth
    of affinity terms is not worked out twice)."""
    source = look.obs.source_daemon_set
    if source is None:
        return []
    left_out = excluded(look.status.preflight)
    if candidates is None:
        candidates = eligible_nodes(look.spec, source, look.obs.nodes)
    return [
        PlanNode(n.name, n.labels, n.zone)
        for n in candidates
        if n.name not in left_out and kernel_supports(look.target_mode, n.kernel) is not False
    ]


def _leave_out_old_kernels(look: Look, candidates: Sequence[NodeView]) -> None:
    """A node that joined on a kernel the target mode cannot run is left out, as preflight
    leaves such nodes out: recorded in ``excludedNodes`` (said once) with a Warning."""
    source = look.obs.source_daemon_set
    preflight = look.status.preflight
    if source is None or preflight is None:
        return
    left_out = excluded(preflight)
    for n in candidates:
        if n.name in left_out or kernel_supports(look.target_mode, n.kernel) is not False:
            continue
        left_out.add(n.name)
        preflight.excluded_nodes = sorted(left_out)
        look.event(
            EventReason.NODE_KERNEL_TOO_OLD,
            f"node {n.name} joined, but its kernel {n.kernel} cannot run {look.target_mode}"
            f" mode: it is left out and keeps the current mode",
            warning=True,
        )


def refresh_plan(look: Look) -> None:
    """Drop deleted nodes; let started, uncapped selector (or 100%) stages take newcomers.

    A stage whose ``maxNodes`` (or a percent below 100) left matching nodes out at its start
    takes nobody later: those nodes did not join the cluster, the cap left them out on
    purpose. A newcomer gets the kernel check preflight gave the others.
    """
    present = {n.name for n in look.obs.nodes}
    for stage in look.status.stages:
        stage.nodes = [n for n in stage.nodes if n in present]
    source = look.obs.source_daemon_set
    candidates = [] if source is None else eligible_nodes(look.spec, source, look.obs.nodes)
    _leave_out_old_kernels(look, candidates)
    planned = set(look.planned())
    for node in eligible(look, candidates):
        if node.name in planned:
            continue
        for spec_stage, stage in zip(look.spec.stages, look.status.stages, strict=False):
            if stage.phase == StagePhase.PENDING:
                break
            if not _takes_newcomers(spec_stage, stage):
                continue
            if selector_matches(spec_stage.node_selector, node.labels):
                stage.nodes.append(node.name)
                planned.add(node.name)
                look.event(EventReason.NODE_JOINED, f"node {node.name} joined stage {stage.name}")
                break


def _takes_newcomers(spec_stage: Stage, stage: StageStatus) -> bool:
    """A selector (or 100 %) stage with room under its ``maxNodes`` takes nodes that join."""
    if spec_stage.node_selector is None and spec_stage.percent != 100:
        return False
    if spec_stage.percent is not None and spec_stage.percent != 100:
        return False
    return spec_stage.max_nodes is None or len(stage.nodes) < spec_stage.max_nodes


def _fixed(stages: list[StageStatus]) -> dict[int, list[str]]:
    return {i: s.nodes for i, s in enumerate(stages) if s.phase != StagePhase.PENDING}


def start_stage(look: Look, index: int) -> None:
    plan = plan_stages(look.spec.stages, eligible(look), _fixed(look.status.stages))
    stage = look.status.stages[index]
    # Nodes a dropped stage moved, carried here by ``adopt_new_plan`` while this stage was
    # pending, stay this stage's: the plan knows only the spec's selectors, and without them
    # here they would run the target unrecorded (not counted, not shown, not moved back on
    # delete as what they are).
    # So do its nodes still moving forward: resumed before their move ended, they would
    # finish on the target recorded nowhere, outside every health check (a review).
    flying = {m.node for m in look.status.moves if m.direction == MoveDirection.FORWARD}
    carried = [
        n
        for n in dict.fromkeys([*(stage.moved or []), *(n for n in stage.nodes if n in flying)])
        if n not in plan[index]
    ]
    stage.nodes = [*plan[index], *carried]
    stage.phase = StagePhase.PROGRESSING
    stage.started_time = look.now
    stage.nodes_done = 0
    stage.moved = stage.moved or []  # a dropped stage's finished moves may be carried here
    look.status.current_stage = index
    look.status.analysis = AnalysisStatus() if look.spec.analysis else None
    look.event(EventReason.STAGE_STARTED, f"stage {stage.name}: moving {nodes(len(stage.nodes))}")


def adopt_new_plan(look: Look) -> None:
    """Resume after a plan change: started stages keep their nodes, the rest re-plan."""
    old = {s.name: s for s in look.status.stages if s.phase != StagePhase.PENDING}
    stages = []
    for spec_stage in look.spec.stages:
        kept = old.pop(spec_stage.name, None)
        stages.append(kept or StageStatus(name=spec_stage.name))
    orphans = [n for s in old.values() for n in s.nodes]
    look.status.stages = stages
    dropped = _drop_untouched_leavers(look, stages)
    plan = plan_stages(look.spec.stages, eligible(look), _fixed(stages))
    for i, stage in enumerate(stages):
        if stage.phase == StagePhase.PENDING:
            stage.nodes = plan[i]
    current = next(
        (i for i, s in enumerate(stages) if s.phase != StagePhase.COMPLETED), len(stages) - 1
    )
    # Nodes moved by a stage the new plan dropped stay recorded, so rollback finds them,
    # and so do their finished moves (they are not a person's label). So does a node moving
    # forward that the re-plan left out or put in a later stage (its stage stored Pending
    # by a lost write, then narrowed out: a review saw it finish recorded nowhere).
    flying = [m.node for m in look.status.moves if m.direction == MoveDirection.FORWARD]
    for stage in stages[current + 1 :]:
        if stage.phase == StagePhase.PENDING:
            stage.nodes = [n for n in stage.nodes if n not in flying]
    placed_now = {n for s in stages for n in s.nodes}
    stages[current].nodes = [
        *stages[current].nodes,
        *[n for n in orphans if n not in stages[current].nodes],
        *[n for n in flying if n not in placed_now and n not in orphans],
    ]
    moved = [n for s in old.values() for n in (s.moved or [])]
    recorded = stages[current].moved
    if moved and (recorded is not None or stages[current].phase == StagePhase.PENDING):
        stages[current].moved = [
            *(recorded or []),
            *[n for n in moved if n not in (recorded or [])],
        ]
    # A node belongs to one stage: the orphans now in the current stage leave the plan of
    # every stage after it (planned before they were placed, they were counted twice, e.g.
    # "6/10" nodes moved on an 8-node cluster, until the next stage started and re-planned).
    placed = {n for s in stages[: current + 1] for n in s.nodes}
    for stage in stages[current + 1 :]:
        if stage.phase == StagePhase.PENDING:
            stage.nodes = [n for n in stage.nodes if n not in placed]
            placed.update(stage.nodes)
    look.status.current_stage = current
    look.status.plan_hash = plan_hash(look.spec)
    look.status.resume_phase = Phase.PROGRESSING
    left = (
        f"; {named(dropped)}, not yet moved and no longer selected, left the started stages"
        if dropped
        else ""
    )
    look.event(
        EventReason.PLAN_ADOPTED,
        f"resumed with the new plan at stage {stages[current].name}{left}",
    )


def _drop_untouched_leavers(look: Look, stages: list[StageStatus]) -> list[str]:
    """A started stage keeps its nodes, but not one the new spec no longer selects (its
    ``nodeSelector``, the stage's own selector) that nothing has touched yet: no move, no
    label. A review narrowed spec.nodeSelector to keep a suspect node out mid-stage, and it
    moved anyway. Nodes moved, moving or labelled stay, so rollback still finds them."""
    chosen = {n.name for n in eligible(look)}
    flying = {m.node for m in look.status.moves}
    dropped: list[str] = []
    for spec_stage, stage in zip(look.spec.stages, stages, strict=False):
        if stage.phase == StagePhase.PENDING:
            continue
        touched = flying | set(stage.moved or [])
        selector = spec_stage.node_selector
        leaving = {n for n in stage.nodes if _left_by_spec(look, n, selector, chosen, touched)}
        dropped += [n for n in stage.nodes if n in leaving]
        stage.nodes = [n for n in stage.nodes if n not in leaving]
    return dropped


def _left_by_spec(
    look: Look, name: str, selector: LabelSelector | None, chosen: set[str], touched: set[str]
) -> bool:
    """Untouched (no move, no label) and no longer selected by the spec or the stage."""
    view = look.obs.node(name)
    if name in touched or (view is not None and view.mode_label):
        return False
    if view is None or name not in chosen:
        return True
    return selector is not None and not selector_matches(selector, view.labels)


def covers_every_node(look: Look) -> bool:
    """Finalize only when no node the source DaemonSet runs on stays on the source mode."""
    source = look.obs.source_daemon_set
    if source is None:
        return False
    every = {
        n.name
        for n in eligible_nodes(
            look.spec.model_copy(update={"node_selector": None}), source, look.obs.nodes
        )
    }
    return every <= set(look.planned())


def nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def named(names: Sequence[str], shown: int = 5) -> str:
    """``node a`` / ``nodes a, b, c and 4 more``: nodes named in a message."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{'node' if len(names) == 1 else 'nodes'} {', '.join(names[:shown])}{more}"


def mixed_mode_words(lk: Look, moved: int) -> str:
    """What a Completed, unfinalized policy says: which nodes run which mode. With every
    node covered (``finalize: false``) there are no "others" to name (a review)."""
    if covers_every_node(lk):
        return (
            f"{nodes(moved)} run {lk.spec.target_mode}, every node the policy covers; both"
            " DaemonSets kept (finalize: false)"
        )
    return (
        f"{nodes(moved)} run {lk.spec.target_mode}; the others stay on"
        f" {lk.status.source_mode}, both DaemonSets kept (mixed mode)"
    )
