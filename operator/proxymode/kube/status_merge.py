"""What a JSON merge patch of the status leaves on the server, computed before sending it
(a look that would change nothing writes nothing)."""

from __future__ import annotations

from typing import Any


def merged(current: Any, patch: Any) -> Any:
    """``current`` after a JSON merge patch (RFC 7386) of ``patch``, as the API server
    stores it: a list is replaced whole, and the server drops the null fields inside its
    items (``history[].stage``, ``stages[].bakedSince``), so they are dropped here too."""
    if not isinstance(patch, dict):
        return without_nulls(patch)
    out = dict(current) if isinstance(current, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value
