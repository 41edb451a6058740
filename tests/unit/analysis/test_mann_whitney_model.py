"""The ``mannWhitney`` field of a check: defaults, bounds, the wire name and its rule."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from proxymode.api import crd
from proxymode.api.models import Check, MannWhitney

BASE = {"name": "sync", "template": "SyncLatencyP99", "maxSeconds": 1}


def test_defaults_and_wire_name() -> None:
    check = Check.model_validate({**BASE, "mannWhitney": {}})
    assert check.mann_whitney == MannWhitney(alpha=0.05, tolerance=0.1, min_samples=3)
    assert check.wire()["mannWhitney"] == {"alpha": 0.05, "tolerance": 0.1, "minSamples": 3}
    assert "mannWhitney" not in Check.model_validate(BASE).wire()


@pytest.mark.parametrize(
    "bad",
    [
        {"alpha": 0},
        {"alpha": 0.51},
        {"tolerance": -0.1},
        {"tolerance": 10.5},
        {"minSamples": 1},
        {"minSamples": 1001},
        {"confLevel": 0.98},
    ],
)
def test_bounds(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Check.model_validate({**BASE, "mannWhitney": bad})


def test_edges_are_allowed() -> None:
    edges = {"alpha": 0.5, "tolerance": 0, "minSamples": 2}
    assert Check.model_validate({**BASE, "mannWhitney": edges}).mann_whitney is not None
    edges = {"alpha": 1e-6, "tolerance": 10, "minSamples": 1000}
    assert Check.model_validate({**BASE, "mannWhitney": edges}).mann_whitney is not None


def test_a_custom_query_needs_the_by_node_placeholder() -> None:
    custom = {"name": "q", "query": "sum(x{ {{nodes}} })", "max": 1, "mannWhitney": {}}
    with pytest.raises(ValidationError, match=r"mannWhitney needs a template, or a custom query"):
        Check.model_validate(custom)
    custom["query"] = "sum by ({{by_node}}) (x{ {{nodes}} })"
    assert Check.model_validate(custom).mann_whitney is not None


def test_the_crd_carries_the_same_rule() -> None:
    check = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["analysis"]["properties"]["checks"]["items"]
    rules = {r["message"]: r["rule"] for r in check["x-kubernetes-validations"]}
    message = (
        "mannWhitney needs a template, or a custom query with the {{by_node}} placeholder so"
        " that it can give one value per node"
    )
    assert rules[message] == (
        "!has(self.mannWhitney) || has(self.template)"
        " || (has(self.query) && self.query.contains('{{by_node}}'))"
    )
    schema = check["properties"]["mannWhitney"]["properties"]
    assert schema["alpha"]["exclusiveMinimum"] is True and schema["alpha"]["maximum"] == 0.5
    assert schema["minSamples"]["minimum"] == 2 and schema["minSamples"]["default"] == 3
