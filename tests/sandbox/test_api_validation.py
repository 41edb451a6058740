"""The real API server refuses bad ProxyModePolicies with messages a person understands.

The CRD from crds/ is installed into the sandbox; every case of the shared invalid-spec
corpus is refused (schema bounds, enums, CEL), nothing is stored, and the transition
rule keeps targetMode fixed while a rollout is in flight.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from proxymode.api import models
from tests.policy_cases import InvalidCase, invalid_cases, valid_base

CASES = invalid_cases()
G, V, P = models.GROUP, models.VERSION, models.PLURAL


@pytest.fixture(scope="module")
def policies(api: client.ApiClient, crd: str) -> client.CustomObjectsApi:
    """The custom-objects API, with the CRD installed."""
    return client.CustomObjectsApi(api)


def message(error: ApiException) -> str:
    """The Status message the API server sent (what kubectl prints)."""
    return str(json.loads(error.body)["message"])


def policy(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": models.KIND, "metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_invalid_spec_is_refused_and_nothing_is_stored(
    policies: client.CustomObjectsApi, case: InvalidCase
) -> None:
    name = f"bad-{case.name}"[:40]
    with pytest.raises(ApiException) as refused:
        policies.create_cluster_custom_object(
            G, V, P, policy(name, case.spec), field_validation="Strict"
        )
    assert refused.value.status in (400, 422), refused.value.body  # 400: unknown field
    assert case.apiserver in message(refused.value)
    with pytest.raises(ApiException) as missing:
        policies.get_cluster_custom_object(G, V, P, name)
    assert missing.value.status == 404


def test_a_long_name_is_refused(policies: client.CustomObjectsApi) -> None:
    with pytest.raises(ApiException) as refused:
        policies.create_cluster_custom_object(G, V, P, policy("x" * 41, valid_base()))
    assert "the policy name must be at most 40 characters" in message(refused.value)


def test_defaults_are_applied_by_the_api_server(policies: client.CustomObjectsApi) -> None:
    name = f"defaults-{uuid.uuid4().hex[:6]}"
    try:
        created = policies.create_cluster_custom_object(G, V, P, policy(name, valid_base()))
        spec = created["spec"]
        assert spec["kubeProxy"] == {
            "namespace": "kube-system",
            "daemonSet": "kube-proxy",
            "configMap": "kube-proxy",
            "configKey": "config.conf",
        }
        assert spec["maxUnavailable"] == 1 and spec["paused"] is False and spec["finalize"] is True
        assert spec["rollback"] == {"automatic": True}
        assert spec["incompatibleNodes"] == "Refuse"
        assert models.PolicySpec.model_validate(spec).stages[0].name == "canary"
    finally:
        policies.delete_cluster_custom_object(G, V, P, name)


def under_phase(
    policies: client.CustomObjectsApi,
    name: str,
    phase: str,
    spec: dict[str, Any],
    backup: dict[str, str] | None = None,
) -> ApiException | None:
    """Patch ``spec`` while the stored phase is ``phase``: the refusal, or None if accepted.

    The worker's operator is session-wide and may be running: it can write its own status
    between the phase written here and the spec patch. The CEL rule is judged only on a
    patch made while the stored phase is still the one written, so such a race is retried;
    an accepted patch is undone before a retry.
    """
    before = policies.get_cluster_custom_object(G, V, P, name)["spec"]
    for _ in range(10):
        stored = {"phase": phase, "backup": backup}  # no backup: the field is cleared
        policies.patch_cluster_custom_object_status(G, V, P, name, {"status": stored})
        try:
            policies.patch_cluster_custom_object(G, V, P, name, {"spec": spec})
        except ApiException as refused:
            if refused.status != 422:
                raise  # not the CEL rule's refusal: the test says what it was
            if policies.get_cluster_custom_object(G, V, P, name)["status"]["phase"] == phase:
                return refused
            continue
        got = policies.get_cluster_custom_object(G, V, P, name)
        # Accepted under what this wrote only if it is still stored: the operator's own
        # write in between may have cleared the snapshot (CI's run of b3c36f4).
        if got["status"].get("phase") == phase and got["status"].get("backup") == backup:
            return None
        _undo(policies, name, phase, {k: before.get(k) for k in spec})
    pytest.fail(f"the stored phase moved off {phase} around every one of 10 spec patches")


def _undo(policies: client.CustomObjectsApi, name: str, phase: str, undo: dict[str, Any]) -> None:
    """Put the spec back, under a stored phase in which the CEL rules allow every change
    (Pending, no snapshot): the operator may meanwhile have stored a phase under which they
    refuse the undo itself (CI's run of 2e4e101: a 422 on the undo, after the operator had
    acted on the accepted patch). It was written under ``phase``, the very phase whose
    refusal is tested, so it passed only when the operator's own write came in between
    (CI's run of 693e808: ten refusals in a row for kubeProxy under Analyzing)."""
    for _ in range(10):
        policies.patch_cluster_custom_object_status(
            G, V, P, name, {"status": {"phase": "Pending", "backup": None}}
        )
        try:
            policies.patch_cluster_custom_object(G, V, P, name, {"spec": undo})
            return
        except ApiException as refused:
            if refused.status != 422:
                raise
    pytest.fail(f"could not put the spec back after testing it under {phase} in 10 tries")


def test_target_mode_is_immutable_while_a_rollout_is_in_flight(
    policies: client.CustomObjectsApi,
) -> None:
    name = f"immutable-{uuid.uuid4().hex[:6]}"
    policies.create_cluster_custom_object(G, V, P, policy(name, valid_base()))
    try:
        policies.patch_cluster_custom_object(G, V, P, name, {"spec": {"targetMode": "ipvs"}})

        refused = under_phase(policies, name, "Progressing", {"targetMode": "nftables"})
        assert refused is not None, "targetMode changed while the stored phase was Progressing"
        assert refused.status == 422
        assert "targetMode cannot change while a rollout is in flight" in message(refused)
        # Other fields may still change mid-rollout (e.g. pausing it).
        assert under_phase(policies, name, "Progressing", {"paused": True}) is None

        # Nor the kube-proxy it migrates (the snapshot and the patched source are that one's).
        other = {"kubeProxy": {"namespace": "elsewhere"}}
        refused = under_phase(policies, name, "Analyzing", other)
        assert refused is not None and refused.status == 422, "kubeProxy changed mid-rollout"
        assert "kubeProxy cannot change while a rollout is in flight" in message(refused)

        assert under_phase(policies, name, "RolledBack", {"targetMode": "nftables"}) is None
        got = policies.get_cluster_custom_object(G, V, P, name)
        assert got["spec"]["targetMode"] == "nftables" and got["spec"]["paused"] is True
        assert under_phase(policies, name, "Failed", other) is None  # refused at preflight
        # A run that failed after changing something (its snapshot) still holds that kube-proxy.
        back = {"kubeProxy": {"namespace": "kube-system"}}
        refused = under_phase(
            policies, name, "Failed", back, backup={"namespace": "x", "name": "y"}
        )
        assert refused is not None and refused.status == 422, "changed under a snapshot"
        # So does its target mode: a retry under another mode left the old pair behind.
        refused = under_phase(
            policies, name, "Failed", {"targetMode": "ipvs"}, backup={"namespace": "x", "name": "y"}
        )
        assert refused is not None and refused.status == 422, "targetMode under a snapshot"
        assert under_phase(policies, name, "Failed", {"targetMode": "ipvs"}) is None
        assert under_phase(policies, name, "Preflight", {"targetMode": "nftables"}) is None
    finally:
        policies.delete_cluster_custom_object(G, V, P, name)
