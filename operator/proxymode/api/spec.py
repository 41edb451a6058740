"""``spec``: what a person asks for. Bounds and CEL rules here are what the API server enforces."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from proxymode.api.base import (
    MAX_STAGES,
    PERCENT,
    ApiModel,
    IncompatibleNodes,
    ManagedAddon,
    ProxyMode,
    SourceTemplate,
    cel,
)
from proxymode.api.checks import (
    Analysis,
    Name,
    require_unique,
)

# -- spec ----------------------------------------------------------------------------------------


LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
"""A label key as Kubernetes validates one: an optional DNS-subdomain prefix and ``/``, then
a name of at most 63 letters, digits, ``-``, ``_`` and ``.``, a letter or digit at each end.
The prefix's 253 characters at most are a separate rule (``PREFIX_FITS``): RE2 cannot bound a
group's length."""
PREFIX_FITS = "{key}.indexOf('/') <= 253"
"""CEL: the key's DNS-subdomain prefix, if any, is at most 253 characters (a longer one
passed the pattern, and the API server refused the node selector only when applied)."""
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
KEY_MESSAGE = (
    "is not a valid label key (an optional DNS-subdomain prefix of at most 253 characters and"
    " '/', then a name of at most 63 letters, digits, '-', '_' or '.', beginning and ending"
    " with a letter or digit)"
)
VALUE_MESSAGE = (
    "is not a valid label value (at most 63 letters, digits, '-', '_' or '.', beginning and"
    " ending with a letter or digit)"
)
EMPTY_SELECTOR_MESSAGE = (
    "an empty nodeSelector selects every node: give matchLabels or matchExpressions, or"
    " leave nodeSelector out and give a percent"
)
VALUES_MESSAGE = "operators In and NotIn need at least one value; Exists and DoesNotExist take none"


def valid_label_key(key: str) -> bool:
    """The pattern and the prefix's length, as Kubernetes checks a label key."""
    return re.fullmatch(LABEL_KEY, key) is not None and key.find("/") <= 253


LabelKey = Annotated[str, Field(min_length=1, max_length=317, pattern=LABEL_KEY)]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE)]
MapKey = Annotated[str, Field(min_length=1, max_length=317)]
"""A matchLabels key: its pattern is a CEL rule on the map (a structural schema has no
patternProperties) and a validator here."""


# Selectors are refused where Kubernetes' own validation of a LabelSelector refuses them: a
# selector read loosely (values ignored under Exists, no value under In, an empty one)
# silently selected every node or none (a review).


class LabelSelectorRequirement(ApiModel):
    """One requirement: a node label's key, an operator and (for In, NotIn) values."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0"
                    " : !has(self.values) || size(self.values) == 0",
                    VALUES_MESSAGE,
                ),
                cel(PREFIX_FITS.format(key="self.key"), f"key {KEY_MESSAGE}"),
            ]
        }
    )

    key: LabelKey = Field(description="The node label the requirement is about.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the label's value relates to values."
    )
    values: Annotated[list[LabelValue], Field(max_length=64)] | None = Field(
        default=None, description="The values for In and NotIn; empty for Exists, DoesNotExist."
    )

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> LabelSelectorRequirement:
        if bool(self.values) != (self.operator in ("In", "NotIn")):
            raise ValueError(VALUES_MESSAGE)
        if not valid_label_key(self.key):
            raise ValueError(f"key {self.key!r} {KEY_MESSAGE}")
        return self


class LabelSelector(ApiModel):
    """A metav1.LabelSelector: matchLabels and matchExpressions, ANDed."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.matchLabels) || self.matchLabels.all(k,"
                    f" k.matches(r'{LABEL_KEY}') && {PREFIX_FITS.format(key='k')})",
                    f"a matchLabels key {KEY_MESSAGE}",
                ),
            ]
        }
    )

    match_labels: Annotated[dict[MapKey, LabelValue], Field(max_length=32)] | None = Field(
        default=None, description="Node labels that must all be equal to these values."
    )
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=32)] | None = (
        Field(default=None, description="Requirements on node labels; all must hold.")
    )

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    @field_validator("match_labels")
    @classmethod
    def _label_keys(cls, labels: dict[str, str] | None) -> dict[str, str] | None:
        for key in labels or {}:
            if not valid_label_key(key):
                raise ValueError(f"a matchLabels key {key!r} {KEY_MESSAGE}")
        return labels


