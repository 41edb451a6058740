"""Every move of a look: start moves within the budget, step the ones in flight (``moves``
steps one), adopt nodes a lost status write left at ``switching``.

The budget (``maxUnavailable``) is counted from the world, not from ``status.moves`` alone,
so a lost status write never lets more nodes go down than it allows (``start_moves``).
"""

from __future__ import annotations

from proxymode.api.models import Move, MoveDirection, Switch
from proxymode.engine import verify
from proxymode.engine.actions import SetNodeMode
from proxymode.engine.look import Look
from proxymode.engine.moves import (
    DEFAULT_GRACE_SECONDS,
    MoveContext,
    MoveFailure,
    final_label,
    healthy_proxy,
    start,
    step,
)
from proxymode.engine.observed import SWITCHING, Object, Observed
from proxymode.engine.planner import max_unavailable_count
from proxymode.kubeproxy import cleanup_needed


def context(look: Look) -> MoveContext:
    source_mode = look.status.source_mode or "iptables"
    return MoveContext(
        policy=look.name,
        uid=look.uid,
        target_mode=look.target_mode,
        needs_cleanup=cleanup_needed(source_mode, look.target_mode),
        source_daemon_set=look.obs.source_daemon_set,
        ready_timeout_seconds=look.spec.ready_timeout_seconds,
        namespace=look.spec.kube_proxy.namespace,
        grace_seconds=_grace(look.obs.source_daemon_set),
        source_mode=verify.source_running_mode(look, source_mode),
        verify=verify.settings(look),
    )


def _grace(source: Object | None) -> int:
    pod_spec = ((source or {}).get("spec") or {}).get("template", {}).get("spec", {})
    return int(pod_spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))


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


def drive(look: Look, direction: MoveDirection = MoveDirection.FORWARD) -> MoveFailure | None:
    """Step every move; returns the first failure, if any."""
    adopt_orphans(look, direction)
    ctx = context(look)
    keep: list[Move] = []
    failure: MoveFailure | None = None
    limit = budget(look)
    between = {n for n in look.planned() if (v := look.obs.node(n)) and v.mode_label == SWITCHING}
    for move in look.status.moves:
        if _not_left(move, look.obs, ctx) and len(between) >= limit:
            # Recorded but not yet off its label (a status write lost as one move ended
            # and the next began, then an abort, records both): it leaves its proxy only
            # with room in the budget (a review walked two nodes back on a budget of one).
            keep.append(move)
            continue
        result = step(move, look.obs, ctx)
        if any(isinstance(a, SetNodeMode) and a.value == SWITCHING for a in result.actions):
            between.add(move.node)
        look.actions.extend(result.actions)
        if result.record is not None:
            verify.record(look, result.record)
        if result.failure and failure is None:
            failure = MoveFailure(result.failure)
            failure.unverified = result.unverified
        if not result.done:
            keep.append(move)
        elif result.failure is None and move.direction == MoveDirection.FORWARD:
            _record_moved(look, move.node)
    look.status.moves = keep
    if keep:
        look.soon(2)
    return failure


def _not_left(move: Move, observed: Observed, ctx: MoveContext) -> bool:
    """The move's node still carries the label it leaves: its first step is still to come."""
    node = observed.node(move.node)
    if node is None or not node.ready:
        return False
    label = node.mode_label
    return label != SWITCHING and label != final_label(move.direction, ctx.target_mode)


def start_moves(
    look: Look, candidates: list[str], direction: MoveDirection, through_switching: bool = False
) -> list[str]:
    """Start moves for ``candidates`` in order while the budget allows.

    ``through_switching``: the nodes already carry the label the move ends at, but their
    kube-proxy is not the right one (it read the wrong ConfigMap, or a person set the
    label by hand): each goes through ``switching`` anyway, so its proxy restarts (after
    its cleanup, where the pair needs one).

    Returns the nodes that hold the budget when it stops a candidate (down, not moving),
    so the status can name them; empty when nothing waits on the budget.

    The budget is counted from the world, not from ``status.moves`` alone, so a lost
    status write never lets more nodes go down than ``maxUnavailable``:

    - forward, every planned node without a Ready kube-proxy counts (a rollout never
      adds outages to a cluster that already has some);
    - back (rollback, handback), only nodes this policy is moving count: a broken canary
      that is not moving yet has no working proxy to lose, and counting it would block
      the very move that mends it.
    """
    if look.moves_held is not None:
        return []
    moving = {m.node for m in look.status.moves}
    planned = look.planned()
    if direction == MoveDirection.FORWARD:
        down = {n for n in planned if not healthy_proxy(look.obs, n, look.target_mode)} | moving
    else:
        switching = {n for n in planned if (v := look.obs.node(n)) and v.mode_label == SWITCHING}
        down = switching | moving
    limit = budget(look)
    for node in candidates:
        if node in moving or look.obs.node(node) is None or look.obs.kubelet_down(node):
            continue  # a down kubelet: no pod would stop or start there (``kubelet_wait.hold``)
        if len(down) >= limit:
            return sorted(down - {m.node for m in look.status.moves})
        look.status.moves.append(start(node, direction, look.now))
        down.add(node)
        label = view.mode_label if (view := look.obs.node(node)) else None
        if through_switching and label == final_label(direction, look.target_mode):
            look.actions.append(SetNodeMode(node, SWITCHING, expect=label))
        else:
            look.actions.extend(step(look.status.moves[-1], look.obs, context(look)).actions)
        look.soon(2)
    return []


def _record_moved(look: Look, node: str) -> None:
    """A finished forward move: the node's target label is this policy's doing. While a
    stage bakes, when it arrived is kept too (``status.recentSwitches``): the analysis
    leaves the node out of the canary group until its window holds the new proxy alone
    (a target pod's age said that before, and read a roll of the target DaemonSet's
    template, every pod new, as every canary just switched: a review)."""
    index = look.status.current_stage
    stages = look.status.stages
    if index is not None and 0 <= index < len(stages) and stages[index].baked_since is not None:
        switches = [s for s in look.status.recent_switches if s.node != node]
        look.status.recent_switches = [*switches, Switch(node=node, time=look.now)]
    for stage in look.status.stages:
        if node in stage.nodes and stage.moved is not None and node not in stage.moved:
            stage.moved.append(node)
