"""``spec``: what a person asks for. Bounds and CEL rules here are what the API server enforces."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from proxymode.api.base import (
    DNS_LABEL,
    MAX_CHECKS,
    MAX_NAME,
    MAX_STAGES,
    PERCENT,
    SECONDS_TEMPLATES,
    ApiModel,
    IncompatibleNodes,
    OnNoData,
    ProxyMode,
    Template,
    cel,
)

# -- spec ----------------------------------------------------------------------------------------


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=DNS_LABEL)]
LabelKey = Annotated[str, Field(min_length=1, max_length=317)]
LabelValue = Annotated[str, Field(max_length=63)]


class LabelSelectorRequirement(ApiModel):
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: Annotated[list[LabelValue], Field(max_length=64)] | None = None


class LabelSelector(ApiModel):
    """A metav1.LabelSelector: matchLabels and matchExpressions, ANDed."""

    match_labels: Annotated[dict[LabelKey, LabelValue], Field(max_length=32)] | None = None
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=32)] | None = None

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


class KubeProxyRef(ApiModel):
    """Where the cluster's kube-proxy lives (kubeadm's names by default)."""

    namespace: Name = "kube-system"
    daemon_set: Annotated[str, Field(min_length=1, max_length=253)] = "kube-proxy"
    config_map: Annotated[str, Field(min_length=1, max_length=253)] = "kube-proxy"
    config_key: Annotated[str, Field(min_length=1, max_length=253)] = "config.conf"


class Stage(ApiModel):
    """One step of the rollout: a node pool (selector), a cumulative share (percent), or both."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.nodeSelector) || has(self.percent)",
                    "a stage needs a nodeSelector, a percent, or both",
                )
            ]
        }
    )

    name: Name
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
        return self


class SecretKeyRef(ApiModel):
    name: Annotated[str, Field(min_length=1, max_length=253)]
    key: Annotated[str, Field(min_length=1, max_length=253)]


class BasicAuth(ApiModel):
    username: SecretKeyRef
    password: SecretKeyRef


class PrometheusSource(ApiModel):
    """How to reach Prometheus. Secrets are read from the operator's namespace."""

    url: Annotated[str, Field(min_length=1, max_length=2048, pattern=r"^https?://")]
    bearer_token: SecretKeyRef | None = None
    basic_auth: BasicAuth | None = None
    ca: SecretKeyRef | None = Field(default=None, description="PEM CA bundle to verify TLS.")
    insecure_skip_verify: bool = False
    node_label: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z_]\w*$")] = (
        Field(default="instance", description="The series label that carries the node name.")
    )
    timeout_seconds: Annotated[int, Field(ge=1, le=120)] = 10


class MannWhitney(ApiModel):
    """A one-sided Mann-Whitney U test of the canary's per-node values against the baseline's.

    Kayenta's judge, without the score: the check fails when the canary nodes' values are
    significantly greater (at ``alpha``) than the baseline nodes' values scaled by
    ``1 + tolerance``. It compares two groups: when the plan leaves a group with fewer
    than ``minSamples`` nodes (no baseline at the last stage, a small canary pool) it does
    not apply and the check's other bounds decide; fewer values than that from groups big
    enough (missing data) is Inconclusive. Few nodes cannot reach a small alpha: with 3
    against 3 the smallest p-value is 1/20 = 0.05.
    """

    alpha: Annotated[float, Field(gt=0, le=0.5)] = Field(
        default=0.05, description="Significance level of the one-sided test (p <= alpha fails)."
    )
    tolerance: Annotated[float, Field(ge=0, le=10)] = Field(
        default=0.1,
        description="Relative band: the canary may be up to (1 + tolerance) times the baseline"
        " before it counts as worse.",
    )
    min_samples: Annotated[int, Field(ge=2, le=1000)] = Field(
        default=3, description="Per-node values each group needs, or the test is Inconclusive."
    )


