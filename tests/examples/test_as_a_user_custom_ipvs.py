"""``make sandbox``, then the custom-query example and the ipvs one (user_steps.py says how and
why)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from proxymode_sandbox import Sandbox, kubeadm_proxy
from tests.examples.user_steps import (
    KUBE_SYSTEM,
    apply_as_a_user,
    assert_finalized,
    cli,
    config_mode,
    delete_policy,
    ipvs_available,
    made,
    modes,
    verdicts,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1200)]
__all__ = ["made"]  # the module-scoped sandbox fixture, one per module that imports it


def first_round_judged(status: Mapping[str, Any]) -> bool:
    """The canary's first round is in: the example's point is to be seen before promoting."""
    return verdicts(status).get("sync-failures") in ("Pass", "Fail")


def test_custom_query_without_data_is_inconclusive_never_a_pass(made: Sandbox) -> None:
    """custom-success-rate-check.yaml asks for Envoy's series, which the sandbox has not (no
    ingress): as the example says, a query that returns nothing is Inconclusive, never a
    pass, while the built-in check next to it passes. A person promotes; it finalizes."""
    name = "iptables-to-nftables-edge"
    rounds: list[dict[str, str]] = []

    def seen_and_judged(status: Mapping[str, Any]) -> bool:
        """On the canary stage, wait for its first round; later stages promote at once."""
        if rounds:
            return True
        if first_round_judged(status):
            rounds.append(verdicts(status))
            return True
        return False

    try:
        name, status = apply_as_a_user(
            made, "custom-success-rate-check.yaml", before_promote=seen_and_judged
        )
        assert rounds[0] == {"edge-success-rate": "Inconclusive", "sync-failures": "Pass"}
        assert "edge-success-rate" not in status["baseline"]["metrics"], "no data, no value"
        assert_finalized(made, status, "nftables")
    finally:
        delete_policy(made, name)
        cli(made.dir, "reset-kube-proxy")
    # As `up` installed it: the finalized run left its exclusion term (KeepExclusionTerm,
    # owned by the operator's field manager), which an apply alone kept (a review).
    ds = made.get_json("daemonset", kubeadm_proxy.NAME, namespace=KUBE_SYSTEM)
    assert "proxymode.io" not in json.dumps(ds["spec"]), ds["spec"]["template"]["spec"]


def test_ipvs_example_as_far_as_this_kernel_allows(made: Sandbox) -> None:
    """iptables-to-ipvs-metallb.yaml. With IPVS in the kernel: Completed, finalized, strictARP
    in kube-system's config. Without (a container, as on this project's machines), the real
    nodes' kube-proxy refuses ipvs at start: the operator rolls back by itself and names the
    node, and every node runs iptables again. Which one is decided by the kernel, not here."""
    name = "iptables-to-ipvs"
    try:
        name, status = apply_as_a_user(made, "iptables-to-ipvs-metallb.yaml")
        if ipvs_available():
            assert_finalized(made, status, "ipvs")
            conf = made.get_json("configmap", kubeadm_proxy.NAME, namespace=KUBE_SYSTEM)
            assert yaml.safe_load(conf["data"]["config.conf"])["ipvs"]["strictARP"] is True
        else:
            assert status["phase"] == "RolledBack", status.get("message")
            real = made.real_node_names()
            assert "KubeProxyUnhealthy" in status["message"]
            assert any(n in status["message"] for n in real), status["message"]
            assert set(modes(made).values()) == {None}
            assert config_mode(made) == "iptables"
            print(f"  no IPVS on this machine: {status['message']}")
    finally:
        delete_policy(made, name)
