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

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from proxymode.api.models import Move, MoveDirection, NodeVerification
from proxymode.api.reasons import RollbackReason
from proxymode.engine import jobs, kubelet_wait, verify
from proxymode.engine.actions import Action, CreateJob, DeleteObject, SetNodeMode
from proxymode.engine.look import Look
from proxymode.engine.objects import template_generation
from proxymode.engine.observed import (
    SWITCHING,
    CleanupJobView,
    Object,
    Observed,
    ProxyKind,
    ProxyPod,
)

DEFAULT_GRACE_SECONDS = 30
STALE_JOB_MARGIN_SECONDS = 30
"""A cleanup Job created more than this before its move started is a leftover (the node
re-registered under the same name), not this move's: it is deleted and run again. The
margin absorbs clock skew between the operator and the API server."""


def cleanup_deadline(ready_timeout_seconds: int) -> int:
    """The cleanup Job's ``activeDeadlineSeconds``: ``kube-proxy --cleanup`` takes seconds
    with the image already on the node; past this the Job ends Failed by itself."""
    return max(120, 2 * ready_timeout_seconds)


@dataclass(frozen=True)
class MoveContext:
    policy: str
    uid: str
    target_mode: str
    needs_cleanup: bool
    source_daemon_set: Object | None
    """None when it is gone: a move that needs a cleanup Job then fails, naming it."""
    ready_timeout_seconds: int
    namespace: str = "kube-system"
    grace_seconds: int = DEFAULT_GRACE_SECONDS
    """The old kube-proxy's ``terminationGracePeriodSeconds``: what it may take to go."""
    source_mode: str = "iptables"
    verify: verify.Settings | None = None
    """How to verify a node once its new kube-proxy is Ready; None: Ready is enough."""

    @property
    def switch_deadline(self) -> int:
        """How long a node may stay at ``switching``: the old pod's grace period plus
        ``readyTimeoutSeconds``, plus the cleanup Job's own deadline when it needs one."""
        extra = cleanup_deadline(self.ready_timeout_seconds) if self.needs_cleanup else 0
        return self.grace_seconds + self.ready_timeout_seconds + extra


@dataclass
class MoveStep:
    """What one look at a moving node found and decided."""

    actions: list[Action] = field(default_factory=list)
    done: bool = False
    failure: str | None = None
    unverified: bool = False
    """The failure is a failed verification (a breach of its own reason)."""
    record: NodeVerification | None = None


class MoveFailure(str):
    """A move's failure, said for people, with what kind of failure it is for the reason."""

    unverified: bool = False


def failure_reason(failure: str) -> RollbackReason:
    """The rollback (or pause) reason of a failure ``drive`` returned."""
    if isinstance(failure, MoveFailure) and failure.unverified:
        return RollbackReason.NODE_NOT_VERIFIED
    return RollbackReason.KUBE_PROXY_UNHEALTHY


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
    if not node.ready:
        kubelet_wait.hold(move, observed.now, ctx.switch_deadline)
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
    waited = (observed.now - kubelet_wait.since(move, observed)).total_seconds()
    late = waited > ctx.switch_deadline
    if pods := observed.pods_on(move.node):
        if late:  # the old kube-proxy is still terminating: never two at once
            result.failure = (
                f"node {move.node} is stuck switching: its old kube-proxy pod {pods[0].name}"
                f" has not gone {waited:.0f}s after the move started (limit"
                f" {ctx.switch_deadline}s); the node is left without a kube-proxy"
            )
        return result
    if cleanup and not _cleaned(move, observed, ctx, result, late):
        return result
    result.actions.append(SetNodeMode(move.node, final, expect=SWITCHING))
    return result


def _cleaned(
    move: Move, observed: Observed, ctx: MoveContext, result: MoveStep, late: bool
) -> bool:
    """Step the node's cleanup Job; True once it has succeeded (and is asked to go)."""
    waited = (observed.now - kubelet_wait.since(move, observed)).total_seconds()
    job = observed.job_on(move.node)
    outlived = job is not None and kubelet_wait.outlived(job.created, move.node, observed)
    if job is not None and (_stale(job, move) or (job.failed and outlived)):
        # A leftover of an earlier move, or one whose deadline ran out while the node's
        # kubelet was down (no pod of it could run: not the node's answer): run a fresh one
        # once it is gone.
        result.actions.append(DeleteObject("batch/v1", "Job", ctx.namespace, job.name))
        return False
    if job is None:
        if ctx.source_daemon_set is None:
            result.failure = (
                f"the source kube-proxy DaemonSet in {ctx.namespace} is gone: no cleanup"
                f" Job can be made for node {move.node} (label switching)"
            )
            return False
        job_body = jobs.cleanup_job(
            ctx.policy,
            ctx.uid,
            ctx.source_daemon_set,
            move.node,
            cleanup_deadline(ctx.ready_timeout_seconds),
        )
        result.actions.append(CreateJob(job_body))
        return False
    if job.failed:
        result.failure = (
            f"the cleanup Job {job.name} failed on node {move.node}; the node is left"
            " between proxies (label switching) for a person to inspect"
        )
        return False
    if not job.succeeded:
        if late:
            result.failure = (
                f"node {move.node} is stuck switching: the cleanup Job {job.name} has not"
                f" finished {waited:.0f}s after the move started (limit"
                f" {ctx.switch_deadline}s)"
            )
        return False
    result.actions.append(DeleteObject("batch/v1", "Job", ctx.namespace, job.name))
    return True


