"""``make sandbox``, then the two nftables examples that need nothing else: mixed mode and the
canary (user_steps.py says how and why)."""

from __future__ import annotations

import pytest

from proxymode_sandbox import Sandbox, kubeadm_proxy
from tests.examples.user_steps import (
    apply_as_a_user,
    assert_finalized,
    cli,
    config_mode,
    daemon_sets,
    delete_policy,
    made,
    modes,
    nft_table_on_real_nodes,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(1200)]
__all__ = ["made"]  # the module-scoped sandbox fixture, one per module that imports it


def test_partial_pools_end_in_mixed_mode(made: Sandbox) -> None:
    """partial-pools-mixed-mode.yaml needs a legacy pool, which the default sandbox lacks:
    the user adds one node to it (``proxymode-sandbox node add legacy``, examples README).
    End: Completed, finalized false, the legacy node on iptables; deleting the policy rolls
    every moved node back."""
    cli(made.dir, "node", "add", "legacy")
    try:
        name, status = apply_as_a_user(made, "partial-pools-mixed-mode.yaml")
        assert status["phase"] == "Completed", (status.get("message"), status.get("history"))
        assert status["finalized"] is False and "mixed mode" in status["message"]
        now = modes(made)
        assert now.pop("legacy-1") is None, "the legacy node stays with the source"
        assert set(now.values()) == {"nftables"}, now
        assert daemon_sets(made) == [kubeadm_proxy.NAME, f"{kubeadm_proxy.NAME}-nftables"]
        assert config_mode(made) == "iptables", "the source ConfigMap is untouched"
        assert all(nft_table_on_real_nodes(made).values()), "real nodes run nftables"
        delete_policy(made, name)
        assert set(modes(made).values()) == {None}
        assert daemon_sets(made) == [kubeadm_proxy.NAME]
    finally:
        delete_policy(made, "nftables-canary-and-general")
        cli(made.dir, "node", "remove", "legacy-1")


def test_nftables_canary_completes_and_finalizes(made: Sandbox) -> None:
    """iptables-to-nftables-canary.yaml: four stages (on six nodes the 25 % stage adds none
    to the canaries: a preflight Warning, done at once), then kube-system's kube-proxy says
    nftables."""
    name = "iptables-to-nftables"
    try:
        name, status = apply_as_a_user(made, "iptables-to-nftables-canary.yaml")
        assert_finalized(made, status, "nftables")
        assert all(nft_table_on_real_nodes(made).values())
        print(f"  baseline through the Service: {status['baseline']['metrics']}")
    finally:
        delete_policy(made, name)
        cli(made.dir, "reset-kube-proxy")
