"""Every path through the judge: no data, each threshold, the baseline, Mann-Whitney, rounds."""

from __future__ import annotations

import math
from typing import Any

import pytest

from proxymode.analysis.judge import Sample, judge
from proxymode.api.models import Check, Verdict
from proxymode.engine.gate import round_verdict
from proxymode.engine.observed import CheckOutcome

PASS, FAIL, INCONCLUSIVE = Verdict.PASS, Verdict.FAIL, Verdict.INCONCLUSIVE


def sync(**thresholds: Any) -> Check:
    return Check(name="sync", template="SyncLatencyP99", **thresholds)


# -- no data -------------------------------------------------------------------------------------


def test_a_query_error_is_inconclusive_and_says_why() -> None:
    out = judge(sync(max_seconds=1), Sample(None, error="Prometheus unreachable: timeout"))
    assert out == CheckOutcome(
        "sync", INCONCLUSIVE, None, None, "no verdict: Prometheus unreachable: timeout"
    )


def test_an_error_wins_even_with_values() -> None:
    out = judge(sync(max_seconds=1), Sample(5.0, error="query refused: bad_data"))
    assert out.verdict == INCONCLUSIVE and "bad_data" in out.message
    assert out.canary == 5.0


def test_no_value_for_the_canary_is_inconclusive() -> None:
    out = judge(sync(max_seconds=1), Sample(None, baseline=0.2))
    assert out.verdict == INCONCLUSIVE
    assert out.message == "no data: p99 sync returned nothing for the canary"
    assert out.baseline == 0.2


@pytest.mark.parametrize(
    ("value", "shown"), [(math.nan, "NaN"), (math.inf, "+inf"), (-math.inf, "-inf")]
)
def test_non_finite_canary_is_inconclusive_and_not_stored(value: float, shown: str) -> None:
    out = judge(sync(max_seconds=1), Sample(value, baseline=math.nan))
    assert out.verdict == INCONCLUSIVE
    assert f"p99 sync is {shown} for the canary" in out.message
    assert out.canary is None and out.baseline is None  # status is JSON: no NaN there


# -- absolute thresholds -------------------------------------------------------------------------


def test_max_seconds_fails_above_and_names_the_values() -> None:
    out = judge(sync(max_seconds=1), Sample(1.84))
    assert out == CheckOutcome("sync", FAIL, 1.84, None, "p99 sync 1.840s > maxSeconds 1s")


def test_max_seconds_passes_at_and_below() -> None:
    assert judge(sync(max_seconds=1), Sample(1.0)).verdict == PASS
    out = judge(sync(max_seconds=0.5), Sample(0.12))
    assert out.verdict == PASS and out.message == "p99 sync 0.120s <= maxSeconds 0.5s"


def test_max_ratio_for_conntrack() -> None:
    check = Check(name="ct", template="ConntrackUsage", max_ratio=0.9)
    assert judge(check, Sample(0.92)).message == "conntrack usage 0.92 > maxRatio 0.9"
    assert judge(check, Sample(0.92)).verdict == FAIL
    assert judge(check, Sample(0.9)).verdict == PASS


def test_max_for_sync_failures() -> None:
    check = Check(name="failures", template="SyncFailures", max=0)
    out = judge(check, Sample(3.0000004))
    assert out.verdict == FAIL and out.message == "sync failures 3 > max 0"
    assert judge(check, Sample(0.0)).verdict == PASS


def test_staleness_and_network_programming_are_in_seconds() -> None:
    stale = Check(name="stale", template="SyncStaleness", max_seconds=60)
    assert judge(stale, Sample(75.0)).message == "sync staleness 75.000s > maxSeconds 60s"
    netprog = Check(name="np", template="NetworkProgrammingP99", max_seconds=10)
    assert judge(netprog, Sample(2.5)).message == "p99 network programming 2.500s <= maxSeconds 10s"


def test_custom_query_min_and_max() -> None:
    check = Check(name="success-rate", query="sum(x{ {{nodes}} })", min=0.99, max=1)
    low = judge(check, Sample(0.95))
    assert low.verdict == FAIL and low.message == "success-rate 0.95 < min 0.99"
    high = judge(check, Sample(1.5))
    assert high.verdict == FAIL and high.message == "success-rate 1.5 > max 1"
    ok = judge(check, Sample(0.995))
    assert ok.verdict == PASS
    assert ok.message == "success-rate 0.995 <= max 1; success-rate 0.995 >= min 0.99"
    assert judge(check, Sample(0.99)).verdict == PASS


# -- relative to the baseline --------------------------------------------------------------------


