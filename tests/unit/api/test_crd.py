"""crds/ is generated from the models and is a valid structural schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from proxymode.api import crd

CRD_FILE = Path(__file__).resolve().parents[3] / "crds" / "proxymode.io_proxymodepolicies.yaml"


def test_committed_crd_matches_the_models() -> None:
    assert CRD_FILE.read_text() == crd.render(), "crds/ is stale: run `make crds`"


def _walk(node: Any, path: str, out: list[str]) -> None:
    if not isinstance(node, dict):
        return
    for forbidden in ("$ref", "anyOf", "oneOf", "allOf", "title", "propertyNames"):
        if forbidden in node:
            out.append(f"{path}: {forbidden}")
    for flag in ("exclusiveMinimum", "exclusiveMaximum"):
        if flag in node and not isinstance(node[flag], bool):
            out.append(f"{path}: {flag} must be a boolean in OpenAPI v3.0")
    typed = "type" in node or node.get("x-kubernetes-int-or-string")
    if not typed and path not in ("",):
        out.append(f"{path}: no type")
    if node.get("type") == "array" and "x-kubernetes-list-type" not in node:
        out.append(f"{path}: list without x-kubernetes-list-type")
    unbounded = "enum" not in node and "format" not in node and "maxLength" not in node
    if node.get("type") == "string" and unbounded and not path.startswith(".status"):
        out.append(f"{path}: spec string without maxLength")
    for key, child in node.get("properties", {}).items():
        _walk(child, f"{path}.{key}", out)
    if "items" in node:
        _walk(node["items"], f"{path}[]", out)
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}{{}}", out)


def test_schema_is_structural_and_bounded() -> None:
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    problems: list[str] = []
    for key in ("spec", "status"):
        _walk(schema["properties"][key], f".{key}", problems)
    assert problems == []


def test_printer_columns_and_status_subresource() -> None:
    version = crd.crd()["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"] if "priority" not in c] == [
        "Target",
        "Phase",
        "Stage",
        "Nodes",
        "Age",
    ]
    assert version["subresources"] == {"status": {}}
    assert yaml.safe_load(crd.render())["spec"]["scope"] == "Cluster"
