"""The judge: one check's measured values in, a tri-state verdict with its reason out.

Pure and total: whatever the adapter measured (or failed to measure) becomes a
``CheckOutcome`` the engine counts (``engine.gate``: warm-up, failureLimit,
inconclusiveLimit, onNoData). The rules:

- No verdict without data: a query error (Prometheus unreachable, a bad query), no value
  for the canary, or a NaN/Inf one is Inconclusive, never a Pass and never a Fail.
- Absolute thresholds compare the canary's group value: above ``maxSeconds``,
  ``maxRatio`` or ``max`` fails, below ``min`` fails (equal passes).
- ``maxRatioToBaseline`` needs a baseline above 0 (else Inconclusive, "no baseline"),
  except that a canary of 0 against a baseline of 0 passes (nothing got worse).
- ``mannWhitney`` compares the per-node values: each group needs ``minSamples`` finite
  values (NaNs are dropped, as Kayenta's default ``nanStrategy: remove`` does) or it is
  Inconclusive; when a group is smaller than ``minSamples`` in the plan itself (no baseline
  left at the last stage, a two-node canary pool) the comparison does not apply and says
  so; it fails when the canary's values are significantly greater (one-sided,
  ``p <= alpha``) than the baseline's scaled by ``1 + tolerance``.
- Several thresholds on one check: Fail if any fails, else Inconclusive if any is,
  else Pass. The message gives the deciding findings with the measured values and the
  threshold, e.g. ``p99 sync 1.840s > maxSeconds 1s``.

Values that are not finite are reported as None in the outcome: status is JSON, which has
no NaN.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from proxymode.analysis.stats import mann_whitney_u
from proxymode.api.models import SECONDS_TEMPLATES, Check, MannWhitney, Template, Verdict
from proxymode.engine.observed import CheckOutcome

_WHAT = {
    Template.SYNC_LATENCY_P99: "p99 sync",
    Template.NETWORK_PROGRAMMING_P99: "p99 network programming",
    Template.CONNTRACK_USAGE: "conntrack usage",
    Template.SYNC_FAILURES: "sync failures",
    Template.SYNC_STALENESS: "sync staleness",
}


@dataclass(frozen=True)
class Sample:
    """What the adapter measured for one check in one round."""

    canary: float | None
    """The canary group's value (``group_query``); None when the query returned nothing."""
    baseline: float | None = None
    """The baseline group's value, or None when there is no baseline (or no data for it)."""
    canary_per_node: tuple[float, ...] = ()
    """One value per canary node (``per_node_query``), for ``mannWhitney`` only."""
    baseline_per_node: tuple[float, ...] = ()
    """One value per baseline node, for ``mannWhitney`` only."""
    error: str | None = None
    """Why the values could not be measured (Prometheus unreachable, query refused)."""
    canary_size: int | None = None
    """How many nodes the canary group has in the plan (None: not known)."""
    baseline_size: int | None = None
    """How many planned nodes are still on the source mode (None: not known)."""


@dataclass(frozen=True)
class _Finding:
    verdict: Verdict
    message: str


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _describe(check: Check) -> tuple[str, bool]:
    """What the value is called in messages, and whether it is in seconds."""
    if check.template is None:
        return check.name, False
    template = Template(check.template)
    return _WHAT[template], template in SECONDS_TEMPLATES


def _value(value: float, seconds: bool) -> str:
    return f"{value:.3f}s" if seconds else f"{value:.4g}"


def _limit(value: float, seconds: bool) -> str:
    return f"{value:g}s" if seconds else f"{value:g}"


def judge(check: Check, sample: Sample) -> CheckOutcome:
    """The verdict of ``check`` on ``sample``, with the measured values and the reason."""
    canary, baseline = _finite(sample.canary), _finite(sample.baseline)
    what, seconds = _describe(check)

    def outcome(verdict: Verdict, message: str) -> CheckOutcome:
        return CheckOutcome(
            name=check.name, verdict=verdict, canary=canary, baseline=baseline, message=message
        )

    if sample.error is not None:
        return outcome(Verdict.INCONCLUSIVE, f"no verdict: {sample.error}")
    if sample.canary is None:
        return outcome(Verdict.INCONCLUSIVE, f"no data: {what} returned nothing for the canary")
    if canary is None:
        odd = "NaN" if math.isnan(sample.canary) else f"{sample.canary:+}"
        return outcome(
            Verdict.INCONCLUSIVE,
            f"no data: {what} is {odd} for the canary (nothing observed in the window?)",
        )

    findings = _absolute(check, canary, what, seconds)
    if check.max_ratio_to_baseline is not None:
        findings.append(_ratio(check.max_ratio_to_baseline, canary, sample.baseline, what, seconds))
    if check.mann_whitney is not None:
        findings.append(_mann_whitney(check.mann_whitney, sample, what, seconds))

    for verdict in (Verdict.FAIL, Verdict.INCONCLUSIVE, Verdict.PASS):
        deciding = [f.message for f in findings if f.verdict == verdict]
        if deciding:
            return outcome(verdict, "; ".join(deciding))
    # The model refuses a check without a threshold; say so rather than pass silently.
    return outcome(Verdict.INCONCLUSIVE, f"{what} {_value(canary, seconds)}: no threshold set")


