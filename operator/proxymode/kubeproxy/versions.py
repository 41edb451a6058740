"""Which kube-proxy modes a Kubernetes version can run, and what switching between them costs.

Preflight must refuse a target mode the running kube-proxy does not have *before* any node
moves, because kube-proxy has not fallen back to another mode since 1.26: it exits, and the
node loses Service routing. The facts here come from ``reference/kube-proxy.md`` §3.1
(modes by version), §4 (kernel requirements) and §5 (what a mode switch cleans up):

* ``userspace`` was removed in 1.26; proxymode only knows iptables, ipvs and nftables.
* nftables: alpha in 1.29-1.30 behind ``NFTablesProxyMode`` (default off), beta and on by
  default in 1.31, GA and locked on in 1.33. It needs kernel 5.13 or later.
* ipvs: deprecated in 1.35 (still works); the ``KubeProxyIPVS`` gate arrives in 1.37 on by
  default and defaults to off in 1.40; the code is planned to go in 1.43 (KEP-5495).
* iptables works in every version, and an empty mode means iptables on Linux.

Everything is pure: versions come in as strings (node info, image tags) and go out as data.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

IPTABLES: Final = "iptables"
IPVS: Final = "ipvs"
NFTABLES: Final = "nftables"
MODES: Final[tuple[str, ...]] = (IPTABLES, IPVS, NFTABLES)
"""kube-proxy's Linux modes that proxymode migrates between, spelled exactly as kube-proxy does."""

NFTABLES_GATE: Final = "NFTablesProxyMode"
IPVS_GATE: Final = "KubeProxyIPVS"


@dataclass(frozen=True, order=True)
class KubeVersion:
    """A Kubernetes release as ``major.minor.patch``; ordering compares numerically.

    Build suffixes (``-eks-abc``, ``+k3s1``) are dropped because mode support depends only on
    the upstream minor release the build is based on.
    """

    major: int
    minor: int
    patch: int = 0

    def __str__(self) -> str:
        return f"v{self.major}.{self.minor}.{self.patch}"

    @property
    def minor_release(self) -> str:
        """``"1.31"``: how release notes and this module's messages name a release."""
        return f"{self.major}.{self.minor}"


def _release(minor: int) -> KubeVersion:
    return KubeVersion(1, minor)


NFTABLES_ALPHA: Final = _release(29)
NFTABLES_BETA: Final = _release(31)
NFTABLES_GA: Final = _release(33)
IPVS_DEPRECATED: Final = _release(35)
IPVS_GATE_ADDED: Final = _release(37)
IPVS_OFF_BY_DEFAULT: Final = _release(40)
IPVS_REMOVED: Final = _release(43)

GATE_INTRODUCED: Final[Mapping[str, KubeVersion]] = {
    NFTABLES_GATE: NFTABLES_ALPHA,
    IPVS_GATE: IPVS_GATE_ADDED,
}
"""The first release that knows each gate: kube-proxy refuses to start on an unknown gate."""

_VERSION_RE: Final = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+][0-9A-Za-z._+-]*)?")
_KERNEL_RE: Final = re.compile(r"(\d+)\.(\d+)(?:[.\-+_~ ].*)?")


def parse_version(text: str) -> KubeVersion:
    """Parse ``v1.37.2``, ``1.31``, ``v1.30.4-eks-abc`` or ``v1.30.4+k3s1``.

    Raises ValueError on anything else, so that a garbled version stops preflight instead of
    being treated as some default release.
    """
    if not isinstance(text, str):
        raise ValueError(f"a Kubernetes version must be a string, got {type(text).__name__}")
    match = _VERSION_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes version (expected e.g. v1.31.2)")
    major, minor, patch = match.groups()
    return KubeVersion(int(major), int(minor), int(patch or 0))


def version_from_image(image: str) -> KubeVersion | None:
    """The version in a kube-proxy image tag (``registry.k8s.io/kube-proxy:v1.33.1``).

    Returns None when the image has no tag or the tag is not a version (``latest``, digest
    only), because then the version must come from elsewhere (the node's kubelet version).
    """
    name = image.split("@", 1)[0]
    last_part = name.rsplit("/", 1)[-1]
    if ":" not in last_part:
        return None
    tag = last_part.rsplit(":", 1)[1]
    try:
        return parse_version(tag)
    except ValueError:
        return None


def normalize_mode(mode: str) -> str:
    """The effective Linux mode: ``""`` means iptables; unknown modes raise ValueError.

    The error names the reason a person would need (userspace is gone, kernelspace is Windows).
    """
    if mode == "":
        return IPTABLES
    if mode in MODES:
        return mode
    if mode == "userspace":
        raise ValueError(
            "mode 'userspace' was removed in Kubernetes 1.26; proxymode migrates only between "
            "iptables, ipvs and nftables"
        )
    if mode == "kernelspace":
        raise ValueError("mode 'kernelspace' is kube-proxy's Windows mode; proxymode is Linux only")
    raise ValueError(f"unknown kube-proxy mode {mode!r}; the Linux modes are {', '.join(MODES)}")


@dataclass(frozen=True)
class ModeSupport:
    """Whether one kube-proxy release can run one mode, and on which conditions."""

    mode: str
    version: KubeVersion
    supported: bool
    reason: str  # one sentence for status, events and preflight findings
    feature_gates_needed: dict[str, bool] = field(default_factory=dict)
    deprecated: bool = False
    notes: tuple[str, ...] = ()


