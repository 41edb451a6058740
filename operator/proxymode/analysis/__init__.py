"""Analysis: PromQL for the checks (``templates``), the verdicts (``judge``), the statistics.

Pure code, no I/O: the Prometheus adapter renders the queries here, sends them (by POST,
one per check per group per round), and hands what it measured to ``judge``; the rounds
are counted by ``proxymode.engine.gate``.
"""

from __future__ import annotations

from proxymode.analysis.judge import Sample, judge
from proxymode.analysis.stats import mann_whitney_u
from proxymode.analysis.templates import clipped_window, group_query, node_matcher, per_node_query

__all__ = [
    "Sample",
    "clipped_window",
    "group_query",
    "judge",
    "mann_whitney_u",
    "node_matcher",
    "per_node_query",
]
