"""When the source DaemonSet has settled: what rollback and finalize wait for at their end.

Settled means every node the source DaemonSet runs on is served by a Ready source
kube-proxy that is staying, and the DaemonSet's controller has taken up its spec. Two
things make that harder than the DaemonSet's status counts:

- The counts can say "rolled out" mid-restart (a terminating pod still counts Ready, a new
  pod counts updated before it is Ready), and they come from another watch than the pods,
  so they may be an event behind: the pods are read too, node by node (a review saw
  RolledBack while a restored template's restart was still under way on a node).
- A node whose kubelet is down never settles: its old pod stays Terminating, no new one
  runs, and that pod counts against the rolling update's ``maxUnavailable``, so the
  controller stops replacing the pods of the other nodes too (``rollingUpdate`` in
  pkg/controller/daemon/update.go). Such nodes are left out of the wait and named when the
  phase ends (a review found a rollback that never finished).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from proxymode.engine.look import Look
from proxymode.engine.matching import requirement_holds
from proxymode.engine.observed import MODE_LABEL, NodeView, Object, ProxyKind
from proxymode.engine.preflight.nodes import Term, required_terms, scheduled_by, term_matches
from proxymode.engine.stages import named


def generation_observed(ds: Object) -> bool:
    status = ds.get("status") or {}
    return int(status.get("observedGeneration", 0)) >= int(ds["metadata"].get("generation", 0))


def rolled_out(ds: Object, excused: int = 0, stalled: bool = False) -> bool:
    """The DaemonSet's controller has seen its spec and every pod is of it and Ready.

    With ``excused`` nodes down, up to that many may lack a Ready pod or an updated one.
    ``stalled``: down nodes holding pods of it fill its ``maxUnavailable``, so pods of the
    previous template may stay on live nodes too (the controller waits for them; see the
    module). Every node that should run a pod must still
    have one (``currentNumberScheduled`` counts a Terminating pod too)."""
    st = ds.get("status") or {}
    desired = st.get("desiredNumberScheduled", 0)
    return (
        generation_observed(ds)
        and st.get("currentNumberScheduled", 0) >= desired
        and (stalled or st.get("updatedNumberScheduled", 0) >= desired - excused)
        and st.get("numberReady", 0) >= desired - excused
        and (st.get("numberUnavailable") or 0) <= excused
    )


def on_delete(ds: Object) -> bool:
    return bool(((ds.get("spec") or {}).get("updateStrategy") or {}).get("type") == "OnDelete")


def max_unavailable(ds: Object, desired: int) -> int:
    """How many nodes the DaemonSet's rolling update lets be unavailable at once (a
    percentage of ``desired`` rounds up, as the controller's does; at least 1)."""
    strategy = (ds.get("spec") or {}).get("updateStrategy") or {}
    value = (strategy.get("rollingUpdate") or {}).get("maxUnavailable", 1)
    try:
        if isinstance(value, str) and value.endswith("%"):
            return max(1, math.ceil(int(value[:-1]) * desired / 100))
        return max(1, int(value))
    except (TypeError, ValueError):
        return 1


def runs_on(ds: Object, nodes: Sequence[NodeView]) -> set[str]:
    """The nodes ``ds`` schedules a pod on, its ``proxymode.io/mode`` terms included: a
    node another migration keeps off this DaemonSet (its ``NotIn``) is not one of them,
    whatever pod is still terminating there (found by a review)."""
    terms = required_terms((ds.get("spec") or {}).get("template", {}).get("spec") or {})
    return {
        n.name
        for n in scheduled_by(ds, nodes)
        if terms is None or any(term_matches(Term.of(t), n) and _mode_holds(t, n) for t in terms)
    }


def _mode_holds(term: Mapping[str, Any], node: NodeView) -> bool:
    expressions = [e for e in term.get("matchExpressions") or [] if isinstance(e, Mapping)]
    return all(
        requirement_holds(
            str(e.get("operator")), MODE_LABEL, list(e.get("values") or []), node.labels
        )
        for e in expressions
        if e.get("key") == MODE_LABEL
    )


