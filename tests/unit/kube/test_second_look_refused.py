"""A second look the API server refuses (403): held, except a deleted policy still Pending,
which goes as a refused first look lets it (pure: the fresh observer is a stand-in)."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from proxymode.api.models import Phase, PolicyStatus
from proxymode.engine.actions import Decision
from proxymode.kube.reconcile import Reconciler
from tests.unit.engine.seq import make_policy
from tests.unit.engine.sim import Sim


class _Refused:
    def observe(self, *_: Any, **__: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden")


def _reconciler() -> Reconciler:
    rec = Reconciler(client.ApiClient())
    rec.fresh = _Refused()  # type: ignore[assignment]
    return rec


def test_a_refused_second_look_lets_a_deleted_pending_policy_go() -> None:
    policy = make_policy()
    observed = Sim.cluster({"general": 2}).observe(deleting=True, policy="to-nft")
    release = Decision(PolicyStatus(), release_finalizer=True)
    got, _ = _reconciler()._second_look("to-nft", policy, observed, release, deleting=True)
    assert got.release_finalizer


def test_a_refused_second_look_holds_a_started_policy_s_release_and_says_why() -> None:
    started = PolicyStatus(phase=Phase.PROGRESSING)
    policy = make_policy().model_copy(update={"status": started})
    observed = Sim.cluster({"general": 2}).observe(deleting=True, policy="to-nft")
    release = Decision(started, release_finalizer=True)
    got, _ = _reconciler()._second_look("to-nft", policy, observed, release, deleting=True)
    assert not got.release_finalizer and not got.actions
    assert "HTTP 403: Forbidden" in (got.status.message or ""), got.status.message
    assert "letting the deleted policy go" in (got.status.message or "")
