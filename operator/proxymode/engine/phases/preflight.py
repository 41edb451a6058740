"""Pending / Preflight: check the cluster, plan the stages, start the rollout (DESIGN §6)."""

from __future__ import annotations

from collections.abc import Sequence

from proxymode.api.models import Finding, Phase, Preflight, Severity, StageStatus
from proxymode.api.reasons import EventReason, FailureReason
from proxymode.engine import naming
from proxymode.engine.actions import DeleteObject
from proxymode.engine.look import Look
from proxymode.engine.objects import BACKUP_RUN
from proxymode.engine.planner import plan_hash, plan_stages
from proxymode.engine.preflight import run_preflight
from proxymode.engine.preflight.codes import Code
from proxymode.engine.setup import changed_anything
from proxymode.engine.stages import eligible


def look(lk: Look) -> Phase | None:
    stale = lk.obs.backup is not None and lk.obs.backup.get(BACKUP_RUN) != str(lk.status.run)
    if stale:
        # A snapshot from an earlier run of this policy (a retry): the world was put back
        # from it; take a fresh one, never reuse a stale one. (A snapshot of this run means
        # the first status write was lost: go on with it.)
        if changed_anything(lk):
            lk.fail(
                FailureReason.STALE_CHANGES,
                "a previous run's changes are still in place; abort (roll back) before retrying",
            )
            return None
        ns, name = lk.spec.kube_proxy.namespace, naming.backup_config_map(lk.name)
        lk.actions.append(DeleteObject("v1", "ConfigMap", ns, name))
        lk.requeue = 1
        return None
    ahead = _ahead_of_me(lk)
    if ahead:
        # Created together with another policy on the same kube-proxy: one goes first,
        # decided the same way in both looks (creation time, then name); this one waits,
        # changing nothing, and then meets the first as AnotherPolicyInFlight.
        lk.status.message = (
            f"waiting: ProxyModePolicy {ahead} drives the same kube-proxy DaemonSet and was"
            " created first; only one policy may migrate it at a time"
        )
        lk.requeue = 10
        return None
    lk.status.started_time = lk.status.started_time or lk.now
    lk.transition(Phase.PREFLIGHT, EventReason.PREFLIGHT_STARTED, "checking the cluster")
    result = run_preflight(lk.spec, lk.obs)
    if lk.obs.backup is not None:
        # This run's snapshot exists: a status write after setup was lost, and any
        # proxymode.io/mode label is this run's own move, not one set before the policy.
        result = result.without(Code.NODES_ALREADY_LABELLED)
    elif any(f.code == Code.ANOTHER_POLICY_IN_FLIGHT for f in result.findings):
        # The labels are the other policy's moves: "remove the label" would pull its nodes
        # out from under it. That policy's finding says what to do.
        result = result.without(Code.NODES_ALREADY_LABELLED)
    lk.status.preflight = Preflight(
        passed=result.passed,
        checked_time=lk.now,
        findings=list(result.findings),
        excluded_nodes=list(result.excluded),
    )
    lk.status.baseline = result.baseline
    lk.status.source_mode = result.source_mode
    lk.status.target_mode = lk.target_mode
    if not result.passed and _waiting_for_series(lk, result.findings):
        # Only Prometheus's series are missing, and preflight is young: a scrape may not have
        # happened yet (a fresh node, a fresh Prometheus). Hold, changing nothing; after the
        # grace the refusal stands (the findings already say which nodes and checks).
        lk.status.message = (
            "waiting for Prometheus to have the checks' series for every eligible node"
            f" (up to {series_grace(lk)} s from the start of preflight); nothing changed"
        )
        lk.requeue = 5
        return None
    if not result.passed:
        errors = [f.message for f in result.findings if f.severity == Severity.ERROR]
        lk.fail(FailureReason.PREFLIGHT_FAILED, " ".join(errors))  # sentences, each with its stop
        return None
    nodes = eligible(lk)
    plan = plan_stages(lk.spec.stages, nodes)
    lk.status.stages = [
        StageStatus(name=s.name, nodes=p) for s, p in zip(lk.spec.stages, plan, strict=True)
    ]
    lk.status.plan_hash = plan_hash(lk.spec)
    lk.status.current_stage = 0
    lk.transition(
        Phase.PROGRESSING,
        EventReason.ROLLOUT_STARTED,
        f"moving {sum(len(p) for p in plan)} of {len(nodes)} eligible nodes from"
        f" {result.source_mode} to {lk.spec.target_mode} in {len(plan)} stages",
    )
    return Phase.PROGRESSING


SERIES_GRACE_MIN_SECONDS = 30


def series_grace(lk: Look) -> int:
    """How long preflight waits for missing series: two analysis intervals, at least 30 s."""
    interval = lk.spec.analysis.interval_seconds if lk.spec.analysis is not None else 0
    return max(SERIES_GRACE_MIN_SECONDS, 2 * interval)


def _waiting_for_series(lk: Look, findings: Sequence[Finding]) -> bool:
    errors = [f for f in findings if f.severity == Severity.ERROR]
    if not errors or any(f.code != Code.METRIC_SERIES_MISSING for f in errors):
        return False
    started = lk.status.started_time or lk.now
    return (lk.now - started).total_seconds() < series_grace(lk)


def _ahead_of_me(lk: Look) -> str | None:
    """The name of a not-yet-started rival that goes first, if any (earliest, then name)."""
    mine = (str(lk.policy.metadata.get("creationTimestamp") or ""), lk.name)
    earlier = sorted(p for p in lk.obs.facts.pending_policies if p < mine)
    return earlier[0][1] if earlier else None