def _stale(job: CleanupJobView, move: Move) -> bool:
    if job.created is None:
        return False
    return (move.since - job.created).total_seconds() > STALE_JOB_MARGIN_SECONDS


def _arriving(move: Move, observed: Observed, ctx: MoveContext) -> MoveStep:
    result = MoveStep()
    pods = [
        p for p in observed.pods_on(move.node, arrived_kind(move.direction)) if not p.terminating
    ]
    back = kubelet_wait.back(move.node, observed)
    if pods and all(p.ready for p in pods):
        if ctx.verify is None:
            result.done = True
            return result
        # A verification Job made before the node's kubelet came back ran (or did not)
        # while it was away: verify.step runs it again, as for a pod newer than it.
        born = [p.created for p in pods if p.created is not None] + ([back] if back else [])
        outcome = verify.step(
            move.node,
            move.direction,
            pod_born=max(born) if born else None,
            observed=observed,
            policy=(ctx.policy, ctx.uid, ctx.namespace),
            mode_pair=(ctx.source_mode, ctx.target_mode),
            settings=ctx.verify,
            source=ctx.source_daemon_set,
        )
        result.actions.extend(outcome.actions)
        result.done, result.record = outcome.verified, outcome.record
        result.failure, result.unverified = outcome.failure, outcome.failure is not None
        return result
    stale = _stale_source_pods(move, pods, ctx)
    if stale:
        # Under the OnDelete this operator put on the source, a template a person fixed
        # never reaches a pod that crashes on the old one: the move back waited on it for
        # ever, the deletion's finalizer with it (a review). The node goes through
        # switching once more: the source DaemonSet's controller deletes that pod and
        # makes one from its current template. Its clock starts again.
        move.since = observed.now
        result.actions.append(
            SetNodeMode(move.node, SWITCHING, expect=final_label(move.direction, ctx.target_mode))
        )
        return result
    crashed = [
        p
        for p in pods
        if p.restarts > 0
        and not p.ready
        and not kubelet_wait.restarts_excused(p, move.node, observed)
    ]
    if crashed and move.direction == MoveDirection.FORWARD:
        # A new kube-proxy that exits before it is ever Ready (CrashLoopBackOff: a mode the
        # kernel lacks, a config it refuses) will not mend by waiting out the ready timeout;
        # a moved node whose proxy restarts fails the run all the same (health_failure).
        pod = crashed[0]
        times = "time" if pod.restarts == 1 else "times"
        result.failure = (
            f"kube-proxy pod {pod.name} on node {move.node} restarted {pod.restarts} {times}"
            " before it was ever Ready"
        )
        return result
    # The readiness clock starts when the new pod appears, not at the move's start: the old
    # pod's termination (and the cleanup) have their own deadline, at switching.
    born = [p.created for p in pods if p.created is not None]
    if born:
        start = max(born) if back is None else max(*born, back)
        waited, limit = (observed.now - start).total_seconds(), ctx.ready_timeout_seconds
    else:
        waited = (observed.now - kubelet_wait.since(move, observed)).total_seconds()
        limit = ctx.switch_deadline + ctx.ready_timeout_seconds
    if waited > limit:
        what = f"pod {pods[0].name}" if pods else "no pod was created"
        result.failure = (
            f"kube-proxy on node {move.node} is not Ready {waited:.0f}s after it started"
            f" ({what}; limit {limit}s)"
        )
    return result


def _stale_source_pods(move: Move, pods: list[ProxyPod], ctx: MoveContext) -> list[ProxyPod]:
    """Source pods on a node moving back that are not Ready and were made from an older
    template than the source DaemonSet's current one (``pod-template-generation``)."""
    if move.direction == MoveDirection.FORWARD or ctx.source_daemon_set is None:
        return []
    current = template_generation(ctx.source_daemon_set)
    return [
        p
        for p in pods
        if not p.ready
        and current is not None
        and p.template_generation is not None
        and p.template_generation < current
    ]


def done(look: Look, names: Sequence[str]) -> list[str]:
    """Of ``names``, those moved: on the target label, its kube-proxy healthy, and no move of
    theirs still in flight (Ready but not verified yet is not moved)."""
    moving = {m.node for m in look.status.moves}
    return [
        n
        for n in names
        if n not in moving and look.at_target(n) and healthy_proxy(look.obs, n, look.target_mode)
    ]


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
