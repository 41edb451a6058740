"""Label and node-affinity matching, the one implementation (Kubernetes semantics).

Used by the planner (``metav1.LabelSelector`` of ``spec.nodeSelector`` and stages) and by
preflight (the source DaemonSet's ``nodeSelector`` and required node affinity, i.e.
``core/v1`` ``NodeSelectorRequirement``, which adds ``Gt`` and ``Lt``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from proxymode.api.models import LabelSelector


def requirement_holds(
    operator: str, key: str, values: Sequence[str], labels: Mapping[str, str]
) -> bool:
    """One requirement: In, NotIn, Exists, DoesNotExist, Gt, Lt.

    An operator Kubernetes does not know matches nothing (it schedules nowhere).
    """
    value = labels.get(key)
    if operator in ("Gt", "Lt"):
        return _numeric(operator == "Gt", value, values)
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    return False


def _numeric(greater: bool, value: str | None, values: Sequence[str]) -> bool:
    """Gt/Lt: one integer bound; a missing or non-integer label never matches."""
    if value is None or len(values) != 1:
        return False
    try:
        have, bound = int(value), int(values[0])
    except ValueError:
        return False
    return have > bound if greater else have < bound


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics; an absent or empty selector matches everything."""
    if selector is None:
        return True
    if any(labels.get(k) != v for k, v in (selector.match_labels or {}).items()):
        return False
    return all(
        requirement_holds(r.operator, r.key, list(r.values or []), labels)
        for r in selector.match_expressions or []
    )
