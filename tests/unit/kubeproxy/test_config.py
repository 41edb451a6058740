"""KubeProxyConfiguration parsing and the derived target config (DESIGN §3 step 2).

The fixture is the full kubeadm-defaulted ``config.conf`` the sandbox installs, so the rules
are exercised on the shape real clusters have (``iptables.syncPeriod: 30s`` next to
``nftables.syncPeriod: 0s``), not on a toy dict.
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template
from typing import Any

import pytest
import yaml

from proxymode.kubeproxy.config import (
    ConfigError,
    KubeProxyConfig,
    MovedField,
    deep_merge,
    parse_config,
    render_target_config,
    with_mode,
)
from proxymode.kubeproxy.versions import KubeVersion, parse_version

KUBEADM_TEMPLATE = (
    Path(__file__).resolve().parents[3] / "sandbox/proxymode_sandbox/data/kube-proxy-config.conf"
)
V131 = parse_version("v1.31.4")


def kubeadm_text(mode: str = "iptables", cluster_cidr: str = "10.244.0.0/16") -> str:
    """kubeadm's config.conf in ``mode`` (kubeadm writes an empty mode as ``""``)."""
    return Template(KUBEADM_TEMPLATE.read_text()).substitute(
        mode=mode or '""', cluster_cidr=cluster_cidr
    )


def kubeadm(mode: str = "iptables", **changes: Any) -> KubeProxyConfig:
    """The kubeadm config in ``mode`` with ``changes`` deep-merged (None deletes)."""
    data = yaml.safe_load(kubeadm_text(mode))
    return KubeProxyConfig(deep_merge(data, changes))


def changed_top_level_keys(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


def v(text: str) -> KubeVersion:
    return parse_version(text)


# --- parsing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "raw", "effective"),
    [
        ("iptables", "iptables", "iptables"),
        ("ipvs", "ipvs", "ipvs"),
        ("nftables", "nftables", "nftables"),
        ("", "", "iptables"),
    ],
)
def test_parse_kubeadm_config(mode: str, raw: str, effective: str) -> None:
    config = parse_config(kubeadm_text(mode))
    assert config.raw_mode == raw
    assert config.mode == effective
    assert config.sub_struct("iptables")["syncPeriod"] == "30s"
    assert config.sub_struct("nftables")["syncPeriod"] == "0s"
    assert config.feature_gates == {}
    assert config.to_dict()["clusterCIDR"] == "10.244.0.0/16"


def test_missing_or_null_mode_means_iptables() -> None:
    base = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
    assert parse_config(base).mode == "iptables"
    assert parse_config(base + "mode: null\n").mode == "iptables"


def test_config_keeps_unknown_fields_and_hands_out_copies() -> None:
    text = kubeadm_text() + "futureField:\n  nested: [1, 2]\n"
    config = parse_config(text)
    copy = config.to_dict()
    assert copy["futureField"] == {"nested": [1, 2]}
    copy["futureField"]["nested"].append(3)
    copy["mode"] = "ipvs"
    config.sub_struct("iptables")["syncPeriod"] = "1h"
    assert config.to_dict()["futureField"] == {"nested": [1, 2]}
    assert config.mode == "iptables"
    assert config.sub_struct("iptables")["syncPeriod"] == "30s"
    assert config == parse_config(text)
    assert config != parse_config(kubeadm_text())


