"""Moving one node between the two kube-proxies, one safe step per look (DESIGN §3.5).

A move always passes through ``switching``, where neither DaemonSet runs: the label
changes only once the old pod is gone, and (for iptables <-> ipvs) once the cleanup Job
has finished. Which step a node is at is read from the world every time — its label,
its pods, its Job — never remembered, so a restart between any two steps resumes at
the right one. ``status.moves`` records only *that* a node is moving, which way and
since when.

Directions:

- Forward: source -> target (label ``<target>``), cleanup when the pair needs it.
- Back: target -> source (label removed), cleanup when the pair needs it (rollback).
- Handback: target -> source after finalize wrote the target mode into the source
  ConfigMap (same mode on both sides: no cleanup).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from proxymode.api.models import Move, MoveDirection, StagePhase
from proxymode.engine import objects
from proxymode.engine.actions import Action, CreateJob, DeleteObject, SetNodeMode
from proxymode.engine.look import Look
from proxymode.engine.observed import SWITCHING, Object, Observed, ProxyKind
from proxymode.engine.planner import max_unavailable_count
from proxymode.kubeproxy import cleanup_needed


@dataclass(frozen=True)
class MoveContext:
    policy: str
    uid: str
    target_mode: str
    needs_cleanup: bool
    source_daemon_set: Object
    ready_timeout_seconds: int


@dataclass
class MoveStep:
    """What one look at a moving node found and decided."""

    actions: list[Action] = field(default_factory=list)
    done: bool = False
    failure: str | None = None


def final_label(direction: MoveDirection | str, target_mode: str) -> str | None:
    return target_mode if direction == MoveDirection.FORWARD else None


def arrived_kind(direction: MoveDirection | str) -> ProxyKind:
    return ProxyKind.TARGET if direction == MoveDirection.FORWARD else ProxyKind.SOURCE


def step(move: Move, observed: Observed, ctx: MoveContext) -> MoveStep:
    """Advance one move by at most one step."""
    node = observed.node(move.node)
    result = MoveStep()
    if node is None:
        result.done = True  # the node left the cluster: nothing to move
        return result
    label = node.mode_label
    final = final_label(move.direction, ctx.target_mode)
    cleanup = ctx.needs_cleanup and move.direction != MoveDirection.HANDBACK
    if label == SWITCHING:
        return _from_switching(move, observed, ctx, final, cleanup)
    if label == final:
        return _arriving(move, observed, ctx)
    # Still on the side it leaves: take it out of both DaemonSets first.
    result.actions.append(SetNodeMode(move.node, SWITCHING, expect=label))
    return result


def _from_switching(
    move: Move, observed: Observed, ctx: MoveContext, final: str | None, cleanup: bool
) -> MoveStep:
    result = MoveStep()
    if observed.pods_on(move.node):
        return result  # the old kube-proxy is still terminating: never two at once
    if cleanup:
        job = observed.job_on(move.node)
        if job is None:
            result.actions.append(
                CreateJob(
                    objects.cleanup_job(ctx.policy, ctx.uid, ctx.source_daemon_set, move.node)
                )
            )
            return result
        if job.failed:
            result.failure = (
                f"the cleanup Job {job.name} failed on node {move.node}; the node is left"
                " between proxies (label switching) for a person to inspect"
            )
            return result
        if not job.succeeded:
            return result
        namespace = ctx.source_daemon_set["metadata"]["namespace"]
        result.actions.append(DeleteObject("batch/v1", "Job", namespace, job.name))
    result.actions.append(SetNodeMode(move.node, final, expect=SWITCHING))
    return result


def _arriving(move: Move, observed: Observed, ctx: MoveContext) -> MoveStep:
    result = MoveStep()
    pods = [
        p for p in observed.pods_on(move.node, arrived_kind(move.direction)) if not p.terminating
    ]
    if pods and all(p.ready for p in pods):
        result.done = True
        return result
    waited = (observed.now - move.since).total_seconds()
    if waited > ctx.ready_timeout_seconds:
        what = f"pod {pods[0].name}" if pods else "no pod"
        result.failure = (
            f"kube-proxy on node {move.node} is not Ready {waited:.0f}s after the move"
            f" started ({what}; limit {ctx.ready_timeout_seconds}s)"
        )
    return result


def healthy_proxy(observed: Observed, node: str, target_mode: str) -> bool:
    """True when the kube-proxy the node's label calls for runs Ready there."""
    view = observed.node(node)
    if view is None or view.mode_label == SWITCHING:
        return False
    kind = ProxyKind.TARGET if view.mode_label == target_mode else ProxyKind.SOURCE
    pods = [p for p in observed.pods_on(node, kind) if not p.terminating]
    return bool(pods) and all(p.ready for p in pods)


