"""Which decisions are read again from the server before they are acted on (pure rule).

The first half states the rule on hand-made decisions; the second drives the engine through
the controller model (``sim.Sim``) into the verdicts that end in the phase they began in (a
retry that fails again, a resume that pauses again, a Failed policy deleted with its source
gone), which a rule comparing phases before and after would miss.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from proxymode.api.models import Phase, PolicyStatus
from proxymode.api.reasons import EventReason, PauseReason, RollbackReason, paused_event
from proxymode.api.status import HistoryEntry
from proxymode.engine import objects
from proxymode.engine.actions import Decision, SetNodeMode
from proxymode.engine.machine import advance
from proxymode.engine.observed import MODE_LABEL
from proxymode.engine.second_look import needs_second_look
from tests.unit.engine.seq import THREE_STAGES, Run, make_policy, terminal
from tests.unit.engine.sim import Sim

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RUNNING = PolicyStatus(
    phase=Phase.PROGRESSING,
    history=[HistoryEntry(time=NOW, phase=Phase.PROGRESSING, reason=EventReason.STAGE_STARTED)],
)


def _decided(phase: Phase, reason: str, **fields: object) -> Decision:
    """The decision of a look that went from RUNNING to ``phase`` (one history entry)."""
    entry = HistoryEntry(time=NOW.replace(minute=1), phase=phase, reason=reason)
    status = RUNNING.model_copy(
        update={"phase": phase, "history": [*RUNNING.history, entry], **fields}
    )
    return Decision(status=status)


def _rollback(reason: RollbackReason) -> Decision:
    return _decided(Phase.ROLLING_BACK, EventReason.ROLLBACK_STARTED, rollback_reason=reason)


def _pause(reason: PauseReason) -> Decision:
    return _decided(Phase.PAUSED, paused_event(reason), paused_reason=reason)


@pytest.mark.parametrize(
    "decision",
    [
        _rollback(RollbackReason.KUBE_PROXY_UNHEALTHY),
        _rollback(RollbackReason.NODE_NOT_VERIFIED),
        _pause(PauseReason.KUBE_PROXY_UNHEALTHY),
        _pause(PauseReason.NODE_NOT_VERIFIED),
        _pause(PauseReason.FINALIZE_STUCK),
        _decided(Phase.FAILED, "SourceMissing"),
        _decided(Phase.FAILED, "RollbackStuck"),
    ],
    ids=lambda d: f"{d.status.phase}-{d.status.history[-1].reason}",
)
def test_a_new_verdict_on_the_observed_cluster_is_read_again(decision: Decision) -> None:
    assert needs_second_look(RUNNING, decision)
    settled = Decision(status=decision.status)
    assert not needs_second_look(decision.status, settled), "already decided: nothing new"


@pytest.mark.parametrize(
    "decision",
    [
        Decision(status=RUNNING),
        _decided(Phase.ANALYZING, EventReason.STAGE_BAKING),
        _decided(Phase.COMPLETED, EventReason.COMPLETED),
        _rollback(RollbackReason.ABORTED),
        _rollback(RollbackReason.RETRY),
        _rollback(RollbackReason.POLICY_DELETED),
        _rollback(RollbackReason.ANALYSIS_FAILED),
        _rollback(RollbackReason.NO_DATA),
        _pause(PauseReason.SPEC),
        _pause(PauseReason.PLAN_CHANGED),
        _pause(PauseReason.NO_DATA),
        _pause(PauseReason.ANALYSIS_FAILED),
    ],
    ids=lambda d: f"{d.status.phase}-{d.status.history[-1].reason}",
)
def test_what_a_person_or_prometheus_decided_is_not(decision: Decision) -> None:
    assert not needs_second_look(RUNNING, decision)


def test_a_rollback_after_a_pause_for_the_same_reason_is_new() -> None:
    """Paused for an unhealthy proxy, then rolled back for it (a resume, or a person's
    ``rollback.automatic: true``): a new verdict. An abort's rollback that then fails is
    new too."""
    paused = _pause(PauseReason.KUBE_PROXY_UNHEALTHY).status
    entry = HistoryEntry(
        time=NOW.replace(minute=2), phase=Phase.ROLLING_BACK, reason="RollbackStarted"
    )
    unhealthy = paused.model_copy(
        update={
            "phase": Phase.ROLLING_BACK,
            "rollback_reason": RollbackReason.KUBE_PROXY_UNHEALTHY,
            "history": [*paused.history, entry],
        }
    )
    assert needs_second_look(paused, Decision(status=unhealthy))
    aborted = _rollback(RollbackReason.ABORTED).status
    stuck = HistoryEntry(time=NOW.replace(minute=3), phase=Phase.FAILED, reason="RollbackStuck")
    failed = aborted.model_copy(
        update={"phase": Phase.FAILED, "history": [*aborted.history, stuck]}
    )
    assert needs_second_look(aborted, Decision(status=failed))


def test_new_entries_count_when_the_history_is_full() -> None:
    """History keeps its last 50 entries: an entry that pushes the oldest out is new."""
    full = [
        HistoryEntry(time=NOW.replace(second=i), phase=Phase.PROGRESSING, reason="StageStarted")
        for i in range(50)
    ]
    before = RUNNING.model_copy(update={"history": full})
    failed = HistoryEntry(time=NOW.replace(minute=5), phase=Phase.FAILED, reason="BackupLost")
    after = before.model_copy(update={"phase": Phase.FAILED, "history": [*full[1:], failed]})
    assert needs_second_look(before, Decision(status=after))


def test_letting_a_policy_go_is_read_again_unless_nothing_is_left_to_undo() -> None:
    """A deletion's release rests on what was observed (source, snapshot, labels) unless the
    stored status already says the run is over: finalized, or RolledBack. Pending is read
    again: a look in Pending acts (preflight, even the first moves) before it stores, so a
    lost write leaves a changed cluster under a stored Pending."""
    strip = SetNodeMode("node-1", None, expect="nftables")
    assert needs_second_look(RUNNING, Decision(RUNNING, (strip,), release_finalizer=True))
    assert needs_second_look(RUNNING, Decision(RUNNING, (), release_finalizer=True))
    assert not needs_second_look(RUNNING, Decision(RUNNING, (strip,)))
    for settled in (
        RUNNING.model_copy(update={"phase": Phase.COMPLETED, "finalized": True}),
        RUNNING.model_copy(update={"phase": Phase.ROLLED_BACK}),
    ):
        assert not needs_second_look(settled, Decision(settled, (), release_finalizer=True))
    assert needs_second_look(PolicyStatus(), Decision(PolicyStatus(), (), release_finalizer=True))


def test_a_retry_that_starts_over_is_read_again() -> None:
    """``retry`` from Failed starts over (and preflight deletes the old run's snapshot) only
    when the cluster holds none of that run's changes: an observed choice."""
    entry = HistoryEntry(time=NOW.replace(minute=4), phase=Phase.PENDING, reason="Retry")
    failed = RUNNING.model_copy(update={"phase": Phase.FAILED})
    retried = PolicyStatus(phase=Phase.PREFLIGHT, history=[*failed.history, entry])
    assert needs_second_look(failed, Decision(status=retried))


# -- the engine's own decisions, through the controller model ------------------------------


def _looks(run: Run, count: int) -> list[bool]:
    """``count`` looks; for each, whether its decision would be read again."""
    flags = []
    for _ in range(count):
        before = run.policy.status
        flags.append(needs_second_look(before, run.step()))
    return flags


def test_a_retry_that_fails_again_is_read_again() -> None:
    """Failed (a node's kernel too old for nftables), then ``retry``: the look resets to
    Pending (read again: a retry), and the next, observed for preflight, fails it again (a
    new verdict, read again)."""
    sim = Sim.cluster({"canary": 1, "general": 1, "legacy": 1})
    run = Run(sim, make_policy())
    run.until(terminal, limit=50)
    assert run.policy.status.phase == Phase.FAILED, run.policy.status.message
    sim.action = "retry"
    assert _looks(run, 4) == [True, True, False, False]
    assert run.policy.status.phase == Phase.FAILED
    assert [h.reason for h in run.policy.status.history][-2:] == [
        "PreflightStarted",
        "PreflightFailed",
    ]


def test_a_resume_that_pauses_again_for_the_same_reason_is_read_again() -> None:
    """``rollback.automatic: false`` and a canary's proxy never Ready: Paused
    (KubeProxyUnhealthy), read again once; looks while paused are not; ``resume`` with the
    proxy still down pauses again for the same reason in the same look: read again."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    slow = [{**s, "bakeSeconds": 7200} for s in THREE_STAGES]
    policy = make_policy(stages=slow, readyTimeoutSeconds=20, rollback={"automatic": False})
    run = Run(sim, policy)
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    next(p for p in sim.pods if p.node == "canary-1").unready = 1000
    flags = []
    while run.policy.status.phase != Phase.PAUSED and len(flags) < 40:
        flags += _looks(run, 1)
    assert run.policy.status.paused_reason == PauseReason.KUBE_PROXY_UNHEALTHY
    assert flags[-1] and not any(flags[:-1]), flags
    assert _looks(run, 3) == [False, False, False]
    sim.action = "resume"
    assert _looks(run, 3) == [True, False, False]
    assert run.policy.status.paused_reason == PauseReason.KUBE_PROXY_UNHEALTHY
    assert [h.reason for h in run.policy.status.history][-2:] == [
        "Resumed",
        "PausedKubeProxyUnhealthy",
    ]


def test_deleting_a_failed_policy_whose_source_is_gone_is_read_again() -> None:
    """The source DaemonSet deleted mid-run: Failed (SourceMissing), read again. Deleting
    the policy then strips its labels and lets it go in one look, with no new history entry
    (it is Failed already): that release is read again too, since a cache that only lags
    behind a DaemonSet re-created would strip the labels of nodes that could go back."""
    sim = Sim.cluster({"canary": 2, "general": 2})
    run = Run(sim, make_policy(stages=[{**s, "bakeSeconds": 7200} for s in THREE_STAGES]))
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    del sim.objects[("DaemonSet", "kube-proxy")]
    assert _looks(run, 3) == [True, False, False]
    assert run.policy.status.phase == Phase.FAILED
    run.deleting = True
    run.checking = False  # the source is gone: no world to check against
    before = run.policy.status
    decision = run.step()
    assert decision.release_finalizer
    assert any(isinstance(a, SetNodeMode) and a.value is None for a in decision.actions)
    assert needs_second_look(before, decision)


def _aborted_without_labels(sim: Sim) -> Run:
    """A run aborted until no node is labelled, then Failed (SourceMissing: the source
    DaemonSet deleted, which the rollback cannot make again; a deleted ConfigMap it makes
    again from the snapshot), with its other changes in place (the source still patched)."""
    run = Run(sim, make_policy(stages=[{**s, "bakeSeconds": 7200} for s in THREE_STAGES]))
    run.checking = False  # the source ConfigMap goes: no world to check against
    run.until(lambda p: p.status.phase == Phase.ANALYZING)
    sim.action = "abort"
    run.until(
        lambda p: (
            p.status.phase == Phase.ROLLING_BACK
            and not any(MODE_LABEL in n.labels for n in sim.nodes.values())
        ),
        limit=60,
    )
    daemon_set = sim.objects.pop(("DaemonSet", "kube-proxy"))
    run.step()
    assert run.policy.status.phase == Phase.FAILED, run.policy.status.message
    sim.objects[("DaemonSet", "kube-proxy")] = daemon_set  # a person puts it back
    assert objects.source_is_patched(sim.get("DaemonSet", "kube-proxy"), "nftables")
    sim.action = None
    return run


def test_a_release_on_a_copy_that_lags_a_recreated_source_is_read_again() -> None:
    """The found case of the review: no label left to strip, so the release alone says
    the decision rests on the copy. On the server's copy the policy rolls back first."""
    run = _aborted_without_labels(Sim.cluster({"canary": 2, "general": 2}))
    run.deleting = True
    fresh = run.observe()
    cached = advance(run.policy, replace(fresh, source_daemon_set=None))
    assert cached.release_finalizer
    assert not any(isinstance(a, SetNodeMode) for a in cached.actions)
    assert needs_second_look(run.policy.status, cached)
    server = advance(run.policy, fresh)
    assert not server.release_finalizer
    assert server.status.phase == Phase.ROLLING_BACK


def test_a_retry_on_a_copy_that_misses_the_changes_is_read_again() -> None:
    """A retry decided on a copy without the patched source and the target DaemonSet: the
    run's snapshot, not the copy, says the run changed the cluster, so the copy does not
    start over (it did, and its next look deleted the snapshot); what it decides instead
    (Failed: no source to roll back to) is read again, and the server's copy rolls back."""
    run = _aborted_without_labels(Sim.cluster({"canary": 2, "general": 2}))
    run.step()
    run.sim.action = "retry"
    fresh = run.observe()
    cached = advance(run.policy, replace(fresh, source_daemon_set=None, target_daemon_set=None))
    assert cached.status.phase != Phase.PENDING, "started over on a copy"
    assert needs_second_look(run.policy.status, cached)
    server = advance(run.policy, fresh)
    assert server.status.phase == Phase.ROLLING_BACK
    assert server.status.rollback_reason == RollbackReason.RETRY
