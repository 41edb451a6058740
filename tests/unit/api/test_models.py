"""The pydantic models refuse what the CRD refuses, with the same words where we wrote them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxymode.api.models import PolicySpec, ProxyModePolicy
from tests.policy_cases import InvalidCase, invalid_cases, valid_base

CASES = invalid_cases()


def test_the_corpus_is_big_enough() -> None:
    assert len(CASES) >= 12
    assert len({c.name for c in CASES}) == len(CASES)


def test_the_base_spec_is_valid_and_defaults_apply() -> None:
    spec = PolicySpec.model_validate(valid_base())
    assert spec.target_mode == "nftables"
    assert spec.kube_proxy.daemon_set == "kube-proxy"
    assert spec.kube_proxy.config_key == "config.conf"
    assert spec.max_unavailable == 1
    assert spec.rollback.automatic is True
    assert spec.finalize is True and spec.paused is False
    assert [s.bake_seconds for s in spec.stages] == [30, 30, 30]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_invalid_spec_is_refused_by_the_model(case: InvalidCase) -> None:
    with pytest.raises(ValidationError) as refused:
        PolicySpec.model_validate(case.spec)
    assert case.model in str(refused.value)


def test_wire_form_is_camel_case_and_round_trips() -> None:
    spec = PolicySpec.model_validate(
        {
            **valid_base(),
            "maxUnavailable": "25%",
            "analysis": {
                "prometheus": {"url": "http://prometheus:9090"},
                "checks": [{"name": "p99", "template": "SyncLatencyP99", "maxSeconds": 1}],
            },
        }
    )
    wire = spec.wire()
    assert wire["maxUnavailable"] == "25%"
    assert wire["analysis"]["checks"][0] == {
        "name": "p99",
        "template": "SyncLatencyP99",
        "maxSeconds": 1.0,
    }
    assert "onNoData" in wire["analysis"] and wire["analysis"]["onNoData"] == "Pause"
    assert PolicySpec.model_validate(wire) == spec


def test_a_whole_object_parses_with_unknown_status_fields_ignored() -> None:
    obj = {
        "apiVersion": "proxymode.io/v1alpha1",
        "kind": "ProxyModePolicy",
        "metadata": {"name": "to-nftables", "generation": 2},
        "spec": valid_base(),
        "status": {"phase": "Progressing", "currentStage": 1, "fromTheFuture": True},
    }
    policy = ProxyModePolicy.model_validate(obj)
    assert policy.status.phase == "Progressing"
    assert policy.status.current_stage == 1