def start(node: str, direction: MoveDirection, now: datetime) -> Move:
    return Move(node=node, direction=direction, since=now)


# -- every move of a look ------------------------------------------------------------------------


def context(look: Look) -> MoveContext:
    source_mode = look.status.source_mode or "iptables"
    return MoveContext(
        policy=look.name,
        uid=look.uid,
        target_mode=look.target_mode,
        needs_cleanup=cleanup_needed(source_mode, look.target_mode),
        source_daemon_set=look.obs.source_daemon_set or {},
        ready_timeout_seconds=look.spec.ready_timeout_seconds,
    )


def budget(look: Look) -> int:
    total = sum(len(s.nodes) for s in look.status.stages)
    return max_unavailable_count(look.spec.max_unavailable, max(total, 1))


def labelled(look: Look, names: list[str]) -> list[str]:
    """Of ``names``, the nodes that still carry a ``proxymode.io/mode`` label."""
    return [n for n in names if (v := look.obs.node(n)) is not None and v.mode_label is not None]


def adopt_orphans(look: Look, direction: MoveDirection) -> None:
    """Nodes left at ``switching`` without a recorded move (a lost status write)."""
    moving = {m.node for m in look.status.moves}
    for name in look.planned():
        node = look.obs.node(name)
        if node is not None and node.mode_label == SWITCHING and name not in moving:
            look.status.moves.append(start(name, direction, look.now))
            moving.add(name)


def drive(look: Look, direction: MoveDirection = MoveDirection.FORWARD) -> str | None:
    """Step every move; returns the first failure, if any."""
    adopt_orphans(look, direction)
    ctx = context(look)
    keep: list[Move] = []
    failure = None
    for move in look.status.moves:
        result = step(move, look.obs, ctx)
        look.actions.extend(result.actions)
        if result.failure and failure is None:
            failure = result.failure
        if not result.done:
            keep.append(move)
    look.status.moves = keep
    if keep:
        look.soon(2)
    return failure


def start_moves(look: Look, candidates: list[str], direction: MoveDirection) -> None:
    """Start moves for ``candidates`` in order while the budget allows.

    The budget is counted from the world, not from ``status.moves`` alone, so a lost
    status write never lets more nodes go down than ``maxUnavailable``:

    - forward, every planned node without a Ready kube-proxy counts (a rollout never
      adds outages to a cluster that already has some);
    - back (rollback, handback), only nodes this policy is moving count: a broken canary
      that is not moving yet has no working proxy to lose, and counting it would block
      the very move that mends it.
    """
    moving = {m.node for m in look.status.moves}
    planned = look.planned()
    if direction == MoveDirection.FORWARD:
        down = {n for n in planned if not healthy_proxy(look.obs, n, look.target_mode)} | moving
    else:
        switching = {n for n in planned if (v := look.obs.node(n)) and v.mode_label == SWITCHING}
        down = switching | moving
    limit = budget(look)
    for node in candidates:
        if node in moving or look.obs.node(node) is None:
            continue
        if len(down) >= limit:
            break
        look.status.moves.append(start(node, direction, look.now))
        down.add(node)
        first = step(look.status.moves[-1], look.obs, context(look))
        look.actions.extend(first.actions)
        look.soon(2)


def health_failure(look: Look) -> str | None:
    """A moved node whose target kube-proxy restarts or stays not Ready."""
    timeout = look.spec.ready_timeout_seconds
    moving = {m.node for m in look.status.moves}
    for name in look.planned():
        node = look.obs.node(name)
        if node is None or node.mode_label != look.target_mode or name in moving:
            continue
        for pod in look.obs.pods_on(name):
            where = f"kube-proxy pod {pod.name} on node {name}"
            if pod.restarts > 0:
                return f"{where} restarted {pod.restarts} times"
            age = (look.now - pod.created).total_seconds() if pod.created else 0.0
            if not pod.ready and not pod.terminating and age > timeout:
                return f"{where} is not Ready {age:.0f}s after it started"
    return None


def forward_todo(look: Look, started_only: bool = True) -> list[str]:
    """Planned nodes (of started stages) not yet on the target mode."""
    stages = [s for s in look.status.stages if not started_only or s.phase != StagePhase.PENDING]
    return [
        n
        for s in stages
        for n in s.nodes
        if (node := look.obs.node(n)) is not None and node.mode_label != look.target_mode
    ]
