"""External tools the tests run (promtool, prometheus), found the same way everywhere.

``make system-deps`` installs them (Debian's prometheus package), and ``make test`` runs it
first, so a missing tool is a broken setup, not a reason to skip: every test that needs one
fails, saying which tool is missing and how to install it (a skip would hide that the real
Prometheus checks did not run).
"""

from __future__ import annotations

import shutil

import pytest


def required(name: str) -> str:
    """The path of ``name`` on PATH; fails the calling test clearly when it is not there."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not on PATH; `make system-deps` installs it (Debian's prometheus package)",
            pytrace=False,
        )
    return path
