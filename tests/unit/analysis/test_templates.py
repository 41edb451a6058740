"""The PromQL the templates render: matcher escaping, group vs per-node shapes, placeholders.

Prometheus itself evaluates these queries in tests/promql; here the text is pinned, and
the escaping is checked against Python's ``re`` (RE2 and Python agree on the escapes used).
"""

from __future__ import annotations

import json
import re

import pytest

from proxymode.analysis.templates import (
    FAILURE_COUNTERS,
    group_query,
    node_matcher,
    per_node_query,
)
from proxymode.api.models import Check, Template


def _pattern(matcher: str) -> str:
    """The regex inside a rendered matcher, unquoted the way PromQL unquotes strings."""
    label, _, quoted = matcher.partition("=~")
    assert re.fullmatch(r"[a-zA-Z_]\w*", label)
    value = json.loads(quoted)
    assert isinstance(value, str)
    return value


def test_matcher_shape() -> None:
    assert node_matcher(["b", "a", "c"], "instance") == 'instance=~"^(?:a|b|c)$"'
    assert node_matcher(["a"], "node") == 'node=~"^(?:a)$"'


def test_matcher_escapes_dots_so_look_alikes_do_not_match() -> None:
    matcher = node_matcher(["ip-10-0-0-1.ec2.internal", "n1.pool-a"], "instance")
    assert matcher == r'instance=~"^(?:ip-10-0-0-1\\.ec2\\.internal|n1\\.pool-a)$"'
    pattern = re.compile(_pattern(matcher))
    assert pattern.fullmatch("n1.pool-a")
    assert pattern.fullmatch("ip-10-0-0-1.ec2.internal")
    assert not pattern.fullmatch("n1-pool-a")
    assert not pattern.fullmatch("ip-10-0-0-1xec2xinternal")
    assert not pattern.fullmatch("n1.pool-a.extra")
    assert not pattern.fullmatch("")


ODD = [
    "a.b",
    "x+y",
    "star*",
    "q?",
    "(paren)",
    "[br]",
    "{brace}",
    "pi|pe",
    "^caret",
    "dollar$",
    "back\\slash",
    'quo"te',
    "10.0.0.1:9100",
    "tab\tnew\nline",
    "ünïcode-名前",
    "dash-and_underscore",
]


@pytest.mark.parametrize("name", ODD)
def test_odd_names_match_themselves_and_nothing_else(name: str) -> None:
    pattern = re.compile(_pattern(node_matcher([name, "other"], "instance")))
    assert pattern.fullmatch(name)
    assert pattern.fullmatch("other")
    for near in (name + "x", "x" + name, name[:-1], name.replace(name[0], "Z", 1)):
        if near not in (name, "other"):
            assert not pattern.fullmatch(near), near


def test_all_odd_names_in_one_matcher() -> None:
    pattern = re.compile(_pattern(node_matcher(ODD, "instance")))
    assert all(pattern.fullmatch(n) for n in ODD)
    assert not pattern.fullmatch("a-b")
    assert not pattern.fullmatch("xxy")


def test_matcher_is_a_valid_promql_string() -> None:
    """Inside the quotes: no raw quote, no raw newline; backslashes come in escaped pairs."""
    quoted = node_matcher(['quo"te', "new\nline", "a.b"], "instance").partition("=~")[2]
    body = quoted[1:-1]
    assert quoted[0] == quoted[-1] == '"'
    assert "\n" not in body
    assert re.search(r'(?<!\\)"', body.replace("\\\\", "")) is None


def test_duplicates_are_dropped_and_order_does_not_matter() -> None:
    assert node_matcher(["b", "a", "b"], "instance") == node_matcher(["a", "b"], "instance")


@pytest.mark.parametrize(
    ("nodes", "label"),
    [([], "instance"), ([""], "instance"), (["a", ""], "instance"), (["a"], "0bad"), (["a"], "")],
)
def test_matcher_refuses_what_would_select_the_wrong_series(nodes: list[str], label: str) -> None:
    with pytest.raises(ValueError, match=r"node|label"):
        node_matcher(nodes, label)


def test_a_5000_node_matcher() -> None:
    nodes = [
        f"ip-10-{i // 65536}-{i // 256 % 256}-{i % 256}.eu-west-1.compute.internal"
        for i in range(5000)
    ]
    matcher = node_matcher(nodes, "instance")  # its build time: benchmarks/engine_scale.py
    pattern = _pattern(matcher)
    assert pattern.count("|") == 4999
    assert len(matcher) < 400_000  # a few hundred kB: sent by POST, fine for Prometheus
    compiled = re.compile(pattern)
    assert compiled.fullmatch(nodes[0]) and compiled.fullmatch(nodes[-1])
    assert compiled.fullmatch(nodes[2500])
    assert not compiled.fullmatch("ip-10-0-0-0xeu-west-1.compute.internal")
    assert not compiled.fullmatch("ip-10-0-19-136.eu-west-1.compute.internal")  # number 5000


def _check(template: Template, **threshold: float) -> Check:
    return Check(name="c", template=template, **(threshold or {"max": 1}))


NODES = ["n1.a", "n2.a"]
M = r'instance=~"^(?:n1\\.a|n2\\.a)$"'
MN = r'node=~"^(?:n1\\.a|n2\\.a)$"'


