"""PromQL for the analysis checks: one query per check per group, never one per node.

Every check is asked twice per round at most: once for the canary group (the nodes moved so
far) and once for the baseline group (eligible nodes still on the source mode). The group is
a single regex matcher on the node label, ``instance=~"^(?:a|b|c)$"``, with every name
escaped, so one query covers 5,000 nodes; the adapter sends it by POST because such a
matcher does not fit in a URL. ``group_query`` gives ONE value for the group;
``per_node_query`` gives one value per node (``by (<node label>)``), which only the
Mann-Whitney comparison needs.

Built-in templates (metric names as kube-proxy and node_exporter export them), and the
threshold each one is judged against. ``maxRatioToBaseline`` (canary / baseline) and
``mannWhitney`` work with every template and with custom queries.

=========================  ======================================================  ==========
template                   group value                                             threshold
=========================  ======================================================  ==========
``SyncLatencyP99``         p99 of ``kubeproxy_sync_proxy_rules_duration_seconds``  maxSeconds
                           over the window, all the group's syncs pooled
``NetworkProgrammingP99``  p99 of ``kubeproxy_network_programming_duration_``      maxSeconds
                           ``seconds``, pooled the same way
``ConntrackUsage``         the worst node's ``node_nf_conntrack_entries /``        maxRatio
                           ``node_nf_conntrack_entries_limit``
``SyncFailures``           how much the iptables-restore, partial-restore and      max
                           nftables sync failure counters grew over the window,
                           summed over the group
``SyncStaleness``          the worst node's ``last_queued - last`` sync            maxSeconds
                           timestamps, clamped at 0
custom ``query``           whatever the query returns                              min / max
=========================  ======================================================  ==========

Notes on the built-ins:

- The sync histogram's highest finite bucket is 16.384 s: a p99 in the ``+Inf`` bucket is
  reported as 16.384 (``histogram_quantile`` returns the highest finite bound). A window
  without syncs gives NaN, which the judge calls Inconclusive.
- kube-proxy 1.33+ adds an ``ip_family`` label; the quantiles and sums aggregate it away and
  the maxima take the worse family.
- ``SyncFailures`` takes each counter's ``increase`` on its own, tags it with a ``counter``
  label and joins them with ``or``: ``increase({__name__=~"a|b"})`` drops the names, so an
  iptables node's restore and partial-restore counters would collide ("vector cannot
  contain metrics with the same labelset" in Prometheus 2.x), and a mode that lacks a
  counter still leaves the others standing.
- Failure counters are labelled vectors from 1.33 on, so a healthy node may export none.
  ``SyncFailures`` therefore falls back to 0 for nodes whose kube-proxy is scraped (its
  always-set ``last_queued`` gauge is present), and stays empty (no data) only when the
  group's kube-proxies are not scraped at all. A vector series born inside the window
  starts at its first value, which ``increase`` cannot see: the first failure of a node
  that never failed before may be missed.
- ``SyncStaleness`` grows only while changes keep arriving: ``last_queued`` moves with every
  Service or EndpointSlice change, ``last`` with every successful sync. A few seconds
  (minSyncPeriod plus the sync itself) is normal.
- ``ConntrackUsage`` comes from node_exporter: its series must carry the same node label,
  with the same values, as kube-proxy's (relabel both to e.g. ``node``), or the two
  exporters' ``instance`` ports will not match the node names.

Custom queries: ``{{nodes}}`` is replaced by the group's matcher (write
``sum(rate(x{ {{nodes}}, code!~"5.." }[5m]))``). For ``mannWhitney`` a custom query also
needs ``{{by_node}}`` inside a ``by`` clause, ``sum by ({{by_node}}) (...)`` or
``sum by (le, {{by_node}}) (...)``: it becomes the node label in the per-node query and
nothing in the group query (``by ()`` and a trailing comma are valid PromQL).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

from proxymode.api.models import Check, Template

NODES_PLACEHOLDER = "{{nodes}}"
BY_NODE_PLACEHOLDER = "{{by_node}}"
QUANTILE = 0.99

SYNC_DURATION = "kubeproxy_sync_proxy_rules_duration_seconds"
NETWORK_PROGRAMMING = "kubeproxy_network_programming_duration_seconds"
CONNTRACK_ENTRIES = "node_nf_conntrack_entries"
CONNTRACK_LIMIT = "node_nf_conntrack_entries_limit"
LAST_QUEUED = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
LAST_SYNC = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
FAILURE_COUNTERS = (
    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",  # iptables and ipvs
    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",  # iptables
    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",  # nftables
)

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
# RE2's metacharacters; a backslash before any other punctuation is legal but not needed.
_RE2_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


def _escape_re2(name: str) -> str:
    return _RE2_META.sub(r"\\\1", name)


def _check_label(node_label: str) -> None:
    if not _LABEL_NAME.match(node_label):
        raise ValueError(f"not a Prometheus label name: {node_label!r}")


def node_matcher(nodes: Sequence[str], node_label: str) -> str:
    """The label matcher selecting exactly ``nodes``: ``instance=~"^(?:a|b\\\\.c)$"``.

    Names are regex-escaped (RE2), then quoted as a PromQL string; duplicates are dropped
    and the order is fixed (sorted), so the same group gives the same query. An empty
    group or an empty name is refused: ``=~"^(?:)$"`` would match the series that lack
    the label altogether.
    """
    _check_label(node_label)
    if not nodes:
        raise ValueError("a group needs at least one node")
    if any(not n for n in nodes):
        raise ValueError("a node name cannot be empty")
    pattern = "^(?:" + "|".join(_escape_re2(n) for n in sorted(set(nodes))) + ")$"
    # JSON's escapes (\\, \", \n, \uXXXX) are all valid in a PromQL double-quoted string.
    return f"{node_label}=~{json.dumps(pattern, ensure_ascii=False)}"


def clipped_window(window_seconds: int, since_switch: float | None) -> int:
    """The range a canary query looks back over: ``window_seconds``, cut to the seconds since
    the group's latest switch, so no sample of a node's old kube-proxy is in it (issue 9
    item 27, decision 0015). Canaries slow on iptables and fast on nftables would otherwise
    fail a 300 s window that still holds their iptables-era syncs. At least 1 s (a range
    must be positive): a round that young reaches before the switch and is not counted."""
    if since_switch is None:
        return window_seconds
    return max(1, min(window_seconds, math.floor(since_switch)))


def group_query(check: Check, *, nodes: Sequence[str], node_label: str, window_seconds: int) -> str:
    """PromQL giving ONE value for the group ``nodes`` (the canary's or the baseline's)."""
    return _render(
        check, nodes=nodes, node_label=node_label, window_seconds=window_seconds, per_node=False
    )


def per_node_query(
    check: Check, *, nodes: Sequence[str], node_label: str, window_seconds: int
) -> str:
    """PromQL giving one value per node of ``nodes``, labelled only with ``node_label``."""
    return _render(
        check, nodes=nodes, node_label=node_label, window_seconds=window_seconds, per_node=True
    )


def _render(
    check: Check, *, nodes: Sequence[str], node_label: str, window_seconds: int, per_node: bool
) -> str:
    if window_seconds < 1:
        raise ValueError(f"the window must be at least 1s, not {window_seconds}s")
    matcher = node_matcher(nodes, node_label)
    if check.query is not None:
        return _custom(check.query, matcher, node_label if per_node else "", per_node)
    if check.template is None:  # the model refuses this; keep mypy and the reader sure
        raise ValueError(f"check {check.name!r} has neither a template nor a query")
    return _builtin(
        Template(check.template), matcher, f"[{window_seconds}s]", node_label if per_node else ""
    )


def _custom(query: str, matcher: str, by_node: str, per_node: bool) -> str:
    if per_node and BY_NODE_PLACEHOLDER not in query:
        raise ValueError(
            "a custom query needs the {{by_node}} placeholder in a by clause to give one"
            " value per node"
        )
    return query.replace(NODES_PLACEHOLDER, matcher).replace(BY_NODE_PLACEHOLDER, by_node)


def _builtin(template: Template, m: str, window: str, node: str) -> str:
    """``node`` is the node label for a per-node query and empty for the group's."""
    by_le = f"le, {node}" if node else "le"
    worst = f"max by ({node})" if node else "max"
    match template:
        case Template.SYNC_LATENCY_P99 | Template.NETWORK_PROGRAMMING_P99:
            metric = SYNC_DURATION if template == Template.SYNC_LATENCY_P99 else NETWORK_PROGRAMMING
            return (
                f"histogram_quantile({QUANTILE}, sum by ({by_le}) (rate({metric}_bucket{{{m}}}"
                f"{window})))"
            )
        case Template.CONNTRACK_USAGE:
            return f"{worst} ({CONNTRACK_ENTRIES}{{{m}}} / {CONNTRACK_LIMIT}{{{m}}})"
        case Template.SYNC_FAILURES:
            # Each counter on its own, tagged, joined with "or" (see the module docstring).
            each = " or ".join(
                f'label_replace(increase({name}{{{m}}}{window}), "counter", "{name}", "", "")'
                for name in FAILURE_COUNTERS
            )
            total = f"sum by ({node})" if node else "sum"
            count = f"count by ({node})" if node else "count"
            return f"{total} ({each}) or ({count} ({LAST_QUEUED}{{{m}}}) * 0)"
        case Template.SYNC_STALENESS:
            return f"{worst} (clamp_min({LAST_QUEUED}{{{m}}} - {LAST_SYNC}{{{m}}}, 0))"
    raise ValueError(f"unknown template {template!r}")  # pragma: no cover - enum exhausted


