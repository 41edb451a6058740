"""Analysis rounds: ask Prometheus about the canary and baseline groups, judge each check.

One round sends, for each check, one query for the canary group and (when the check
compares against a baseline) one for the baseline group, by POST so that a group of
thousands of nodes fits; per-node queries only for ``mannWhitney``. What Prometheus says
(or that it could not be reached) becomes a ``Sample``; the pure judge turns samples into
verdicts; the engine counts them.

Groups (DESIGN §5): the canary is every planned node that runs the target mode now; the
baseline is every planned node still on the source mode. At the last stage there is no
baseline group left, so the engine keeps the baseline values of the first round it saw
(``status.baseline.metrics``) and those stand in.

Credentials come from Secrets in the operator's own namespace (``POD_NAMESPACE``).
"""

from __future__ import annotations

import base64
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

import requests
from kubernetes import client

from proxymode.analysis import (
    Sample,
    clipped_window,
    group_query,
    judge,
    node_matcher,
    per_node_query,
)
from proxymode.api.models import Analysis, Check, ProxyModePolicy, SecretKeyRef, Switch
from proxymode.engine import gate
from proxymode.engine.gate import round_due
from proxymode.engine.observed import AnalysisRound, CheckOutcome, Observed
from proxymode.kube import reach

OPERATOR_NAMESPACE_ENV = "POD_NAMESPACE"
ROUND_WORKERS = 8
"""Checks of one round queried side by side (a policy has at most 16)."""
__all__ = ["Prometheus", "groups", "measure", "round_due", "run_round", "settled_canary"]


def groups(policy: ProxyModePolicy, observed: Observed) -> tuple[list[str], list[str]]:
    """(canary, baseline), as the pure gate forms them."""
    formed = gate.groups(policy, observed)
    return formed.canary, formed.baseline


def _switch_floor(policy: ProxyModePolicy) -> datetime | None:
    """When the current stage's last node arrived on the target mode (it began baking)."""
    status = policy.status
    index = status.current_stage
    if index is None or not (0 <= index < len(status.stages)):
        return None
    return status.stages[index].baked_since


def settled_canary(
    canary: Sequence[str],
    switches: Sequence[Switch],
    now: datetime,
    floor: datetime | None,
    window_seconds: int,
) -> list[str]:
    """The canary without nodes whose window still holds their old proxy's samples.

    A node that arrived on the target mode while the stage bakes (a newcomer, a node moved
    again) switched after ``floor``; it joins the group once a whole window has passed since,
    so the window can stay clipped to ``floor`` alone (issue 9 items 19 and 27). When it
    switched is the engine's record (``status.recentSwitches``), not its target pod's age:
    a roll of the target DaemonSet's template (a person's image bump reaches it) makes every
    pod new on nodes that never left the target mode, and read as every canary just switched,
    the group was empty and the rounds "had no canary" (a review)."""
    if floor is None:
        return list(canary)
    fresh = {
        s.node
        for s in switches
        if s.time > floor and (now - s.time).total_seconds() < window_seconds
    }
    return [name for name in canary if name not in fresh]