def test_ratio_to_baseline_pass_and_fail() -> None:
    check = sync(max_ratio_to_baseline=2)
    out = judge(check, Sample(1.84, baseline=0.8))
    assert out.verdict == FAIL
    assert out.message == "p99 sync canary/baseline 2.3 (1.840s / 0.800s) > maxRatioToBaseline 2"
    assert (out.canary, out.baseline) == (1.84, 0.8)
    assert judge(check, Sample(1.6, baseline=0.8)).verdict == PASS  # exactly 2
    assert judge(check, Sample(0.2, baseline=0.8)).verdict == PASS


@pytest.mark.parametrize("baseline", [None, math.nan, math.inf])
def test_ratio_without_a_usable_baseline_is_inconclusive(baseline: float | None) -> None:
    out = judge(sync(max_ratio_to_baseline=2), Sample(1.0, baseline=baseline))
    assert out.verdict == INCONCLUSIVE
    assert out.message.startswith("no baseline for maxRatioToBaseline")
    assert out.baseline is None


def test_baseline_zero() -> None:
    check = Check(name="failures", template="SyncFailures", max_ratio_to_baseline=1.5)
    both = judge(check, Sample(0.0, baseline=0.0))
    assert both.verdict == PASS and "both 0" in both.message
    worse = judge(check, Sample(2.0, baseline=0.0))
    assert worse.verdict == INCONCLUSIVE
    assert worse.message.startswith("no baseline") and "above 0" in worse.message
    negative = judge(check, Sample(1.0, baseline=-1.0))
    assert negative.verdict == INCONCLUSIVE


# -- several thresholds on one check -------------------------------------------------------------


def test_fail_beats_inconclusive_beats_pass() -> None:
    check = sync(max_seconds=1, max_ratio_to_baseline=2)
    # fails the absolute limit, no baseline: Fail, and the message says only what failed
    out = judge(check, Sample(1.84))
    assert out.verdict == FAIL and out.message == "p99 sync 1.840s > maxSeconds 1s"
    # passes the absolute limit, no baseline: Inconclusive
    out = judge(check, Sample(0.5))
    assert out.verdict == INCONCLUSIVE and out.message.startswith("no baseline")
    # both pass
    out = judge(check, Sample(0.5, baseline=0.4))
    assert out.verdict == PASS
    assert out.message == (
        "p99 sync 0.500s <= maxSeconds 1s;"
        " p99 sync canary/baseline 1.25 (0.500s / 0.400s) <= maxRatioToBaseline 2"
    )
    # both fail: both named
    out = judge(check, Sample(3.0, baseline=1.0))
    assert out.verdict == FAIL
    assert "> maxSeconds 1s" in out.message and "> maxRatioToBaseline 2" in out.message


# -- Mann-Whitney --------------------------------------------------------------------------------

MW = {"alpha": 0.05, "tolerance": 0.1, "min_samples": 3}


def mw(**overrides: Any) -> Check:
    return sync(max_seconds=10, mann_whitney={**MW, **overrides})


def test_mann_whitney_fails_when_the_canary_is_clearly_worse() -> None:
    sample = Sample(2.0, 1.0, canary_per_node=(1.9, 2.0, 2.2), baseline_per_node=(0.9, 1.0, 1.1))
    out = judge(mw(), sample)
    assert out.verdict == FAIL
    # 3 against 3, complete separation even after the band (1.1 * 1.1 = 1.21 < 1.9): p = 1/20
    assert "p=0.05" in out.message and "p <= alpha 0.05" in out.message
    assert "U=9 (n=3/3)" in out.message
    assert "medians canary 2.000s, baseline 1.000s" in out.message


def test_mann_whitney_passes_within_the_tolerance_band() -> None:
    # the canary is 5% slower everywhere: inside the 10% band
    base = (0.50, 0.60, 0.70, 0.80, 0.90)
    sample = Sample(
        0.9, 0.85, canary_per_node=tuple(v * 1.05 for v in base), baseline_per_node=base
    )
    out = judge(mw(), sample)
    assert out.verdict == PASS and "not significantly greater" in out.message
    # even without a band: 5% slower, interleaved with the baseline, is not significant
    assert judge(mw(tolerance=0), sample).verdict == PASS


def test_mann_whitney_tolerance_decides() -> None:
    base = (1.0, 1.1, 1.2, 1.3)
    canary = (1.5, 1.6, 1.7, 1.8)  # about 40% worse
    sample = Sample(1.8, 1.3, canary_per_node=canary, baseline_per_node=base)
    assert judge(mw(tolerance=0.1), sample).verdict == FAIL  # 1.3 * 1.1 = 1.43 < 1.5
    assert judge(mw(tolerance=0.5), sample).verdict == PASS  # 1.0 * 1.5 = 1.5: interleaved


