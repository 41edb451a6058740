"""Small helpers preflight's checks share: findings, readable node lists, safe lookups."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from proxymode.api.models import Count, Finding, Severity

NAMES_IN_MESSAGE: Final = 10
"""A message names at most this many nodes; the finding's ``nodes`` lists all of them."""


def new_finding(severity: Severity, code: str, message: str, nodes: Iterable[str] = ()) -> Finding:
    return Finding(severity=severity, code=code, message=message, nodes=sorted(nodes))


def name_list(names: Sequence[str], limit: int = NAMES_IN_MESSAGE) -> str:
    """``a, b, c`` or ``a, b, ... and 7 more``: node lists in messages stay readable."""
    shown = ", ".join(names[:limit])
    rest = len(names) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown


def carrying(objects: Sequence[str]) -> str:
    """``DaemonSet x carries`` or ``DaemonSet x and ConfigMap y carry``."""
    return f"{' and '.join(objects)} {'carries' if len(objects) == 1 else 'carry'}"


def plural(count: int, noun: str) -> str:
    """``1 node``, ``3 nodes``; for "are"/"is" the caller picks the phrasing."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def value_counts(values: Iterable[str]) -> list[Count]:
    """How many nodes share each value, sorted by value; an empty value counts as unknown."""
    counter = Counter(value or "unknown" for value in values)
    return [Count(value=value, count=count) for value, count in sorted(counter.items())]


def get_mapping(obj: Mapping[str, Any] | None, *path: str) -> Mapping[str, Any]:
    """``obj[path...]`` when every step is a mapping, else an empty mapping."""
    current: Any = obj
    for key in path:
        if not isinstance(current, Mapping):
            return {}
        current = current.get(key)
    return current if isinstance(current, Mapping) else {}


def get_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def get_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
