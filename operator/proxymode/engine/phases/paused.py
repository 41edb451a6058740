"""Paused: in-flight moves finish, nothing new starts; resume by hand, by spec, or by data."""

from __future__ import annotations

from proxymode.api.models import Phase, Verdict
from proxymode.api.reasons import EventReason, PauseReason
from proxymode.engine import moves, node_checks, walk
from proxymode.engine.commands import resume
from proxymode.engine.look import Look
from proxymode.engine.planner import plan_hash
from proxymode.engine.setup import remake_deleted_target


def look(lk: Look) -> Phase | None:
    if lk.status.paused_reason == PauseReason.SPEC and not lk.spec.paused:
        return _resume(lk)
    remake_deleted_target(lk)
    # In-flight moves finish (a node is never left between proxies); no new ones start.
    failure = walk.drive(lk) or node_checks.health_failure(lk)
    if failure and lk.spec.rollback.automatic:
        lk.start_rollback(moves.failure_reason(failure), failure)
        return None
    if failure:
        # rollback.automatic is false: nothing undoes it, so it must be said (item 22).
        lk.trouble = failure
        if lk.status.message != failure:
            lk.status.message = failure
            lk.event(EventReason.BREACH_WHILE_PAUSED, failure, warning=True)
    if (
        lk.status.paused_reason == PauseReason.PLAN_CHANGED
        and lk.status.plan_hash
        and plan_hash(lk.spec) == lk.status.plan_hash
        and not failure
    ):
        # The edit was taken back (a review saw the pause still say the plan changed).
        lk.status.message = (
            "the stage plan is the one in flight again; annotate proxymode.io/action=resume"
            " to go on"
        )
    if lk.force_promote and lk.status.resume_phase == Phase.ANALYZING:
        return _resume(lk)
    if lk.status.paused_reason == PauseReason.NO_DATA and data_returned(lk):
        return _resume(lk, EventReason.DATA_RETURNED, "the metric checks answer again; ")
    lk.requeue = 2 if lk.status.moves else 30
    if lk.status.paused_reason == PauseReason.NO_DATA and lk.spec.analysis is not None:
        lk.soon(float(lk.spec.analysis.interval_seconds))
    return None


def _resume(lk: Look, reason: EventReason = EventReason.RESUMED, why: str = "") -> Phase | None:
    """Resume, and go on in the same look only if the resume took (``spec.paused`` refuses
    it; dispatching again while still Paused would come straight back here)."""
    resume(lk, reason, why)
    return None if lk.status.phase == Phase.PAUSED else lk.status.phase


def data_returned(lk: Look) -> bool:
    """A fresh round in which every check measured something (pass or fail)."""
    round_ = lk.obs.analysis
    status = lk.status.analysis
    if round_ is None or status is None or not round_.checks:
        return False
    if status.last_round_time is not None and round_.time <= status.last_round_time:
        return False
    if any(c.verdict == Verdict.INCONCLUSIVE for c in round_.checks):
        status.last_round_time = round_.time
        return False
    status.consecutive_inconclusive = 0
    return True
