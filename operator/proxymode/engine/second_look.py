"""Which decisions are read again from the API server before they are acted on.

The operator's looks read nodes, kube-proxy pods, Jobs, DaemonSets and ConfigMaps from
watch-fed caches (``kube.cache``). A cache may be behind the server for a moment: events
still in a socket buffer when a stalled operator (a SIGSTOP, a long GC or CPU-starved
pause) runs again, a watch being re-opened after a break. Most decisions made on such a
copy cost nothing: the next look, a moment later, sees the event and goes on. A few cannot
be taken back: a rollback of every moved node, a pause a person must clear, a run marked
Failed. A look that saw a deadline pass on a copy in which a deleted pod still stands would
roll back a migration that was fine (CI's run of 48f2c79: "its old kube-proxy pod ... has not
gone 65s after the move started", after the operator was frozen for 65 s, with the pod long
gone on the server).

So a look whose decision newly rolls back, pauses or fails *for what it observed of the
cluster* is decided once more on a read of the server itself, and only that second decision
is acted on. What a person asked for (abort, retry, ``spec.paused``, a plan change, the
policy's deletion) and what Prometheus answered (its data is read fresh every round) are
not read again: a second read could not change them.
"""

from __future__ import annotations

from proxymode.api.models import Phase, PolicyStatus
from proxymode.api.reasons import PauseReason, RollbackReason

OBSERVED_ROLLBACKS = frozenset(
    {RollbackReason.KUBE_PROXY_UNHEALTHY, RollbackReason.NODE_NOT_VERIFIED}
)
"""Rollbacks started for what the look saw of nodes, pods and Jobs."""
OBSERVED_PAUSES = frozenset(
    {PauseReason.KUBE_PROXY_UNHEALTHY, PauseReason.NODE_NOT_VERIFIED, PauseReason.FINALIZE_STUCK}
)
"""Pauses (``rollback.automatic: false``, or a finalize that cannot go on) for the same."""


def needs_second_look(before: PolicyStatus, after: PolicyStatus) -> bool:
    """True when going from ``before`` to ``after`` rests on the cluster as observed and
    cannot be taken back by the next look: a new rollback, pause or failure of that kind."""
    if after.phase == Phase.FAILED:
        return before.phase != Phase.FAILED
    if after.phase == Phase.ROLLING_BACK and after.rollback_reason in OBSERVED_ROLLBACKS:
        return (before.phase, before.rollback_reason) != (after.phase, after.rollback_reason)
    if after.phase == Phase.PAUSED and after.paused_reason in OBSERVED_PAUSES:
        return (before.phase, before.paused_reason) != (after.phase, after.paused_reason)
    return False
