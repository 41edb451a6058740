"""The sandbox fixtures of ``tests/sandbox/conftest.py``, re-exported (not copied) for the plugin.

pytest keeps a session fixture per conftest that defines it, so when ``tests/sandbox`` and
``tests/cli`` run in one session each gets its own sandbox (the second one picks the next
free node network unless ``PROXYMODE_SANDBOX_NODE_NET`` pins one).
"""

from __future__ import annotations

from tests.sandbox.conftest import (
    api,
    apps,
    core,
    crd,
    faults,
    namespace,
    operator,
    policies,
    proxy,
    sampler,
    sandbox,
)

__all__ = [
    "api",
    "apps",
    "core",
    "crd",
    "faults",
    "namespace",
    "operator",
    "policies",
    "proxy",
    "sampler",
    "sandbox",
]