class KubeProxyRef(ApiModel):
    """Where the cluster's kube-proxy lives (kubeadm's names by default)."""

    namespace: Name = Field(
        default="kube-system", description="The namespace of kube-proxy's DaemonSet and ConfigMap."
    )
    daemon_set: Annotated[str, Field(min_length=1, max_length=253)] = Field(
        default="kube-proxy", description="The source kube-proxy DaemonSet's name."
    )
    config_map: Annotated[str, Field(min_length=1, max_length=253)] = Field(
        default="kube-proxy", description="The ConfigMap holding kube-proxy's configuration."
    )
    config_key: Annotated[str, Field(min_length=1, max_length=253)] = Field(
        default="config.conf",
        description="The key in that ConfigMap with the KubeProxyConfiguration.",
    )


class Stage(ApiModel):
    """One step of the rollout: a node pool (selector), a cumulative share (percent), or both."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.nodeSelector) || has(self.percent)",
                    "a stage needs a nodeSelector, a percent, or both",
                ),
                cel(
                    "!has(self.nodeSelector) || has(self.nodeSelector.matchLabels)"
                    " && size(self.nodeSelector.matchLabels) > 0"
                    " || has(self.nodeSelector.matchExpressions)"
                    " && size(self.nodeSelector.matchExpressions) > 0",
                    EMPTY_SELECTOR_MESSAGE,
                ),
            ]
        }
    )

    name: Name = Field(description="The stage's name, unique in the policy (status and Events).")
    node_selector: LabelSelector | None = Field(
        default=None, description="Nodes this stage may move (e.g. the canary pool)."
    )
    percent: Annotated[int, Field(ge=1, le=100)] | None = Field(
        default=None,
        description="Cumulative share of all eligible nodes moved once this stage is done.",
    )
    max_nodes: Annotated[int, Field(ge=1, le=100000)] | None = Field(
        default=None, description="At most this many nodes in this stage."
    )
    bake_seconds: Annotated[int, Field(ge=0, le=604800)] = Field(
        default=300, description="How long the stage's nodes run before it may promote."
    )

    @model_validator(mode="after")
    def _selector_or_percent(self) -> Stage:
        if self.node_selector is None and self.percent is None:
            raise ValueError(
                f"stage {self.name!r}: a stage needs a nodeSelector, a percent, or both"
            )
        if self.node_selector is not None and self.node_selector.empty:
            raise ValueError(f"stage {self.name!r}: {EMPTY_SELECTOR_MESSAGE}")
        return self


class Rollback(ApiModel):
    automatic: bool = Field(
        default=True, description="Roll back by itself on a breach; false pauses instead."
    )


class Verify(ApiModel):
    """How a moved node proves its kube-proxy works before the move counts (issue 11)."""

    enabled: bool = Field(
        default=True,
        description="Run the verification Job on each moved node; false trusts a Ready pod"
        " (which, without a readiness probe, only means the process started).",
    )
    service: Annotated[
        str,
        Field(
            min_length=5,
            max_length=253 + 64 + 7,
            pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?:[0-9]{1,5}$",
        ),
    ] = Field(
        default="default/kubernetes:443",
        description="namespace/name:port of the Service a node must reach through its new"
        " rules (a TCP connect to its ClusterIP).",
    )
    timeout_seconds: Annotated[int, Field(ge=10, le=3600)] = Field(
        default=300,
        description="How long a node may take to show a first full sync, the rules and the"
        " Service; past it the node fails verification (a breach).",
    )


class PolicySpec(ApiModel):
    """What a ProxyModePolicy asks for: the target mode and how to get there."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.stages.all(s, self.stages.exists_one(t, t.name == s.name))",
                    "stage names must be unique",
                ),
                cel(
                    "self.stages.filter(s, has(s.percent)).map(s, s.percent).isSorted()",
                    "stage percents must not decrease from one stage to the next",
                ),
                cel(
                    "type(self.maxUnavailable) == int ? self.maxUnavailable >= 1 :"
                    " self.maxUnavailable.matches('^([1-9][0-9]?|100)%$')",
                    "maxUnavailable must be a whole number of nodes (1 or more) or a percent"
                    " from 1% to 100%",
                ),
            ]
        }
    )

    target_mode: ProxyMode = Field(description="The kube-proxy mode to move nodes to.")
    kube_proxy: KubeProxyRef = Field(
        default_factory=KubeProxyRef,
        json_schema_extra={"default": {}},
        description="Where the source kube-proxy lives (kubeadm's names by default).",
    )
    node_selector: LabelSelector | None = Field(
        default=None,
        description="Nodes the policy may touch (default: all the source DaemonSet runs on).",
    )
    config_overrides: dict[str, Any] | None = Field(
        default=None, description="Merged into the target KubeProxyConfiguration."
    )
    stages: Annotated[list[Stage], Field(min_length=1, max_length=MAX_STAGES)] = Field(
        description="The rollout's stages in order; each moves its nodes, then bakes and is"
        " judged before the next starts."
    )
    max_unavailable: int | str = Field(
        default=1, description="Nodes between proxies at once: a number or a percent."
    )
    incompatible_nodes: IncompatibleNodes = Field(
        default=IncompatibleNodes.REFUSE,
        description="Nodes that cannot run the target mode: refuse the run, or leave them out.",
    )
    managed_addon: ManagedAddon = Field(
        default=ManagedAddon.REFUSE,
        description="kube-proxy that a platform reconciles back (the EKS add-on, AKS): refuse"
        " the run, or proceed (it no longer manages it, or will not update it meanwhile).",
    )
    ready_timeout_seconds: Annotated[int, Field(ge=10, le=3600)] = Field(
        default=300,
        description="How long a moved node's kube-proxy may take to become Ready before the"
        " stage counts as failed.",
    )
    analysis: Analysis | None = None
    rollback: Rollback = Field(
        default_factory=Rollback,
        json_schema_extra={"default": {}},
        description="What a failed gate does: roll back by itself, or pause for a person.",
    )
    paused: bool = Field(
        default=False,
        description="Hold the rollout where it is (nodes in flight finish their move); false"
        " goes on. Created paused, not even preflight runs.",
    )
    finalize: bool = Field(
        default=True,
        description="After the last stage, fold the result back into the source objects.",
    )
    finalize_source_template: SourceTemplate = Field(
        default=SourceTemplate.KEEP_EXCLUSION_TERM,
        description="What finalize leaves in the source DaemonSet's pod template:"
        " KeepExclusionTerm (default) keeps the 'proxymode.io/mode NotIn [<target>, switching]'"
        " node-affinity term the nodes were handed back under, which every node matches once"
        " the labels are gone, so each kube-proxy starts twice in the migration; Exact puts"
        " the original affinity back, at the cost of one more rolling restart of every"
        " kube-proxy.",
    )
    verify: Verify = Field(
        default_factory=Verify,
        json_schema_extra={"default": {}},
        description="Verification of each moved node (first sync, rules, a Service).",
    )

    @field_validator("stages")
    @classmethod
    def _stages(cls, stages: list[Stage]) -> list[Stage]:
        require_unique([s.name for s in stages], "stage")
        last = 0
        for s in stages:
            if s.percent is None:
                continue
            if s.percent < last:
                raise ValueError("stage percents must not decrease from one stage to the next")
            last = s.percent
        return stages

    @field_validator("max_unavailable")
    @classmethod
    def _max_unavailable(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value < 1:
                raise ValueError("maxUnavailable must be a whole number of nodes (1 or more)")
            return value
        if not PERCENT.fullmatch(value):
            raise ValueError(
                "maxUnavailable must be a whole number of nodes (1 or more) or a percent"
                " from 1% to 100%"
            )
        return value
