"""The analysis templates' queries against a real Prometheus over backfilled history.

``test_templates_promtool.py`` runs the queries in promtool's rule-test engine; this module
is its complement: the same queries go, through the operator's own adapter
(``proxymode.kube.rounds.Prometheus``, a form-encoded POST, here at a fixed evaluation
time), to a real ``prometheus`` server's HTTP API
reading real TSDB blocks that ``promtool tsdb create-blocks-from openmetrics`` wrote. So the
whole path is covered: the exposition format kube-proxy's metrics are stored in, the
storage, the API's parsing of the query, and PromQL. The 5,000-node group goes in the
POST body: such a query is about a megabyte, beyond Go's 1 MiB header limit once
URL-encoded (a client that put it in the URL got 431 from Prometheus; this found it).

The data (``tests.promql.backfill``): canary nodes c1..c3 (nftables, fast syncs), baseline
nodes b1..b3 (iptables, slower), and a decoy c10 that an unanchored ``c1`` would match, with
values far from everyone's. Every expected value below is worked out by hand from that
data. All counters grow the same amount every 15 s scrape, so over the 300 s window
(20 scrape intervals) ``increase`` is 20 times the growth per scrape, and a histogram's
bucket rates are proportional to its per-scrape bucket counts, which the quantile
derivations use directly. Prometheus starts once for the module (about 1 s).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import pytest
import requests
from kubernetes import client

from proxymode.analysis.templates import group_query, per_node_query
from proxymode.api.models import Analysis, Check, PrometheusSource
from proxymode.kube.rounds import Prometheus, measure
from tests.promql.backfill import (
    BASELINE,
    CANARY,
    DECOY,
    EVAL_TIME,
    NODE_LABEL,
    WINDOW,
    backfill,
    openmetrics,
    serve,
)

CANARY_NODES = tuple(n.name for n in CANARY)  # c1, c2, c3
BASELINE_NODES = tuple(n.name for n in BASELINE)  # b1, b2, b3
Rows = list[tuple[dict[str, str], float]]


@dataclass(frozen=True)
class Expected:
    """A check and what its queries give at ``EVAL_TIME``: for the canary group, the
    baseline group, each canary node (``None``: the check has no per-node form), and the
    canary group with the decoy ``c10`` added (to show the decoy would be noticed)."""

    check: Check
    canary: float
    baseline: float
    per_node: Mapping[str, float] | None
    with_decoy: float


# histogram_quantile(0.99, ...) on the pooled bucket rates: rank = 0.99 * (+Inf count); find
# the first bucket whose cumulative count reaches the rank; interpolate linearly inside it:
#   lower bound + (upper - lower) * (rank - count below) / (count in the bucket).
# Counts below are per scrape interval (the rates are these divided by 15 s).
SYNC_LATENCY = Expected(
    Check(name="sync-latency", template="SyncLatencyP99", max_seconds=1),
    # Canary: c1 14 at 0.02 + 1 at 0.05; c2 15 at 0.02; c3 13 at 0.02 + 2 at 0.05.
    # Pooled: le=0.032 -> 42, le=0.064 -> 45 (+Inf 45). Rank 0.99 * 45 = 44.55, in
    # (0.032, 0.064]: 0.032 + 0.032 * (44.55 - 42) / 3 = 0.032 + 0.032 * 0.85 = 0.0592.
    canary=0.0592,
    # Baseline: b1, b2 6 at 0.1 + 4 at 0.2; b3 6 at 0.1 + 3 at 0.2 + 1 at 0.3.
    # Pooled: le=0.128 -> 18, le=0.256 -> 29, le=0.512 -> 30. Rank 29.7, in (0.256, 0.512]:
    # 0.256 + 0.256 * (29.7 - 29) / 1 = 0.256 + 0.1792 = 0.4352.
    baseline=0.4352,
    # Rank 0.99 * 15 = 14.85 on each node.
    # c1: le=0.032 -> 14, le=0.064 -> 15: 0.032 + 0.032 * 0.85 / 1 = 0.0592.
    # c2: le=0.016 -> 0, le=0.032 -> 15: 0.016 + 0.016 * 14.85 / 15 = 0.03184.
    # c3: le=0.032 -> 13, le=0.064 -> 15: 0.032 + 0.032 * 1.85 / 2 = 0.0616.
    per_node={"c1": 0.0592, "c2": 0.03184, "c3": 0.0616},
    # + c10's 15 syncs of 20 s (+Inf only): rank 0.99 * 60 = 59.4 > 45 = le=16.384, so the
    # rank is in +Inf and histogram_quantile answers the highest finite bound.
    with_decoy=16.384,
)
NETWORK_PROGRAMMING = Expected(
    Check(name="network-programming", template="NetworkProgrammingP99", max_seconds=5),
    # Canary: c1 10 at 0.8 + 5 at 1.5; c2 12 at 0.8 + 3 at 1.5; c3 9 at 0.8 + 5 at 1.5 +
    # 1 at 2.5. Pooled: le=1 -> 31, le=2 -> 44, le=3 -> 45. Rank 44.55, in (2, 3]:
    # 2 + 1 * (44.55 - 44) / 1 = 2.55.
    canary=2.55,
    # Baseline: each node 5 at 1.5 + 8 at 2.5 + 2 at 4.5; pooled (x3): le=2 -> 15,
    # le=3 -> 39, le=4 -> 39, le=5 -> 45. Rank 44.55, in (4, 5]: 4 + (44.55 - 39) / 6 = 4.925.
    baseline=4.925,
    # c1: le=1 -> 10, le=2 -> 15: 1 + 4.85 / 5 = 1.97. c2: le=1 -> 12, le=2 -> 15:
    # 1 + 2.85 / 3 = 1.95. c3: le=2 -> 14, le=3 -> 15: 2 + 0.85 / 1 = 2.85.
    per_node={"c1": 1.97, "c2": 1.95, "c3": 2.85},
    # + c10's 15 at 400 s (+Inf): rank 59.4 > 45 = le=300: the highest finite bound, 300.
    with_decoy=300.0,
)
CONNTRACK = Expected(
    Check(name="conntrack", template="ConntrackUsage", max_ratio=0.9),
    # entries / 131072: c1 16384 -> 0.125, c2 32768 -> 0.25, c3 8192 -> 0.0625; the worst.
    canary=0.25,
    # b1 65536 -> 0.5, b2 98304 -> 0.75, b3 32768 -> 0.25.
    baseline=0.75,
    per_node={"c1": 0.125, "c2": 0.25, "c3": 0.0625},
    with_decoy=130000 / 131072,
)
SYNC_FAILURES = Expected(
    Check(name="sync-failures", template="SyncFailures", max=0),
    # Growth per scrape x 20 intervals. c1: nftables counter at 2, not growing -> 0 (its
    # cleanup-failure counter grows 5 a scrape and must not count); c2: 1 a scrape -> 20;
    # c3: no failure counter exported, kube-proxy scraped -> 0.
    canary=20.0,
    # b1: restore 1 + partial 2 a scrape -> 60; b2: both flat -> 0; b3: restore 3 -> 60.
    baseline=120.0,
    per_node={"c1": 0.0, "c2": 20.0, "c3": 0.0},
    # + c10: 100 a scrape -> 2000.
    with_decoy=2020.0,
)
SYNC_STALENESS = Expected(
    Check(name="sync-staleness", template="SyncStaleness", max_seconds=30),
    # last_queued - last at the last scrape, from the per-node lags (queued, synced):
    # c1 (2, 3) -> 1; c2 (1, 4) -> 3; c3 (10, 5) -> -5, clamped to 0. The worst.
    canary=3.0,
    # b1 (1, 6) -> 5; b2 IPv4 (2, 4) -> 2 and IPv6 (1, 8) -> 7, the worse family; b3 -> 0.
    baseline=7.0,
    per_node={"c1": 1.0, "c2": 3.0, "c3": 0.0},
    with_decoy=900.0,  # c10 (1, 901)
)
SYNCS_IN_WINDOW = Expected(
    # A custom query with both placeholders: in the group query {{by_node}} becomes nothing.
    Check(
        name="syncs-in-window",
        query=(
            "sum by ({{by_node}}) (increase(kubeproxy_sync_proxy_rules_duration_seconds_count"
            "{ {{nodes}} }[5m]))"
        ),
        min=1,
    ),
    canary=900.0,  # 3 nodes x 15 syncs a scrape x 20 intervals
    baseline=600.0,  # 3 nodes x 10 syncs a scrape x 20 intervals
    per_node={"c1": 300.0, "c2": 300.0, "c3": 300.0},
    with_decoy=1200.0,  # + c10's 15 a scrape
)
MEAN_SYNC = Expected(
    # A custom query using {{nodes}} twice, over the histogram's _sum and _count series.
    Check(
        name="mean-sync",
        query=(
            "sum(rate(kubeproxy_sync_proxy_rules_duration_seconds_sum{ {{nodes}} }[5m]))"
            " / sum(rate(kubeproxy_sync_proxy_rules_duration_seconds_count{ {{nodes}} }[5m]))"
        ),
        max=1,
    ),
    # Seconds synced per scrape / syncs per scrape. Canary: c1 14 * 0.02 + 0.05 = 0.33,
    # c2 0.3, c3 13 * 0.02 + 2 * 0.05 = 0.36: 0.99 / 45 = 0.022.
    canary=0.022,
    # b1, b2 6 * 0.1 + 4 * 0.2 = 1.4; b3 0.6 + 0.6 + 0.3 = 1.5: 4.3 / 30.
    baseline=4.3 / 30,
    per_node=None,  # no {{by_node}}: no per-node form
    with_decoy=(0.99 + 15 * 20.0) / 60,
)
EXPECTED = {
    e.check.name: e
    for e in (
        SYNC_LATENCY,
        NETWORK_PROGRAMMING,
        CONNTRACK,
        SYNC_FAILURES,
        SYNC_STALENESS,
        SYNCS_IN_WINDOW,
        MEAN_SYNC,
    )
}
PER_NODE = {name: e for name, e in EXPECTED.items() if e.per_node is not None}

# 5,000 names: the canary's three, then synthetic nodes with no series, half of them with
# dots (regex metacharacters that node_matcher must escape).
SYNTHETIC = [
    *(f"node-{i:05d}" for i in range(1, 2499)),
    *(f"ip-10-0-{i // 250}-{i % 250}.ec2.internal" for i in range(2499)),
]
BIG_GROUP = [*CANARY_NODES, *SYNTHETIC]


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One Prometheus for the module over the backfilled blocks; ``serve`` stops it on the
    way out, whether the tests passed or not."""
    workdir = tmp_path_factory.mktemp("backfill")
    tsdb = backfill(openmetrics(), workdir)
    with serve(tsdb, workdir) as url:
        yield url


