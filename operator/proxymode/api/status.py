"""``status``: what the operator writes. Tolerant of fields a newer operator adds."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from proxymode.api.base import (
    GROUP,
    KIND,
    MAX_NODES_IN_STATUS,
    VERSION,
    ApiModel,
    Phase,
    Severity,
    StagePhase,
    StatusModel,
    Verdict,
)
from proxymode.api.reasons import PauseReason, RollbackReason
from proxymode.api.spec import PolicySpec

# -- status --------------------------------------------------------------------------------------


class Condition(StatusModel):
    """A metav1.Condition."""

    type: Annotated[str, Field(max_length=316)]
    status: Literal["True", "False", "Unknown"]
    reason: Annotated[str, Field(max_length=1024)]
    message: Annotated[str, Field(max_length=32768)] = ""
    last_transition_time: datetime
    observed_generation: int | None = None


class StageStatus(StatusModel):
    name: str
    phase: StagePhase = StagePhase.PENDING
    nodes: Annotated[list[str], Field(max_length=MAX_NODES_IN_STATUS)] = Field(default_factory=list)
    nodes_done: int = 0
    moved: Annotated[list[str] | None, Field(max_length=MAX_NODES_IN_STATUS)] = None
    """The nodes of this stage that a move of this policy put on the target. A node on the
    target label that is not here got it from someone else (no cleanup ran, the old proxy
    may have overlapped) and is moved again. ``None``: the status was written before this
    field existed, and every node on the target is trusted as it was then."""
    started_time: datetime | None = None
    baked_since: datetime | None = None
    completed_time: datetime | None = None


class Count(StatusModel):
    """How many nodes share one value (a kernel, an OS image, a runtime)."""

    value: str
    count: int


class Baseline(StatusModel):
    kubernetes_version: str | None = None
    kube_proxy_version: str | None = None
    kube_proxy_image: str | None = None
    source_mode: str | None = None
    kernels: list[Count] = Field(default_factory=list)
    os_images: list[Count] = Field(default_factory=list)
    container_runtimes: list[Count] = Field(default_factory=list)
    cni: str | None = None
    services: int | None = None
    endpoint_slices: int | None = None
    nodes: int | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    provisional: list[str] = Field(default_factory=list)
    """Checks whose value in ``metrics`` came from source kube-proxies still settling (one
    started less than ``warmupSeconds + windowSeconds`` before the round): slow first syncs
    would make ``maxRatioToBaseline`` lenient, so each later round replaces it, until one
    from settled proxies keeps it."""
    recorded_time: datetime | None = None


class Finding(StatusModel):
    severity: Severity
    code: str
    message: str
    nodes: list[str] = Field(default_factory=list)


class Preflight(StatusModel):
    passed: bool = False
    checked_time: datetime | None = None
    findings: list[Finding] = Field(default_factory=list)
    excluded_nodes: list[str] | None = Field(
        default=None,
        description="Nodes preflight left out because they cannot run the target mode"
        " (incompatibleNodes: Exclude); the rollout never plans them.",
    )


class CheckResult(StatusModel):
    name: str
    canary: float | None = None
    baseline: float | None = None
    verdict: Verdict
    message: str = ""


class AnalysisStatus(StatusModel):
    last_round_time: datetime | None = None
    rounds: int = 0
    passing_rounds: int = 0
    consecutive_failures: int = 0
    consecutive_inconclusive: int = 0
    checks: list[CheckResult] = Field(default_factory=list)


class HistoryEntry(StatusModel):
    time: datetime
    phase: str
    stage: str | None = None
    reason: str
    message: str = ""


class MoveDirection(StrEnum):
    FORWARD = "Forward"
    BACK = "Back"
    HANDBACK = "Handback"


class Move(StatusModel):
    """A node between two kube-proxies. Bounded by maxUnavailable, so the list stays short."""

    node: str
    direction: MoveDirection
    since: datetime


class Switch(StatusModel):
    """A node that arrived on the target mode while a stage baked, and when."""

    node: str
    time: datetime


MAX_VERIFICATIONS = 5
"""How many verifications status keeps in each list (the latest, the failing ones)."""


class NodeVerification(StatusModel):
    """One node's verification, as its Job reported it."""

    node: str
    time: datetime
    verified: bool
    mode: str = ""
    direction: MoveDirection | None = None
    summary: str = Field(default="", max_length=1024)
    first_sync_seconds: float | None = None
    probe_millis: float | None = None


