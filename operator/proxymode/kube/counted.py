"""Count every request the operator's Kubernetes client sends, by verb, resource and code.

The API server's own metrics have no client label, and a FlowSchema counts one identity's
requests whoever sent them in that process. This counter is the operator's Kubernetes
client as it saw its own traffic: the looks' reads and writes (labels, Jobs, the target
pair, status), the caches' lists and watches, discovery. Not in it: what kopf sends
through its own client (its watch of the policies, finalizer and annotation patches, and
the Events the operator posts through ``kopf.event``) and Prometheus queries sent through
the API server's service proxy by the analysis' own HTTP session. It is the figure behind
"requests per minute" in ``benchmarks/scale.py`` (beside the FlowSchema count, which holds
both) and on a real cluster's dashboard.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
DISCOVERY = "discovery"
NAMESPACE_SUBRESOURCES = ("status", "finalize")
"""``namespaces/<ns>/status`` is the namespace's own subresource, not a kind inside it."""


def describe(method: str, url: str, prefix: str = "") -> tuple[str, str]:
    """(verb, resource) of a request, close to how the API server names them.

    ``prefix`` is the path of the server's URL (a gateway's ``/k8s/clusters/c-1``), taken
    off first. ``resource`` carries a subresource after a slash
    (``proxymodepolicies/status``); discovery (``/api``, ``/apis/<group>/<version>``) is
    ``discovery``; a path outside ``/api`` and ``/apis`` (``/version``) is named by its
    first segment. Only the kind of object is kept, never a name: the labels stay bounded.
    """
    parts = urlsplit(url)
    path = parts.path
    if prefix and path.startswith(prefix):
        path = path[len(prefix) :]
    segments = [s for s in path.split("/") if s]
    if segments[:1] == ["api"]:
        rest = segments[2:]
    elif segments[:1] == ["apis"]:
        rest = segments[3:]
    else:
        return method.lower(), segments[0] if segments else DISCOVERY
    if not rest:
        return method.lower(), DISCOVERY
    watching = parse_qs(parts.query).get("watch", [""])[0].lower() in ("true", "1")
    if rest[0] == "watch":  # the old /watch/ paths: the object's kind follows
        rest, watching = rest[1:], True
        if not rest:
            return "watch", DISCOVERY
    own = len(rest) == 3 and rest[2] in NAMESPACE_SUBRESOURCES
    if rest[0] == "namespaces" and len(rest) >= 3 and not own:
        rest = rest[2:]  # namespaces/<ns>/<resource>...: the namespaced object's kind
    resource = rest[0] + (f"/{rest[2]}" if len(rest) == 3 else "")
    if method == "GET":
        verb = "watch" if watching else ("get" if len(rest) >= 2 else "list")
    elif method == "DELETE" and len(rest) == 1:
        verb = "deletecollection"
    else:
        verb = VERBS.get(method, method.lower())
    return verb, resource


def count_requests(api: client.ApiClient, record: Callable[[str, str, str], None]) -> None:
    """Make every request of ``api`` call ``record(verb, resource, code)`` once it answers
    (``code`` is the HTTP status, or ``error`` when no response came). A failing ``record``
    is logged, never passed on: counting must not change what a request returns."""
    rest = api.rest_client
    send: Callable[..., Any] = rest.request
    prefix = urlsplit(api.configuration.host or "").path.rstrip("/")

    def note(verb: str, resource: str, code: str) -> None:
        try:
            record(verb, resource, code)
        except Exception:
            log.exception("could not count a request (%s %s)", verb, resource)

    def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        verb, resource = describe(method, url, prefix)
        try:
            response = send(method, url, *args, **kwargs)
        except ApiException as e:
            note(verb, resource, str(e.status))
            raise
        except Exception:
            note(verb, resource, "error")
            raise
        note(verb, resource, str(getattr(response, "status", "")))
        return response

    rest.request = counted  # type: ignore[method-assign]
