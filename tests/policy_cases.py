"""The shared corpus of invalid ProxyModePolicy specs (tests/data/invalid_policies.yaml)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CORPUS = Path(__file__).parent / "data" / "invalid_policies.yaml"


@dataclass(frozen=True)
class InvalidCase:
    name: str
    spec: dict[str, Any]
    apiserver: str
    model: str


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def valid_base() -> dict[str, Any]:
    base: dict[str, Any] = yaml.safe_load(CORPUS.read_text())["base"]
    return base


def invalid_cases() -> list[InvalidCase]:
    doc = yaml.safe_load(CORPUS.read_text())
    return [
        InvalidCase(c["name"], _merge(doc["base"], c["spec"]), c["apiserver"], c["model"])
        for c in doc["cases"]
    ]
