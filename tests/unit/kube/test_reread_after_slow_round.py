"""After a slow analysis round the look reads the policy again, so an abort, a pause or a
spec edit made while Prometheus answered is acted on in that look (pure: the API's read and
the round are stand-ins; the sandbox's tests cover the real ones)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from proxymode.engine.machine import advance
from proxymode.engine.observed import ACTION_ANNOTATION, AnalysisRound
from proxymode.kube import reconcile, rounds
from proxymode.kube.reconcile import Reconciler
from tests.unit.engine.seq import ANALYSIS, make_policy
from tests.unit.engine.sim import Sim

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


class _Reads(Reconciler):
    """A reconciler whose policy reads answer ``fresh``."""

    def __init__(self, fresh: dict[str, Any] | None) -> None:
        super().__init__(client.ApiClient())
        self.fresh_body = fresh
        self.reads = 0

    def read(self, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return copy.deepcopy(self.fresh_body)


def _wire(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    policy = make_policy(analysis=ANALYSIS, **spec)
    body = policy.model_dump(by_alias=True, mode="json", exclude_none=True)
    body["metadata"] = {**policy.metadata, "annotations": annotations or {}}
    return body


@pytest.fixture
def slow_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round is due and counts as slow."""
    monkeypatch.setattr(rounds, "round_due", lambda *_: True)
    monkeypatch.setattr(rounds, "run_round", lambda *_a, **_k: AnalysisRound(time=NOW, checks=()))
    monkeypatch.setattr(reconcile, "REREAD_AFTER_SECONDS", -1.0)


@pytest.mark.usefixtures("slow_round")
def test_an_abort_set_during_a_slow_round_is_in_the_look_that_decides() -> None:
    body = _wire()
    fresh = _wire({ACTION_ANNOTATION: "abort"})
    rec = _Reads(fresh)
    policy = reconcile.models.from_wire(body)
    observed = Sim.cluster({"general": 2}).observe(policy="to-nft")
    measured = rec._measure("to-nft", body, policy, observed, now=NOW, deleting=False)
    assert measured is not None
    got_body, got_policy, got = measured
    assert rec.reads == 1
    assert got_body["metadata"]["annotations"] == {ACTION_ANNOTATION: "abort"}
    assert got.action == "abort", "the engine reads the action from Observed"
    assert got.analysis is not None, "the same checks: the round is kept"
    assert got_policy.spec == policy.spec
    # And the engine, given that, aborts in this look.
    decision = advance(got_policy, got)
    assert decision.status.handled_action == "abort"


@pytest.mark.usefixtures("slow_round")
def test_a_deletion_during_a_slow_round_is_seen_and_a_policy_gone_is_not_acted_on() -> None:
    body = _wire()
    fresh = _wire()
    fresh["metadata"]["deletionTimestamp"] = "2026-12-06T12:00:01Z"
    policy = reconcile.models.from_wire(body)
    observed = Sim.cluster({"general": 2}).observe(policy="to-nft")
    measured = _Reads(fresh)._measure("to-nft", body, policy, observed, now=NOW, deleting=False)
    assert measured is not None and measured[2].deleting
    gone = _Reads(None)._measure("to-nft", body, policy, observed, now=NOW, deleting=False)
    assert gone is None


@pytest.mark.usefixtures("slow_round")
def test_an_edit_of_the_checks_drops_the_round_measured_for_the_old_ones() -> None:
    body = _wire()
    fresh = _wire()
    fresh["metadata"]["generation"] = 2
    fresh["spec"]["analysis"]["intervalSeconds"] = 30
    rec = _Reads(fresh)
    policy = reconcile.models.from_wire(body)
    observed = Sim.cluster({"general": 2}).observe(policy="to-nft")
    measured = rec._measure("to-nft", body, policy, observed, now=NOW, deleting=False)
    assert measured is not None
    _, got_policy, got = measured
    assert got_policy.spec.analysis is not None and got_policy.spec.analysis.interval_seconds == 30
    assert got.analysis is None
    assert got.generation == 2, "observedGeneration is the spec decided on"


@pytest.mark.usefixtures("slow_round")
def test_nothing_changed_keeps_the_first_read() -> None:
    body = _wire()
    rec = _Reads(copy.deepcopy(body))
    policy = reconcile.models.from_wire(body)
    observed = Sim.cluster({"general": 2}).observe(policy="to-nft")
    measured = rec._measure("to-nft", body, policy, observed, now=NOW, deleting=False)
    assert measured is not None
    got_body, got_policy, got = measured
    assert got_body is body and got_policy is policy and got.analysis is not None
