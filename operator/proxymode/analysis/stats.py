"""The Mann-Whitney U test, one-sided, in pure Python (no scipy in the operator's image).

``mann_whitney_u(x, y)`` returns U for ``x`` and the p-value for "x tends to be greater than
y" (scipy's ``alternative="greater"``):

- Ranks are 1-based over the pooled sample; tied values share their average rank.
  ``U_x = R_x - n_x (n_x + 1) / 2``, so ``U_x + U_y = n_x n_y`` and ``U_x`` counts the
  pairs where x beats y (a tie counts one half).
- Without ties and with ``n_x * n_y <= EXACT_MAX_PAIRS`` the p-value is exact:
  ``P(U >= U_x)`` under the null, from the distribution of U. The number of arrangements
  with ``U = u`` is the coefficient of ``q**u`` in the Gaussian binomial coefficient
  ``[n_x + n_y choose n_x]_q``, built up by exact integer polynomial steps, so a small
  canary against a large baseline (3 against 1,000) is still exact and cheap.
- Otherwise the normal approximation with the tie correction of the variance and a
  continuity correction of 0.5 toward the mean (what scipy's ``method="asymptotic"`` does):
  ``z = (U_x - n_x n_y / 2 - 0.5) / sigma``, ``p = P(Z >= z)``. When every value is tied the
  variance is 0 and there is no evidence either way: p is 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

EXACT_MAX_PAIRS = 2500
"""Exact p-values up to this many (x, y) pairs, e.g. 50 against 50 or 10 against 250."""


def rank_average(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """1-based ranks with ties averaged, and the sizes of the tie groups (only those > 1)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties: list[int] = []
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        average = (start + end) / 2 + 1
        for k in range(start, end + 1):
            ranks[order[k]] = average
        if end > start:
            ties.append(end - start + 1)
        start = end + 1
    return ranks, ties


def u_distribution(n1: int, n2: int) -> list[int]:
    """How many of the C(n1+n2, n1) arrangements give U = 0, 1, ..., n1*n2 (no ties)."""
    m, n = sorted((n1, n2))
    poly = [1]
    for i in range(1, m + 1):
        # [n+i choose i]_q = [n+i-1 choose i-1]_q * (1 - q^(n+i)) / (1 - q^i)
        grown = [*poly, *([0] * (n + i))]
        for k in range(len(grown) - 1, n + i - 1, -1):
            grown[k] -= grown[k - (n + i)]
        for k in range(i, len(grown)):
            grown[k] += grown[k - i]
        poly = grown[: i * n + 1]  # the top coefficients are 0 after the division
    return poly


def _exact_greater(u: float, n1: int, n2: int) -> float:
    counts = u_distribution(n1, n2)
    at_least = math.ceil(u - 1e-9)
    return sum(counts[at_least:]) / math.comb(n1 + n2, n1)


def _normal_greater(u: float, n1: int, n2: int, ties: Sequence[int]) -> float:
    n = n1 + n2
    tie_term = sum(t**3 - t for t in ties)
    variance = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """U for ``x`` and the one-sided p-value for "x tends to be greater than y"."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("the Mann-Whitney test needs at least one value in each sample")
    pooled = [*x, *y]
    if not all(math.isfinite(v) for v in pooled):
        raise ValueError("the Mann-Whitney test needs finite values")
    ranks, ties = rank_average(pooled)
    u = math.fsum(ranks[:n1]) - n1 * (n1 + 1) / 2
    if not ties and n1 * n2 <= EXACT_MAX_PAIRS:
        p = _exact_greater(u, n1, n2)
    else:
        p = _normal_greater(u, n1, n2, ties)
    return u, min(1.0, max(0.0, p))