class Prometheus:
    """A Prometheus client for one policy's ``analysis.prometheus`` settings.

    Queries go as a form-encoded POST body to ``/api/v1/query``: a group matcher for
    thousands of nodes is about a megabyte, over Prometheus's (Go's) 1 MiB header limit and
    far over a reverse proxy's URL limit. (prometheus-api-client's ``custom_query`` puts the
    query in the URL even with ``method="POST"``, so it is not used for this.)
    """

    def __init__(self, api: client.ApiClient, analysis: Analysis) -> None:
        source = analysis.prometheus
        namespace = os.environ.get(OPERATOR_NAMESPACE_ENV, "proxymode-system")
        self.core = client.CoreV1Api(api)
        self.url = source.url.rstrip("/") + "/api/v1/query"
        self.timeout = source.timeout_seconds
        self.session = requests.Session()
        # Passed with every request: a session-level verify loses to REQUESTS_CA_BUNDLE /
        # CURL_CA_BUNDLE in the environment, which would silently drop the policy's CA.
        self.verify: bool | str = True
        self.ca_file: str | None = None
        """The temporary CA bundle this client wrote (removed by ``close``)."""
        service = reach.use_service_proxy(source.url)
        if service is not None:  # outside the cluster: through the API server (reach.py)
            if source.bearer_token is not None or source.basic_auth is not None:
                raise ValueError(
                    f"{source.url} is an in-cluster Service and this operator runs outside"
                    " the cluster: it reaches it through the API server's service proxy,"
                    " which cannot pass bearerToken or basicAuth; run the operator in the"
                    " cluster, or give a URL reachable from where it runs"
                )
            self.url = service.through(api.configuration.host) + "/api/v1/query"
            self.verify = reach.api_server_session(api, self.session)
            return
        if source.bearer_token is not None:
            token = self._secret(namespace, source.bearer_token)
            self.session.headers["Authorization"] = f"Bearer {token}"
        if source.basic_auth is not None:
            self.session.auth = (
                self._secret(namespace, source.basic_auth.username),
                self._secret(namespace, source.basic_auth.password),
            )
        if source.insecure_skip_verify:
            self.verify = False
        elif source.ca is not None:
            pem = self._secret(namespace, source.ca)  # before the file: a missing key leaves none
            bundle = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives until close()
                "w", suffix=".pem", prefix="proxymode-ca-", delete=False
            )
            with bundle:
                bundle.write(pem)
            self.verify = bundle.name
            self.ca_file = bundle.name

    def close(self) -> None:
        """Close the session and remove the temporary CA bundle, if one was written."""
        self.session.close()
        if self.ca_file is not None:
            Path(self.ca_file).unlink(missing_ok=True)
            self.ca_file = None

    def _secret(self, namespace: str, ref: SecretKeyRef) -> str:
        secret = self.core.read_namespaced_secret(ref.name, namespace)
        data = (secret.data or {}).get(ref.key)
        if data is None:
            raise KeyError(f"secret {namespace}/{ref.name} has no key {ref.key!r}")
        return base64.b64decode(data).decode().strip()

    def values(self, query: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query's rows, (labels, value); ``at`` is a Unix time (default: now)."""
        form = {"query": query, "timeout": f"{self.timeout}s"}
        if at is not None:
            form["time"] = f"{at:.3f}"
        response = self.session.post(
            self.url, data=form, timeout=self.timeout + 5, verify=self.verify
        )
        data = reach.prometheus_data(response)
        if data.get("resultType") == "scalar":
            return [({}, float(data["result"][1]))]
        return [(dict(r.get("metric") or {}), float(r["value"][1])) for r in data["result"]]


def _single(rows: list[tuple[dict[str, str], float]]) -> float | None:
    values = [v for _, v in rows if not math.isnan(v)]
    return values[0] if len(values) == 1 else (max(values) if values else None)


def measure(
    prom: Prometheus,
    check: Check,
    analysis: Analysis,
    *,
    canary: Sequence[str],
    baseline: Sequence[str],
    recorded_baseline: float | None,
    canary_window: int | None = None,
    record_baseline: bool = False,
) -> Sample:
    """Query one check for both groups; any failure makes an Inconclusive sample, never a pass.

    ``canary_window`` is the canary's range clipped to its latest switch (``clipped_window``);
    the baseline group never switched, so it keeps the whole window. The baseline group is
    asked when the check compares with it, and when ``record_baseline`` says the status has
    no settled value of it yet (a check with absolute bounds too: the engine retries every
    round until one is kept, and a round before the first move that Prometheus could not
    answer must not leave the check without one for the whole run)."""
    label, window = analysis.prometheus.node_label, analysis.window_seconds
    clipped = canary_window or window
    needs_baseline = check.max_ratio_to_baseline is not None or check.mann_whitney is not None
    baseline_value = recorded_baseline
    if baseline and record_baseline and not needs_baseline:
        # Asked only to record it: on its own, so a baseline query Prometheus cannot answer
        # never costs the canary's verdict. None then, not the value held: a provisional
        # one handed back would be kept as if measured (recorded on a later round instead).
        baseline_value = _baseline_only(prom, check, analysis, baseline)
    try:
        canary_value = _single(
            prom.values(group_query(check, nodes=canary, node_label=label, window_seconds=clipped))
        )
        if baseline and needs_baseline:
            baseline_value = _single(
                prom.values(
                    group_query(check, nodes=baseline, node_label=label, window_seconds=window)
                )
            )
        canary_nodes: tuple[float, ...] = ()
        baseline_nodes: tuple[float, ...] = ()
        if check.mann_whitney is not None and baseline:
            canary_nodes = tuple(
                v
                for _, v in prom.values(
                    per_node_query(check, nodes=canary, node_label=label, window_seconds=clipped)
                )
            )
            baseline_nodes = tuple(
                v
                for _, v in prom.values(
                    per_node_query(check, nodes=baseline, node_label=label, window_seconds=window)
                )
            )
    except Exception as e:  # unreachable, refused, timed out: no data, not a verdict
        return Sample(canary=None, error=f"Prometheus: {type(e).__name__}: {e}"[:300])
    return Sample(
        canary_value,
        baseline_value,
        canary_nodes,
        baseline_nodes,
        canary_size=len(canary),
        baseline_size=len(baseline),
    )


def _baseline_only(
    prom: Prometheus, check: Check, analysis: Analysis, baseline: Sequence[str]
) -> float | None:
    """The baseline group's value alone (no canary yet); None when Prometheus cannot say."""
    label = analysis.prometheus.node_label
    query = group_query(
        check, nodes=baseline, node_label=label, window_seconds=analysis.window_seconds
    )
    try:
        value = _single(prom.values(query))
    except Exception:  # recorded on a later round instead
        return None
    # An infinite value (a quantile above the top bucket) is no baseline, and JSON cannot
    # carry it into the status.
    return value if value is not None and math.isfinite(value) else None


COVERAGE_METRIC = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"


def _silent_nodes(prom: Prometheus, analysis: Analysis, nodes: Sequence[str]) -> list[str]:
    """Canary nodes from which Prometheus has no kube-proxy series right now."""
    label = analysis.prometheus.node_label
    query = f"count by ({label}) ({COVERAGE_METRIC}{{{node_matcher(nodes, label)}}})"
    try:
        reporting = {labels.get(label, "") for labels, _ in prom.values(query)}
    except Exception:  # Prometheus itself is unreachable: the checks will say so
        return []
    return sorted(set(nodes) - reporting)


def run_round(
    api: client.ApiClient,
    policy: ProxyModePolicy,
    observed: Observed,
    now: datetime,
    client_for: Callable[[Analysis], Prometheus] | None = None,
) -> AnalysisRound:
    """Measure and judge every check once; the round the engine counts.

    ``client_for`` hands out a kept client (the reconciler keeps one per policy and
    settings); without it a client is made for this round and closed after it.
    """
    analysis = policy.spec.analysis
    assert analysis is not None
    if client_for is None:
        own: list[Prometheus] = []

        def client_for(a: Analysis) -> Prometheus:
            own.append(Prometheus(api, a))
            return own[-1]

        try:
            return run_round(api, policy, observed, now, client_for)
        finally:
            for made in own:
                made.close()
    canary, baseline = groups(policy, observed)
    floor = _switch_floor(policy)
    canary = settled_canary(
        canary, policy.status.recent_switches, now, floor, analysis.window_seconds
    )
    since = (now - floor).total_seconds() if floor is not None else None
    window = clipped_window(analysis.window_seconds, since)
    recorded = policy.status.baseline.metrics if policy.status.baseline else {}
    provisional = set(policy.status.baseline.provisional) if policy.status.baseline else set()
    outcomes: list[CheckOutcome] = []
    baseline_values: dict[str, float] = {}
    try:
        prom: Prometheus | None = client_for(analysis)
        setup_error = ""
    except Exception as e:  # a missing Secret: every check is inconclusive, and says why
        prom, setup_error = None, f"cannot reach Prometheus: {e}"
    silent = _silent_nodes(prom, analysis, canary) if prom is not None and canary else []

    def one(check: Check) -> tuple[CheckOutcome, float | None]:
        """One check's outcome, and the baseline value it measured (or None)."""
        kept: float | None = None
        if prom is None or not canary:
            sample = Sample(canary=None, error=setup_error or "no canary node runs the target mode")
            if prom is not None and baseline:  # before the first move: the baseline still
                kept = _baseline_only(prom, check, analysis, baseline)  # counts (item 12)
        elif silent:
            # A group value from the nodes that do report would hide the ones that do not.
            shown = ", ".join(silent[:5]) + (
                f" and {len(silent) - 5} more" if len(silent) > 5 else ""
            )
            sample = Sample(
                canary=None,
                error=f"no kube-proxy metrics from {shown} ({len(silent)} of {len(canary)}"
                " canary nodes)",
            )
        else:
            sample = measure(
                prom,
                check,
                analysis,
                canary=canary,
                baseline=baseline,
                recorded_baseline=recorded.get(check.name),
                canary_window=window,
                record_baseline=check.name not in recorded or check.name in provisional,
            )
            if baseline and sample.baseline is not None:
                kept = sample.baseline
        return judge(check, sample), kept

    # The checks side by side: a round takes its slowest query, not the sum of them (six
    # checks on a Prometheus answering in 4 s held a look, and an abort, for 16 s).
    with ThreadPoolExecutor(
        max_workers=max(1, min(ROUND_WORKERS, len(analysis.checks))),
        thread_name_prefix="round",
    ) as pool:
        for check, (outcome, kept) in zip(
            analysis.checks, pool.map(one, analysis.checks), strict=True
        ):
            outcomes.append(outcome)
            if kept is not None:
                baseline_values[check.name] = kept
    return AnalysisRound(
        time=now,
        checks=tuple(outcomes),
        baseline_values=baseline_values,
        window_start=now - timedelta(seconds=window),
    )
