"""Before the first move: does Prometheus have each check's series for the nodes?

Asked while the policy is Pending or in Preflight (nothing has changed yet), one query per
template check (``analysis.templates.series_query``) over every node the cluster has; the
engine's preflight compares the answer with the eligible nodes (``MetricSeriesMissing``).
So a node Prometheus does not scrape, or a node label that does not carry node names, is
found before a canary moves, not after it as NoData. Custom queries are asked only whether
Prometheus takes them as PromQL: their series may come only with the target mode.
"""

from __future__ import annotations

from collections.abc import Callable

from proxymode.analysis.templates import group_query, series_query
from proxymode.api.models import Analysis, Check, ProxyModePolicy, Template
from proxymode.engine.look import PREFLIGHT_OBSERVED
from proxymode.engine.observed import CheckSeries, Observed, SeriesCoverage
from proxymode.kube.reach import PrometheusAnswerError
from proxymode.kube.rounds import Prometheus

ASKED_IN = PREFLIGHT_OBSERVED


def due(policy: ProxyModePolicy, *, deleting: bool) -> bool:
    """Ask only while preflight runs (a policy with checks, not paused before preflight)."""
    return (
        not deleting
        and policy.spec.analysis is not None
        and not policy.spec.paused
        and policy.status.phase in ASKED_IN
    )


def coverage(
    prom: Prometheus, policy: ProxyModePolicy, observed: Observed, *, at: float | None = None
) -> SeriesCoverage:
    """Each template check's reporting nodes among ``observed.nodes``; errors per check."""
    analysis = policy.spec.analysis
    assert analysis is not None
    label = analysis.prometheus.node_label
    names = [n.name for n in observed.nodes if n.name]
    checks: list[CheckSeries] = []
    for check in analysis.checks:
        if not names:
            continue
        if check.template is None:
            invalid = _refused_as_promql(prom, check, analysis, names, at)
            if invalid:
                checks.append(CheckSeries(check.name, invalid=invalid))
            continue
        query = series_query(Template(check.template), nodes=names, node_label=label)
        try:
            rows = prom.values(query, at=at)
        except Exception as e:  # unreachable, refused: preflight says so and waits
            checks.append(CheckSeries(check.name, error=f"{type(e).__name__}: {e}"[:300]))
            continue
        checks.append(CheckSeries(check.name, frozenset(r.get(label, "") for r, _ in rows)))
    return SeriesCoverage(time=observed.now, checks=tuple(checks))


def _refused_as_promql(
    prom: Prometheus, check: Check, analysis: Analysis, names: list[str], at: float | None
) -> str:
    """Prometheus's words when it refuses a custom check's query as PromQL (``bad_data``: a
    typo every round would only call inconclusive, after nodes moved); empty otherwise.
    Other answers say nothing here: its series may exist only once nodes run the target."""
    try:
        query = group_query(
            check,
            nodes=names,
            node_label=analysis.prometheus.node_label,
            window_seconds=analysis.window_seconds,
        )
        prom.values(query, at=at)
    except PrometheusAnswerError as e:
        said = str(e)
        return said[:500] if "bad_data" in said else ""
    except Exception:  # unreachable, or not renderable: the rounds say so
        return ""
    return ""


def look(
    policy: ProxyModePolicy, observed: Observed, client_for: Callable[[Analysis], Prometheus]
) -> SeriesCoverage:
    """The coverage for ``observed``, through the policy's Prometheus client: the one the
    reconciler keeps per policy and settings (``client_for``), so asking costs no Secret
    read and leaves no CA file behind."""
    analysis = policy.spec.analysis
    assert analysis is not None
    try:
        prom = client_for(analysis)
    except Exception as e:  # a missing Secret: every check says why
        error = f"cannot reach Prometheus: {e}"[:300]
        return SeriesCoverage(
            time=observed.now,
            checks=tuple(
                CheckSeries(c.name, error=error) for c in analysis.checks if c.template is not None
            ),
        )
    return coverage(prom, policy, observed)
