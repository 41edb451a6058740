"""Can the checks be measured? kube-proxy's metrics bind address, and Prometheus's series.

kube-proxy serves ``/metrics`` on ``metricsBindAddress``, default ``127.0.0.1:10249``, and
kubeadm writes that field empty: Prometheus, off the node, then gets nothing, and a policy
gated on kube-proxy's metrics would find out only after its first canary moved, as NoData.
So preflight (1) says so from the configs, with the fix, and (2) before the first node moves
confirms with Prometheus itself (``Observed.series``, asked by the adapter) that every
template check has series for every eligible node. Custom queries are not confirmed: they
may read series that only the target mode exports. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from proxymode.api.models import Check, Finding, PolicySpec, Severity, Template
from proxymode.engine.observed import SeriesCoverage
from proxymode.engine.preflight.codes import Code
from proxymode.engine.preflight.text import name_list, new_finding, plural

DEFAULT_METRICS_ADDRESS: Final = "127.0.0.1:10249"
SCRAPABLE_ADDRESS: Final = "0.0.0.0:10249"
KUBE_PROXY_METRIC_PREFIX: Final = "kubeproxy_"
NODE_EXPORTER_TEMPLATES: Final = frozenset({Template.CONNTRACK_USAGE})


def metrics_address(config: Mapping[str, Any] | None) -> str:
    """The address kube-proxy serves ``/metrics`` on: an empty field means the default."""
    value = (config or {}).get("metricsBindAddress")
    return (
        str(value).strip() if isinstance(value, str) and value.strip() else DEFAULT_METRICS_ADDRESS
    )


def is_local(address: str) -> bool:
    """Loopback only: Prometheus cannot reach it from another host."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    host = host.strip("[]")
    return host.startswith("127.") or host in ("localhost", "::1")


def reads_kube_proxy(check: Check) -> bool:
    if check.template is not None:
        return Template(check.template) not in NODE_EXPORTER_TEMPLATES
    return KUBE_PROXY_METRIC_PREFIX in (check.query or "")


def needs_baseline(check: Check) -> bool:
    return check.max_ratio_to_baseline is not None or check.mann_whitney is not None


def metrics_reach(
    spec: PolicySpec, source: Mapping[str, Any] | None, target: Mapping[str, Any] | None
) -> list[Finding]:
    """Checks on kube-proxy's metrics while kube-proxy serves them on loopback only."""
    if spec.analysis is None or source is None:
        return []
    checks = [c.name for c in spec.analysis.checks if reads_kube_proxy(c)]
    if not checks:
        return []
    ref = spec.kube_proxy
    source_address = metrics_address(source)
    target_address = metrics_address(target) if target is not None else source_address
    if not is_local(source_address) and not is_local(target_address):
        return []
    how = (
        "leaves metricsBindAddress empty, so kube-proxy listens on its default "
        f"{DEFAULT_METRICS_ADDRESS} (kubeadm writes it empty)"
        if not str(source.get("metricsBindAddress") or "").strip()
        else f"sets metricsBindAddress: {source_address}"
    )
    which = f"Checks {', '.join(checks)} read" if len(checks) > 1 else f"Check {checks[0]} reads"
    where = f"ConfigMap {ref.namespace}/{ref.config_map} key {ref.config_key!r}"
    if is_local(target_address):
        fix = (
            f"Set metricsBindAddress: {SCRAPABLE_ADDRESS} in {where} (then restart the "
            f"kube-proxy pods) so both groups are measured, or at least set configOverrides: "
            f'{{metricsBindAddress: "{SCRAPABLE_ADDRESS}"}} for the target kube-proxy; or '
            f"scrape 127.0.0.1:10249 from an agent on each node."
        )
        said = f"The source config {how}, and the target config keeps {target_address}"
    else:
        baseline = [
            c.name for c in spec.analysis.checks if reads_kube_proxy(c) and needs_baseline(c)
        ]
        fix = (
            f"configOverrides sets the target's to {target_address}, so the canaries are "
            f"measured; the source nodes are not"
            + (
                f", so {', '.join(baseline)} (compared with the baseline group) cannot be "
                f"judged. Set metricsBindAddress: {SCRAPABLE_ADDRESS} in {where} too."
                if baseline
                else "."
            )
        )
        said = f"The source config {how}"
    return [
        new_finding(
            Severity.WARNING,
            Code.METRICS_NOT_SCRAPED,
            f"{which} kube-proxy's own metrics. {said}: loopback only, which Prometheus cannot "
            f"scrape from off the node. {fix}",
        )
    ]