_HEAD = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mode: [iptables\n", "not valid YAML"),
        ("a: b: c\n", "not valid YAML"),
        ("", "empty"),
        ("# only a comment\n", "empty"),
        ("- mode: iptables\n", "must be a YAML mapping, got list"),
        ("just a string\n", "must be a YAML mapping, got str"),
        ("kind: KubeProxyConfiguration\nmode: iptables\n", "apiVersion is None"),
        (
            "apiVersion: kubeproxy.config.k8s.io/v1beta1\nkind: KubeProxyConfiguration\n",
            "apiVersion is 'kubeproxy.config.k8s.io/v1beta1'",
        ),
        ("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n", "kind is"),
        ("apiVersion: kubeproxy.config.k8s.io/v1alpha1\n", "kind is None"),
        (_HEAD + "mode: bpf\n", "unknown kube-proxy mode 'bpf'"),
        (_HEAD + "mode: userspace\n", "removed in Kubernetes 1.26"),
        (_HEAD + "mode: kernelspace\n", "Windows"),
        (_HEAD + "mode: 3\n", "mode must be a string"),
        (_HEAD + "featureGates: NFTablesProxyMode=true\n", "featureGates must be a mapping"),
        (_HEAD + "featureGates:\n  NFTablesProxyMode: 'yes'\n", "must be true or false"),
        (_HEAD + "iptables: 30s\n", "iptables must be a mapping"),
        (_HEAD + "conntrack: [1]\n", "conntrack must be a mapping"),
    ],
)
def test_parse_config_refuses_malformed_input(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config(text)


def test_parse_config_refuses_non_text() -> None:
    with pytest.raises(ConfigError, match="must be text"):
        parse_config(b"mode: iptables")  # type: ignore[arg-type]


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        parse_config("")


# --- moving the mode-dependent fields --------------------------------------------------------


def test_iptables_to_nftables_on_kubeadm_config() -> None:
    source = parse_config(kubeadm_text("iptables"))
    result = render_target_config(source, "nftables", version=V131)
    assert result.mode == "nftables"
    assert result.data["mode"] == "nftables"
    assert result.data["nftables"]["syncPeriod"] == "30s"
    assert result.data["nftables"]["minSyncPeriod"] == "1s"
    assert result.moved == [
        MovedField("syncPeriod", "iptables.syncPeriod", "nftables.syncPeriod", "30s"),
        MovedField("minSyncPeriod", "iptables.minSyncPeriod", "nftables.minSyncPeriod", "1s"),
    ]
    assert str(result.moved[0]) == "iptables.syncPeriod -> nftables.syncPeriod (30s)"
    # nothing else changes; the source sub-struct is kept for a later switch back
    assert changed_top_level_keys(source.to_dict(), result.data) == {"mode", "nftables"}
    assert result.data["iptables"] == source.sub_struct("iptables")
    assert "featureGates" not in result.data
    assert result.feature_gates_set == {}


def test_iptables_to_ipvs_on_kubeadm_config() -> None:
    source = parse_config(kubeadm_text("iptables"))
    result = render_target_config(source, "ipvs", version=V131)
    assert result.data["mode"] == "ipvs"
    assert result.data["ipvs"]["syncPeriod"] == "30s"
    assert result.data["ipvs"]["minSyncPeriod"] == "1s"
    # ipvs reads masqueradeAll/masqueradeBit from iptables.*: nothing else moves
    assert [m.field for m in result.moved] == ["syncPeriod", "minSyncPeriod"]
    assert changed_top_level_keys(source.to_dict(), result.data) == {"mode", "ipvs"}
    assert any("ipvs.strictARP: true" in w for w in result.warnings)


def test_nftables_to_iptables_keeps_explicit_iptables_values() -> None:
    # kubeadm writes iptables.syncPeriod: 30s explicitly; that wins over nftables' value
    source = kubeadm("nftables", nftables={"syncPeriod": "45s", "minSyncPeriod": "2s"})
    result = render_target_config(source, "iptables", version=V131)
    assert result.data["mode"] == "iptables"
    assert result.data["iptables"]["syncPeriod"] == "30s"
    assert result.data["iptables"]["minSyncPeriod"] == "1s"
    assert result.moved == []


def test_nftables_to_iptables_moves_into_unset_iptables_fields() -> None:
    source = kubeadm(
        "nftables",
        nftables={"syncPeriod": "45s", "masqueradeAll": True, "masqueradeBit": 12},
        iptables={"syncPeriod": "0s", "minSyncPeriod": None},
    )
    result = render_target_config(source, "iptables", version=V131)
    assert result.data["iptables"]["syncPeriod"] == "45s"
    assert "minSyncPeriod" not in result.data["iptables"]  # nftables had 0s: nothing to move
    assert result.data["iptables"]["masqueradeAll"] is True
    assert result.data["iptables"]["masqueradeBit"] == 12
    assert {m.target for m in result.moved} == {
        "iptables.syncPeriod",
        "iptables.masqueradeAll",
        "iptables.masqueradeBit",
    }


def test_ipvs_to_nftables_moves_periods_and_the_iptables_masquerade_fields() -> None:
    source = kubeadm(
        "ipvs",
        ipvs={"syncPeriod": "20s", "minSyncPeriod": "2s", "scheduler": "rr", "strictARP": True},
        iptables={"masqueradeAll": True},
    )
    result = render_target_config(source, "nftables", version=v("1.33.0"))
    assert result.data["nftables"] == {
        "masqueradeAll": True,
        "masqueradeBit": None,
        "minSyncPeriod": "2s",
        "syncPeriod": "20s",
    }
    assert [m.source for m in result.moved] == [
        "ipvs.syncPeriod",
        "ipvs.minSyncPeriod",
        "iptables.masqueradeAll",
    ]
    assert result.data["ipvs"]["scheduler"] == "rr"


def test_nftables_to_ipvs_moves_masquerade_all_into_iptables() -> None:
    source = kubeadm("nftables", nftables={"masqueradeAll": True, "syncPeriod": "10s"})
    result = render_target_config(source, "ipvs", version=V131)
    assert result.data["iptables"]["masqueradeAll"] is True
    assert result.data["ipvs"]["syncPeriod"] == "10s"


@pytest.mark.parametrize("unset", [None, "", "0s", "0", 0, "0h0m0s", "0.0s", "0ms"])
def test_unset_periods_are_not_moved(unset: Any) -> None:
    source = kubeadm("iptables", iptables={"syncPeriod": unset, "minSyncPeriod": "2s"})
    source_data = source.to_dict()
    source_data["iptables"]["syncPeriod"] = unset  # deep_merge would delete a None
    result = render_target_config(KubeProxyConfig(source_data), "nftables", version=V131)
    assert result.data["nftables"]["syncPeriod"] == "0s"
    assert result.data["nftables"]["minSyncPeriod"] == "2s"
    assert [m.field for m in result.moved] == ["minSyncPeriod"]


def test_masquerade_bit_zero_is_a_value_and_moves() -> None:
    source = kubeadm("iptables", iptables={"masqueradeBit": 0})
    result = render_target_config(source, "nftables", version=V131)
    assert result.data["nftables"]["masqueradeBit"] == 0


def test_explicit_target_value_wins_over_the_moved_one() -> None:
    source = kubeadm("iptables", nftables={"syncPeriod": "15s"})
    result = render_target_config(source, "nftables", version=V131)
    assert result.data["nftables"]["syncPeriod"] == "15s"
    assert [m.field for m in result.moved] == ["minSyncPeriod"]


def test_overrides_win_over_moved_and_explicit_values() -> None:
    source = kubeadm("iptables", nftables={"minSyncPeriod": "3s"})
    result = render_target_config(
        source,
        "nftables",
        version=V131,
        overrides={"nftables": {"syncPeriod": "5s", "minSyncPeriod": "4s"}},
    )
    assert result.data["nftables"]["syncPeriod"] == "5s"
    assert result.data["nftables"]["minSyncPeriod"] == "4s"
    assert result.moved == []


def test_override_deleting_a_target_field_is_not_undone_by_the_move() -> None:
    source = parse_config(kubeadm_text("iptables"))
    result = render_target_config(
        source, "nftables", version=V131, overrides={"nftables": {"minSyncPeriod": None}}
    )
    assert "minSyncPeriod" not in result.data["nftables"]
    assert [m.field for m in result.moved] == ["syncPeriod"]


def test_missing_target_sub_struct_is_created() -> None:
    source = KubeProxyConfig(
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "iptables": {"syncPeriod": "30s"},
        }
    )
    result = render_target_config(source, "nftables", version=V131)
    assert result.data["nftables"] == {"syncPeriod": "30s"}
    assert result.data["mode"] == "nftables"


