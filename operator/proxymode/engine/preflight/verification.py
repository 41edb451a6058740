"""Preflight of ``spec.verify``: the Service each moved node must reach exists.

Without it every verification fails ("not found or has no ClusterIP"), so the first moved
node failed and the run rolled back: a typo in ``spec.verify.service`` cost a node's
restart, twice, to find out (a review). The adapter reads the Service's ClusterIP on every
look (``Observed.service_ips``); here its absence refuses the run before anything changes.
"""

from __future__ import annotations

from proxymode.api.models import Finding, PolicySpec, Severity
from proxymode.engine.observed import Observed
from proxymode.engine.preflight.codes import Code
from proxymode.engine.preflight.text import new_finding


def verify_service(spec: PolicySpec, observed: Observed) -> list[Finding]:
    """An Error when verification is on and its Service was not found (or has no IP)."""
    verify = spec.verify
    if not verify.enabled:
        return []
    key = verify.service.rsplit(":", 1)[0]
    if observed.service_ips.get(key):
        return []
    return [
        new_finding(
            Severity.ERROR,
            Code.VERIFY_SERVICE_MISSING,
            f"The Service {key} (spec.verify.service {verify.service!r}) was not found, has"
            " no ClusterIP, or could not be read: every moved node must reach it to be"
            " verified, so each move would fail. Name a Service with a ClusterIP that every"
            " node can reach (the default, default/kubernetes:443, always exists), or set"
            " spec.verify.enabled: false, then retry.",
        )
    ]