class Check(ApiModel):
    """One exit criterion judged every round, for the canary and (if asked) the baseline."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.template) != has(self.query)",
                    "a check needs exactly one of template or query",
                ),
                cel(
                    "has(self.maxSeconds) || has(self.maxRatio) || has(self.maxRatioToBaseline)"
                    " || has(self.min) || has(self.max)",
                    "a check needs a threshold: maxSeconds, maxRatio, maxRatioToBaseline,"
                    " min or max",
                ),
                cel(
                    "!has(self.query) || self.query.contains('{{nodes}}')",
                    "a custom query must contain the {{nodes}} placeholder for the group's nodes",
                ),
                cel(
                    "!has(self.maxSeconds) || (has(self.template) && self.template in"
                    " ['SyncLatencyP99', 'NetworkProgrammingP99', 'SyncStaleness'])",
                    "maxSeconds applies to SyncLatencyP99, NetworkProgrammingP99 and SyncStaleness",
                ),
                cel(
                    "!has(self.maxRatio)"
                    " || (has(self.template) && self.template == 'ConntrackUsage')",
                    "maxRatio applies to ConntrackUsage",
                ),
                cel(
                    "!has(self.mannWhitney) || has(self.template)"
                    " || (has(self.query) && self.query.contains('{{by_node}}'))",
                    "mannWhitney needs a template, or a custom query with the {{by_node}}"
                    " placeholder so that it can give one value per node",
                ),
            ]
        }
    )

    name: Name
    template: Template | None = None
    query: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        default=None,
        description="PromQL with {{nodes}} where the group's node matcher goes; for"
        " mannWhitney also {{by_node}} in a by clause (the node label per node, empty for"
        " the group).",
    )
    max_seconds: Annotated[float, Field(gt=0, le=3600)] | None = None
    max_ratio: Annotated[float, Field(gt=0, le=1)] | None = None
    max_ratio_to_baseline: Annotated[float, Field(gt=0, le=100)] | None = Field(
        default=None, description="Fail when canary / baseline exceeds this."
    )
    min: float | None = Field(default=None, ge=-1e12, le=1e12)
    max: float | None = Field(default=None, ge=-1e12, le=1e12)
    mann_whitney: MannWhitney | None = Field(
        default=None,
        description="Also compare the canary's per-node values with the baseline's"
        " (one-sided Mann-Whitney U with a tolerance band).",
    )

    @model_validator(mode="after")
    def _coherent(self) -> Check:
        where = f"check {self.name!r}"
        if (self.template is None) == (self.query is None):
            raise ValueError(f"{where}: a check needs exactly one of template or query")
        thresholds = (
            self.max_seconds,
            self.max_ratio,
            self.max_ratio_to_baseline,
            self.min,
            self.max,
        )
        if all(t is None for t in thresholds):
            raise ValueError(
                f"{where}: a check needs a threshold: maxSeconds, maxRatio, maxRatioToBaseline,"
                " min or max"
            )
        if self.query is not None and "{{nodes}}" not in self.query:
            raise ValueError(
                f"{where}: a custom query must contain the {{{{nodes}}}} placeholder for the"
                " group's nodes"
            )
        if self.max_seconds is not None and self.template not in SECONDS_TEMPLATES:
            raise ValueError(
                f"{where}: maxSeconds applies to SyncLatencyP99, NetworkProgrammingP99 and"
                " SyncStaleness"
            )
        if self.max_ratio is not None and self.template != Template.CONNTRACK_USAGE:
            raise ValueError(f"{where}: maxRatio applies to ConntrackUsage")
        if (
            self.mann_whitney is not None
            and self.template is None
            and (self.query is None or "{{by_node}}" not in self.query)
        ):
            raise ValueError(
                f"{where}: mannWhitney needs a template, or a custom query with the"
                " {{by_node}} placeholder so that it can give one value per node"
            )
        return self


class Analysis(ApiModel):
    """The metric gates: every round judges each check; bad rounds roll back, no data holds."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.checks.all(c, self.checks.exists_one(d, d.name == c.name))",
                    "check names must be unique",
                ),
            ]
        }
    )

    prometheus: PrometheusSource
    interval_seconds: Annotated[int, Field(ge=5, le=3600)] = 60
    window_seconds: Annotated[int, Field(ge=10, le=86400)] = Field(
        default=300, description="The range each rate() and quantile looks back over."
    )
    warmup_seconds: Annotated[int, Field(ge=0, le=3600)] = Field(
        default=120, description="A fresh kube-proxy's first syncs are slow: do not judge them."
    )
    failure_limit: Annotated[int, Field(ge=1, le=100)] = Field(
        default=2, description="Consecutive failed rounds before rollback."
    )
    inconclusive_limit: Annotated[int, Field(ge=1, le=100)] = Field(
        default=5, description="Consecutive no-data rounds before onNoData applies."
    )
    min_passing_rounds: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=3, description="Passing rounds a stage needs before it may promote."
    )
    on_no_data: OnNoData = OnNoData.PAUSE
    checks: Annotated[list[Check], Field(min_length=1, max_length=MAX_CHECKS)]

    @field_validator("checks")
    @classmethod
    def _unique_checks(cls, checks: list[Check]) -> list[Check]:
        _require_unique([c.name for c in checks], "check")
        return checks


class Rollback(ApiModel):
    automatic: bool = Field(
        default=True, description="Roll back by itself on a breach; false pauses instead."
    )


def _require_unique(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{what} names must be unique: {name!r} appears twice")
        seen.add(name)


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
    stages: Annotated[list[Stage], Field(min_length=1, max_length=MAX_STAGES)]
    max_unavailable: int | str = Field(
        default=1, description="Nodes between proxies at once: a number or a percent."
    )
    incompatible_nodes: IncompatibleNodes = Field(
        default=IncompatibleNodes.REFUSE,
        description="Nodes that cannot run the target mode: refuse the run, or leave them out.",
    )
    ready_timeout_seconds: Annotated[int, Field(ge=10, le=3600)] = Field(
        default=300,
        description="How long a moved node's kube-proxy may take to become Ready before the"
        " stage counts as failed.",
    )
    analysis: Analysis | None = None
    rollback: Rollback = Field(default_factory=Rollback, json_schema_extra={"default": {}})
    paused: bool = False
    finalize: bool = Field(
        default=True,
        description="After the last stage, fold the result back into the source objects.",
    )

    @field_validator("stages")
    @classmethod
    def _stages(cls, stages: list[Stage]) -> list[Stage]:
        _require_unique([s.name for s in stages], "stage")
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
        if not PERCENT.match(value):
            raise ValueError(
                "maxUnavailable must be a whole number of nodes (1 or more) or a percent"
                " from 1% to 100%"
            )
        return value