# --- overrides --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("base", "overrides", "expected"),
    [
        ({"a": {"b": 1, "c": 2}}, {"a": {"b": 3}}, {"a": {"b": 3, "c": 2}}),
        ({"a": {"b": {"c": 1, "d": 2}}}, {"a": {"b": {"d": 5}}}, {"a": {"b": {"c": 1, "d": 5}}}),
        ({"a": [1, 2, 3]}, {"a": [9]}, {"a": [9]}),
        ({"a": 1}, {"a": {"x": 1}}, {"a": {"x": 1}}),
        ({"a": {"x": 1}}, {"a": "flat"}, {"a": "flat"}),
        ({"a": 1, "b": 2}, {"a": None}, {"b": 2}),
        ({"a": {"b": 1, "c": 2}}, {"a": {"c": None}}, {"a": {"b": 1}}),
        ({"a": 1}, {"missing": None}, {"a": 1}),
        ({"a": None}, {"a": {"b": 1, "c": None}}, {"a": {"b": 1}}),
        ({}, {"a": ("x", "y")}, {"a": ["x", "y"]}),
    ],
)
def test_deep_merge(
    base: dict[str, Any], overrides: dict[str, Any], expected: dict[str, Any]
) -> None:
    before = yaml.safe_dump(base)
    assert deep_merge(base, overrides) == expected
    assert yaml.safe_dump(base) == before  # the base is not modified