_ON_EVENTS_ONLY = frozenset({Template.NETWORK_PROGRAMMING_P99})
"""Templates whose series a healthy kube-proxy exports only once it has programmed an
endpoints change (the real v1.37 kube-proxy on the sandbox's real nodes has none before):
a missing series before the first move says nothing about the scrape."""


def series_findings(
    spec: PolicySpec,
    eligible: Sequence[str],
    coverage: SeriesCoverage | None,
    *,
    source_local: bool,
    target_local: bool,
) -> list[Finding]:
    """Every template check must have Prometheus series for every eligible node."""
    analysis = spec.analysis
    if analysis is None or coverage is None or not eligible:
        return []
    measured = {c.name: c for c in coverage.checks}
    label = analysis.prometheus.node_label
    findings: list[Finding] = []
    missing_by_set: dict[tuple[str, ...], list[str]] = {}
    later: list[str] = []
    for check in analysis.checks:
        series = measured.get(check.name)
        if series is not None and series.invalid:
            findings.append(
                new_finding(
                    Severity.ERROR,
                    Code.QUERY_INVALID,
                    f"Check {check.name}'s query is not PromQL Prometheus accepts: it"
                    f" {series.invalid}. Every round would be inconclusive, after nodes"
                    f" moved. Fix spec.analysis.checks[{check.name}].query, then retry"
                    " (positions count in the query as sent, with {{nodes}} and {{by_node}}"
                    " filled in).",
                )
            )
            continue
        if check.template is None or series is None or check.template in _ON_EVENTS_ONLY:
            continue
        if series.error:
            findings.append(
                new_finding(
                    Severity.ERROR,
                    Code.METRIC_SERIES_MISSING,
                    f"Prometheus ({analysis.prometheus.url}) could not be asked for check "
                    f"{check.name}'s series before the first move: {series.error}. Fix "
                    f"spec.analysis.prometheus (URL, credentials, CA) or Prometheus itself.",
                )
            )
            continue
        missing = tuple(sorted(set(eligible) - series.nodes))
        if not missing:
            continue
        if (
            reads_kube_proxy(check)
            and source_local
            and not target_local
            and not needs_baseline(check)
        ):
            later.append(check.name)
            continue
        missing_by_set.setdefault(missing, []).append(check.name)
    for missing, checks in missing_by_set.items():
        kube_proxy = any(reads_kube_proxy(c) for c in analysis.checks if c.name in checks)
        exporter = (
            f"kube-proxy's /metrics (metricsBindAddress reachable, e.g. {SCRAPABLE_ADDRESS})"
            if kube_proxy
            else "node_exporter's conntrack gauges"
        )
        findings.append(
            new_finding(
                Severity.ERROR,
                Code.METRIC_SERIES_MISSING,
                f"Prometheus has no series for check{'s' if len(checks) > 1 else ''} "
                f"{', '.join(checks)} from {plural(len(missing), 'eligible node')} "
                f"({name_list(list(missing))}) of {len(eligible)}, so their rounds would have "
                f"no data once they move. Make Prometheus scrape {exporter} on every node, with "
                f"the node name in the label {label!r} (spec.analysis.prometheus.nodeLabel), "
                f"or narrow spec.nodeSelector to the nodes it scrapes.",
                missing,
            )
        )
    if later:
        findings.append(
            new_finding(
                Severity.WARNING,
                Code.METRIC_SERIES_MISSING,
                f"Check{'s' if len(later) > 1 else ''} {', '.join(later)}: the source "
                f"kube-proxies serve metrics on loopback only, so Prometheus has their series "
                f"only once a node runs the target kube-proxy (configOverrides sets its "
                f"metricsBindAddress); a canary that stays silent then shows as NoData.",
            )
        )
    return findings
