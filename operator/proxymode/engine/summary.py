"""The summary fields and conditions, derived at the end of every look from status and world.

``Degraded`` says what was observed, not only which phase the rollout is in: a failed run,
a rollback (with its code), a breach that paused the rollout, or a moved kube-proxy that
is unhealthy right now (in flight, paused, or in a Completed mixed-mode policy). Its reason
is the code of what was seen, its message the detail.
"""

from __future__ import annotations

from datetime import datetime

from proxymode.api.models import Condition, Phase, PolicyStatus
from proxymode.api.reasons import ConditionReason, PauseReason
from proxymode.engine import moves
from proxymode.engine.look import Look
from proxymode.engine.node_checks import health_failure

IN_FLIGHT = frozenset(
    {Phase.PREFLIGHT, Phase.PROGRESSING, Phase.ANALYZING, Phase.FINALIZING, Phase.ROLLING_BACK}
)
BREACH_PAUSES = frozenset(
    {PauseReason.ANALYSIS_FAILED, PauseReason.KUBE_PROXY_UNHEALTHY, PauseReason.FINALIZE_STUCK}
)


def derive_summary(look: Look) -> None:
    st = look.status
    st.observed_generation = look.obs.generation
    st.current_stage_name = look.stage_name()
    planned = look.planned()
    # Counted as the stages count (``nodesDone``): on the target, healthy, its move ended
    # (verified). Counting every node on the target label, in flight too, showed "5/6 nodes
    # moved" over stages saying 2/2 and 2/4 (a review).
    moved = moves.done(look, planned)
    if st.phase == Phase.FINALIZING or (st.phase == Phase.COMPLETED and st.finalized):
        # Finalizing hands nodes back to the source DaemonSet, now in the target mode: a node
        # handed back still runs the target, so it still counts (the figure stays n/n; it
        # fell to the handed-back count, 7/7 to 1/7, which read as nodes going back).
        moved = [
            n
            for n in planned
            if (v := look.obs.node(n)) and v.mode_label in (None, look.target_mode)
        ]
    st.node_progress = f"{len(moved)}/{len(planned)}" if planned else None
    set_conditions(look)


def degraded(look: Look) -> tuple[str, str] | None:
    """(reason, message) of what was observed going wrong, or None when nothing was."""
    st = look.status
    phase = st.phase
    if phase == Phase.FAILED:
        last = st.history[-1].reason if st.history else "Failed"
        return last, st.message or ""
    if phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK) and st.rollback_reason is not None:
        return str(st.rollback_reason), st.rollback_message or st.message or ""
    if phase == Phase.PAUSED and st.paused_reason in BREACH_PAUSES:
        return str(st.paused_reason), st.message or ""
    if look.trouble is not None:
        return str(PauseReason.KUBE_PROXY_UNHEALTHY), look.trouble
    if phase in IN_FLIGHT | {Phase.PAUSED, Phase.COMPLETED}:
        # A moved node whose kube-proxy restarts or stays not Ready, seen now: in flight the
        # next look breaches on it; paused (rollback.automatic false) or in mixed mode it
        # would otherwise hide behind a healthy-looking phase.
        unhealthy = health_failure(look)
        if unhealthy:
            return str(PauseReason.KUBE_PROXY_UNHEALTHY), unhealthy
    return None


def set_conditions(look: Look) -> None:
    """The conditions, each with a message of its own: ``Ready`` and ``Progressing`` carry
    the phase's message (why not ready yet, what is in flight); ``Paused``, ``Degraded`` and
    ``RolledBack`` say something only when True (a False one repeating the phase's words,
    five times in ``kubectl describe``, told nothing and made every status write longer)."""
    st = look.status
    phase = Phase(st.phase)
    message = st.message or ""
    bad = degraded(look)
    paused = phase == Phase.PAUSED
    rolled_back = phase == Phase.ROLLED_BACK
    wanted = {
        "Ready": (phase == Phase.COMPLETED, str(phase), message),
        "Progressing": (phase in IN_FLIGHT, str(phase), message),
        "Paused": (
            paused,
            str(
                st.paused_reason
                or (ConditionReason.PAUSED if paused else ConditionReason.NOT_PAUSED)
            ),
            message if paused else "",
        ),
        "Degraded": (
            bad is not None,
            bad[0] if bad else str(ConditionReason.HEALTHY),
            bad[1] if bad else "",
        ),
        "RolledBack": (
            rolled_back,
            str(Phase.ROLLED_BACK if rolled_back else ConditionReason.NOT_ROLLED_BACK),
            message if rolled_back else "",
        ),
    }
    current = {c.type: c for c in st.conditions}
    result = []
    for kind, (true, reason, text) in wanted.items():
        value = "True" if true else "False"
        old = current.get(kind)
        since = old.last_transition_time if old is not None and old.status == value else look.now
        result.append(
            Condition(
                type=kind,
                status=value,
                reason=reason,
                message=text,
                last_transition_time=since,
                observed_generation=look.obs.generation,
            )
        )
    st.conditions = result


def refused(status: PolicyStatus, message: str, generation: int, now: datetime) -> PolicyStatus:
    """The status of a look the API server refused to let read (RBAC: typically a
    ``spec.kubeProxy.namespace`` the chart did not grant): ``message`` says what was refused,
    and ``Degraded`` is True (reason ``Forbidden``) for this generation, so that Argo CD and
    ``kubectl wait --for=condition=Degraded`` see it even before the first successful look
    (which alone sets ``observedGeneration``). Nothing else changes: no look ran. The next
    successful look derives every condition again."""
    old = next((c for c in status.conditions if c.type == "Degraded"), None)
    flagged = Condition(
        type="Degraded",
        status="True",
        reason=str(ConditionReason.FORBIDDEN),
        message=message,
        last_transition_time=old.last_transition_time
        if old is not None and old.status == "True"
        else now,
        observed_generation=generation,
    )
    others = [c for c in status.conditions if c.type != "Degraded"]
    return status.model_copy(update={"message": message, "conditions": [*others, flagged]})
