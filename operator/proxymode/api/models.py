"""The ProxyModePolicy API: spec and status as pydantic models, the one source of truth.

The CRD in ``crds/`` is generated from these models (``proxymode.api.crd``), so the
bounds and enums of these models are what the API server enforces. Cross-field rules are
written twice on purpose: as CEL (``x-kubernetes-validations``, so ``kubectl apply``
is refused with a clear message and nothing is stored) and as pydantic validators
(so the operator never acts on a spec the API server would have refused, e.g. one
stored before a CRD upgrade). A shared corpus of invalid specs tests both.

Field names are camelCase on the wire (``alias``) and snake_case in Python.

The models live in ``base`` (names, bounds, enums), ``checks`` (the analysis), ``spec`` and
``status``; this module is
the one import path for all of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from proxymode.api.base import (
    DNS_LABEL,
    GROUP,
    IN_FLIGHT_PHASES,
    KIND,
    MAX_CHECKS,
    MAX_HISTORY,
    MAX_NAME,
    MAX_NODES_IN_STATUS,
    MAX_POLICY_NAME,
    MAX_STAGES,
    PERCENT,
    PLURAL,
    SECONDS_TEMPLATES,
    SHORT_NAMES,
    SINGULAR,
    TARGET_EDITABLE_PHASES,
    VERSION,
    ApiModel,
    IncompatibleNodes,
    ManagedAddon,
    OnNoData,
    Phase,
    ProxyMode,
    Severity,
    SourceTemplate,
    StagePhase,
    StatusModel,
    Template,
    Verdict,
    cel,
)
from proxymode.api.checks import (
    Analysis,
    BasicAuth,
    Check,
    MannWhitney,
    Name,
    PrometheusSource,
    SecretKeyRef,
)
from proxymode.api.spec import (
    KubeProxyRef,
    LabelKey,
    LabelSelector,
    LabelSelectorRequirement,
    LabelValue,
    PolicySpec,
    Rollback,
    Stage,
    Verify,
)
from proxymode.api.status import (
    MAX_VERIFICATIONS,
    AnalysisStatus,
    BackupRef,
    Baseline,
    CheckResult,
    Condition,
    Count,
    Finding,
    HistoryEntry,
    Move,
    MoveDirection,
    NodeVerification,
    PolicyStatus,
    Preflight,
    ProxyModePolicy,
    StageStatus,
    Switch,
    VerificationStatus,
)

__all__ = [
    "DNS_LABEL",
    "GROUP",
    "IN_FLIGHT_PHASES",
    "KIND",
    "MAX_CHECKS",
    "MAX_HISTORY",
    "MAX_NAME",
    "MAX_NODES_IN_STATUS",
    "MAX_POLICY_NAME",
    "MAX_STAGES",
    "MAX_VERIFICATIONS",
    "PERCENT",
    "PLURAL",
    "SECONDS_TEMPLATES",
    "SHORT_NAMES",
    "SINGULAR",
    "TARGET_EDITABLE_PHASES",
    "VERSION",
    "Analysis",
    "AnalysisStatus",
    "ApiModel",
    "BackupRef",
    "Baseline",
    "BasicAuth",
    "Check",
    "CheckResult",
    "Condition",
    "Count",
    "Finding",
    "HistoryEntry",
    "IncompatibleNodes",
    "KubeProxyRef",
    "LabelKey",
    "LabelSelector",
    "LabelSelectorRequirement",
    "LabelValue",
    "ManagedAddon",
    "MannWhitney",
    "Move",
    "MoveDirection",
    "Name",
    "NodeVerification",
    "OnNoData",
    "Phase",
    "PolicySpec",
    "PolicyStatus",
    "Preflight",
    "PrometheusSource",
    "ProxyMode",
    "ProxyModePolicy",
    "Rollback",
    "SecretKeyRef",
    "Severity",
    "SourceTemplate",
    "Stage",
    "StagePhase",
    "StageStatus",
    "StatusModel",
    "Switch",
    "Template",
    "Verdict",
    "VerificationStatus",
    "Verify",
    "cel",
    "from_wire",
]


def from_wire(body: object) -> ProxyModePolicy:
    """A ProxyModePolicy read from what the API server stores or a manifest holds, judged as
    the API server judges it.

    - By the wire (camelCase) names only: the models also take Python names
      (``bake_seconds``) so code can build them, but the API server refuses those as unknown
      fields (or, without strict field validation, drops them).
    - The spec strictly, as JSON: the API server refuses ``"5"`` for an integer, ``1`` for a
      boolean, ``1.5`` for a count, where pydantic's lax mode would coerce them, so a plan
      made from a file could differ from what ``kubectl apply`` stores (found by the
      generated specs, issue 15 item 2). The status, written by the operator itself, is read
      as before.
    """
    if isinstance(body, Mapping):
        wire = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
        ProxyModePolicy.model_validate_json(
            json.dumps(wire, default=str), strict=True, by_alias=True, by_name=False
        )
    return ProxyModePolicy.model_validate(body, by_alias=True, by_name=False)