@pytest.fixture(scope="module")
def prom(prometheus_url: str) -> Prometheus:
    """The operator's adapter, configured as a policy without credentials would make it."""
    analysis = Analysis(
        prometheus=PrometheusSource(url=prometheus_url), checks=[SYNC_FAILURES.check]
    )
    return Prometheus(client.ApiClient(), analysis)


def _ask(prom: Prometheus, query: str) -> Rows:
    """An instant query at the history's last scrape (never "now": the data is from 2023)."""
    return prom.values(query, at=EVAL_TIME)


def _one(rows: Rows, query: str) -> float:
    """The single value a group query gives (one row, whatever its labels)."""
    assert len(rows) == 1, f"{len(rows)} rows for {query[:300]}"
    return rows[0][1]


def _group(check: Check, nodes: Sequence[str]) -> str:
    return group_query(check, nodes=nodes, node_label=NODE_LABEL, window_seconds=WINDOW)


def test_the_backfilled_history_is_served(prom: Prometheus) -> None:
    """Prometheus keeps the 2023 blocks and answers at ``EVAL_TIME`` from the last scrape:
    every node's kube-proxy (b2 dual-stack) and node_exporter are there."""
    rows = _ask(prom, "count by (job) ({__name__=~'kubeproxy_sync_proxy_rules_last_.*'})")
    assert rows == [({"job": "kube-proxy"}, 16.0)]  # 7 nodes x 2 gauges, + b2's IPv6 pair
    rows = _ask(prom, "count(node_nf_conntrack_entries)")
    assert rows == [({}, float(len(CANARY) + len(BASELINE) + 1))]
    raw = requests.post(
        f"{prom.url}",
        data={"query": 'node_nf_conntrack_entries{instance="c1"}', "time": str(EVAL_TIME)},
        timeout=10,
    ).json()
    assert raw["data"]["result"][0]["value"][0] == EVAL_TIME


