"""The Mann-Whitney U test against known values.

Where the expected numbers come from:

- "by hand": worked out in the comment next to the case.
- "scipy": ``scipy.stats.mannwhitneyu(x, y, alternative="greater", method=...)`` from
  scipy 1.17.1 (statistic and p-value as printed by it, method named per case), run once
  outside this project; scipy is not a dependency.
- "enumeration": every arrangement of the pooled ranks, counted in the test itself
  (independent of the Gaussian-binomial recurrence the code uses).
"""

from __future__ import annotations

import itertools
import math

import pytest

from proxymode.analysis.stats import (
    EXACT_MAX_PAIRS,
    mann_whitney_u,
    rank_average,
    u_distribution,
)


def test_ranks_average_ties() -> None:
    # by hand: sorted 1, 2, 2, 3 -> ranks 1, 2.5, 2.5, 4; one tie group of 2
    assert rank_average([2.0, 1.0, 3.0, 2.0]) == ([2.5, 1.0, 4.0, 2.5], [2])
    assert rank_average([5.0, 5.0, 5.0]) == ([2.0, 2.0, 2.0], [3])
    assert rank_average([3.0, 1.0, 2.0]) == ([3.0, 1.0, 2.0], [])


@pytest.mark.parametrize(("n1", "n2"), [(1, 1), (1, 4), (2, 3), (3, 3), (4, 6), (5, 5), (7, 3)])
def test_u_distribution_matches_enumeration(n1: int, n2: int) -> None:
    counts = [0] * (n1 * n2 + 1)
    for ranks in itertools.combinations(range(1, n1 + n2 + 1), n1):
        counts[sum(ranks) - n1 * (n1 + 1) // 2] += 1
    assert u_distribution(n1, n2) == counts
    assert sum(counts) == math.comb(n1 + n2, n1)


def test_complete_separation_three_against_three() -> None:
    # by hand: x all above y, U = 3*3 = 9; exactly 1 of C(6,3) = 20 arrangements gives
    # U >= 9, so p = 1/20 = 0.05 (scipy exact: 9.0, 0.05)
    assert mann_whitney_u([1.1, 2.3, 3.2], [0.5, 0.9, 1.0]) == (9.0, 0.05)
    # the other way round: U = 0 and every arrangement has U >= 0 (scipy exact: 0.0, 1.0)
    assert mann_whitney_u([0.5, 0.9, 1.0], [1.1, 2.3, 3.2]) == (0.0, 1.0)


def test_exact_small_samples() -> None:
    # scipy exact: 13.0, 0.2777777777777778 (= 35/126 by enumeration)
    u, p = mann_whitney_u([0.80, 0.83, 1.89, 1.04, 1.45], [1.15, 0.88, 0.90, 0.74])
    assert u == 13.0
    assert p == pytest.approx(0.2777777777777778, rel=1e-12)
    # scipy exact: 48.0, 0.010256410256410256
    u, p = mann_whitney_u(
        [19.1, 22.4, 17.3, 25.0, 21.9, 23.5, 20.2],
        [16.2, 18.4, 15.9, 20.6, 17.7, 19.8, 14.3, 18.9],
    )
    assert u == 48.0
    assert p == pytest.approx(0.010256410256410256, rel=1e-12)


def test_exact_p_equals_enumeration() -> None:
    x, y = [3.1, 0.2, 5.5, 4.4], [1.0, 2.0, 2.5, 0.1, 6.0]
    u, p = mann_whitney_u(x, y)
    pooled = sorted(x + y)
    rank = {v: i + 1 for i, v in enumerate(pooled)}
    observed = sum(rank[v] for v in x)
    arrangements = list(itertools.combinations(range(1, 10), 4))
    at_least = sum(1 for r in arrangements if sum(r) >= observed)
    assert u == observed - 10
    assert p == pytest.approx(at_least / len(arrangements), rel=1e-12)


def test_a_small_canary_against_a_large_baseline_stays_exact() -> None:
    # 3 canaries above all 700 baseline nodes: U = 2100 and only the top arrangement
    # reaches it, p = 1 / C(703, 3) (by hand)
    baseline = [i / 1000 for i in range(700)]
    u, p = mann_whitney_u([5.0, 6.0, 7.0], baseline)
    assert EXACT_MAX_PAIRS >= 3 * 700
    assert u == 2100.0
    assert p == pytest.approx(1 / math.comb(703, 3), rel=1e-12)


def test_ties_use_the_normal_approximation_with_tie_correction() -> None:
    # scipy asymptotic (continuity and tie correction): 25.5, 0.10158695879254287
    u, p = mann_whitney_u([1, 2, 2, 3, 3, 3, 4], [1, 1, 2, 2, 3])
    assert u == 25.5
    assert p == pytest.approx(0.10158695879254287, rel=1e-9)


def test_zero_heavy_samples() -> None:
    # failure counts: mostly zeros. scipy asymptotic: 21.0, 0.06819010781789459
    u, p = mann_whitney_u([0, 0, 0, 1, 2], [0, 0, 0, 0, 0, 0])
    assert u == 21.0
    assert p == pytest.approx(0.06819010781789459, rel=1e-9)


def test_large_samples_use_the_normal_approximation() -> None:
    x = [i * 0.37 % 5 + 0.2 for i in range(60)]
    y = [i * 0.53 % 5 for i in range(70)]
    assert len(x) * len(y) > EXACT_MAX_PAIRS
    # scipy asymptotic: 2251.0, 0.24107191011318485 (exact would be 0.2417...)
    u, p = mann_whitney_u(x, y)
    assert u == 2251.0
    assert p == pytest.approx(0.24107191011318485, rel=1e-9)


def test_all_tied_gives_no_evidence() -> None:
    # every value equal: the variance is 0; nothing suggests x > y
    assert mann_whitney_u([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]) == (4.5, 1.0)


def test_u_counts_pairs_won() -> None:
    x, y = [1.0, 4.0, 6.0], [2.0, 3.0, 5.0, 7.0]
    u_x, _ = mann_whitney_u(x, y)
    u_y, _ = mann_whitney_u(y, x)
    assert u_x == sum(1 for a in x for b in y if a > b) == 5
    assert u_x + u_y == len(x) * len(y)


@pytest.mark.parametrize(
    ("x", "y"), [([], [1.0]), ([1.0], []), ([math.nan], [1.0]), ([1.0], [math.inf])]
)
def test_refuses_empty_or_non_finite_samples(x: list[float], y: list[float]) -> None:
    with pytest.raises(ValueError, match="Mann-Whitney"):
        mann_whitney_u(x, y)
