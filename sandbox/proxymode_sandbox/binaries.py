"""Find (and if needed build) the control-plane binaries the sandbox runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "build-binaries.sh"
REQUIRED = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-proxy",
    "kubectl",
    "kwok",
    "helm",
)


def binary_dir() -> Path:
    """The directory with every binary in ``REQUIRED``.

    ``PROXYMODE_BIN_DIR`` names a ready directory; otherwise the build script
    returns its cache directory, building first when the cache is cold (minutes)
    and answering in milliseconds when it is warm.
    """
    override = os.environ.get("PROXYMODE_BIN_DIR")
    if override:
        directory = Path(override)
    else:
        out = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True
        ).stdout
        directory = Path(out.strip().splitlines()[-1])
    missing = [b for b in REQUIRED if not (directory / b).is_file()]
    if missing:
        raise FileNotFoundError(f"{directory} lacks {', '.join(missing)}")
    return directory
