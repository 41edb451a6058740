"""Mode support by version, kernel minimums and the cleanup matrix (kube-proxy.md §3.1, §4, §5)."""

from __future__ import annotations

import pytest

from proxymode.kubeproxy.versions import (
    KubeVersion,
    cleanup_needed,
    kernel_supports,
    minimum_kernel,
    mode_support,
    normalize_mode,
    parse_kernel_version,
    parse_version,
    version_from_image,
)


def v(text: str) -> KubeVersion:
    return parse_version(text)


# --- versions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("v1.37.2", KubeVersion(1, 37, 2)),
        ("1.31", KubeVersion(1, 31, 0)),
        ("v1.30.4-eks-abc", KubeVersion(1, 30, 4)),
        ("v1.30.4-gke.1348000", KubeVersion(1, 30, 4)),
        ("v1.31.1+k3s1", KubeVersion(1, 31, 1)),
        ("  v1.29.0 ", KubeVersion(1, 29, 0)),
        ("v1.29.0-rc.1", KubeVersion(1, 29, 0)),
    ],
)
def test_parse_version_accepts_release_strings(text: str, expected: KubeVersion) -> None:
    assert parse_version(text) == expected


@pytest.mark.parametrize(
    "text", ["", "latest", "v1", "1.x", "vv1.2.3", "1.2.3.4", "v1.2.3 extra", "sha256:abc"]
)
def test_parse_version_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes version"):
        parse_version(text)


def test_parse_version_rejects_non_strings() -> None:
    with pytest.raises(ValueError, match="must be a string"):
        parse_version(None)  # type: ignore[arg-type]


def test_versions_order_numerically_not_lexically() -> None:
    assert v("1.9") < v("1.10") < v("1.10.1") < v("1.29") < v("2.0")
    assert sorted([v("1.31.2"), v("1.29"), v("1.31.10")]) == [v("1.29"), v("1.31.2"), v("1.31.10")]
    assert str(v("1.31")) == "v1.31.0"
    assert v("v1.31.7").minor_release == "1.31"


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("registry.k8s.io/kube-proxy:v1.33.1", KubeVersion(1, 33, 1)),
        ("localhost:5000/kube-proxy:v1.30.0", KubeVersion(1, 30, 0)),
        (
            "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/kube-proxy:v1.29.0-minimal-eksbuild.1",
            KubeVersion(1, 29, 0),
        ),
        ("registry.k8s.io/kube-proxy:v1.32.3@sha256:" + "a" * 64, KubeVersion(1, 32, 3)),
        ("registry.k8s.io/kube-proxy@sha256:" + "a" * 64, None),
        ("localhost:5000/kube-proxy", None),
        ("kube-proxy:latest", None),
        ("kube-proxy", None),
    ],
)
def test_version_from_image_reads_the_tag(image: str, expected: KubeVersion | None) -> None:
    assert version_from_image(image) == expected


# --- modes ------------------------------------------------------------------------------------


def test_empty_mode_is_iptables_and_unknown_modes_say_why() -> None:
    assert normalize_mode("") == "iptables"
    assert normalize_mode("nftables") == "nftables"
    with pytest.raises(ValueError, match=r"removed in Kubernetes 1\.26"):
        normalize_mode("userspace")
    with pytest.raises(ValueError, match="Windows"):
        normalize_mode("kernelspace")
    with pytest.raises(ValueError, match="unknown kube-proxy mode 'IPVS'"):
        normalize_mode("IPVS")


@pytest.mark.parametrize(
    ("mode", "version", "gates", "expected"),
    [
        # iptables: every version, and "" means iptables
        ("iptables", "1.26", None, (True, {}, False)),
        ("iptables", "1.45", None, (True, {}, False)),
        ("", "1.31", None, (True, {}, False)),
        # userspace is gone, whatever the version
        ("userspace", "1.22", None, (False, {}, False)),
        ("userspace", "1.37", None, (False, {}, False)),
        # nftables: absent, alpha behind the gate, beta default on, GA
        ("nftables", "1.28.9", None, (False, {}, False)),
        ("nftables", "1.29.0", None, (True, {"NFTablesProxyMode": True}, False)),
        ("nftables", "1.30.14", None, (True, {"NFTablesProxyMode": True}, False)),
        (
            "nftables",
            "1.29",
            {"NFTablesProxyMode": True},
            (True, {"NFTablesProxyMode": True}, False),
        ),
        ("nftables", "1.31.0", None, (True, {}, False)),
        ("nftables", "1.33", None, (True, {}, False)),
        ("nftables", "1.37", None, (True, {}, False)),
        # an explicit false on a default-on gate has to be turned back on
        (
            "nftables",
            "1.31",
            {"NFTablesProxyMode": False},
            (True, {"NFTablesProxyMode": True}, False),
        ),
        # ipvs: fine, deprecated from 1.35, off by default from 1.40, gone in 1.43
        ("ipvs", "1.26", None, (True, {}, False)),
        ("ipvs", "1.34.9", None, (True, {}, False)),
        ("ipvs", "1.35.0", None, (True, {}, True)),
        ("ipvs", "1.37", None, (True, {}, True)),
        ("ipvs", "1.37", {"KubeProxyIPVS": False}, (True, {"KubeProxyIPVS": True}, True)),
        ("ipvs", "1.40", None, (False, {}, True)),
        ("ipvs", "1.40", {"KubeProxyIPVS": False}, (False, {}, True)),
        ("ipvs", "1.41", {"KubeProxyIPVS": True}, (True, {"KubeProxyIPVS": True}, True)),
        ("ipvs", "1.43", {"KubeProxyIPVS": True}, (False, {}, True)),
    ],
)
def test_mode_support_by_version(
    mode: str,
    version: str,
    gates: dict[str, bool] | None,
    expected: tuple[bool, dict[str, bool], bool],
) -> None:
    """``expected`` is (supported, feature_gates_needed, deprecated)."""
    supported, needed, deprecated = expected
    support = mode_support(mode, v(version), gates)
    assert support.supported is supported, support.reason
    assert support.feature_gates_needed == needed
    assert support.deprecated is deprecated
    assert support.reason.endswith(".")