def down_nodes(look: Look, ds: Object) -> list[str]:
    """Nodes holding a source pod whose kubelet is not Ready (a node powered off, cut off,
    or gone while the migration ran): no pod starts, stops or reports there until it is
    back, and the DaemonSet's rolling update waits for them. Only those ``ds`` runs on
    (its ``proxymode.io/mode`` terms included): another migration's node, its
    source pod stuck Terminating there, stalls the roll but is not this one's to serve
    (found by a review). The DaemonSet's controller starts their kube-proxy from the
    template put back when they are back."""
    return _down(look, runs_on(ds, look.obs.nodes))


def _down(look: Look, among: Collection[str] | None) -> list[str]:
    """Nodes holding a source pod whose kubelet is not Ready, of ``among`` if given (any
    such node stalls the DaemonSet's rolling update, ours or not)."""
    holding = {p.node for p in look.obs.pods if p.kind == ProxyKind.SOURCE}
    return sorted(n for n in holding if look.obs.kubelet_down(n) and (among is None or n in among))


def source_settled(look: Look, ds: Object) -> bool:
    """The source DaemonSet rolled out and every node it runs on served by a Ready source
    kube-proxy that is staying, but for the nodes whose kubelet is down."""
    mine = runs_on(ds, look.obs.nodes)
    down = _down(look, mine)
    desired = (ds.get("status") or {}).get("desiredNumberScheduled", 0)
    # A status an event behind the pod cache can still count a pod the cache has seen go:
    # the pods must cover as many of its nodes as the DaemonSet wants.
    covered = {p.node for p in look.obs.pods if p.kind == ProxyKind.SOURCE and p.node in mine}
    # OnDelete (the person's own strategy, put back): the controller replaces no pod of its
    # own, so the restored template reaches each node when its pod is next deleted, and
    # the count of updated pods says nothing of what serves the nodes (a review found a
    # rollback that never ended on such a source).
    stalled = on_delete(ds) or len(_down(look, None)) >= max_unavailable(ds, desired)
    return (
        rolled_out(ds, excused=len(down), stalled=stalled)
        and len(covered) >= desired
        and not unserved(look, mine - set(down))
    )


def unserved(look: Look, among: Collection[str] | None = None) -> list[str]:
    """Nodes with a source kube-proxy (of ``among``, if given) none of which is Ready and
    staying. A node the source no longer runs on (another migration keeps it) is not
    waited for: its pod there is on its way out, whatever its kubelet does."""
    serving: dict[str, bool] = {}
    for pod in look.obs.pods:
        if pod.kind == ProxyKind.SOURCE and (among is None or pod.node in among):
            ok = pod.ready and not pod.terminating
            serving[pod.node] = serving.get(pod.node, False) or ok
    return sorted(node for node, ok in serving.items() if not ok)


def waiting_on(look: Look, ds: Object) -> str:
    """``: no Ready kube-proxy that stays on node a`` for the nodes a settle waits on, or ""
    (a crash-looping source kube-proxy on a live node is waited for, and named)."""
    mine = runs_on(ds, look.obs.nodes)
    waiting = unserved(look, mine - set(_down(look, mine)))
    return f": no Ready kube-proxy that stays on {named(waiting)}" if waiting else ""


def not_seen(look: Look, ds: Object | None) -> str:
    """What a terminal message adds for the nodes whose kubelet is down, or ""."""
    stalling = _down(look, None)
    if ds is None or not stalling:
        return ""
    down = down_nodes(look, ds)
    st = ds.get("status") or {}
    desired, updated = st.get("desiredNumberScheduled", 0), st.get("updatedNumberScheduled", 0)
    text = ""
    if down:
        whose = "whose kubelet is" if len(down) == 1 else "whose kubelets are"
        text += (
            f"; not seen on {named(down)}, {whose} not Ready: the restored DaemonSet starts"
            f" kube-proxy there when {'it is' if len(down) == 1 else 'they are'} back"
        )
    if updated < desired and not on_delete(ds):
        text += (
            f"; its rolling update ({updated} of {desired} pods updated) finishes on its own,"
            f" on {named(stalling)} when {'its kubelet is' if len(stalling) == 1 else 'theirs are'}"
            " back"
        )
    return text
