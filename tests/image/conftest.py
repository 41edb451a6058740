"""Fixtures for the image built for real (tests/image/): podman, no Docker, no registry.

``built_image`` runs ``images/build.sh`` once per session. The script is idempotent: when the
local store holds an image with the content key of the build inputs (the build context, the
Dockerfile, the script, the base images) it builds nothing, so a cached run costs a few
seconds; a cold build (debootstrap of the base, then the build) happens once per machine and
again only when an input changes. The tests are skipped, saying why, only where podman cannot
run (not installed, not root, ``podman info`` failing); a failing build is a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import ROOT, run

BUILD_SCRIPT = ROOT / "images" / "build.sh"
VERSION = "0.1.0"


@dataclass(frozen=True)
class BuiltImage:
    """What images/build.sh printed: the image in the local store and its OCI archive."""

    name: str
    image_id: str
    key: str
    size_bytes: int
    archive: Path
    containers_conf: Path
    log: str

    def env(self) -> dict[str, str]:
        """The environment for podman: the script's containers.conf (runc, ulimits)."""
        return {**os.environ, "CONTAINERS_CONF": str(self.containers_conf)}


def why_podman_cannot_run() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (`make system-deps` installs it on Debian)"
    if os.geteuid() != 0:
        return "images/build.sh runs as root (debootstrap, chroot, podman's root store)"
    info = run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"], check=False)
    if info.returncode != 0:
        return f"`podman info` fails here: {info.stderr.strip()[-500:]}"
    return None


def parse_build_output(stdout: str) -> dict[str, str]:
    pairs = [line.partition("=") for line in stdout.splitlines() if "=" in line]
    return {k: v for k, _, v in pairs if k.isupper()}


def build_image() -> tuple[dict[str, str], subprocess.CompletedProcess[str]]:
    result = run(["bash", BUILD_SCRIPT], cwd=ROOT, timeout=1800)
    return parse_build_output(result.stdout), result


@pytest.fixture(scope="session")
def built_image() -> BuiltImage:
    reason = why_podman_cannot_run()
    if reason is not None:
        pytest.skip(f"the image cannot be built on this machine: {reason}")
    out, result = build_image()
    return BuiltImage(
        name=out["IMAGE"],
        image_id=out["IMAGE_ID"],
        key=out["KEY"],
        size_bytes=int(out["SIZE_BYTES"]),
        archive=Path(out["ARCHIVE"]),
        containers_conf=Path(out["CONTAINERS_CONF"]),
        log=result.stderr,
    )


def podman(
    image: BuiltImage, *args: str | Path, check: bool = True, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return run(["podman", *args], check=check, env=image.env(), **kwargs)


@pytest.fixture(scope="session")
def image_root(built_image: BuiltImage) -> Iterator[Path]:
    """The image's filesystem, mounted read-only from the local store (``podman image mount``)."""
    mounted = podman(built_image, "image", "mount", built_image.image_id).stdout.strip()
    try:
        yield Path(mounted)
    finally:
        podman(built_image, "image", "unmount", built_image.image_id, check=False)


def chart_security_flags(deployment: dict[str, Any]) -> list[str]:
    """`podman run` flags that give a container what the chart's Deployment gives its pod.

    From the rendered Deployment, not restated: runAsUser/runAsGroup, readOnlyRootFilesystem
    (and no tmpfs podman would add by itself), the dropped capabilities,
    allowPrivilegeEscalation: false, the seccomp profile (podman's default is the runtime
    default), the emptyDir volumes as tmpfs with their size limits, and the memory limit.
    """
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    psc, csc = pod.get("securityContext", {}), container.get("securityContext", {})
    merged = {**psc, **csc}
    flags = [f"--user={merged['runAsUser']}:{merged.get('runAsGroup', merged['runAsUser'])}"]
    if merged.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--read-only-tmpfs=false"]
    flags += [f"--cap-drop={c}" for c in merged.get("capabilities", {}).get("drop", [])]
    if merged.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    assert merged.get("seccompProfile", {}).get("type") == "RuntimeDefault"
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        assert "emptyDir" in volume, f"only emptyDir volumes are mapped: {volume}"
        size = volume["emptyDir"].get("sizeLimit")
        options = "rw,nosuid,nodev" + (f",size={_bytes(size)}" if size else "")
        flags.append(f"--tmpfs={mount['mountPath']}:{options}")
    limit = container.get("resources", {}).get("limits", {}).get("memory")
    if limit:
        flags.append(f"--memory={_bytes(limit)}")
    return flags


def _bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity.removesuffix(suffix)) * factor)
    return int(quantity)


def deployment_of(objects: Sequence[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    return deployment


def load_all(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="session")
def bins() -> Path:
    """The directory with the sandbox's helm and kubectl (sandbox/build-binaries.sh)."""
    from proxymode_sandbox.binaries import binary_dir  # noqa: PLC0415 - only when asked for

    return binary_dir()