@pytest.mark.parametrize(
    ("mode", "version", "gates", "phrase"),
    [
        ("nftables", "1.28", None, "appeared in 1.29"),
        ("nftables", "1.30", None, "featureGates.NFTablesProxyMode: true"),
        ("nftables", "1.32", None, "on by default"),
        ("nftables", "1.34", None, "generally available"),
        ("ipvs", "1.35", None, "deprecated since 1.35"),
        ("ipvs", "1.40", None, "featureGates.KubeProxyIPVS: true"),
        ("ipvs", "1.44", {"KubeProxyIPVS": True}, "removed in 1.43"),
        ("userspace", "1.25", None, "removed in Kubernetes 1.26"),
        ("bpf", "1.31", None, "unknown kube-proxy mode"),
    ],
)
def test_mode_support_reasons_name_the_fact(
    mode: str, version: str, gates: dict[str, bool] | None, phrase: str
) -> None:
    assert phrase in mode_support(mode, v(version), gates).reason


def test_mode_support_notes_an_explicitly_disabled_nftables_gate() -> None:
    notes = mode_support("nftables", v("1.32"), {"NFTablesProxyMode": False}).notes
    assert notes == (
        "featureGates.NFTablesProxyMode is false in the config; nftables mode needs it true.",
    )
    assert mode_support("nftables", v("1.32")).notes == ()


# --- cleanup matrix -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "target", "needed"),
    [
        ("iptables", "ipvs", True),
        ("ipvs", "iptables", True),
        ("", "ipvs", True),
        ("ipvs", "", True),
        ("iptables", "nftables", False),
        ("nftables", "iptables", False),
        ("ipvs", "nftables", False),
        ("nftables", "ipvs", False),
        ("iptables", "iptables", False),
        ("ipvs", "ipvs", False),
        ("", "iptables", False),
    ],
)
def test_cleanup_needed_exactly_between_iptables_and_ipvs(
    source: str, target: str, needed: bool
) -> None:
    assert cleanup_needed(source, target) is needed


def test_cleanup_needed_refuses_unknown_modes() -> None:
    with pytest.raises(ValueError, match="userspace"):
        cleanup_needed("userspace", "iptables")


# --- kernels --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("6.1.0-28-cloud-amd64", (6, 1)),
        ("5.15.0-1071-aws", (5, 15)),
        ("4.18.0-553.el8_10.x86_64", (4, 18)),
        ("5.14.0-427.13.1.el9_4.x86_64", (5, 14)),
        ("6.10.3+deb13-amd64", (6, 10)),
        ("5.13", (5, 13)),
        ("", None),
        ("unknown", None),
        ("5", None),
        ("v5.13", None),
        (None, None),
    ],
)
def test_parse_kernel_version(text: str | None, expected: tuple[int, int] | None) -> None:
    assert parse_kernel_version(text) == expected


def test_minimum_kernel_only_for_nftables() -> None:
    assert minimum_kernel("nftables") == (5, 13)
    assert minimum_kernel("iptables") is None
    assert minimum_kernel("ipvs") is None
    assert minimum_kernel("") is None


@pytest.mark.parametrize(
    ("mode", "kernel", "expected"),
    [
        ("nftables", "6.1.0-28-cloud-amd64", True),
        ("nftables", "5.15.0-1071-aws", True),
        ("nftables", "5.13", True),
        ("nftables", "5.12.19", False),
        ("nftables", "4.18.0-553.el8_10.x86_64", False),
        ("nftables", "6.10.1", True),  # 6.10 is newer than 5.13, not "6.1"
        ("nftables", "garbage", None),
        ("nftables", None, None),
        ("iptables", "4.18.0-553.el8_10.x86_64", True),
        ("ipvs", "garbage", True),
    ],
)
def test_kernel_supports(mode: str, kernel: str | None, expected: bool | None) -> None:
    assert kernel_supports(mode, kernel) is expected
