"""Which decisions are read again from the API server before they are acted on.

The operator's looks read nodes, kube-proxy pods, Jobs, DaemonSets and ConfigMaps from
watch-fed caches (``kube.cache``). A cache may be behind the server for a moment: events
still in a socket buffer when a stalled operator (a SIGSTOP, a long GC or CPU-starved
pause) runs again, a watch being re-opened after a break. Most decisions made on such a
copy cost nothing: the next look, a moment later, sees the event and goes on. A few cannot
be taken back: a rollback of every moved node, a pause a person must clear, a run marked
Failed, a deleted policy let go with its labels stripped. A look that saw a deadline pass on
a copy in which a deleted pod still stands would roll back a migration that was fine (CI's
run of 48f2c79: "its old kube-proxy pod ... has not gone 65s after the move started", after
the operator was frozen for 65 s, with the pod long gone on the server).

So a look whose decision rolls back, pauses or fails *for what it observed of the cluster*
is decided once more on a read of the server itself, and only that second decision is acted
on. The rule looks at what this look did, not at the phase it ends in: the history entries
it appended (a ``retry`` from Failed that fails again, a ``resume`` that pauses again for the
same reason, both end where they began, and both are new verdicts), and a release of the
finalizer. Two choices a person started are read again too, because how the engine carries
them out rests on what it observed: a ``retry`` (roll back first, or start over and delete
the old run's snapshot, is decided on whether the cluster still holds that run's changes),
and the deletion's release of the finalizer (at once, or after a rollback, is decided on
whether the source, the snapshot and the labels are there) unless the stored status already
says nothing is left to undo (finalized, or RolledBack).

Not read again:

- what a person asked for, where its effect does not rest on the observed cluster (abort,
  ``spec.paused``, a plan change, a resume that goes on): a second read could not change it;
- a verdict of Prometheus (``AnalysisFailed``, ``NoData``): its samples were read fresh this
  round. The round's node groups (which nodes are canaries) come from the same observation,
  so a cache that is behind may have put a node in the wrong group for one round; the
  verdict is still taken as measured, and the next round groups from a newer copy;
- favourable decisions (a move goes on, a stage is promoted, the run completes): what
  follows them (the bake, the verification Jobs, the next look) runs on newer copies, and
  every node write is a JSON patch that tests the label the engine saw. The one window left
  is a Completed reached on a copy a moment behind (a pod seen Ready that has just crashed):
  no look follows it, and the cache's lag, normally well under a second, is that window.
"""

from __future__ import annotations

from proxymode.api.models import Phase, PolicyStatus
from proxymode.api.reasons import EventReason, PauseReason, RollbackReason, paused_event
from proxymode.engine.actions import Decision

OBSERVED_ROLLBACKS = frozenset(
    {RollbackReason.KUBE_PROXY_UNHEALTHY, RollbackReason.NODE_NOT_VERIFIED}
)
"""Rollbacks started for what the look saw of nodes, pods and Jobs."""
OBSERVED_PAUSES = frozenset(
    {PauseReason.KUBE_PROXY_UNHEALTHY, PauseReason.NODE_NOT_VERIFIED, PauseReason.FINALIZE_STUCK}
)
"""Pauses (``rollback.automatic: false``, or a finalize that cannot go on) for the same."""
_PAUSE_ENTRIES = frozenset(paused_event(r) for r in OBSERVED_PAUSES)


def needs_second_look(before: PolicyStatus, decision: Decision) -> bool:
    """True when ``decision``, taken on a look at a policy whose status was ``before``,
    newly rests on the cluster as observed and could not be taken back by the next look."""
    after = decision.status
    for entry in (e for e in after.history if e not in before.history):
        if entry.phase == Phase.FAILED:
            return True
        if entry.phase == Phase.PAUSED and entry.reason in _PAUSE_ENTRIES:
            return True
        if entry.reason == EventReason.ROLLBACK_STARTED and (
            after.rollback_reason in OBSERVED_ROLLBACKS
        ):
            return True
        if entry.reason == EventReason.RETRY:
            return True
    return decision.release_finalizer and not _settled(before)


def _settled(status: PolicyStatus) -> bool:
    """Nothing of the run is left to undo, whatever a copy of the cluster shows: finalized,
    or RolledBack. Pending is not: a look in Pending runs preflight and may act (snapshot,
    target pair, the source's patch, even the first moves) before its status write, and a
    lost write leaves the stored phase Pending over a changed cluster."""
    return status.finalized or status.phase == Phase.ROLLED_BACK
