"""Every reason the operator writes: status fields, history entries and Events. One place.

Reasons are codes, stable across releases: tools match on them (the Argo CD health Lua,
alerts on ``kubectl get events``), so a reason is never a sentence and a sentence is never
a reason. The human part goes in a separate message field next to it.

- ``PauseReason``: ``status.pausedReason``; why the rollout waits for a person (or for
  data). The history entry and Event of the pause are ``Paused<reason>``.
- ``RollbackReason``: ``status.rollbackReason``; why a rollback started. The message is
  ``status.rollbackMessage``.
- ``FailureReason``: the reason of the ``Failed`` history entry and its Event; the run
  stopped and needs a person (``retry`` or a fix).
- ``EventReason``: every other Event and history reason (steps of a healthy rollout).
- ``ConditionReason``: the reasons of the conditions that are not a phase or a pause.
"""

from __future__ import annotations

from enum import StrEnum


class PauseReason(StrEnum):
    SPEC = "Spec"
    """``spec.paused`` is true; clearing it resumes."""
    PLAN_CHANGED = "PlanChanged"
    """The stage plan changed mid-rollout; ``resume`` adopts the new plan, ``abort`` rolls back."""
    NO_DATA = "NoData"
    """``inconclusiveLimit`` rounds without data and ``onNoData: Pause``; resumes by itself
    when the checks answer again."""
    ANALYSIS_FAILED = "AnalysisFailed"
    """``failureLimit`` failing rounds with ``rollback.automatic: false``."""
    KUBE_PROXY_UNHEALTHY = "KubeProxyUnhealthy"
    """A moved kube-proxy restarts or stays not Ready, with ``rollback.automatic: false``."""
    FINALIZE_STUCK = "FinalizeStuck"
    """Handing a node back to the source DaemonSet failed during Finalizing."""
    NODE_NOT_VERIFIED = "NodeNotVerified"
    """A moved node failed verification, with ``rollback.automatic: false``."""
    TARGET_CONFIG_INVALID = "TargetConfigInvalid"
    """A spec edit mid-run (``configOverrides``) that the target configuration cannot be
    rendered from: the run holds where it is until the spec is fixed and resumed, or aborted
    (failing the run left its moved nodes unwatched, with no way on but a retry)."""


class RollbackReason(StrEnum):
    ABORTED = "Aborted"
    """A person annotated ``proxymode.io/action=abort``."""
    RETRY = "Retry"
    """A person asked for ``retry`` of a failed run that had changed something: walk it back,
    then start the next run."""
    POLICY_DELETED = "PolicyDeleted"
    """The policy is being deleted before it finalized: every node goes back."""
    KUBE_PROXY_UNHEALTHY = "KubeProxyUnhealthy"
    """A moved kube-proxy restarts or stays not Ready (``readyTimeoutSeconds``)."""
    ANALYSIS_FAILED = "AnalysisFailed"
    """``failureLimit`` analysis rounds in a row failed."""
    NO_DATA = "NoData"
    """``inconclusiveLimit`` rounds without data and ``onNoData: Rollback``."""
    NODE_NOT_VERIFIED = "NodeNotVerified"
    """A moved node failed verification: no full sync, the old mode's rules left, the new
    mode's missing, or the verification Service unreachable from it (``spec.verify``)."""


class FailureReason(StrEnum):
    PREFLIGHT_FAILED = "PreflightFailed"
    """A preflight check found an Error; nothing was changed."""
    STALE_CHANGES = "StaleChanges"
    """A retry found a previous run's changes still in place."""
    BACKUP_LOST = "BackupLost"
    """The snapshot ConfigMap was deleted after the run changed something."""
    SOURCE_MISSING = "SourceMissing"
    """The source kube-proxy DaemonSet or ConfigMap disappeared mid-rollout."""
    TARGET_CONFIG_INVALID = "TargetConfigInvalid"
    """The target configuration cannot be rendered from the snapshot."""
    ROLLBACK_STUCK = "RollbackStuck"
    """A node cannot be moved back (its cleanup Job failed, its kube-proxy never Ready)."""
    FINALIZE_BLOCKED = "FinalizeBlocked"
    """Finalizing cannot start: the snapshot or the source objects are missing, or the final
    configuration cannot be rendered."""