def test_overrides_deep_merge_into_the_target_config() -> None:
    source = parse_config(kubeadm_text("iptables"))
    result = render_target_config(
        source,
        "nftables",
        version=V131,
        overrides={
            "conntrack": {"maxPerCore": 65536, "tcpBeLiberal": True},
            "nodePortAddresses": ["primary"],
            "metricsBindAddress": "0.0.0.0:10249",
            "portRange": None,
            "featureGates": {"SomeAlphaGate": True},
        },
    )
    data = result.data
    assert data["conntrack"]["maxPerCore"] == 65536
    assert data["conntrack"]["tcpBeLiberal"] is True
    assert data["conntrack"]["udpTimeout"] == "0s"  # untouched sibling kept
    assert data["nodePortAddresses"] == ["primary"]
    assert data["metricsBindAddress"] == "0.0.0.0:10249"
    assert "portRange" not in data
    assert data["featureGates"] == {"SomeAlphaGate": True}
    assert not any("nodePortAddresses is unset" in w for w in result.warnings)
    assert not any("tcpBeLiberal" in w for w in result.warnings)


def test_override_lists_replace_instead_of_appending() -> None:
    source = kubeadm("iptables", ipvs={"excludeCIDRs": ["10.0.0.0/8", "192.168.0.0/16"]})
    result = render_target_config(
        source, "ipvs", version=V131, overrides={"ipvs": {"excludeCIDRs": ["172.16.0.0/12"]}}
    )
    assert result.data["ipvs"]["excludeCIDRs"] == ["172.16.0.0/12"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["nftables"],
            "configOverrides must be a mapping of KubeProxyConfiguration fields, got list",
        ),
        ("mode: ipvs", "configOverrides must be a mapping"),
        ({"mode": "ipvs"}, "configOverrides.mode must not change the mode"),
        ({"mode": None}, "configOverrides.mode must not change the mode"),
        ({"apiVersion": "kubeproxy.config.k8s.io/v1beta1"}, "must not change apiVersion"),
        ({"kind": "KubeletConfiguration"}, "must not change kind"),
        ({"kind": None}, "must not change kind"),
        (
            {"nodePortAddress": ["primary"]},
            "unknown KubeProxyConfiguration field 'nodePortAddress'",
        ),
        ({"nftables": {"syncPeriodd": "5s"}}, "configOverrides.nftables: unknown .* 'syncPeriodd'"),
        ({"ipvs": {"strictArp": True}}, "'strictArp'; did you mean 'strictARP'"),
        ({"conntrack": {"maxPerCPU": 1}}, "configOverrides.conntrack: unknown .* 'maxPerCPU'"),
        ({"nftables": "fast"}, "configOverrides.nftables must be a mapping of nftables fields"),
        ({"featureGates": {"NFTablesProxyMode": "on"}}, "must be true or false"),
        ({"featureGates": ["NFTablesProxyMode"]}, "featureGates must be a mapping"),
        ({1: "x"}, "unknown KubeProxyConfiguration field 1"),
    ],
)
def test_bad_overrides_are_refused_with_the_reason(overrides: Any, message: str) -> None:
    source = parse_config(kubeadm_text("iptables"))
    with pytest.raises(ConfigError, match=message):
        render_target_config(source, "nftables", version=V131, overrides=overrides)


def test_unknown_override_key_suggests_the_closest_field() -> None:
    source = parse_config(kubeadm_text("iptables"))
    with pytest.raises(ConfigError) as caught:
        render_target_config(source, "nftables", version=V131, overrides={"nodePortAddress": []})
    assert "did you mean 'nodePortAddresses'?" in str(caught.value)