def series_query(template: Template, *, nodes: Sequence[str], node_label: str) -> str:
    """PromQL giving one row per node of ``nodes`` that has the series ``template`` reads
    (``count by (<node label>)``), for the check before any node moves. Every series here is
    exported in every mode (the sync and network-programming histograms, the sync
    timestamps, node_exporter's conntrack gauges), so the source nodes must have them; the
    conntrack ratio is asked as the template divides it, so mismatched node labels between
    the two exporters show up as missing too."""
    m = node_matcher(nodes, node_label)
    match template:
        case Template.SYNC_LATENCY_P99:
            inner = f"{SYNC_DURATION}_count{{{m}}}"
        case Template.NETWORK_PROGRAMMING_P99:
            inner = f"{NETWORK_PROGRAMMING}_count{{{m}}}"
        case Template.CONNTRACK_USAGE:
            inner = f"{CONNTRACK_ENTRIES}{{{m}}} / {CONNTRACK_LIMIT}{{{m}}}"
        case Template.SYNC_FAILURES:
            inner = f"{LAST_QUEUED}{{{m}}}"
        case Template.SYNC_STALENESS:
            inner = f"{LAST_QUEUED}{{{m}}} - {LAST_SYNC}{{{m}}}"
        case _:  # pragma: no cover - enum exhausted
            raise ValueError(f"unknown template {template!r}")
    return f"count by ({node_label}) ({inner})"