def test_sync_latency_p99() -> None:
    check = _check(Template.SYNC_LATENCY_P99, max_seconds=1)
    assert group_query(check, nodes=NODES, node_label="instance", window_seconds=300) == (
        "histogram_quantile(0.99, sum by (le) (rate("
        f"kubeproxy_sync_proxy_rules_duration_seconds_bucket{{{M}}}[300s])))"
    )
    assert per_node_query(check, nodes=NODES, node_label="node", window_seconds=120) == (
        "histogram_quantile(0.99, sum by (le, node) (rate("
        f"kubeproxy_sync_proxy_rules_duration_seconds_bucket{{{MN}}}[120s])))"
    )


def test_network_programming_p99() -> None:
    check = _check(Template.NETWORK_PROGRAMMING_P99, max_seconds=5)
    assert group_query(check, nodes=NODES, node_label="instance", window_seconds=600) == (
        "histogram_quantile(0.99, sum by (le) (rate("
        f"kubeproxy_network_programming_duration_seconds_bucket{{{M}}}[600s])))"
    )
    assert "sum by (le, instance)" in per_node_query(
        check, nodes=NODES, node_label="instance", window_seconds=600
    )


def test_conntrack_usage() -> None:
    check = _check(Template.CONNTRACK_USAGE, max_ratio=0.9)
    ratio = f"node_nf_conntrack_entries{{{M}}} / node_nf_conntrack_entries_limit{{{M}}}"
    assert group_query(check, nodes=NODES, node_label="instance", window_seconds=300) == (
        f"max ({ratio})"
    )
    assert per_node_query(check, nodes=NODES, node_label="instance", window_seconds=300) == (
        f"max by (instance) ({ratio})"
    )


def test_sync_failures_counts_every_modes_counters_and_falls_back_to_zero() -> None:
    check = _check(Template.SYNC_FAILURES, max=0)
    query = group_query(check, nodes=NODES, node_label="instance", window_seconds=300)
    assert FAILURE_COUNTERS == (
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
        "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
    )
    for name in FAILURE_COUNTERS:
        assert f"increase({name}{{{M}}}[300s])" in query
    assert query.startswith("sum (label_replace(")
    assert query.endswith(
        f") or (count (kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{{{M}}}) * 0)"
    )
    per_node = per_node_query(check, nodes=NODES, node_label="node", window_seconds=300)
    assert per_node.startswith("sum by (node) (label_replace(")
    assert ") or (count by (node) (kubeproxy_sync_proxy_rules_last_queued" in per_node


def test_sync_staleness() -> None:
    check = _check(Template.SYNC_STALENESS, max_seconds=30)
    diff = (
        f"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{{{M}}}"
        f" - kubeproxy_sync_proxy_rules_last_timestamp_seconds{{{M}}}"
    )
    assert group_query(check, nodes=NODES, node_label="instance", window_seconds=300) == (
        f"max (clamp_min({diff}, 0))"
    )
    assert per_node_query(check, nodes=NODES, node_label="instance", window_seconds=300) == (
        f"max by (instance) (clamp_min({diff}, 0))"
    )


@pytest.mark.parametrize("template", list(Template))
def test_every_template_renders_both_shapes(template: Template) -> None:
    check = Check(name="c", template=template, max_ratio_to_baseline=2)
    group = group_query(check, nodes=NODES, node_label="node", window_seconds=300)
    per_node = per_node_query(check, nodes=NODES, node_label="node", window_seconds=300)
    assert MN in group and MN in per_node
    assert "by (node)" not in group and "le, node" not in group
    assert "by (node)" in per_node or "by (le, node)" in per_node
    assert group.count("(") == group.count(")") and per_node.count("(") == per_node.count(")")


def test_custom_query_replaces_every_placeholder() -> None:
    check = Check(
        name="errors",
        query='sum(rate(x{ {{nodes}}, code!~"5.." }[5m])) / sum(rate(y{ {{nodes}} }[5m]))',
        max=0.01,
    )
    assert group_query(check, nodes=NODES, node_label="instance", window_seconds=300) == (
        f'sum(rate(x{{ {M}, code!~"5.." }}[5m])) / sum(rate(y{{ {M} }}[5m]))'
    )


def test_custom_query_by_node_placeholder() -> None:
    check = Check(
        name="p99",
        query="histogram_quantile(0.9, sum by (le, {{by_node}}) (rate(x_bucket{ {{nodes}} }[5m])))",
        max=1,
    )
    group = group_query(check, nodes=NODES, node_label="instance", window_seconds=300)
    per_node = per_node_query(check, nodes=NODES, node_label="instance", window_seconds=300)
    assert group == f"histogram_quantile(0.9, sum by (le, ) (rate(x_bucket{{ {M} }}[5m])))"
    assert per_node == (
        f"histogram_quantile(0.9, sum by (le, instance) (rate(x_bucket{{ {M} }}[5m])))"
    )


def test_custom_query_without_by_node_has_no_per_node_form() -> None:
    check = Check(name="q", query="sum(x{ {{nodes}} })", max=1)
    with pytest.raises(ValueError, match="by_node"):
        per_node_query(check, nodes=NODES, node_label="instance", window_seconds=300)


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window"):
        group_query(
            _check(Template.SYNC_LATENCY_P99, max_seconds=1),
            nodes=NODES,
            node_label="instance",
            window_seconds=0,
        )
