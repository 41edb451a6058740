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

from proxymode.api.models import Move, MoveDirection
from proxymode.engine import objects
from proxymode.engine.actions import Action, CreateJob, DeleteObject, SetNodeMode
from proxymode.engine.observed import SWITCHING, Object, Observed, ProxyKind


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


def unavailable(observed: Observed, moves: list[Move], target_mode: str) -> set[str]:
    """Nodes without a Ready kube-proxy right now: the ones maxUnavailable counts.

    A node counts when it is switching, or when the pod it should run is missing or not
    Ready. Nodes that were already broken before a move do not block moving them back.
    """
    out: set[str] = set()
    for move in moves:
        node = observed.node(move.node)
        if node is None:
            continue
        if node.mode_label == SWITCHING:
            out.add(move.node)
            continue
        kind = ProxyKind.TARGET if node.mode_label == target_mode else ProxyKind.SOURCE
        pods = observed.pods_on(move.node, kind)
        if not pods or not all(p.ready for p in pods):
            out.add(move.node)
    return out


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