def mode_support(
    mode: str, version: KubeVersion, feature_gates: Mapping[str, bool] | None = None
) -> ModeSupport:
    """Can kube-proxy ``version`` run ``mode``, given the ``featureGates`` its config sets?

    ``feature_gates`` are the explicit settings in the config that will run (source config
    plus overrides). They matter in two ways: an explicit ``false`` on a gate the mode needs
    must be turned back on (listed in ``feature_gates_needed``), and ipvs from 1.40 runs only
    when ``KubeProxyIPVS`` is explicitly true, because opting back into a mode the project
    turned off is a decision for a person, not for the operator.
    """
    gates = dict(feature_gates or {})
    try:
        effective = normalize_mode(mode)
    except ValueError as error:
        return ModeSupport(mode, version, supported=False, reason=f"{error}.")
    if effective == NFTABLES:
        return _nftables_support(version, gates)
    if effective == IPVS:
        return _ipvs_support(version, gates)
    return ModeSupport(
        IPTABLES, version, supported=True, reason="iptables mode exists in every kube-proxy."
    )


def _nftables_support(version: KubeVersion, gates: Mapping[str, bool]) -> ModeSupport:
    release = version.minor_release
    if version < NFTABLES_ALPHA:
        return ModeSupport(
            NFTABLES,
            version,
            supported=False,
            reason=f"kube-proxy {release} has no nftables mode; it appeared in 1.29 (alpha).",
        )
    disabled = gates.get(NFTABLES_GATE) is False
    needed = {NFTABLES_GATE: True} if version < NFTABLES_BETA or disabled else {}
    notes: tuple[str, ...] = ()
    if disabled and version >= NFTABLES_BETA:
        notes = (
            f"featureGates.{NFTABLES_GATE} is false in the config; nftables mode needs it true.",
        )
    if version < NFTABLES_BETA:
        reason = (
            f"nftables mode is alpha in kube-proxy {release} and runs only with "
            f"featureGates.{NFTABLES_GATE}: true."
        )
    elif version < NFTABLES_GA:
        reason = (
            f"nftables mode is beta in kube-proxy {release}; its feature gate is on by default."
        )
    else:
        reason = f"nftables mode is generally available in kube-proxy {release} (GA since 1.33)."
    return ModeSupport(NFTABLES, version, True, reason, feature_gates_needed=needed, notes=notes)


def _ipvs_support(version: KubeVersion, gates: Mapping[str, bool]) -> ModeSupport:
    release = version.minor_release
    if version < IPVS_DEPRECATED:
        return ModeSupport(IPVS, version, True, f"ipvs mode exists in kube-proxy {release}.")
    if version >= IPVS_REMOVED:
        return ModeSupport(
            IPVS,
            version,
            supported=False,
            reason=(
                f"ipvs mode is not available in kube-proxy {release}: its code is planned to be "
                "removed in 1.43 (KEP-5495)."
            ),
            deprecated=True,
        )
    deprecation = (
        f"ipvs is deprecated since 1.35 (KEP-5495): kube-proxy {release} still runs it but logs "
        "a warning at start, and it is off by default from 1.40."
    )
    if version >= IPVS_OFF_BY_DEFAULT and gates.get(IPVS_GATE) is not True:
        return ModeSupport(
            IPVS,
            version,
            supported=False,
            reason=(
                f"ipvs mode is off by default in kube-proxy {release} (feature gate {IPVS_GATE} "
                f"defaults to false there) and kube-proxy exits in it; set "
                f"featureGates.{IPVS_GATE}: true to opt in."
            ),
            deprecated=True,
        )
    needs_gate = version >= IPVS_OFF_BY_DEFAULT or (
        version >= IPVS_GATE_ADDED and gates.get(IPVS_GATE) is False
    )
    needed = {IPVS_GATE: True} if needs_gate else {}
    return ModeSupport(
        IPVS, version, True, deprecation, feature_gates_needed=needed, deprecated=True
    )


def cleanup_needed(source_mode: str, target_mode: str) -> bool:
    """Does a node need ``kube-proxy --cleanup`` (or a reboot) when it changes mode?

    True exactly for iptables <-> ipvs: kube-proxy removes the other modes' rules at start only
    when nftables is on one side; between the two iptables-based modes the old rules (and, from
    ipvs, the kube-ipvs0 device holding every Service IP) stay and break traffic (§5, §8.2).
    """
    pair = {normalize_mode(source_mode), normalize_mode(target_mode)}
    return pair == {IPTABLES, IPVS}


def minimum_kernel(mode: str) -> tuple[int, int] | None:
    """The oldest kernel ``(major, minor)`` the mode accepts; None when kube-proxy checks none.

    nftables mode refuses to start below 5.13 (``pkg/proxy/nftables/supported.go``).
    """
    return (5, 13) if normalize_mode(mode) == NFTABLES else None


@functools.lru_cache(maxsize=4096)
def parse_kernel_version(text: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` from a node's ``kernelVersion`` such as ``6.1.0-28-cloud-amd64``.

    None when the string carries no recognisable version, so callers can report "unknown"
    instead of guessing.
    """
    if not isinstance(text, str):
        return None
    match = _KERNEL_RE.fullmatch(text.strip())
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def kernel_supports(mode: str, kernel_version: str | None) -> bool | None:
    """Can a node with this kernel run ``mode``? None when a minimum exists but is unknowable.

    Modes without a kernel minimum answer True whatever the string, because the kernel cannot
    stop them and an unparseable string should not make preflight inconclusive for them.
    """
    minimum = minimum_kernel(mode)
    if minimum is None:
        return True
    kernel = parse_kernel_version(kernel_version)
    if kernel is None:
        return None
    return kernel >= minimum
