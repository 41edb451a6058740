"""The built-in templates' PromQL, evaluated by Prometheus itself (``promtool test rules``).

Each test writes a promtool unit-test file into ``tmp_path``: deterministic input series
for a few nodes (kube-proxy's real bucket layouts, 1-minute samples of counters growing
linearly, so ``rate``/``increase`` over the 5-minute window are exact), and
``promql_expr_test`` entries whose ``expr`` is a query rendered by
``proxymode.analysis.templates`` for a subset of the nodes. The expected values were worked
out by hand; each is derived in a comment next to its data. Quantiles are wrapped in
``round(..., 0.001)`` (cluster-harness.md §6: histogram_quantile's floating point is not
exact). Every scenario has a baseline node whose data would change the canary's values, and
it is named so that an unescaped matcher would match it (``n1.pool-a.example`` matches
``n1-pool-a-example`` when the dots are not escaped), so a template that leaks the baseline
into the canary group, or a matcher that is not escaped, fails here.

Evaluation is at 10m; every window is [300s], i.e. samples 5m..10m (counters: 5 increments).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from proxymode.analysis.templates import group_query, per_node_query
from proxymode.api.models import Check
from tests.tools import required

WINDOW = 300
EVAL_TIME = "10m"
STEPS = 20  # 21 samples, 0m..20m

A = "n1.pool-a.example"  # canary
B = "n2.pool-a.example"  # canary
C = "n1-pool-a-example"  # baseline; matched by A's name if the dots were not escaped
D = "n3.pool-a.example"  # canary, kube-proxy scraped but some metrics absent
E = "n4.pool-a.example"  # not scraped at all: no series

# kube-proxy's buckets (kube-proxy.md §1.1): ExponentialBuckets(0.001, 2, 15) for syncs ...
SYNC_LE = [round(0.001 * 2**i, 3) for i in range(15)]
# ... and 0.25, 0.5, every second 1..59, every 5 s 60..115, every 30 s 120..300 for
# network programming.
NETPROG_LE = [0.25, 0.5, *range(1, 60), *range(60, 120, 5), *range(120, 301, 30)]


def test_bucket_layouts_are_kube_proxys() -> None:
    assert SYNC_LE[0] == 0.001 and SYNC_LE[-1] == 16.384 and len(SYNC_LE) == 15
    assert len(NETPROG_LE) == 80 and NETPROG_LE[-1] == 300 and 115 in NETPROG_LE


def _labels(labels: Mapping[str, str]) -> str:
    return "{" + ",".join(f"{k}={json.dumps(v)}" for k, v in labels.items()) + "}"


def _series(name: str, labels: Mapping[str, str], values: str) -> dict[str, str]:
    return {"series": name + _labels(labels), "values": values}


def _counter(per_minute: float) -> str:
    return f"0+{per_minute:g}x{STEPS}"


def _gauge(value: float) -> str:
    return f"{value:g}+0x{STEPS}"


def _histogram(
    name: str,
    labels: Mapping[str, str],
    les: Sequence[float],
    cumulative: Mapping[float, int],
) -> list[dict[str, str]]:
    """Bucket counters growing by ``cumulative[le]`` a minute; between the given bounds the
    cumulative count stays at the last given one (0 below the first); +Inf gets the total."""
    total = max(cumulative.values())
    out = []
    count = 0
    for le in les:
        count = cumulative.get(le, count)
        out.append(_series(f"{name}_bucket", {**labels, "le": f"{le:g}"}, _counter(count)))
    out.append(_series(f"{name}_bucket", {**labels, "le": "+Inf"}, _counter(total)))
    return out


@dataclass(frozen=True)
class Case:
    """One query: the group's value (``expected`` a float), one value per node (a mapping
    node -> value), or no data at all (None)."""

    nodes: tuple[str, ...]
    expected: float | Mapping[str, float] | None

    @property
    def per_node(self) -> bool:
        return isinstance(self.expected, Mapping)


@dataclass(frozen=True)
class Scenario:
    name: str
    check: Check
    series: list[dict[str, str]]
    cases: list[Case]
    node_label: str = "instance"
    rounded: bool = False
    canary: tuple[str, ...] = (A, B)
    baseline: str = C

    def query(self, nodes: Sequence[str], per_node: bool) -> str:
        render = per_node_query if per_node else group_query
        expr = render(self.check, nodes=nodes, node_label=self.node_label, window_seconds=WINDOW)
        return f"round({expr}, 0.001)" if self.rounded else expr

    def expr_test(self, case: Case, expr: str | None = None) -> dict[str, object]:
        if case.expected is None:
            samples: list[dict[str, object]] = []
        elif isinstance(case.expected, Mapping):
            samples = [
                {"labels": _labels({self.node_label: node}), "value": value}
                for node, value in case.expected.items()
            ]
        else:
            samples = [{"labels": "{}", "value": case.expected}]
        return {
            "expr": expr if expr is not None else self.query(case.nodes, case.per_node),
            "eval_time": EVAL_TIME,
            "exp_samples": samples,
        }


def _kube_proxy(node: str, family: str = "IPv4") -> dict[str, str]:
    return {"instance": node, "job": "kube-proxy", "ip_family": family}


# -- SyncLatencyP99 ------------------------------------------------------------------------------
# Syncs a minute at or below each bound (cumulative). B is dual-stack: its syncs are split
# between the IPv4 and IPv6 series, which the query must add up.
SYNC_A = {0.016: 10, 0.032: 40, 0.064: 80, 0.128: 95, 0.256: 98, 0.512: 100}
SYNC_B4 = {0.032: 10, 0.064: 30, 0.128: 45, 0.256: 47, 0.512: 48, 1.024: 48, 2.048: 50}
SYNC_B6 = {0.032: 10, 0.064: 30, 0.128: 45, 0.256: 48, 0.512: 48, 1.024: 49, 2.048: 50}
# B = B4 + B6 = {0.032: 20, 0.064: 60, 0.128: 90, 0.256: 95, 0.512: 96, 1.024: 97, 2.048: 100}
SYNC_C = {2.048: 10, 4.096: 50, 8.192: 90, 16.384: 100}
SYNC = "kubeproxy_sync_proxy_rules_duration_seconds"
SYNC_SERIES = [
    *_histogram(SYNC, _kube_proxy(A), SYNC_LE, SYNC_A),
    *_histogram(SYNC, _kube_proxy(B), SYNC_LE, SYNC_B4),
    *_histogram(SYNC, _kube_proxy(B, "IPv6"), SYNC_LE, SYNC_B6),
    *_histogram(SYNC, _kube_proxy(C), SYNC_LE, SYNC_C),
    # D's syncs all take longer than the highest finite bucket: only +Inf grows.
    *_histogram(SYNC, _kube_proxy(D), SYNC_LE, {float("inf"): 100}),
]
SYNC_CASES = [
    # {A,B}: 200 a minute, rank 0.99*200 = 198. At le=1.024 197, at 2.048 200:
    # 1.024 + 1.024 * (198-197)/(200-197) = 1.36533 -> 1.365.
    Case((A, B), 1.365),
    # A: rank 99; le=0.256 98, le=0.512 100: 0.256 + 0.256 * 1/2 = 0.384.
    # B: rank 99; le=1.024 97, le=2.048 100: 1.024 + 1.024 * 2/3 = 1.70667 -> 1.707.
    Case((A, B), {A: 0.384, B: 1.707}),
    # C: rank 99; le=8.192 90, le=16.384 100: 8.192 + 8.192 * 9/10 = 15.5648 -> 15.565.
    Case((C,), 15.565),
    # {A,B,C}: 300, rank 297; le=8.192 290, le=16.384 300: 8.192 + 8.192 * 7/10 = 13.9264.
    Case((A, B, C), 13.926),
    # D: rank in +Inf: histogram_quantile answers the highest finite bound.
    Case((D,), 16.384),
    Case((E,), None),
]

# -- NetworkProgrammingP99 (node label "node"; instance is the scrape address) ------------------
NP_A = {1: 50, 2: 90, 3: 98, 4: 100}
NP_B = {1: 20, 5: 60, 10: 90, 15: 97, 20: 100}
NP_C = {60: 10, 120: 50, 300: 100}
NETPROG = "kubeproxy_network_programming_duration_seconds"


def _np_labels(node: str, ip: str) -> dict[str, str]:
    return {"instance": f"{ip}:10249", "job": "kube-proxy", "node": node}


NP_SERIES = [
    *_histogram(NETPROG, _np_labels(A, "10.0.0.1"), NETPROG_LE, NP_A),
    *_histogram(NETPROG, _np_labels(B, "10.0.0.2"), NETPROG_LE, NP_B),
    *_histogram(NETPROG, _np_labels(C, "10.0.0.3"), NETPROG_LE, NP_C),
]
NP_CASES = [
    # {A,B}: rank 198; le=19 100+97 = 197, le=20 200: 19 + 1 * 1/3 = 19.333.
    Case((A, B), 19.333),
    # A: rank 99; le=3 98, le=4 100: 3 + 1/2 = 3.5. B: le=19 97, le=20 100: 19 + 2/3 = 19.667.
    Case((A, B), {A: 3.5, B: 19.667}),
    # C: rank 99; le=270 50, le=300 100: 270 + 30 * 49/50 = 299.4.
    Case((C,), 299.4),
    # {A,B,C}: rank 297; le=270 250, le=300 300: 270 + 30 * 47/50 = 298.2.
    Case((A, B, C), 298.2),
]

# -- ConntrackUsage (node_exporter) -------------------------------------------------------------
LIMIT = 131072  # kube-proxy's default conntrack minimum (kube-proxy.md §1.2)


def _conntrack(node: str, entries: int) -> list[dict[str, str]]:
    labels = {"instance": node, "job": "node-exporter"}
    return [
        _series("node_nf_conntrack_entries", labels, _gauge(entries)),
        _series("node_nf_conntrack_entries_limit", labels, _gauge(LIMIT)),
    ]


CONNTRACK_SERIES = [
    *_conntrack(A, 32768),  # 0.25
    *_conntrack(B, 98304),  # 0.75
    *_conntrack(C, 126976),  # 0.96875
]
CONNTRACK_CASES = [
    Case((A, B), 0.75),  # the worst node
    Case((A, B), {A: 0.25, B: 0.75}),
    Case((C,), 0.96875),
    Case((A, B, C), 0.96875),
    Case((E,), None),
]

# -- SyncFailures -------------------------------------------------------------------------------
FAIL_IPT = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
FAIL_PARTIAL = "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"
FAIL_NFT = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
QUEUED = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
LAST = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
FAILURE_SERIES = [
    # A, iptables mode: 1 restore failure a minute (5 in the window), partial restores fine.
    # Two counters with the same labels but the name: see test_a_name_regex_would_collide.
    _series(FAIL_IPT, _kube_proxy(A), _counter(1)),
    _series(FAIL_PARTIAL, _kube_proxy(A), _counter(0)),
    # Not a sync failure: must not count.
    _series("kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", _kube_proxy(A), "0+7x20"),
    _series(QUEUED, _kube_proxy(A), _gauge(1000)),
    # B, nftables mode: 2 a minute (10 in the window).
    _series(FAIL_NFT, _kube_proxy(B), _counter(2)),
    _series(QUEUED, _kube_proxy(B), _gauge(1000)),
    # C (baseline): 100 a minute.
    _series(FAIL_IPT, _kube_proxy(C), _counter(100)),
    _series(QUEUED, _kube_proxy(C), _gauge(1000)),
    # D: 1.33+ vector counters that never failed are not exported; kube-proxy is scraped.
    _series(QUEUED, _kube_proxy(D), _gauge(1000)),
]
FAILURE_CASES = [
    Case((A, B, D), 15),  # 5 + 10 + 0
    Case((A, B, D), {A: 5, B: 10, D: 0}),
    Case((D,), 0),  # scraped, no failure counters: 0, not "no data"
    Case((E,), None),  # not scraped: no data
    Case((D, E), {D: 0}),
    Case((C,), 500),
    Case((A, B, C, D), 515),
]

# -- SyncStaleness ------------------------------------------------------------------------------
STALENESS_SERIES = [
    # A: IPv4 5 s behind, IPv6 up to date -> 5.
    _series(QUEUED, _kube_proxy(A), _gauge(1000)),
    _series(LAST, _kube_proxy(A), _gauge(995)),
    _series(QUEUED, _kube_proxy(A, "IPv6"), _gauge(1000)),
    _series(LAST, _kube_proxy(A, "IPv6"), _gauge(1000)),
    # B: 20 s behind.
    _series(QUEUED, _kube_proxy(B), _gauge(2000)),
    _series(LAST, _kube_proxy(B), _gauge(1980)),
    # C (baseline): hung for 1000 s.
    _series(QUEUED, _kube_proxy(C), _gauge(5000)),
    _series(LAST, _kube_proxy(C), _gauge(4000)),
    # D: synced after the last queued change: -100, clamped to 0.
    _series(QUEUED, _kube_proxy(D), _gauge(100)),
    _series(LAST, _kube_proxy(D), _gauge(200)),
]
STALENESS_CASES = [
    Case((A, B), 20),  # the worst node
    Case((A, B, D), {A: 5, B: 20, D: 0}),
    Case((D,), 0),
    Case((C,), 1000),
    Case((A, B, C), 1000),
    Case((E,), None),
]

# -- a custom query with both placeholders ------------------------------------------------------
CUSTOM = Check(
    name="syncs-per-window",
    query=(
        "sum by ({{by_node}}) (increase(kubeproxy_sync_proxy_rules_duration_seconds_bucket"
        '{ {{nodes}}, le="+Inf" }[5m]))'
    ),
    min=1,
)
CUSTOM_CASES = [
    Case((A, B), 1000),  # 100 syncs a minute each (B: 50 IPv4 + 50 IPv6), 5 minutes
    Case((A, B), {A: 500, B: 500}),
    Case((A, B, C), 1500),
    Case((E,), None),
]

SCENARIOS = [
    Scenario(
        "SyncLatencyP99",
        Check(name="sync", template="SyncLatencyP99", max_seconds=1),
        SYNC_SERIES,
        SYNC_CASES,
        rounded=True,
    ),
    Scenario(
        "NetworkProgrammingP99",
        Check(name="netprog", template="NetworkProgrammingP99", max_seconds=30),
        NP_SERIES,
        NP_CASES,
        node_label="node",
        rounded=True,
    ),
    Scenario(
        "ConntrackUsage",
        Check(name="conntrack", template="ConntrackUsage", max_ratio=0.9),
        CONNTRACK_SERIES,
        CONNTRACK_CASES,
    ),
    Scenario(
        "SyncFailures",
        Check(name="failures", template="SyncFailures", max=0),
        FAILURE_SERIES,
        FAILURE_CASES,
        canary=(A, B, D),
    ),
    Scenario(
        "SyncStaleness",
        Check(name="staleness", template="SyncStaleness", max_seconds=30),
        STALENESS_SERIES,
        STALENESS_CASES,
    ),
    Scenario("custom", CUSTOM, SYNC_SERIES, CUSTOM_CASES),
]
IDS = [s.name for s in SCENARIOS]


def _promtool() -> str:
    return required("promtool")


def _run(tmp_path: Path, series: list[dict[str, str]], tests: list[dict[str, object]]) -> str:
    """Run promtool on one test group; return its output with the exit code asserted by
    the caller (the output is part of every assertion message)."""
    doc = {
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    path = tmp_path / "templates_test.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 20))
    done = subprocess.run(
        [_promtool(), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}"


def _passed(output: str) -> bool:
    return output.startswith("exit 0\n")


def test_promtool_is_installed() -> None:
    _promtool()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_template_gives_the_computed_values(tmp_path: Path, scenario: Scenario) -> None:
    tests = [scenario.expr_test(case) for case in scenario.cases]
    output = _run(tmp_path, scenario.series, tests)
    assert _passed(output), output


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_a_leaking_group_would_be_caught(tmp_path: Path, scenario: Scenario) -> None:
    """The canary's expectations do not hold once the baseline node is in the group, nor
    with a matcher whose dots are not escaped: the values above tell the groups apart."""
    canary = next(c for c in scenario.cases if c.nodes == scenario.canary and not c.per_node)
    leaked = scenario.query((*canary.nodes, scenario.baseline), per_node=False)
    unescaped = scenario.query(canary.nodes, per_node=False).replace("\\\\.", ".")
    assert unescaped != scenario.query(canary.nodes, per_node=False)
    for expr in (leaked, unescaped):
        output = _run(tmp_path, scenario.series, [scenario.expr_test(canary, expr)])
        assert not _passed(output) and "FAILED" in output, f"{expr}\n{output}"


def test_a_5000_node_matcher_is_accepted_by_prometheus(tmp_path: Path) -> None:
    scenario = SCENARIOS[0]
    nodes = [A, B, *(f"ip-10-1-{i // 250}-{i % 250}.pool-b.example" for i in range(4998))]
    expr = scenario.query(nodes, per_node=False)
    assert len(expr) > 150_000
    output = _run(tmp_path, scenario.series, [scenario.expr_test(Case((A, B), 1.365), expr)])
    assert _passed(output), output[:2000]


def test_a_name_regex_would_collide(tmp_path: Path) -> None:
    """Why SyncFailures does not use ``increase({__name__=~...})``: increase drops the name,
    and an iptables node's two counters then have the same labels."""
    naive = (
        'sum(increase({__name__=~"' + "|".join((FAIL_IPT, FAIL_PARTIAL, FAIL_NFT)) + '",'
        f' instance="{A}"}}[300s]))'
    )
    output = _run(tmp_path, FAILURE_SERIES, [{"expr": naive, "eval_time": EVAL_TIME}])
    assert not _passed(output) and "same labelset" in output, output