class EventReason(StrEnum):
    PREFLIGHT_STARTED = "PreflightStarted"
    ROLLOUT_STARTED = "RolloutStarted"
    STAGE_STARTED = "StageStarted"
    STAGE_PROGRESSING = "StageProgressing"
    STAGE_BAKING = "StageBaking"
    STAGE_COMPLETED = "StageCompleted"
    STAGE_PROMOTED = "StagePromoted"
    STAGE_ROLLING_BACK = "StageRollingBack"
    NODE_JOINED = "NodeJoined"
    """A node joined a started selector (or 100 %) stage."""
    PLAN_ADOPTED = "PlanAdopted"
    RESUMED = "Resumed"
    DATA_RETURNED = "DataReturned"
    """The metric checks answer again after a NoData pause."""
    ANALYSIS_ROUND_FAILED = "AnalysisRoundFailed"
    """A counted round with a failing check (Warning), before ``failureLimit`` is reached."""
    ANALYSIS_ROUND_INCONCLUSIVE = "AnalysisRoundInconclusive"
    """A counted round without a verdict (Warning), before ``inconclusiveLimit``."""
    PROMOTE_REQUESTED = "PromoteRequested"
    PROMOTE_IGNORED = "PromoteIgnored"
    """``promote`` outside a bake: refused out loud, not remembered."""
    UNKNOWN_ACTION = "UnknownAction"
    RETRY = "Retry"
    ROLLBACK_STARTED = "RollbackStarted"
    ROLLED_BACK = "RolledBack"
    FINALIZING = "Finalizing"
    COMPLETED = "Completed"
    FORBIDDEN = "Forbidden"
    """The operator may not read what the policy needs (RBAC); nothing was changed."""
    BREACH_WHILE_PAUSED = "BreachWhilePaused"
    """A moved kube-proxy restarts or stays not Ready while the policy is paused and
    ``rollback.automatic`` is false: nothing is undone by itself, so it is said (Warning,
    once per distinct finding; ``Degraded`` stays True while it lasts)."""
    PROMOTED_WITHOUT_DATA = "PromotedWithoutData"
    """``onNoData: Continue`` let a stage go on after ``inconclusiveLimit`` rounds without
    data (Warning; in history too): the promotion rests on no evidence."""
    NODE_KERNEL_TOO_OLD = "NodeKernelTooOld"
    """A node joined mid-rollout on a kernel the target mode cannot run: left out (Warning)."""
    ACTION_IGNORED = "ActionIgnored"
    """A one-shot ``abort``, ``resume`` or ``retry`` the phase cannot honour: refused out
    loud (Warning) and removed, never remembered."""
    HAND_SET_LABEL = "HandSetLabel"
    """A node of a stage not yet started carries the target ``proxymode.io/mode`` label
    that this policy did not set (Warning): it is walked back, with its cleanup, and moves
    again with its stage, instead of being trusted as a finished move."""
    TARGET_EDITED = "TargetEdited"
    """The target DaemonSet's spec carries a change the operator did not render (someone's
    ``kubectl edit``, ``set image``, ``rollout restart``): its controller rolls it out, paced
    like the operator's own changes; the change is lost when the migration ends (Warning,
    once per template generation; decision 0073)."""
    TARGET_DELETED = "TargetDeleted"
    """The target DaemonSet was deleted under nodes this run moved, their kube-proxies with
    it, and is made again (Warning, naming how to stop a migration instead)."""
    SOURCE_CONFIG_MAP_RESTORED = "SourceConfigMapRestored"
    """The source ConfigMap was deleted under a run that must roll back: made again from the
    snapshot (Warning), so the nodes return to a kube-proxy that starts."""
    NODE_VERIFIED = "NodeVerified"
    """A moved node proved its kube-proxy: first sync, rules, the Service (with figures)."""
    NODE_NOT_VERIFIED = "NodeNotVerified"
    """A moved node failed verification (Warning), naming what was found."""


class ConditionReason(StrEnum):
    FORBIDDEN = "Forbidden"
    """Degraded: the API server refused a read the policy needs (RBAC); nothing was acted on."""
    HEALTHY = "Healthy"
    NOT_PAUSED = "NotPaused"
    NOT_ROLLED_BACK = "NotRolledBack"
    PAUSED = "Paused"


def paused_event(reason: PauseReason | str) -> str:
    """The history and Event reason of a pause: ``Paused<reason>``."""
    return f"Paused{reason}"
