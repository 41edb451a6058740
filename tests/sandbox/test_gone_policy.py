"""A deleted policy leaves nothing behind in the operator's process.

kopf stops a policy's daemon as soon as its deletion starts, so the daemon never sees the
policy gone; the delete handler lets it go, and the watch's ``DELETED`` event is the last
word. What the process kept for the policy (its state series on ``/metrics``, its wake-up
flag, its look lock, its Prometheus client) must go then: an operator that runs for months
while policies come and go would otherwise report phases of policies long deleted (an
alert on ``proxymode_policy_phase{phase="Failed"}`` firing for a policy nobody can find)
and grow without end.
"""

from __future__ import annotations

import re
import urllib.request

import pytest

from proxymode_sandbox import Sandbox
from tests.sandbox.harness import KubeProxy, Policies, eventually

pytestmark = pytest.mark.sandbox


def _state_series(url: str, name: str) -> list[str]:
    """The operator's state gauges (phase, nodes by state) that name ``name``."""
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - our loopback
        text = resp.read().decode()
    wanted = re.compile(rf'^proxymode_policy_(phase|nodes)\{{[^}}]*policy="{name}"', re.M)
    return [m.group(0) for m in wanted.finditer(text)]


def test_a_deleted_policy_s_state_series_go_with_it(
    operator: Sandbox, policies: Policies, proxy: KubeProxy
) -> None:
    # Paused before preflight: the operator looks (and reports a phase) but changes nothing.
    name = policies.create(proxy.namespace, paused=True)
    url = operator.operator_metrics_url
    assert url, "the session's operator serves /metrics"
    eventually(lambda: _state_series(url, name), timeout=60, what=f"{name}'s phase on /metrics")
    policies.delete_all()  # and waits until the API server has no such policy
    eventually(
        lambda: not _state_series(url, name),
        timeout=30,
        what=f"{name}'s state series to leave /metrics once it is gone",
    )
