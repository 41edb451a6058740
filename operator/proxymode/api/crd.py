"""Generate the ProxyModePolicy CRD from the pydantic models.

pydantic emits JSON Schema with ``$ref``/``$defs``, ``anyOf`` for optional fields and
titles; a CRD needs a *structural* schema: every node typed, refs inlined, no
``anyOf`` carrying types, every list with a list type. ``structural`` rewrites one
into the other, keeping bounds, enums, defaults, descriptions and the CEL rules
the models carry in ``x-kubernetes-validations``.

``python -m proxymode.api.crd`` prints the CRD; ``make crds`` writes ``crds/``, and a
unit test fails when the file and the models disagree.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import yaml

from proxymode.api import models

# Fields whose list semantics are not "atomic": conditions merge by type (metav1 convention).
_MAP_LISTS = {"conditions": ["type"]}
NAME_TOO_LONG = (
    f"the policy name must be at most {models.MAX_POLICY_NAME} characters"
    " (it names the objects it creates)"
)
# Whole-object rules: they need both spec and status, so they sit at the root of the schema.
ROOT_RULES = [
    {
        # Failed and Preflight only when nothing was changed (no snapshot): a run that failed
        # mid-way still has the target pair of its mode, which a retry under another mode
        # never deleted (a review: kube-proxy-nftables left behind by a retry to ipvs).
        "rule": (
            "!has(oldSelf.spec) || self.spec.targetMode == oldSelf.spec.targetMode"
            " || !has(self.status) || !has(self.status.phase)"
            " || self.status.phase in ["
            + ", ".join(f"'{p}'" for p in models.Phase if p in models.TARGET_EDITABLE_PHASES)
            + "]"
            " || (self.status.phase in ['Preflight', 'Failed'] && !has(self.status.backup))"
        ),
        "message": (
            "targetMode cannot change while a rollout is in flight, after it completed, or"
            " after a failed run changed the cluster; abort it (retry, if it Failed: that"
            " rolls back first), or create a new policy, to choose another mode"
        ),
        "reason": "FieldValueForbidden",
        "fieldPath": ".spec.targetMode",
    },
    {
        # The rollout's objects (the snapshot, the target pair, the source it patched) are
        # the kube-proxy this names: another one mid-run would leave the first unrestorable.
        # Failed only when nothing was changed (no snapshot): a run that failed to finalize
        # or to roll back still has the source patched and nodes labelled.
        "rule": (
            "!has(oldSelf.spec) || self.spec.kubeProxy == oldSelf.spec.kubeProxy"
            " || !has(self.status) || !has(self.status.phase)"
            " || self.status.phase in ['Pending', 'RolledBack']"
            " || (self.status.phase == 'Failed' && !has(self.status.backup))"
        ),
        "message": (
            "kubeProxy cannot change while a rollout is in flight or after it completed: the"
            " rollout's changes are to the kube-proxy it names; abort it (or create a new"
            " policy) to migrate another"
        ),
        "reason": "FieldValueForbidden",
        "fieldPath": ".spec.kubeProxy",
    },
    {
        "rule": f"self.metadata.name.size() <= {models.MAX_POLICY_NAME}",
        "message": NAME_TOO_LONG,
    },
]
_EXCLUSIVE = {"exclusiveMinimum": "minimum", "exclusiveMaximum": "maximum"}
_DROP = {"title", "$defs", "discriminator", "propertyNames"}


def structural(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rewrite one pydantic JSON Schema node (and its children) into a structural schema."""
    defs = defs if defs is not None else schema.get("$defs", {})
    node = copy.deepcopy(schema)
    if "$ref" in node:
        target = defs[node.pop("$ref").split("/")[-1]]
        merged = {**copy.deepcopy(target), **node}
        return structural(merged, defs)
    if "anyOf" in node:
        node = _collapse_any_of(node, defs)
        if "x-kubernetes-int-or-string" in node:
            return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in _DROP:
            _copy_key(out, key, value, defs)
    # additionalProperties False: structural schemas prune unknown fields anyway. True (a
    # free-form mapping such as configOverrides): say so the structural way.
    if isinstance(out.get("additionalProperties"), bool) and out.pop("additionalProperties"):
        out["x-kubernetes-preserve-unknown-fields"] = True
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True
    if out.get("type") == "array":
        out.setdefault("x-kubernetes-list-type", "atomic")
    if out.get("default", "absent") is None:
        del out["default"]
    return out


