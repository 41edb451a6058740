"""Which decisions are read again from the server before they are acted on (pure rule)."""

from __future__ import annotations

import pytest

from proxymode.api.models import Phase, PolicyStatus
from proxymode.api.reasons import PauseReason, RollbackReason
from proxymode.engine.second_look import needs_second_look

RUNNING = PolicyStatus(phase=Phase.PROGRESSING)


def _status(phase: Phase, **fields: object) -> PolicyStatus:
    return PolicyStatus.model_validate({"phase": phase, **fields})


@pytest.mark.parametrize(
    "after",
    [
        _status(Phase.ROLLING_BACK, rollbackReason=RollbackReason.KUBE_PROXY_UNHEALTHY),
        _status(Phase.ROLLING_BACK, rollbackReason=RollbackReason.NODE_NOT_VERIFIED),
        _status(Phase.PAUSED, pausedReason=PauseReason.KUBE_PROXY_UNHEALTHY),
        _status(Phase.PAUSED, pausedReason=PauseReason.NODE_NOT_VERIFIED),
        _status(Phase.PAUSED, pausedReason=PauseReason.FINALIZE_STUCK),
        _status(Phase.FAILED),
    ],
)
def test_a_new_verdict_on_the_observed_cluster_is_read_again(after: PolicyStatus) -> None:
    assert needs_second_look(RUNNING, after)
    assert not needs_second_look(after, after), "already decided: nothing new to confirm"


@pytest.mark.parametrize(
    "after",
    [
        RUNNING,
        _status(Phase.ANALYZING),
        _status(Phase.COMPLETED),
        _status(Phase.ROLLING_BACK, rollbackReason=RollbackReason.ABORTED),
        _status(Phase.ROLLING_BACK, rollbackReason=RollbackReason.RETRY),
        _status(Phase.ROLLING_BACK, rollbackReason=RollbackReason.POLICY_DELETED),
        _status(Phase.ROLLING_BACK, rollbackReason=RollbackReason.ANALYSIS_FAILED),
        _status(Phase.ROLLING_BACK, rollbackReason=RollbackReason.NO_DATA),
        _status(Phase.PAUSED, pausedReason=PauseReason.SPEC),
        _status(Phase.PAUSED, pausedReason=PauseReason.PLAN_CHANGED),
        _status(Phase.PAUSED, pausedReason=PauseReason.NO_DATA),
        _status(Phase.PAUSED, pausedReason=PauseReason.ANALYSIS_FAILED),
    ],
)
def test_what_a_person_or_prometheus_decided_is_not(after: PolicyStatus) -> None:
    assert not needs_second_look(RUNNING, after)


def test_a_rollback_of_another_kind_is_new() -> None:
    """An abort's rollback keeps its reason (Aborted) whatever it meets: nothing new. A
    change of verdict (paused, then rolled back, for an unhealthy proxy) and a rollback
    that fails are new."""
    aborted = _status(Phase.ROLLING_BACK, rollbackReason=RollbackReason.ABORTED)
    paused = _status(Phase.PAUSED, pausedReason=PauseReason.KUBE_PROXY_UNHEALTHY)
    unhealthy = _status(Phase.ROLLING_BACK, rollbackReason=RollbackReason.KUBE_PROXY_UNHEALTHY)
    assert not needs_second_look(aborted, aborted)
    assert needs_second_look(paused, unhealthy)
    assert needs_second_look(aborted, _status(Phase.FAILED))