def _absolute(check: Check, canary: float, what: str, seconds: bool) -> list[_Finding]:
    shown = f"{what} {_value(canary, seconds)}"
    findings: list[_Finding] = []
    uppers = (
        ("maxSeconds", check.max_seconds, True),
        ("maxRatio", check.max_ratio, False),
        ("max", check.max, seconds),
    )
    for field, limit, in_seconds in uppers:
        if limit is None:
            continue
        bound = _limit(limit, in_seconds)
        if canary > limit:
            findings.append(_Finding(Verdict.FAIL, f"{shown} > {field} {bound}"))
        else:
            findings.append(_Finding(Verdict.PASS, f"{shown} <= {field} {bound}"))
    if check.min is not None:
        bound = _limit(check.min, seconds)
        if canary < check.min:
            findings.append(_Finding(Verdict.FAIL, f"{shown} < min {bound}"))
        else:
            findings.append(_Finding(Verdict.PASS, f"{shown} >= min {bound}"))
    return findings


def _ratio(
    limit: float, canary: float, raw_baseline: float | None, what: str, seconds: bool
) -> _Finding:
    baseline = _finite(raw_baseline)
    if baseline is None:
        why = "no data" if raw_baseline is None else f"it is {raw_baseline}"
        return _Finding(Verdict.INCONCLUSIVE, f"no baseline for maxRatioToBaseline ({why})")
    pair = f"{_value(canary, seconds)} / {_value(baseline, seconds)}"
    if baseline == 0 and canary == 0:
        return _Finding(Verdict.PASS, f"{what} canary and baseline both 0 (maxRatioToBaseline)")
    if baseline <= 0:
        return _Finding(
            Verdict.INCONCLUSIVE,
            f"no baseline for maxRatioToBaseline: {what} canary / baseline = {pair} needs a"
            " baseline above 0",
        )
    ratio = canary / baseline
    shown = f"{what} canary/baseline {ratio:.3g} ({pair})"
    if ratio > limit:
        return _Finding(Verdict.FAIL, f"{shown} > maxRatioToBaseline {limit:g}")
    return _Finding(Verdict.PASS, f"{shown} <= maxRatioToBaseline {limit:g}")


def _mann_whitney(test: MannWhitney, sample: Sample, what: str, seconds: bool) -> _Finding:
    small = [
        f"{name} group has {size} node{'s' if size != 1 else ''}"
        for name, size in (("canary", sample.canary_size), ("baseline", sample.baseline_size))
        if size is not None and size < test.min_samples
    ]
    if small:
        # Not missing data but a plan that cannot be compared this way: at the last stage no
        # node is left on the source mode, and a small canary pool never reaches minSamples.
        # Waiting for data that cannot come would hold (or, with onNoData, roll back) a
        # healthy migration; the check's other bounds still decide, and status says so.
        return _Finding(
            Verdict.PASS,
            f"mannWhitney not applicable: {' and '.join(small)} (minSamples"
            f" {test.min_samples}); the check's other bounds decide",
        )
    canary = [v for v in sample.canary_per_node if math.isfinite(v)]
    baseline = [v for v in sample.baseline_per_node if math.isfinite(v)]
    if len(canary) < test.min_samples or len(baseline) < test.min_samples:
        return _Finding(
            Verdict.INCONCLUSIVE,
            f"mannWhitney needs {test.min_samples} per-node values in each group:"
            f" canary has {len(canary)}, baseline {len(baseline)}",
        )
    scale = 1 + test.tolerance
    u, p = mann_whitney_u(canary, [v * scale for v in baseline])
    detail = (
        f"Mann-Whitney U={u:g} (n={len(canary)}/{len(baseline)}), p={p:.3g};"
        f" medians canary {_value(statistics.median(canary), seconds)},"
        f" baseline {_value(statistics.median(baseline), seconds)}"
    )
    band = f"per-node {what} vs baseline x{scale:g} (mannWhitney tolerance {test.tolerance:g})"
    if p <= test.alpha:
        return _Finding(
            Verdict.FAIL,
            f"{band}: canary significantly greater, p <= alpha {test.alpha:g}: {detail}",
        )
    return _Finding(
        Verdict.PASS, f"{band}: not significantly greater, p > alpha {test.alpha:g}: {detail}"
    )