@pytest.mark.parametrize("name", list(EXPECTED))
@pytest.mark.parametrize("group", ["canary", "baseline"])
def test_group_value(prom: Prometheus, name: str, group: str) -> None:
    expected = EXPECTED[name]
    nodes = CANARY_NODES if group == "canary" else BASELINE_NODES
    query = _group(expected.check, nodes)
    value = _one(_ask(prom, query), query)
    assert value == pytest.approx(getattr(expected, group), rel=1e-9, abs=1e-12), query


@pytest.mark.parametrize("name", list(PER_NODE))
def test_per_node_values(prom: Prometheus, name: str) -> None:
    """One value per canary node, labelled with nothing but the node label."""
    expected = PER_NODE[name]
    query = per_node_query(
        expected.check, nodes=CANARY_NODES, node_label=NODE_LABEL, window_seconds=WINDOW
    )
    rows = _ask(prom, query)
    assert all(set(labels) == {NODE_LABEL} for labels, _ in rows), rows
    values = {labels[NODE_LABEL]: value for labels, value in rows}
    assert values == pytest.approx(expected.per_node, rel=1e-9, abs=1e-12), query


@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_node_named_like_a_prefix_is_not_matched(prom: Prometheus, name: str) -> None:
    """``c1`` must not select ``c10``. The canary group (which has ``c1``) gives its
    expected value (``test_group_value``), and adding ``c10`` changes it: the decoy's data
    would have shown, had the matcher picked it up."""
    expected = EXPECTED[name]
    query = _group(expected.check, [*CANARY_NODES, DECOY.name])
    value = _one(_ask(prom, query), query)
    assert value == pytest.approx(expected.with_decoy, rel=1e-9)
    assert value != pytest.approx(expected.canary, rel=1e-3)
    if expected.per_node is not None:
        only_c1 = per_node_query(
            expected.check, nodes=["c1"], node_label=NODE_LABEL, window_seconds=WINDOW
        )
        values = {labels[NODE_LABEL]: value for labels, value in _ask(prom, only_c1)}
        assert values == pytest.approx({"c1": expected.per_node["c1"]}, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_a_5000_node_group_by_post(prom: Prometheus, name: str) -> None:
    """The canary's three names plus 4,997 without series give the canary's value. The
    query is far beyond what fits in a URL (8 KiB is a common proxy limit), so it goes in
    the body of a POST."""
    expected = EXPECTED[name]
    assert len(BIG_GROUP) == len(set(BIG_GROUP)) == 5000
    query = _group(expected.check, BIG_GROUP)
    assert len(urllib.parse.quote(query)) > 100_000
    value = _one(_ask(prom, query), query)
    assert value == pytest.approx(expected.canary, rel=1e-9, abs=1e-12)


# EKS-style node names, as rounds.Prometheus would send them for a 5,000-node group.
EKS_GROUP = [
    f"ip-10-{i // 65536}-{i // 256 % 256}-{i % 256}.eu-west-1.compute.internal" for i in range(5000)
]


def test_the_longest_query_for_5000_eks_nodes(prom: Prometheus) -> None:
    """The longest built-in query (four matchers) for 5,000 EKS-style names: 0.94 MB,
    1.22 MB URL-encoded, over Go's 1 MiB header limit had it gone in the URL."""
    query = _group(SYNC_FAILURES.check, EKS_GROUP)
    assert len(query) > 900_000
    assert _ask(prom, query) == []  # accepted, and none of these nodes has series


class _AtEvalTime(Prometheus):
    """The adapter asked at the history's last scrape instead of now (the data is from 2023):
    the queries and their answers are the real ones."""

    def __init__(self, real: Prometheus) -> None:
        self.__dict__.update(real.__dict__)
        self.asked: list[str] = []

    def values(self, query: str, at: float | None = None) -> Rows:
        self.asked.append(query)
        return super().values(query, at=EVAL_TIME if at is None else at)


def test_a_check_with_absolute_bounds_asks_the_baseline_only_while_none_is_kept(
    prom: Prometheus,
) -> None:
    """A round records the baseline group's value of every check the status has none (or only
    a provisional one) of, absolute bounds included: a round before the first move that
    Prometheus could not answer once left such a check without a baseline for the whole run.
    With a settled value kept, the baseline group is not asked again."""
    check = SYNC_LATENCY.check
    assert check.max_ratio_to_baseline is None and check.mann_whitney is None
    analysis = Analysis(prometheus=PrometheusSource(url=prom.url), checks=[check])
    at = _AtEvalTime(prom)
    wanted = measure(
        at, check, analysis, canary=CANARY_NODES, baseline=BASELINE_NODES,
        recorded_baseline=None, record_baseline=True,
    )  # fmt: skip
    assert wanted.canary == pytest.approx(SYNC_LATENCY.canary, rel=1e-9)
    assert wanted.baseline == pytest.approx(SYNC_LATENCY.baseline, rel=1e-9)
    assert len(at.asked) == 2
    at.asked.clear()
    kept = measure(
        at, check, analysis, canary=CANARY_NODES, baseline=BASELINE_NODES,
        recorded_baseline=0.3, record_baseline=False,
    )  # fmt: skip
    assert kept.baseline == 0.3 and len(at.asked) == 1, at.asked


def test_a_baseline_asked_only_to_record_it_never_costs_the_canarys_verdict(
    prom: Prometheus,
) -> None:
    """When the baseline group's query fails (a 5,000-node matcher timing out), an absolute
    check still gets its canary value and so its verdict; the baseline is left for a later
    round."""
    check = SYNC_LATENCY.check
    analysis = Analysis(prometheus=PrometheusSource(url=prom.url), checks=[check])

    class BaselineFails(_AtEvalTime):
        def values(self, query: str, at: float | None = None) -> Rows:
            if "b1|b2|b3" in query:  # the baseline group's matcher
                self.asked.append(query)
                raise TimeoutError("read timed out")
            return super().values(query, at)

    failing = BaselineFails(prom)
    assert _group(check, BASELINE_NODES) != _group(check, CANARY_NODES)
    sample = measure(
        failing, check, analysis, canary=CANARY_NODES, baseline=BASELINE_NODES,
        recorded_baseline=None, record_baseline=True,
    )  # fmt: skip
    assert sample.canary == pytest.approx(SYNC_LATENCY.canary, rel=1e-9), sample
    assert sample.baseline is None and not sample.error
    assert len(failing.asked) == 2, "the baseline was asked (and failed) and the canary too"
