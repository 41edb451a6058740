"""What the world says about a policy's planned nodes, beside its moves: the nodes still to
move, the nodes someone else labelled, the moved nodes whose kube-proxy is unhealthy.

Read by the phases (rollout, paused, terminal) and the summary; ``moves`` moves nodes, this
module only looks.
"""

from __future__ import annotations

from proxymode.api.models import StagePhase
from proxymode.engine import kubelet_wait
from proxymode.engine.look import Look
from proxymode.engine.stages import named


def health_failure(look: Look) -> str | None:
    """A moved node whose target kube-proxy restarts or stays not Ready.

    Not a node whose kubelet is not Ready: its pods read not Ready because the node
    lifecycle controller marked them so, not because kube-proxy said so; what runs there
    is unknown until the kubelet is back (``kubelets_waited``: the stage waits for it and
    says why). From its return the pod gets the ready timeout again, and a pod that lived
    through the outage is judged by that alone, not by its restart count (a reboot restarts
    every container)."""
    timeout = look.spec.ready_timeout_seconds
    moving = {m.node for m in look.status.moves}
    for name in look.planned():
        node = look.obs.node(name)
        if node is None or node.mode_label != look.target_mode or name in moving:
            continue
        if look.obs.kubelet_down(name):
            continue
        for pod in look.obs.pods_on(name):
            where = f"kube-proxy pod {pod.name} on node {name}"
            rebooted = kubelet_wait.restarts_excused(pod, name, look.obs)
            if pod.restarts > 0 and not rebooted:
                times = "time" if pod.restarts == 1 else "times"
                return f"{where} restarted {pod.restarts} {times}"
            if pod.ready or pod.terminating:
                continue
            # Timed from when it stopped being Ready (or started, if it never was): one
            # failed probe on a pod Ready for an hour is not an hour of not being Ready.
            since = pod.ready_changed or pod.created
            back = kubelet_wait.back(name, look.obs)
            if since is not None and back is not None:
                since = max(since, back)
            age = (look.now - since).total_seconds() if since else 0.0
            if age > timeout:
                return f"{where} has not been Ready for {age:.0f}s (limit {timeout}s)"
    return None


def kubelets_down(look: Look, names: list[str], then: tuple[str, str]) -> str:
    """``; the kubelet of node a is not Ready: <then>`` for the nodes of ``names`` whose
    kubelet is down, or empty: why a wait on them may be long. ``then`` is said for one
    node, or for several."""
    down = [n for n in names if look.obs.kubelet_down(n)]
    if not down:
        return ""
    one = len(down) == 1
    return (
        f"; the kubelet{'' if one else 's'} of {named(down)} {'is' if one else 'are'} not"
        f" Ready: {then[0] if one else then[1]}"
    )


def kubelets_waited(look: Look, names: list[str]) -> str:
    """``kubelets_down`` for the walk: no move starts there, one in flight holds, a moved
    node is not counted moved."""
    return kubelets_down(
        look,
        names,
        (
            "its move waits until it is Ready again (or the Node is deleted)",
            "their move waits until they are Ready again (or the Node is deleted)",
        ),
    )


def forward_todo(look: Look, started_only: bool = True) -> list[str]:
    """Planned nodes (of started stages) not yet on the target mode."""
    stages = [s for s in look.status.stages if not started_only or s.phase != StagePhase.PENDING]
    return [
        n
        for s in stages
        for n in s.nodes
        if (node := look.obs.node(n)) is not None and node.mode_label != look.target_mode
    ]


def hand_labelled(look: Look) -> list[str]:
    """Nodes that carry the target label with no move of this policy behind it: a person
    set it by hand, on a node of a stage not yet started, or of a started stage that
    records its finished moves (``moved``). The label alone proves nothing (no cleanup
    ran, the old proxy may have overlapped), so such a node is walked back and moves again
    with its stage, properly."""
    moving = {m.node for m in look.status.moves}
    started = {n for s in look.status.stages if s.phase != StagePhase.PENDING for n in s.nodes}
    pending = [
        n
        for s in look.status.stages
        if s.phase == StagePhase.PENDING
        for n in s.nodes
        if n not in started
    ]
    unmoved: list[str] = []
    for s in look.status.stages:
        if s.phase != StagePhase.PENDING and s.moved is not None:
            moved = set(s.moved)  # a set: a 5,000-node stage is tested node by node
            unmoved += [n for n in s.nodes if n not in moved]
    return [n for n in pending + unmoved if n not in moving and look.at_target(n)]