class VerificationStatus(StatusModel):
    """Counts of this run's node verifications, the latest ones and the failing ones."""

    verified: int = 0
    failed: int = 0
    latest: Annotated[list[NodeVerification], Field(max_length=MAX_VERIFICATIONS)] = Field(
        default_factory=list
    )
    failures: Annotated[list[NodeVerification], Field(max_length=MAX_VERIFICATIONS)] = Field(
        default_factory=list
    )


class BackupRef(StatusModel):
    """Where the snapshot of everything the operator changes is kept."""

    namespace: str
    name: str


class PolicyStatus(StatusModel):
    phase: Phase = Phase.PENDING
    observed_generation: int | None = None
    source_mode: str | None = None
    target_mode: str | None = None
    plan_hash: str | None = None
    current_stage: int | None = None
    current_stage_name: str | None = None
    node_progress: str | None = Field(default=None, description="Nodes moved / eligible, e.g. 2/6.")
    stages: list[StageStatus] = Field(default_factory=list)
    baseline: Baseline | None = None
    preflight: Preflight | None = None
    analysis: AnalysisStatus | None = None
    moves: list[Move] = Field(default_factory=list)
    recent_switches: Annotated[list[Switch], Field(max_length=MAX_NODES_IN_STATUS)] = Field(
        default_factory=list,
        description="Nodes that arrived on the target mode while a stage baked (a newcomer,"
        " a node moved again), and when: the analysis leaves each out of the canary group"
        " until a whole window has passed since, as its window still holds the old proxy's"
        " samples. Kept for one analysis window.",
    )
    backup: BackupRef | None = None
    paused_reason: PauseReason | None = None
    run: int = Field(default=1, description="Which run of this policy (a retry starts the next).")
    handled_action: str | None = Field(
        default=None,
        description="The one-shot action last acted on; the annotation is removed after this"
        " is stored, so an action is never taken twice.",
    )
    resume_phase: Phase | None = None
    rollback_reason: RollbackReason | None = Field(
        default=None, description="Why the rollback started: a code (see rollbackMessage)."
    )
    rollback_message: str | None = Field(
        default=None, description="What the rollback's reason saw, for people."
    )
    finalized: bool | None = None
    started_time: datetime | None = None
    completed_time: datetime | None = None
    message: str | None = None
    conditions: list[Condition] = Field(default_factory=list)
    history: list[HistoryEntry] = Field(default_factory=list)
    verification: VerificationStatus | None = None

    @model_validator(mode="before")
    @classmethod
    def _split_legacy_rollback_reason(cls, data: Any) -> Any:
        """Before 0010 ``rollbackReason`` was ``"<Code>: <message>"``: read it as the pair, so a
        policy rolling back across an operator upgrade keeps its reason."""
        if not isinstance(data, dict):
            return data
        for code_key, message_key in (
            ("rollbackReason", "rollbackMessage"),
            ("rollback_reason", "rollback_message"),
        ):
            code = data.get(code_key)
            if isinstance(code, str) and ": " in code and not data.get(message_key):
                head, _, tail = code.partition(": ")
                data = {**data, code_key: head, message_key: tail}
        return data


class ProxyModePolicy(ApiModel):
    """The whole object, as read from the API (metadata kept as a plain mapping)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    api_version: str = f"{GROUP}/{VERSION}"
    kind: str = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: PolicySpec
    status: PolicyStatus = Field(default_factory=PolicyStatus)