def _copy_key(out: dict[str, Any], key: str, value: Any, defs: dict[str, Any]) -> None:
    if key == "properties":
        out["properties"] = {k: _property(k, v, defs) for k, v in value.items()}
    elif key in ("items", "additionalProperties") and isinstance(value, dict):
        out[key] = structural(value, defs)
    elif key == "const":
        out["enum"] = [value]
    elif key in _EXCLUSIVE and not isinstance(value, bool):
        # JSON Schema 2020 (pydantic) gives the bound; OpenAPI v3.0 (CRDs) wants a flag.
        out[_EXCLUSIVE[key]] = value
        out[key] = True
    else:
        out[key] = value


def _property(name: str, schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    out = structural(schema, defs)
    if name in _MAP_LISTS and out.get("type") == "array":
        out["x-kubernetes-list-type"] = "map"
        out["x-kubernetes-list-map-keys"] = _MAP_LISTS[name]
    return out


def _collapse_any_of(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """``Optional[X]`` becomes X (optional = not required); ``int | str`` is int-or-string."""
    options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
    types = {o.get("type") for o in options}
    if types == {"integer", "string"}:
        keep = {k: v for k, v in node.items() if k in ("description", "default")}
        return {"x-kubernetes-int-or-string": True, **keep}
    if len(options) != 1:
        raise ValueError(f"cannot make a structural schema from anyOf {options}")
    resolved = options[0]
    if "$ref" in resolved:
        resolved = defs[resolved["$ref"].split("/")[-1]]
    return {**copy.deepcopy(resolved), **node}


def _without_defaults(node: Any) -> Any:
    """Status is written by the operator alone: the API server should not invent values there."""
    if isinstance(node, dict):
        return {k: _without_defaults(v) for k, v in node.items() if k != "default"}
    if isinstance(node, list):
        return [_without_defaults(v) for v in node]
    return node


def _schema_of(model: type[models.ApiModel]) -> dict[str, Any]:
    return structural(model.model_json_schema(by_alias=True, mode="validation"))


def openapi_schema() -> dict[str, Any]:
    """The CRD version's ``openAPIV3Schema``."""
    spec = _schema_of(models.PolicySpec)
    status = _without_defaults(_schema_of(models.PolicyStatus))
    return {
        "type": "object",
        "description": (
            "ProxyModePolicy moves the cluster's kube-proxy to another mode (iptables, ipvs,"
            " nftables) node pool by node pool, gated on kube-proxy's own metrics, and rolls"
            " back by itself on a breach."
        ),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": ROOT_RULES,
    }


PRINTER_COLUMNS = [
    {"name": "Target", "type": "string", "jsonPath": ".spec.targetMode"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Stage", "type": "string", "jsonPath": ".status.currentStageName"},
    {"name": "Nodes", "type": "string", "jsonPath": ".status.nodeProgress"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Source", "type": "string", "jsonPath": ".status.sourceMode", "priority": 1},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
]


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{models.PLURAL}.{models.GROUP}",
            "labels": {
                "app.kubernetes.io/name": "proxymode",
                "app.kubernetes.io/part-of": "proxymode",
            },
        },
        "spec": {
            "group": models.GROUP,
            "scope": "Cluster",
            "names": {
                "kind": models.KIND,
                "listKind": f"{models.KIND}List",
                "plural": models.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": list(models.SHORT_NAMES),
                "categories": ["proxymode"],
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


HEADER = "# Generated from operator/proxymode/api/models.py by `make crds`. Do not edit.\n"


def render() -> str:
    """The CRD as the YAML committed in ``crds/``."""
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100)


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(render())