def test_overrides_may_restate_mode_api_version_and_kind() -> None:
    source = parse_config(kubeadm_text("iptables"))
    result = render_target_config(
        source,
        "nftables",
        version=V131,
        overrides={
            "mode": "nftables",
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
        },
    )
    assert result.data["mode"] == "nftables"


def test_fields_the_source_already_has_are_accepted_in_overrides() -> None:
    # a newer kube-proxy field this module does not list, but the running config has
    source = kubeadm("iptables", futureField="a", nftables={"futureSub": 1})
    result = render_target_config(
        source,
        "nftables",
        version=V131,
        overrides={"futureField": "b", "nftables": {"futureSub": 2}},
    )
    assert result.data["futureField"] == "b"
    assert result.data["nftables"]["futureSub"] == 2


def test_override_in_a_sub_struct_the_mode_ignores_is_warned_about() -> None:
    source = parse_config(kubeadm_text("iptables"))
    result = render_target_config(
        source,
        "nftables",
        version=V131,
        overrides={"iptables": {"syncPeriod": "10s"}, "ipvs": {"scheduler": "rr"}},
    )
    assert (
        "configOverrides sets iptables.syncPeriod, which kube-proxy ignores in nftables mode; "
        "set nftables.syncPeriod instead."
    ) in result.warnings
    assert any("ipvs.scheduler, which kube-proxy ignores" in w for w in result.warnings)
    ipvs = render_target_config(
        source, "ipvs", version=V131, overrides={"iptables": {"masqueradeAll": True}}
    )
    assert not any("ignores" in w for w in ipvs.warnings)  # ipvs reads iptables.masqueradeAll


# --- refusals that are not about overrides -----------------------------------------------------


@pytest.mark.parametrize(
    ("source_mode", "target_mode"),
    [("iptables", "iptables"), ("", "iptables"), ("ipvs", "ipvs"), ("nftables", "nftables")],
)
def test_same_mode_is_refused(source_mode: str, target_mode: str) -> None:
    source = parse_config(kubeadm_text(source_mode))
    with pytest.raises(ConfigError, match="already runs in"):
        render_target_config(source, target_mode, version=V131)


