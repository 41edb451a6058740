"""``spec.analysis``: the metric gate a person asks for: Prometheus, the checks, their bounds.

Split from ``spec`` so that neither module outgrows a screenful of models; ``spec`` imports
these and ``models`` re-exports both.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, field_validator, model_validator

from proxymode.api.base import (
    DNS_LABEL,
    MAX_CHECKS,
    MAX_NAME,
    SECONDS_TEMPLATES,
    ApiModel,
    OnNoData,
    Template,
    cel,
)

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=DNS_LABEL)]


class SecretKeyRef(ApiModel):
    name: Annotated[str, Field(min_length=1, max_length=253)] = Field(
        description="The Secret's name, in the operator's namespace."
    )
    key: Annotated[str, Field(min_length=1, max_length=253)] = Field(
        description="The key in the Secret."
    )


class BasicAuth(ApiModel):
    username: SecretKeyRef = Field(description="The Secret key holding the user name.")
    password: SecretKeyRef = Field(description="The Secret key holding the password.")


class PrometheusSource(ApiModel):
    """How to reach Prometheus. Secrets are read from the operator's namespace."""

    url: Annotated[str, Field(min_length=1, max_length=2048, pattern=r"^https?://")] = Field(
        description="Prometheus's base URL (http or https), e.g."
        " http://prometheus-operated.monitoring:9090."
    )
    bearer_token: SecretKeyRef | None = Field(
        default=None, description="A Secret key holding a bearer token sent with every query."
    )
    basic_auth: BasicAuth | None = Field(
        default=None, description="Secret keys holding a user name and password."
    )
    ca: SecretKeyRef | None = Field(default=None, description="PEM CA bundle to verify TLS.")
    insecure_skip_verify: bool = Field(
        default=False, description="Do not verify Prometheus's TLS certificate (tests only)."
    )
    node_label: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[a-zA-Z_]\w*$")] = (
        Field(default="instance", description="The series label that carries the node name.")
    )
    timeout_seconds: Annotated[int, Field(ge=1, le=120)] = Field(
        default=10, description="How long one query may take."
    )


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

    name: Name = Field(description="The check's name, unique in the policy (status, Events).")
    template: Template | None = None
    query: Annotated[str, Field(min_length=1, max_length=4096)] | None = Field(
        default=None,
        description="PromQL with {{nodes}} where the group's node matcher goes; for"
        " mannWhitney also {{by_node}} in a by clause (the node label per node, empty for"
        " the group).",
    )
    max_seconds: Annotated[float, Field(gt=0, le=3600)] | None = Field(
        default=None, description="Pass when the canary's value is at most this many seconds."
    )
    max_ratio: Annotated[float, Field(gt=0, le=1)] | None = Field(
        default=None, description="Pass when the canary's value (a ratio) is at most this."
    )
    max_ratio_to_baseline: Annotated[float, Field(gt=0, le=100)] | None = Field(
        default=None, description="Fail when canary / baseline exceeds this."
    )
    min: float | None = Field(
        default=None,
        ge=-1e12,
        le=1e12,
        description="Pass when the canary's value is at least this.",
    )
    max: float | None = Field(
        default=None, ge=-1e12, le=1e12, description="Pass when the canary's value is at most this."
    )
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
    interval_seconds: Annotated[int, Field(ge=5, le=3600)] = Field(
        default=60, description="Seconds between analysis rounds while a stage bakes."
    )
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
    checks: Annotated[list[Check], Field(min_length=1, max_length=MAX_CHECKS)] = Field(
        description="What every round measures; a stage completes only when all pass."
    )

    @field_validator("checks")
    @classmethod
    def _unique_checks(cls, checks: list[Check]) -> list[Check]:
        require_unique([c.name for c in checks], "check")
        return checks


def require_unique(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{what} names must be unique: {name!r} appears twice")
        seen.add(name)