def test_mann_whitney_alpha_decides() -> None:
    sample = Sample(2.0, 1.0, canary_per_node=(1.9, 2.0, 2.2), baseline_per_node=(0.9, 1.0, 1.1))
    assert judge(mw(alpha=0.04), sample).verdict == PASS  # p = 0.05 > 0.04


def test_mann_whitney_needs_min_samples_in_each_group() -> None:
    out = judge(mw(), Sample(2.0, 1.0, canary_per_node=(1.9, 2.0), baseline_per_node=(1.0,) * 5))
    assert out.verdict == INCONCLUSIVE
    assert out.message == (
        "mannWhitney needs 3 per-node values in each group: canary has 2, baseline 5"
    )
    no_baseline = judge(mw(), Sample(2.0, None, canary_per_node=(1.9, 2.0, 2.1)))
    assert no_baseline.verdict == INCONCLUSIVE and "baseline 0" in no_baseline.message


def test_mann_whitney_does_not_apply_to_groups_too_small_by_plan() -> None:
    """No node left on the source mode (the last stage), or a canary pool smaller than
    minSamples: the comparison can never be made, so it steps aside and says why, while the
    check's other bounds still decide (and missing data in big enough groups still holds)."""
    last_stage = Sample(0.5, None, canary_per_node=(0.5,) * 6, canary_size=6, baseline_size=0)
    out = judge(mw(), last_stage)
    assert out.verdict == PASS
    assert "mannWhitney not applicable: baseline group has 0 nodes (minSamples 3)" in out.message
    two_canaries = Sample(0.5, 0.4, (0.5, 0.5), (0.4,) * 4, canary_size=2, baseline_size=4)
    assert "canary group has 2 nodes" in judge(mw(), two_canaries).message
    breach = Sample(12.0, None, canary_per_node=(12.0,) * 6, canary_size=6, baseline_size=0)
    assert judge(mw(), breach).verdict == FAIL
    missing = Sample(0.5, 0.4, canary_per_node=(0.5,), canary_size=4, baseline_size=4)
    assert judge(mw(), missing).verdict == INCONCLUSIVE


def test_mann_whitney_drops_nan_per_node_values() -> None:
    sample = Sample(
        2.0, 1.0, canary_per_node=(1.9, math.nan, 2.2), baseline_per_node=(0.9, 1.0, 1.1)
    )
    assert judge(mw(), sample).verdict == INCONCLUSIVE  # 2 finite canary values < 3
    assert judge(mw(min_samples=2), sample).verdict == PASS  # 2 vs 3: p = 1/10 > 0.05


def test_mann_whitney_does_not_hide_an_absolute_breach() -> None:
    sample = Sample(12.0, 1.0, canary_per_node=(1.0, 1.0, 1.0), baseline_per_node=(1.0,) * 3)
    out = judge(mw(), sample)
    assert out.verdict == FAIL and out.message == "p99 sync 12.000s > maxSeconds 10s"


def test_mann_whitney_inconclusive_with_a_passing_limit_is_inconclusive() -> None:
    out = judge(mw(), Sample(0.5, canary_per_node=(0.5,)))
    assert out.verdict == INCONCLUSIVE and out.message.startswith("mannWhitney needs")


# -- rounds --------------------------------------------------------------------------------------


def _outcomes(*verdicts: str) -> list[CheckOutcome]:
    return [CheckOutcome(f"c{i}", v) for i, v in enumerate(verdicts)]


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        ((), INCONCLUSIVE),
        ((PASS,), PASS),
        ((PASS, PASS), PASS),
        ((PASS, INCONCLUSIVE), INCONCLUSIVE),
        ((INCONCLUSIVE, FAIL, PASS), FAIL),
        ((FAIL,), FAIL),
        ((PASS, "Unknown"), INCONCLUSIVE),
    ],
)
def test_round_verdict(verdicts: tuple[str, ...], expected: str) -> None:
    assert round_verdict(_outcomes(*verdicts)) == expected


def test_round_verdict_of_judged_checks() -> None:
    outcomes = [
        judge(sync(max_seconds=1), Sample(0.2)),
        judge(Check(name="ct", template="ConntrackUsage", max_ratio=0.9), Sample(None)),
    ]
    assert round_verdict(outcomes) == INCONCLUSIVE
    outcomes.append(judge(Check(name="f", template="SyncFailures", max=0), Sample(1.0)))
    assert round_verdict(outcomes) == FAIL
