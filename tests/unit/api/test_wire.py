"""``models.from_wire`` judges a policy as the API server does (decision 0091).

Found by the generated specs (issue 15 item 2): the models' lax mode took ``"1"`` for an
integer and ``1`` for a boolean, and ``populate_by_name`` took ``bake_seconds`` for
``bakeSeconds``; the API server refuses all three.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from proxymode.api import models


def body(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "apiVersion": "proxymode.io/v1alpha1",
        "kind": "ProxyModePolicy",
        "metadata": {"name": "p"},
        "spec": {"targetMode": "nftables", "stages": [{"name": "all", "percent": 100}], **spec},
    }
    if status is not None:
        out["status"] = status
    return out


@pytest.mark.parametrize(
    ("spec", "where"),
    [
        ({"stages": [{"name": "all", "percent": 100, "maxNodes": "1"}]}, "maxNodes"),
        ({"rollback": {"automatic": 1}}, "automatic"),
        ({"readyTimeoutSeconds": 60.0}, "readyTimeoutSeconds"),
        ({"paused": "true"}, "paused"),
        ({"maxUnavailable": True}, "maxUnavailable"),
        ({"stages": [{"name": "all", "percent": 100, "bake_seconds": 1}]}, "bake_seconds"),
        ({"target_mode": "ipvs"}, "target_mode"),
    ],
)
def test_what_the_api_server_refuses_the_models_refuse(spec: dict[str, Any], where: str) -> None:
    with pytest.raises(ValidationError, match=where):
        models.from_wire(body(spec))


def test_wire_values_read_as_before() -> None:
    policy = models.from_wire(
        body(
            {
                "maxUnavailable": "50%",
                "analysis": {
                    "prometheus": {"url": "http://p:9090"},
                    "checks": [{"name": "c", "template": "SyncLatencyP99", "maxSeconds": 1}],
                },
            },
            status={"phase": "Progressing", "currentStage": 0, "futureField": 1},
        )
    )
    assert policy.spec.max_unavailable == "50%"
    assert policy.spec.analysis is not None
    assert policy.spec.analysis.checks[0].max_seconds == 1.0
    assert policy.status.phase == models.Phase.PROGRESSING


def test_code_may_still_build_models_by_python_name() -> None:
    stage = models.Stage(name="all", percent=100, bake_seconds=5)
    assert stage.wire()["bakeSeconds"] == 5
