"""A move on a node whose kubelet is not Ready: it waits, and its clocks start again when
the kubelet is back (decision 0120).

A node whose kubelet is down (powered off, cut off, its kubelet stopped) starts, stops and
reports no pod: its old kube-proxy stays Terminating, a new one never runs, a Job's pod
never starts there. Nothing a move waits for can happen, so the move waits where it is
rather than walking on or failing at a deadline; and a deadline that ran out while the
kubelet was away says nothing about the node, so every clock of the move counts from the
kubelet's return (the node's Ready condition's ``lastTransitionTime``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from proxymode.api.models import Move
from proxymode.engine.observed import Observed, ProxyPod


def hold(move: Move, now: datetime, switch_deadline: int) -> None:
    """Keep a move whose node's kubelet is not Ready where it is, whichever way it goes.

    Walking on (to switching, or failing at the deadline there) would leave the node
    without any kube-proxy once the kubelet is back (a review), and a forward move failing
    there rolled the whole migration back for a node outage that is not the new mode's
    doing. The move still counts against the budget of the others: once the kubelet is back
    it walks on without asking again, and a node the operator died before labelling still
    runs its proxy (a review found two live nodes between proxies when it did not). Its
    clock is kept from running out: past three quarters of the switch deadline it is set
    back to one quarter, so the status is rewritten about every half deadline, no more;
    once the kubelet is back the clocks count from then (``since``)."""
    if (now - move.since).total_seconds() > switch_deadline * 0.75:
        move.since = now - timedelta(seconds=switch_deadline * 0.25)


def back(node: str, observed: Observed) -> datetime | None:
    """When the node's kubelet was last Ready again (None: not Ready, or not said).

    A time ahead of the operator's clock is not believed: it is the kubelet's own clock,
    which may run ahead (after a reboot), and a return "in the future" would hold every
    clock of the move at zero on every look, so a move stuck for a reason of its own would
    never fail (a review). The move's own start counts then; ``hold`` has kept at least a
    quarter of its switch deadline for it."""
    view = observed.node(node)
    if view is None or view.ready_since is None or view.ready_since > observed.now:
        return None
    return view.ready_since


RESTART_SLACK_SECONDS = 10
"""How long after the kubelet's return a container's end still counts as the outage's: a
rebooted node's runtime records its old containers' end as it starts, before the kubelet
posts Ready; the slack is for the two clocks (kubelet's, runtime's). A crash in it is
judged by readiness alone (a review found a minute too generous)."""


def restarts_excused(pod: ProxyPod, node: str, observed: Observed) -> bool:
    """The pod's restarts all came with its node's outage: it was made before the kubelet
    last came back and its container last ended no later than then (a reboot restarts
    every container). Its readiness is still judged, from the return. A restart after the
    return counts as any other: a blip of the kubelet does not excuse the pod's later
    crashes (a review)."""
    returned = back(node, observed)
    if returned is None or pod.created is None or pod.created >= returned:
        return False
    ended = pod.last_terminated
    return ended is None or (ended - returned).total_seconds() <= RESTART_SLACK_SECONDS


def since(move: Move, observed: Observed) -> datetime:
    """When the move's clock started: its start, or its node's kubelet coming back after
    that."""
    returned = back(move.node, observed)
    return move.since if returned is None else max(move.since, returned)


def outlived(created: datetime | None, node: str, observed: Observed) -> bool:
    """The node's kubelet came back after ``created`` (a Job's): it was down for part of
    that Job's life, so the Job's end is not the node's answer."""
    returned = back(node, observed)
    return returned is not None and created is not None and returned > created