@pytest.mark.parametrize(
    ("target", "message"),
    [("userspace", "removed in Kubernetes 1.26"), ("ebpf", "unknown kube-proxy mode")],
)
def test_unknown_target_modes_are_refused(target: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        render_target_config(parse_config(kubeadm_text()), target, version=V131)


def test_render_does_not_modify_the_source() -> None:
    source = parse_config(kubeadm_text("iptables"))
    before = source.to_dict()
    render_target_config(
        source, "nftables", version=v("1.30"), overrides={"conntrack": {"min": None}}
    )
    assert source.to_dict() == before


# --- versions and feature gates ------------------------------------------------------------


def test_nftables_on_1_28_is_refused() -> None:
    source = parse_config(kubeadm_text("iptables"))
    with pytest.raises(ConfigError, match=r"kube-proxy 1\.28 has no nftables mode"):
        render_target_config(source, "nftables", version=v("v1.28.15"))


@pytest.mark.parametrize("version", ["v1.29.0", "v1.30.14-eks-1234"])
def test_nftables_on_1_29_and_1_30_gets_its_feature_gate(version: str) -> None:
    source = parse_config(kubeadm_text("iptables"))
    result = render_target_config(source, "nftables", version=v(version))
    assert result.data["featureGates"] == {"NFTablesProxyMode": True}
    assert result.feature_gates_set == {"NFTablesProxyMode": True}
    assert "NFTablesProxyMode: true" in result.text


@pytest.mark.parametrize("version", ["1.31.0", "1.32.5", "1.33.0", "1.37.2"])
def test_nftables_from_1_31_needs_no_gate(version: str) -> None:
    source = parse_config(kubeadm_text("iptables"))
    result = render_target_config(source, "nftables", version=v(version))
    assert "featureGates" not in result.data
    assert result.feature_gates_set == {}


def test_gate_disabled_in_the_source_is_turned_on_with_a_warning() -> None:
    source = kubeadm("iptables", featureGates={"NFTablesProxyMode": False, "Other": True})
    result = render_target_config(source, "nftables", version=v("1.30"))
    assert result.data["featureGates"] == {"NFTablesProxyMode": True, "Other": True}
    assert (
        "featureGates.NFTablesProxyMode was false in the source config and is set to true, "
        "because nftables mode needs it."
    ) in result.warnings


def test_gate_disabled_by_the_overrides_is_refused() -> None:
    source = parse_config(kubeadm_text("iptables"))
    for gates in ({"NFTablesProxyMode": False}, {"NFTablesProxyMode": None}):
        with pytest.raises(
            ConfigError,
            match=r"is (false|null), but nftables mode in kube-proxy 1\.30 needs it true",
        ):
            render_target_config(
                source, "nftables", version=v("1.30"), overrides={"featureGates": gates}
            )


def test_gate_disabled_on_a_default_on_release_is_turned_back_on() -> None:
    source = kubeadm("iptables", featureGates={"NFTablesProxyMode": False})
    result = render_target_config(source, "nftables", version=v("1.32"))
    assert result.data["featureGates"] == {"NFTablesProxyMode": True}


def test_ipvs_on_1_35_warns_that_it_is_deprecated() -> None:
    source = parse_config(kubeadm_text("iptables"))
    result = render_target_config(source, "ipvs", version=v("1.35.1"))
    assert any("ipvs is deprecated since 1.35" in w for w in result.warnings)
    older = render_target_config(source, "ipvs", version=v("1.34"))
    assert not any("deprecated" in w for w in older.warnings)


def test_ipvs_on_1_40_is_refused_unless_the_gate_is_enabled() -> None:
    source = parse_config(kubeadm_text("iptables"))
    with pytest.raises(ConfigError, match=r"featureGates\.KubeProxyIPVS: true to opt in"):
        render_target_config(source, "ipvs", version=v("1.40.0"))
    via_overrides = render_target_config(
        source, "ipvs", version=v("1.40.0"), overrides={"featureGates": {"KubeProxyIPVS": True}}
    )
    assert via_overrides.data["featureGates"] == {"KubeProxyIPVS": True}
    assert via_overrides.feature_gates_set == {}  # already set by the person, not added
    via_source = render_target_config(
        kubeadm("iptables", featureGates={"KubeProxyIPVS": True}), "ipvs", version=v("1.40.0")
    )
    assert via_source.data["mode"] == "ipvs"


def test_a_gate_the_release_does_not_know_is_refused() -> None:
    source = parse_config(kubeadm_text("iptables"))
    with pytest.raises(ConfigError, match=r"KubeProxyIPVS does not exist in kube-proxy 1\.36"):
        render_target_config(
            source, "ipvs", version=v("1.36"), overrides={"featureGates": {"KubeProxyIPVS": True}}
        )


def test_unknown_version_skips_the_gate_but_says_so() -> None:
    source = parse_config(kubeadm_text("iptables"))
    result = render_target_config(source, "nftables", version=None)
    assert "featureGates" not in result.data
    assert any("version is unknown" in w for w in result.warnings)
    known = render_target_config(source, "nftables", version=V131)
    assert not any("version is unknown" in w for w in known.warnings)


# --- warnings -------------------------------------------------------------------------------


def test_nftables_warns_about_node_port_addresses_only_when_unset() -> None:
    expected = (
        "nodePortAddresses is unset: in nftables mode NodePorts listen only on the node's "
        "primary IPs (in iptables mode: all local IPs)."
    )
    unset = render_target_config(parse_config(kubeadm_text()), "nftables", version=V131)
    assert expected in unset.warnings
    from_ipvs = render_target_config(parse_config(kubeadm_text("ipvs")), "nftables", version=V131)
    assert any("(in ipvs mode: all local IPs)" in w for w in from_ipvs.warnings)
    explicit = render_target_config(
        kubeadm("iptables", nodePortAddresses=["0.0.0.0/0"]), "nftables", version=V131
    )
    assert not any("nodePortAddresses" in w for w in explicit.warnings)


def test_iptables_to_nftables_warns_about_the_iptables_only_workarounds() -> None:
    result = render_target_config(parse_config(kubeadm_text()), "nftables", version=V131)
    assert any("no localhost NodePorts" in w for w in result.warnings)
    assert any("conntrack.tcpBeLiberal: true" in w for w in result.warnings)
    from_ipvs = render_target_config(parse_config(kubeadm_text("ipvs")), "nftables", version=V131)
    assert not any("localhost NodePorts" in w for w in from_ipvs.warnings)


def test_ipvs_warns_about_strict_arp_unless_it_is_true() -> None:
    message = "ipvs mode with MetalLB L2 needs ipvs.strictARP: true"
    source = parse_config(kubeadm_text())
    assert any(message in w for w in render_target_config(source, "ipvs", version=V131).warnings)
    strict = render_target_config(
        source, "ipvs", version=V131, overrides={"ipvs": {"strictARP": True}}
    )
    assert not any(message in w for w in strict.warnings)


def test_iptables_target_has_no_mode_warnings() -> None:
    source = kubeadm("nftables", nodePortAddresses=None)
    assert render_target_config(source, "iptables", version=V131).warnings == []


# --- text, round trip, finalize --------------------------------------------------------------

_ROUND_TRIPS = [
    ("iptables", "nftables", "1.29.3", None),
    ("iptables", "nftables", "1.33.0", {"conntrack": {"maxPerCore": 0}}),
    ("iptables", "ipvs", "1.35.0", {"ipvs": {"scheduler": "lc", "strictARP": True}}),
    ("", "nftables", "1.31.0", {"nodePortAddresses": ["primary"], "logging": {"verbosity": 4}}),
    ("nftables", "iptables", "1.32.0", {"iptables": {"localhostNodePorts": False}}),
    ("ipvs", "nftables", "1.34.0", {"featureGates": {"SomeGate": False}}),
    ("nftables", "ipvs", "1.30.0", {"ipvs": {"excludeCIDRs": ["10.0.0.0/8"]}}),
]


@pytest.mark.parametrize(("source_mode", "target", "version", "overrides"), _ROUND_TRIPS)
def test_rendered_text_parses_back_to_the_same_data(
    source_mode: str, target: str, version: str, overrides: dict[str, Any] | None
) -> None:
    source = parse_config(kubeadm_text(source_mode))
    result = render_target_config(source, target, version=v(version), overrides=overrides)
    assert parse_config(result.text).to_dict() == result.data
    assert parse_config(result.text).mode == target
    again = render_target_config(source, target, version=v(version), overrides=overrides)
    assert again.text == result.text


def test_rendered_text_does_not_depend_on_source_key_order() -> None:
    data = yaml.safe_load(kubeadm_text())
    reversed_data = dict(reversed(list(data.items())))
    one = render_target_config(KubeProxyConfig(data), "nftables", version=V131)
    two = render_target_config(KubeProxyConfig(reversed_data), "nftables", version=V131)
    assert one.text == two.text
    keys = [line.split(":")[0] for line in one.text.splitlines() if not line.startswith(" ")]
    assert keys == sorted(keys)


def test_values_yaml_cannot_write_are_refused() -> None:
    source = parse_config(kubeadm_text())
    with pytest.raises(ConfigError, match="cannot be written as YAML"):
        render_target_config(
            source, "nftables", version=V131, overrides={"hostnameOverride": object()}
        )


def test_with_mode_changes_only_the_mode_and_the_moved_fields() -> None:
    source = parse_config(kubeadm_text("iptables"))
    final = with_mode(source, "nftables")
    data = final.to_dict()
    assert final.mode == "nftables"
    assert data["nftables"]["syncPeriod"] == "30s"
    assert data["nftables"]["minSyncPeriod"] == "1s"
    assert changed_top_level_keys(source.to_dict(), data) == {"mode", "nftables"}


def test_with_mode_is_idempotent_for_a_repeated_finalize() -> None:
    source = parse_config(kubeadm_text("iptables"))
    once = with_mode(source, "nftables")
    assert with_mode(once, "nftables") == once


def test_with_mode_matches_what_the_canaries_ran() -> None:
    source = parse_config(kubeadm_text("iptables"))
    overrides = {"nftables": {"syncPeriod": "20s"}, "conntrack": {"tcpBeLiberal": True}}
    target = render_target_config(source, "nftables", version=v("1.30"), overrides=overrides)
    final = with_mode(source, "nftables", version=v("1.30"), overrides=overrides)
    assert final.to_dict() == target.data
    assert final.to_yaml() == target.text


def test_with_mode_refuses_what_render_refuses() -> None:
    source = parse_config(kubeadm_text("iptables"))
    with pytest.raises(ConfigError, match="no nftables mode"):
        with_mode(source, "nftables", version=v("1.28"))
    with pytest.raises(ConfigError, match="unknown KubeProxyConfiguration field"):
        with_mode(source, "nftables", overrides={"nftable": {}})
