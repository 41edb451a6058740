"""Count every request the operator's Kubernetes client sends, by verb, resource and code.

The API server's own metrics have no client label, and a FlowSchema counts one identity's
requests whoever sent them in that process (kopf's watch of the policies and its
finalizer and annotation patches come through its own client, not this one). This
counter is the operator's API client as it saw its own traffic: the looks' reads and
writes, the caches' lists and watches, the Jobs and Events it makes. It is the figure
behind "requests per minute" in ``benchmarks/scale.py`` and on a real cluster's dashboard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client
from kubernetes.client.exceptions import ApiException

VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def describe(method: str, url: str) -> tuple[str, str]:
    """(verb, resource) of a request as the API server would name them.

    ``resource`` carries a subresource after a slash (``proxymodepolicies/status``); a path
    outside ``/api`` and ``/apis`` (``/version``) is named by its first segment.
    """
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    if segments[:1] == ["api"]:
        rest = segments[2:]
    elif segments[:1] == ["apis"]:
        rest = segments[3:]
    else:
        return method.lower(), segments[0] if segments else ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # namespaces/<ns>/<resource>...; a bare namespaces/<ns> is the object
    if not rest:
        return method.lower(), ""
    resource = rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")
    if method == "GET":
        watching = parse_qs(parts.query).get("watch", [""])[0].lower() in ("true", "1")
        verb = "watch" if watching else ("get" if len(rest) >= 2 else "list")
    else:
        verb = VERBS.get(method, method.lower())
    return verb, resource


def count_requests(api: client.ApiClient, record: Callable[[str, str, str], None]) -> None:
    """Make every request of ``api`` call ``record(verb, resource, code)`` once it answers
    (``code`` is the HTTP status, or ``error`` when no response came)."""
    rest = api.rest_client
    send: Callable[..., Any] = rest.request

    def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        verb, resource = describe(method, url)
        try:
            response = send(method, url, *args, **kwargs)
        except ApiException as e:
            record(verb, resource, str(e.status))
            raise
        except Exception:
            record(verb, resource, "error")
            raise
        record(verb, resource, str(getattr(response, "status", "")))
        return response

    rest.request = counted  # type: ignore[method-assign]
