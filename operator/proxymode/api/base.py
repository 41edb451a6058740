"""The API's names, bounds and enums, and the pydantic base models (see ``models``)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue
from pydantic.alias_generators import to_camel

GROUP = "proxymode.io"
VERSION = "v1alpha1"
KIND = "ProxyModePolicy"
PLURAL = "proxymodepolicies"
SINGULAR = "proxymodepolicy"
SHORT_NAMES = ("pmp",)

MAX_NAME = 63
MAX_POLICY_NAME = 40
"""A policy's name goes into the names of the objects it creates (the CRD's CEL rule)."""
MAX_STAGES = 16
MAX_CHECKS = 16
MAX_NODES_IN_STATUS = 10000
MAX_HISTORY = 50

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
PERCENT = re.compile(r"^([1-9][0-9]?|100)%$")


def cel(rule: str, message: str, **extra: str) -> dict[str, JsonValue]:
    return {"rule": rule, "message": message, **extra}


class ApiModel(BaseModel):
    """Base: camelCase on the wire, unknown fields refused (the schema is structural)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
    )

    def wire(self) -> dict[str, Any]:
        """The object as the API stores it: camelCase, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class StatusModel(ApiModel):
    """Status parts tolerate fields they do not know (written by a newer operator)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


# -- enums ---------------------------------------------------------------------------------------


class ProxyMode(StrEnum):
    """kube-proxy's own mode names, spelled exactly as in KubeProxyConfiguration."""

    IPTABLES = "iptables"
    IPVS = "ipvs"
    NFTABLES = "nftables"


class Template(StrEnum):
    """Built-in analysis checks over kube-proxy's and node_exporter's own metrics."""

    SYNC_LATENCY_P99 = "SyncLatencyP99"
    NETWORK_PROGRAMMING_P99 = "NetworkProgrammingP99"
    CONNTRACK_USAGE = "ConntrackUsage"
    SYNC_FAILURES = "SyncFailures"
    SYNC_STALENESS = "SyncStaleness"


SECONDS_TEMPLATES = frozenset(
    {Template.SYNC_LATENCY_P99, Template.NETWORK_PROGRAMMING_P99, Template.SYNC_STALENESS}
)


class OnNoData(StrEnum):
    """What a run of inconclusive rounds leads to. Never a silent promotion."""

    PAUSE = "Pause"
    ROLLBACK = "Rollback"
    CONTINUE = "Continue"


class IncompatibleNodes(StrEnum):
    """What to do with nodes that cannot run the target mode (e.g. kernel < 5.13 for nftables)."""

    REFUSE = "Refuse"
    EXCLUDE = "Exclude"


class SourceTemplate(StrEnum):
    """What finalize leaves in the source DaemonSet's pod template (decision 0014).

    ``KeepExclusionTerm``: the template the nodes were handed back to, which is the original
    plus ``proxymode.io/mode NotIn [<target>, switching]`` in its required node affinity (a
    term every node matches once the labels are gone): putting the update strategy back
    changes nothing the DaemonSet controller rolls, so each kube-proxy starts twice in the
    whole migration. ``Exact``: the original affinity back too, which is one more rolling
    restart of every kube-proxy (three starts).
    """

    KEEP_EXCLUSION_TERM = "KeepExclusionTerm"
    EXACT = "Exact"


class ManagedAddon(StrEnum):
    """What to do when a platform (EKS, AKS, the addon manager) reconciles kube-proxy back."""

    REFUSE = "Refuse"
    PROCEED = "Proceed"


class Phase(StrEnum):
    """The policy's phase: a summary derived from status for printer columns and Argo CD."""

    PENDING = "Pending"
    PREFLIGHT = "Preflight"
    PROGRESSING = "Progressing"
    ANALYZING = "Analyzing"
    PAUSED = "Paused"
    FINALIZING = "Finalizing"
    COMPLETED = "Completed"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"


IN_FLIGHT_PHASES = frozenset(
    {
        Phase.PREFLIGHT,
        Phase.PROGRESSING,
        Phase.ANALYZING,
        Phase.PAUSED,
        Phase.FINALIZING,
        Phase.ROLLING_BACK,
    }
)
TARGET_EDITABLE_PHASES = frozenset({Phase.PENDING, Phase.ROLLED_BACK})
"""Where targetMode may change whatever the status holds; Preflight and Failed also, without a
snapshot (the CRD's rule)."""


class StagePhase(StrEnum):
    PENDING = "Pending"
    PROGRESSING = "Progressing"
    BAKING = "Baking"
    COMPLETED = "Completed"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"


class Verdict(StrEnum):
    PASS = "Pass"  # noqa: S105 - a verdict, not a password
    FAIL = "Fail"
    INCONCLUSIVE = "Inconclusive"


class Severity(StrEnum):
    INFO = "Info"
    WARNING = "Warning"
    ERROR = "Error"
